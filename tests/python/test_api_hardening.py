"""Hardening of the Python API's argument checks (issue 12, items 9-15 and 17): every bad input is
refused with a ValueError naming the op and the argument, before any output is written; never a
crash, a silent coercion or a result read in the wrong order."""

import sys
import tempfile
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import _C

RNG = np.random.default_rng(12)
X = RNG.standard_normal((4, 64)).astype(np.float32)


def _raises(call, op, arg, also=""):
    with pytest.raises(ValueError, match=f"{op}: argument '{arg}'") as e:
        call()
    assert also in str(e.value), str(e.value)
    return e.value


def sqnr(x, y):
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    return 10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2))


# --- 9: read-only outputs --------------------------------------------------------------------

def test_read_only_memmap_global_amax_is_refused_not_written():
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/amax.bin"
        np.array([123.0], np.float32).tofile(path)
        mm = np.memmap(path, np.float32, mode="r", shape=(1,))
        _raises(lambda: lowbit.quantize(X, "nvfp4", global_amax=mm, compute_global_amax=True),
                "quantize", "global_amax", "read-only")
        assert mm[0] == 123.0
        del mm


def test_read_only_array_global_amax_is_refused_not_written():
    ro = np.array([5.0], np.float32)
    ro.flags.writeable = False
    _raises(lambda: lowbit.quantize(X, "nvfp4", global_amax=ro, compute_global_amax=True),
            "quantize", "global_amax", "read-only")
    assert ro[0] == 5.0
    # as an input (not computed) a read-only amax is fine
    qt = lowbit.quantize(X, "nvfp4", global_amax=ro)
    assert qt.global_amax is ro


def test_binding_refuses_read_only_outputs():
    """The module itself (not only the Python layer) refuses a read-only output."""
    out = np.zeros((4, 64), np.float16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="cast: argument 'out'.*read-only"):
        _C.cast(X, _C.DType.float32, out, _C.DType.float16, _C.Saturate.finite)
    assert not out.any()
    amax = np.zeros(1, np.float32)
    amax.flags.writeable = False
    with pytest.raises(ValueError, match="tensor_amax: argument 'out'.*read-only"):
        _C.tensor_amax(X, _C.DType.float32, amax)
    assert amax[0] == 0
    q = np.zeros((4, 64), np.uint8)
    s = np.zeros((4, 2), np.uint8)
    s.flags.writeable = False
    args = (*lowbit.Format("mxfp8_e4m3").c_args(), _C.ScaleLayoutKind.row_major, 1, _C.GroupPad.none)
    with pytest.raises(ValueError, match="quantize: argument 'scales'.*read-only"):
        _C.quantize(X, _C.DType.float32, q, _C.DType.float8_e4m3fn, s, _C.DType.float8_e8m0fnu, *args)
    assert not q.any() and not s.any()


def test_gemm_read_only_out_is_refused():
    rng = np.random.default_rng(3)
    ind = np.array([0, 3, 5], np.int32)
    qa = lowbit.quantize(rng.standard_normal((5, 64)).astype(np.float32), "mxfp8_e4m3", "blocked128x4", m_indptr=ind)
    qb = lowbit.quantize(rng.standard_normal((2, 16, 64)).astype(np.float32), "mxfp4", "blocked128x4")
    out = np.zeros((5, 16), ml_dtypes.bfloat16)
    out.flags.writeable = False
    _raises(lambda: lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, qb.data, qa.scales, qb.scales, ind, out=out),
            "group_gemm_mxfp4_nt_groupwise", "out", "read-only")


# --- 10: host index arrays are copied before they are validated ------------------------------

def _mutate_while(calls, arr, values, seconds=1.0):
    """Runs `calls()` in a loop while another thread keeps rewriting arr[:] with `values` in turn;
    every call must either succeed or raise ValueError (never crash, never another error)."""
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            arr[:] = values[i % len(values)]
            i += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    th = threading.Thread(target=writer)
    th.start()
    ok = refused = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                calls()
                ok += 1
            except ValueError:
                refused += 1
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert ok + refused > 0
    return ok, refused


def test_m_indptr_changed_by_another_thread_never_crashes_quantize():
    x = RNG.standard_normal((300, 64)).astype(np.float32)
    ind = np.array([0, 100, 300], np.int64)
    bad = [np.array(v, np.int64) for v in ([0, 100, 300], [0, 100000, 300], [0, -7, 300], [0, 290, 300],
                                             [0, 300, 300], [0, 2**62, 300])]
    for layout_pad in ("flashinfer", "cumsum"):
        _mutate_while(lambda: lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=ind, group_pad=layout_pad),
                      ind, bad, seconds=0.4)
    # and the dequantize / convert_scale_layout paths
    ind[:] = [0, 100, 300]
    qt = lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=ind.copy())
    qt = lowbit.Quantized(qt.data, qt.scales, format=qt.format, layout="blocked128x4", m_indptr=ind, shape=qt.shape)
    _mutate_while(lambda: lowbit.dequantize(qt), ind, bad, seconds=0.3)
    _mutate_while(lambda: lowbit.convert_scale_layout(qt.scales, 300, 2, "blocked128x4", "row_major", m_indptr=ind),
                  ind, bad, seconds=0.3)


def test_m_indptr_changed_by_another_thread_never_crashes_group_gemm():
    rng = np.random.default_rng(5)
    ind = np.array([0, 3, 5], np.int32)
    a = rng.standard_normal((5, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    qb = lowbit.quantize(rng.standard_normal((2, 16, 64)).astype(np.float32), "mxfp4", "blocked128x4")
    bad = [np.array(v, np.int32) for v in ([0, 3, 5], [0, 2, 100000], [0, -7, 5], [0, 5, 3], [0, 5, 5])]
    _mutate_while(lambda: lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data, None, qb.scales, ind), ind, bad, seconds=0.4)


def test_topk_ids_changed_by_another_thread_never_crash_moe_mlp():
    rng = np.random.default_rng(4)
    T, H, I, E = 3, 64, 32, 3
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = np.zeros((E, 2 * I), np.float32)
    b2 = np.zeros((E, H), np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.array([[0, 2], [1, -1], [2, 2]], np.int32)
    wts = np.full((T, 2), 0.5, np.float32)
    bad = [np.array(v, np.int32) for v in ([[0, 2], [1, -1], [2, 2]], [[0, 1 << 30], [1, -1], [2, 2]],
                                           [[0, 2], [-100000, -1], [2, 2]])]
    _mutate_while(lambda: lowbit.gpt_oss_moe_mlp(x, ids, wts, w1.data, w1.scales, b1, w2.data, w2.scales, b2,
                                                 out_dtype="float32"), ids, bad, seconds=0.4)


# --- 11: checked size arithmetic ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs,arg", [
    (dict(M=-5), "M"), (dict(L=-1), "L"), (dict(K=-32), "K"), (dict(M=2**63 - 1), "M"),
    (dict(M=2**64), "M"), (dict(groups=-1), "groups"),
])
def test_scale_shape_refuses_negative_and_overflowing_sizes(kwargs, arg):
    kw = dict(L=1, M=4, K=32)
    kw.update(kwargs)
    _raises(lambda: lowbit.scale_shape("mxfp4", "blocked128x4", **kw), "scale_shape", arg)


def test_scale_shape_overflow_in_the_module():
    f = lowbit.Format("mxfp4").c_args()
    R = _C.ScaleLayoutKind
    with pytest.raises(ValueError, match="scale_shape: argument 'M'"):
        _C.scale_shape(*f, R.row_major, 1, _C.GroupPad.none, 1, -5, 32)
    with pytest.raises(ValueError, match="scale_shape: argument 'M'.*overflow"):
        _C.scale_shape(*f, R.blocked128x4, 1, _C.GroupPad.none, 1, 2**63 - 1, 32)
    with pytest.raises(ValueError, match="scale_shape: argument 'groups'.*overflow"):
        _C.scale_shape(*f, R.blocked128x4, 1, _C.GroupPad.flashinfer, 1, 4, 32, 2**62)
    with pytest.raises(ValueError, match="scale_shape: argument 'L'.*overflow"):
        _C.scale_shape(*f, R.row_major, 1, _C.GroupPad.none, 2**62, 2**20, 32)
    assert tuple(_C.scale_shape(*f, R.blocked128x4, 1, _C.GroupPad.flashinfer, 1, 4, 32, 2)) == (1, 256, 4)


def test_convert_scale_layout_huge_R_is_refused_not_sigfpe():
    s = np.zeros(16, np.uint8)
    K = _C.ScaleLayoutKind
    with pytest.raises(ValueError, match="convert_scale_layout: argument 'R'.*overflow"):
        _C.convert_scale_layout(s, np.zeros(16, np.uint8), _C.DType.uint8, K.row_major, 1, _C.GroupPad.none,
                                K.blocked128x4, 1, _C.GroupPad.none, 2**62, 4)
    _raises(lambda: lowbit.convert_scale_layout(s, 2**64, 4), "convert_scale_layout", "rows")
    _raises(lambda: lowbit.convert_scale_layout(s, 2**62, 4), "convert_scale_layout", "rows", "overflow")
    with pytest.raises(ValueError, match="convert_scale_layout: argument '(rows|cols)'.*overflow"):
        lowbit.convert_scale_layout(s, 4, 2**62, "row_major", "blocked8x4")
    # a buffer whose shape is not the stored one and whose strides are not index order: the
    # C++ check's 'in' is reported as this function's 'scales'
    odd = np.zeros((4, 2, 2), np.uint8).transpose(2, 1, 0)
    _raises(lambda: lowbit.convert_scale_layout(odd, 8, 2), "convert_scale_layout", "scales", "index order")
    _raises(lambda: lowbit.convert_scale_layout(s, 4, -4), "convert_scale_layout", "cols")


def test_nvfp4_dual_gemm_packed_bytes_is_checked():
    assert _C.nvfp4_dual_gemm_packed_bytes(128, 64, 1) == 4 * 2304
    with pytest.raises(ValueError, match="nvfp4_dual_gemm_packed_bytes: argument 'N'"):
        _C.nvfp4_dual_gemm_packed_bytes(-128, 64, 1)
    with pytest.raises(ValueError, match="nvfp4_dual_gemm_packed_bytes: argument '(N|K|L)'.*overflow"):
        _C.nvfp4_dual_gemm_packed_bytes(2**62, 2**20, 1)
    with pytest.raises(ValueError, match="nvfp4_dual_gemm_packed_bytes: argument 'L'.*overflow"):
        _C.nvfp4_dual_gemm_packed_bytes(2**20, 2**20, 2**40)


# --- 12: misaligned arrays -------------------------------------------------------------------

def _offset_view(a, offset=1):
    buf = np.zeros(a.nbytes + 8, np.uint8)
    v = np.frombuffer(buf.data, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    v[...] = a  # NumPy copies element by element: fine for the test data
    return v


def test_misaligned_input_is_refused_with_the_alignment_named():
    xm = _offset_view(X)
    assert xm.ctypes.data % 4 == 1
    _raises(lambda: lowbit.quantize(xm, "mxfp8_e4m3"), "quantize", "x", "aligned")
    _raises(lambda: lowbit.tensor_amax(xm), "tensor_amax", "x", "4-byte")
    _raises(lambda: lowbit.cast(xm, "bfloat16"), "cast", "x", "aligned")


def test_misaligned_scales_are_refused():
    qt = lowbit.quantize(X, "fp8_e4m3", block=32)  # float32 scales
    bad = lowbit.Quantized(qt.data, _offset_view(qt.scales), format=qt.format)
    _raises(lambda: lowbit.dequantize(bad), "dequantize", "scales", "aligned")


# --- 13: arrays are read by index --------------------------------------------------------------

@pytest.mark.parametrize("fmt,layout", [("mxfp4", "row_major"), ("nvfp4", "row_major"), ("fp8_e4m3", "col_major"),
                                        ("uint4", "row_major"), ("mxfp8_e4m3", "blocked128x4")])
def test_dequantize_fortran_ordered_scales_by_index(fmt, layout):
    x = RNG.standard_normal((40, 256)).astype(np.float32) * 3
    qt = lowbit.quantize(x, fmt, layout, **({"block": 32} if fmt in ("fp8_e4m3", "uint4") else {}))
    zeros = None if qt.zeros is None else np.asfortranarray(qt.zeros)
    qf = lowbit.Quantized(qt.data, np.asfortranarray(qt.scales), zeros, qt.global_amax, format=qt.format,
                          layout=layout, shape=qt.shape)
    assert not qf.scales.flags.c_contiguous
    np.testing.assert_array_equal(lowbit.dequantize(qf), lowbit.dequantize(qt))


def test_block_scale_interleave_of_fortran_array_round_trips():
    s = np.arange(12, dtype=np.uint8).reshape(3, 4)
    np.testing.assert_array_equal(lowbit.block_scale_deinterleave(lowbit.block_scale_interleave(np.asfortranarray(s)), 3, 4), s)
    s3 = np.arange(2 * 130 * 5, dtype=np.uint8).reshape(2, 130, 5)
    np.testing.assert_array_equal(lowbit.block_scale_interleave(np.asfortranarray(s3)), lowbit.block_scale_interleave(s3))


def test_transcode_fortran_ordered_zero_points_by_index():
    x = RNG.standard_normal((6, 64)).astype(np.float32)
    qt = lowbit.quantize(x, "uint4", block=32)
    qf = lowbit.Quantized(qt.data, qt.scales, np.asfortranarray(qt.zeros), format=qt.format, shape=qt.shape)
    np.testing.assert_array_equal(lowbit.transcode(qf).view(np.uint8), lowbit.transcode(qt).view(np.uint8))


def test_module_refuses_scales_not_in_index_order():
    """Through _C directly (no Python reordering) a transposed scale buffer is refused, not misread."""
    q = np.zeros((8, 64), np.uint8)
    s = np.zeros((2, 8), np.uint8).T  # [8, 2], strides (1, 8)
    args = (*lowbit.Format("mxfp8_e4m3").c_args(), _C.ScaleLayoutKind.row_major, 1, _C.GroupPad.none)
    x = np.ones((8, 64), np.float32)
    with pytest.raises(ValueError, match="quantize: argument 'scales'.*index order"):
        _C.quantize(x, _C.DType.float32, q, _C.DType.float8_e4m3fn, s, _C.DType.float8_e8m0fnu, *args)
    assert not q.any() and not s.any()
    with pytest.raises(ValueError, match="dequantize: argument 'scales'.*index order"):
        _C.dequantize(q, _C.DType.float8_e4m3fn, np.ones((2, 8), np.uint8).T, _C.DType.float8_e8m0fnu,
                      np.zeros((8, 64), np.float32), _C.DType.float32, *args)


# --- 14: no silent coercion --------------------------------------------------------------------

@pytest.mark.parametrize("fmt", lowbit.FORMAT_NAMES)
@pytest.mark.parametrize("eps", [float("inf"), 0.0, -1e-10, float("nan"), -float("inf"), "1e-10"])
def test_eps_must_be_finite_and_positive_for_every_format(fmt, eps):
    _raises(lambda: lowbit.Format(fmt, eps=eps), "Format", "eps")
    _raises(lambda: lowbit.quantize(X, fmt, eps=eps), "Format", "eps")


def test_eps_checked_by_the_module_too():
    f = list(lowbit.Format("fp8_e4m3").c_args())
    for eps in (0.0, float("inf"), 1e-50):  # 1e-50 is 0 in float32
        f[-1] = eps
        with pytest.raises(ValueError, match="argument 'eps'"):
            _C.validate_format(*f)


def test_a_scale_with_bf16_activations_is_refused():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    qb = lowbit.quantize(rng.standard_normal((2, 16, 64)).astype(np.float32), "mxfp4", "blocked128x4")
    qa = lowbit.quantize(a.astype(np.float32), "mxfp8_e4m3", "blocked128x4", m_indptr=[0, 3, 5])
    _raises(lambda: lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data, qa.scales, qb.scales, [0, 3, 5]),
            "group_gemm_mxfp4_nt_groupwise", "a_scale", "bfloat16")
    # without it the same call runs
    assert lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data, None, qb.scales, [0, 3, 5]).shape == (5, 16)


@pytest.mark.parametrize("ind", [[0, 3.7, 5], [0, 3.0, 5], [0, True, 5], [0, "3", 5], [0, 2**64, 5]])
def test_m_indptr_list_must_hold_integers(ind):
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    _raises(lambda: lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=ind), "quantize", "m_indptr")
    qb = lowbit.quantize(RNG.standard_normal((2, 16, 64)).astype(np.float32), "mxfp4", "blocked128x4")
    a = x.astype(ml_dtypes.bfloat16)
    _raises(lambda: lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data, None, qb.scales, ind),
            "group_gemm_mxfp4_nt_groupwise", "m_indptr")


def test_float_m_indptr_array_is_refused():
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    _raises(lambda: lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=np.array([0, 3.7, 5])),
            "quantize", "m_indptr", "int32 or int64")


@pytest.mark.parametrize("call,op,arg", [
    (lambda: lowbit.quantize(X, "mxfp4", group_pad="x"), "quantize", "group_pad"),
    (lambda: lowbit.convert_scale_layout(np.zeros((4, 2), np.uint8), 4, 2, group_pad="x"), "convert_scale_layout",
     "group_pad"),
    (lambda: lowbit.scale_shape("mxfp4", "row_major", 1, 4, 64, group_pad="x"), "scale_shape", "group_pad"),
    (lambda: lowbit.Format("nvfp4", zero_scale=0), "Format", "zero_scale"),
    (lambda: lowbit.Format("nvfp4", zero_scale=""), "Format", "zero_scale"),
    (lambda: lowbit.Format("mxfp4", rounding=""), "Format", "rounding"),
    (lambda: lowbit.quantize(X, "mxfp4", "col_major", row_align=1.5), "quantize", "row_align"),
    (lambda: lowbit.quantize(X, "mxfp4", "col_major", row_align=True), "quantize", "row_align"),
    (lambda: lowbit.quantize(X, "mxfp4", "col_major", row_align=2**40), "quantize", "row_align"),
    (lambda: lowbit.Format("int4", block=2**40), "Format", "block"),
    (lambda: lowbit.Format("mxfp4", block=32.0), "Format", "block"),
    (lambda: lowbit.quantize(X, "nvfp4", compute_global_amax="yes"), "quantize", "compute_global_amax"),
])
def test_no_silent_coercion(call, op, arg):
    _raises(call, op, arg)


def test_bool_arrays_are_not_packed_codes():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    qb = lowbit.quantize(rng.standard_normal((2, 16, 64)).astype(np.float32), "mxfp4", "blocked128x4")
    _raises(lambda: lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data.astype(bool), None, qb.scales, [0, 3, 5]),
            "group_gemm_mxfp4_nt_groupwise", "b", "bool")
    _raises(lambda: lowbit.nvfp4_dual_gemm_silu(np.zeros((4, 32), bool), np.zeros((128, 32), np.uint8),
                                                np.zeros((128, 32), np.uint8), np.zeros((4, 4), np.uint8),
                                                np.zeros((128, 4), np.uint8), np.zeros((128, 4), np.uint8)),
            "nvfp4_dual_gemm_silu", "a", "bool")
    qt = lowbit.quantize(X, "mxfp4")
    _raises(lambda: lowbit.dequantize(lowbit.Quantized(qt.data.astype(bool), qt.scales, format="mxfp4", shape=(4, 64))),
            "dequantize", "q")
    # the module refuses a bool array declared as uint8 codes
    args = (*lowbit.Format("mxfp4").c_args(), _C.ScaleLayoutKind.row_major, 1, _C.GroupPad.none)
    out = np.zeros((4, 64), np.float32)
    with pytest.raises(ValueError, match="dequantize: argument 'q'.*bool"):
        _C.dequantize(qt.data.astype(bool), _C.DType.uint8, qt.scales.view(np.uint8), _C.DType.float8_e8m0fnu, out,
                      _C.DType.float32, *args)
    assert not out.any()


@pytest.mark.parametrize("gam", [-3.0, -3, float("nan"), np.array([-3.0], np.float32), np.array([np.nan], np.float32)])
def test_negative_or_nan_global_amax_is_refused(gam):
    _raises(lambda: lowbit.quantize(X, "nvfp4", global_amax=gam), "quantize", "global_amax")
    _raises(lambda: lowbit.nvfp4_quantize(X, global_amax=gam), "quantize", "global_amax")


def test_negative_global_amax_is_refused_by_dequantize():
    qt = lowbit.quantize(X, "nvfp4")
    for gam in (-1.0, np.array([-1.0], np.float32)):
        bad = lowbit.Quantized(qt.data, qt.scales, None, gam, format="nvfp4", shape=qt.shape)
        _raises(lambda: lowbit.dequantize(bad), "dequantize", "global_amax")
    zero = lowbit.Quantized(qt.data, qt.scales, None, 0.0, format="nvfp4", shape=qt.shape)
    assert lowbit.dequantize(zero).shape == (4, 64)  # 0 (the amax of an all-zero tensor) is accepted


def _moe_inputs(seed=4):
    rng = np.random.default_rng(seed)
    T, H, I, E = 3, 64, 32, 3
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    wts = np.array([[0.7, 0.3], [1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    return x, wts, (w1.data, w1.scales, b1, w2.data, w2.scales, b2)


def test_moe_mlp_accepts_int64_topk_ids():
    x, wts, w = _moe_inputs()
    ids32 = np.array([[0, 2], [1, -1], [2, 2]], np.int32)
    a = lowbit.gpt_oss_moe_mlp(x, ids32, wts, *w, out_dtype="float32")
    b = lowbit.gpt_oss_moe_mlp(x, ids32.astype(np.int64), wts, *w, out_dtype="float32")
    c = lowbit.gpt_oss_moe_mlp(x, ids32.tolist(), wts, *w, out_dtype="float32")
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    big = ids32.astype(np.int64)
    big[0, 0] = 2**32  # would wrap to 0 as int32
    _raises(lambda: lowbit.gpt_oss_moe_mlp(x, big, wts, *w, out_dtype="float32"), "gpt_oss_moe_mlp", "topk_ids")


def test_module_says_topk_ids_must_be_int32():
    x, wts, w = _moe_inputs()
    w1, w1s, b1, w2, w2s, b2 = w
    u8 = lambda a: a.view(np.uint8)  # noqa: E731
    out = np.zeros((3, 64), np.float32)
    with pytest.raises(ValueError, match="gpt_oss_moe_mlp: argument 'topk_ids'.*int32"):
        _C.gpt_oss_moe_mlp(x, _C.DType.float32, np.zeros((3, 2), np.int64), wts, u8(w1), u8(w1s), b1, _C.DType.float32,
                           u8(w2), u8(w2s), b2, _C.DType.float32, 1.702, 7.0, _C.ActQuant.bf16, out, _C.DType.float32)
    assert not out.any()


# --- 15: every refusal is a ValueError naming the argument -------------------------------------

def test_quantized_with_a_list_m_indptr():
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    qt = lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=[0, 3, 5])
    ql = lowbit.Quantized(qt.data, qt.scales, format=qt.format, layout="blocked128x4", m_indptr=[0, 3, 5])
    np.testing.assert_array_equal(lowbit.dequantize(ql), lowbit.dequantize(qt))
    bad = lowbit.Quantized(qt.data, qt.scales, format=qt.format, layout="blocked128x4", m_indptr=[0, 3.5, 5])
    _raises(lambda: lowbit.dequantize(bad), "dequantize", "m_indptr")
    _raises(lambda: lowbit.Quantized(qt.data, qt.scales, format=qt.format, m_indptr=7), "Quantized", "m_indptr")


@pytest.mark.parametrize("call,op,arg", [
    (lambda: lowbit.Quantized(np.zeros((4, 32), np.uint8), np.zeros((4, 1), np.uint8), format="mxfp4", shape=(-4, 64)),
     "Quantized", "shape"),
    (lambda: lowbit.Quantized(np.zeros((4, 32), np.uint8), np.zeros((4, 1), np.uint8), format="mxfp4",
                              shape=(2**63, 64)), "Quantized", "shape"),
    (lambda: lowbit.Quantized([[1, 2]], np.zeros((4, 1), np.uint8), format="mxfp4"), "Quantized", "data"),
    (lambda: lowbit.Quantized(np.zeros((4, 32), np.uint8), None, format="mxfp4"), "Quantized", "scales"),
    (lambda: lowbit.Quantized(np.zeros((4, 32), np.uint8), np.zeros((4, 1), np.uint8), format="mxfp4",
                              group_pad="x"), "Quantized", "group_pad"),
    (lambda: lowbit.quantize(np.broadcast_to(X[:1], (2**40, 64)), "mxfp8_e4m3"), "quantize", "x"),
    (lambda: lowbit.cast(np.broadcast_to(X[:1, :1], (2**30, 2**30)), "bfloat16"), "cast", "x"),
    (lambda: lowbit.scale_shape("mxfp4", "row_major", 1, 2**64, 32), "scale_shape", "M"),
    (lambda: lowbit.scale_shape("mxfp4", "row_major", 1, 4.0, 32), "scale_shape", "M"),
    (lambda: lowbit.gpt_oss_moe_mlp(*_moe_inputs()[:1], np.zeros((3, 2), np.int32), _moe_inputs()[1],
                                    *_moe_inputs()[2], alpha="x"), "gpt_oss_moe_mlp", "alpha"),
])
def test_refusals_are_value_errors_naming_the_argument(call, op, arg):
    _raises(call, op, arg)


def test_huge_stride0_view_names_the_input_and_writes_nothing():
    """A stride-0 view whose outputs would not fit is refused before any work."""
    with pytest.raises(ValueError, match="quantize: argument 'x'.*cannot be allocated"):
        lowbit.quantize(np.broadcast_to(X[:1], (2**42, 64)), "nvfp4")


# --- 17: NVFP4 computes its per-tensor amax by default -------------------------------------------

def test_nvfp4_default_computes_the_global_amax():
    w = np.random.default_rng(17).standard_normal((256, 512)).astype(np.float32) * 0.002
    qt = lowbit.quantize(w, "nvfp4")
    assert qt.global_amax is not None and qt.global_amax[0] == np.float32(np.abs(w).max())
    good = sqnr(w, lowbit.dequantize(qt))
    assert good > 15, good
    old = lowbit.quantize(w, "nvfp4", compute_global_amax=False)
    assert old.global_amax is None
    assert sqnr(w, lowbit.dequantize(old)) < 5  # E4M3 block scales underflow without S_enc
    # an explicit global amax is used as given, not recomputed or overwritten
    gam = np.array([1.0], np.float32)
    qg = lowbit.quantize(w, "nvfp4", global_amax=gam)
    assert qg.global_amax is gam and gam[0] == 1.0
    np.testing.assert_array_equal(lowbit.dequantize(qg), lowbit.dequantize(lowbit.quantize(w, "nvfp4", global_amax=1.0)))
    # other formats are unchanged by the default
    assert lowbit.quantize(w, "mxfp4").global_amax is None


@pytest.mark.parametrize("std", [1.0, 0.02, 0.002])
def test_nvfp4_default_sqnr_at_typical_weight_scales(std):
    w = np.random.default_rng(int(std * 1000)).standard_normal((128, 1024)).astype(np.float32) * std
    assert sqnr(w, lowbit.dequantize(lowbit.quantize(w, "nvfp4"))) > 15


# --- a sweep of bad values over the public functions: only ValueErrors that name an argument --------

def _sweep_calls():
    X4 = X[:, :64]
    q8 = lowbit.quantize(X4, "mxfp4")
    qi = lowbit.quantize(X4, "int4", block=32)
    bf = X4.astype(ml_dtypes.bfloat16)
    return {
        "quantize": (lambda **k: lowbit.quantize(**{**dict(x=X4, fmt="nvfp4"), **k}),
                     ["x", "fmt", "layout", "row_align", "m_indptr", "group_pad", "global_amax", "compute_global_amax",
                      "eps", "block"]),
        "dequantize": (lambda **k: lowbit.dequantize(**{**dict(qt=q8), **k}), ["qt", "out_dtype"]),
        "Quantized": (lambda **k: lowbit.dequantize(lowbit.Quantized(**{**dict(
            data=np.zeros((4, 32), np.uint8), scales=np.zeros((4, 2), np.uint8), format="mxfp4"), **k})),
            ["data", "scales", "zeros", "global_amax", "format", "layout", "shape", "row_align", "group_pad", "m_indptr"]),
        "cast": (lambda **k: lowbit.cast(**{**dict(x=X4), **k}), ["x", "dtype"]),
        "convert_scale_layout": (lambda **k: lowbit.convert_scale_layout(**{**dict(
            scales=np.zeros((4, 2), np.uint8), rows=4, cols=2), **k}),
            ["scales", "rows", "cols", "src", "dst", "m_indptr", "src_row_align", "dst_row_align", "group_pad"]),
        "scale_shape": (lambda **k: lowbit.scale_shape(**{**dict(fmt="mxfp4", layout="row_major", L=1, M=4, K=64), **k}),
                        ["fmt", "layout", "L", "M", "K", "groups", "row_align", "group_pad"]),
        "nf4_kcache_quantize": (lambda **k: lowbit.nf4_kcache_quantize(**{**dict(k=np.ones((1, 2, 1, 4), np.float32)), **k}),
                                ["k", "residual_dtype", "nibble_order"]),
        "nf4_kcache_dequantize": (lambda **k: lowbit.nf4_kcache_dequantize(**{**dict(
            codes=np.zeros((1, 2, 1, 2), np.uint8), scale=np.ones((1, 1, 4), np.float32)), **k}),
            ["codes", "scale", "residual", "out_dtype", "nibble_order"]),
        "per_token_group_quant": (lambda **k: lowbit.per_token_group_quant(**{**dict(x=X4, group_size=32), **k}),
                                  ["x", "group_size", "dtype", "eps"]),
        "transcode": (lambda **k: lowbit.transcode(**{**dict(qt=qi), **k}), ["qt", "out_dtype"]),
        "group_gemm": (lambda **k: lowbit.group_gemm_mxfp4_nt_groupwise(**{**dict(
            a=bf, b=np.zeros((1, 8, 32), np.uint8), a_scale=None, b_scale=np.zeros((1, 8, 2), np.uint8), m_indptr=[0, 4],
            b_scale_layout="row_major"), **k}),
            ["a", "b", "a_scale", "b_scale", "m_indptr", "out_dtype", "a_scale_layout", "b_scale_layout", "group_pad",
             "out", "n"]),
        "dual_gemm": (lambda **k: lowbit.nvfp4_dual_gemm_silu(**{**dict(
            a=np.zeros((4, 32), np.uint8), b1=np.zeros((128, 32), np.uint8), b2=np.zeros((128, 32), np.uint8),
            sfa=np.zeros((4, 4), np.uint8), sfb1=np.zeros((128, 4), np.uint8), sfb2=np.zeros((128, 4), np.uint8)), **k}),
            ["a", "b1", "b2", "sfa", "sfb1", "sfb2", "scale_layout", "amax_a", "out", "out_dtype", "packed_b", "n"]),
        "moe": (lambda **k: lowbit.gpt_oss_moe_mlp(**{**dict(
            x=np.zeros((1, 32), np.float32), topk_ids=np.zeros((1, 1), np.int32), topk_weights=np.ones((1, 1), np.float32),
            w1=np.zeros((1, 64, 16), np.uint8), w1_scale=np.zeros((1, 64, 1), np.uint8), b1=np.zeros((1, 64), np.float32),
            w2=np.zeros((1, 32, 16), np.uint8), w2_scale=np.zeros((1, 32, 1), np.uint8), b2=np.zeros((1, 32), np.float32)),
            **k}), ["x", "topk_ids", "topk_weights", "w1", "w1_scale", "b1", "w2", "w2_scale", "b2", "alpha", "limit",
                    "act", "out_dtype", "out"]),
        "Format": (lambda **k: lowbit.Format(**{**dict(name="int4"), **k}),
                   ["name", "block", "rounding", "scale_dtype", "nibble_order", "zero_scale", "eps"]),
    }


def test_sweep_of_bad_values_gives_only_value_errors_naming_an_argument():
    buf = np.zeros(4 * 64 * 4 + 8, np.uint8)
    misaligned = np.frombuffer(buf.data, np.float32, 256, 1).reshape(4, 64)
    bad_values = [None, -1, 0, 1.5, 2**64, -2**63, "x", [1, 2], (), {}, True, float("nan"), float("inf"),
                  np.zeros(3), np.zeros((2, 2), bool), object(), np.zeros((0, 64), np.float32), np.asfortranarray(X),
                  misaligned, np.ones((4, 64), complex), np.array(["a"]), np.zeros((4, 64), np.int64), X[:, ::2], X.T,
                  np.zeros((1,) * 9, np.float32)]
    wrong = []
    for name, (fn, args) in _sweep_calls().items():
        for arg in args:
            for v in bad_values:
                try:
                    fn(**{arg: v})
                except (ValueError, NotImplementedError) as e:
                    if "argument '" not in str(e):
                        wrong.append((name, arg, repr(v)[:40], f"no argument named: {e}"))
                except Exception as e:  # noqa: BLE001 - the point of the test
                    wrong.append((name, arg, repr(v)[:40], f"{type(e).__name__}: {e}"[:160]))
    assert not wrong, "\n".join(map(str, wrong))
