"""The dense linears through the Python API on the CPU: mxfp4_gemm (W4A16 / W4A8, both scale
layouts, prepacked weights, bias) and nvfp4_gemm (bf16 / NVFP4 activations, per-tensor amaxes,
bias), checked against the float64 references of linear_common.py (decoded here from the format
tables) rounded once to the output dtype, and their argument errors (the output untouched). The
CUDA results: test_linear_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

import lowbit
from linear_common import OUT_DTYPES, MxOps, NvOps, np_nvfp4_pack, stored


def _rounded(ref, out_dtype):
    """The float64 reference rounded to the output dtype (via fp32, as the reference stores)."""
    return ref.astype(np.float32).astype(OUT_DTYPES[out_dtype]).astype(np.float64)


def _close_to_rounded(got, ref, out_dtype):
    """got equals the rounded reference, up to one output ulp where the fp64 -> fp32 -> out double
    rounding and NumPy's fp64 matmul order (not the reference's sequential sum) can differ."""
    got = np.asarray(got).astype(np.float64)
    want = _rounded(ref, out_dtype)
    spacing = np.abs(np.nextafter(want.astype(OUT_DTYPES[out_dtype]), np.inf).astype(np.float64) - want) + 1e-300
    assert (np.abs(got - want) <= spacing).all()
    assert np.mean(got == want) > 0.99


MX_CASES = [  # M, N, K, act, a_layout, b_layout, bias, packed, out
    (1, 8, 32, "bf16", "row_major", "row_major", False, False, "bfloat16"),
    (7, 24, 64, "e4m3", "blocked128x4", "blocked128x4", True, False, "float16"),
    (130, 16, 96, "e5m2", "row_major", "blocked128x4", True, True, "bfloat16"),
    (65, 136, 288, "e4m3", "blocked128x4", "row_major", False, True, "bfloat16"),
    (200, 8, 544, "bf16", "row_major", "blocked128x4", True, False, "float16"),
]


@pytest.mark.parametrize("case", MX_CASES, ids=lambda c: f"m{c[0]}-n{c[1]}-k{c[2]}-{c[3]}")
def test_mxfp4_gemm_cpu_matches_numpy(case):
    M, N, K, act, la, lb, bias, packed, out_dtype = case
    ops = MxOps(M, N, K, act, bias=bias, seed=M + N + K)
    a_scale = None if ops.a_sc is None else stored(ops.a_sc, la)
    b, b_sc = ops.b, stored(ops.b_sc, lb)
    kw = {}
    if packed:
        b, b_sc = lowbit.mxfp4_gemm_prepack(b, b_sc, b_scale_layout=lb)
        assert b.shape == (-(-N // 128) * 128, -(-K // 256) * 128)
        kw = {"b_packed": True, "n": N}
    c = lowbit.mxfp4_gemm(ops.a, b, b_sc, a_scale=a_scale, bias=ops.bias, a_scale_layout=la, b_scale_layout=lb,
                          out_dtype=out_dtype, **kw)
    assert c.shape == (M, N) and c.dtype == np.dtype(OUT_DTYPES[out_dtype])
    _close_to_rounded(c, ops.reference(), out_dtype)


def test_mxfp4_gemm_equals_grouped_gemm_with_one_group():
    ops = MxOps(37, 64, 128, "e4m3", seed=3)
    dense = lowbit.mxfp4_gemm(ops.a, ops.b, ops.b_sc, a_scale=ops.a_sc, b_scale_layout="row_major")
    grouped = lowbit.group_gemm_mxfp4_nt_groupwise(ops.a, ops.b[None], ops.a_sc, ops.b_sc[None], [0, 37],
                                                   a_scale_layout="row_major", b_scale_layout="row_major")
    np.testing.assert_array_equal(dense.view(np.uint16), grouped.view(np.uint16))


def test_mxfp4_gemm_out_argument_and_bias_dtypes():
    ops = MxOps(5, 16, 64, "bf16", seed=4)
    out = np.zeros((5, 16), dtype=ml_dtypes.bfloat16)
    r = lowbit.mxfp4_gemm(ops.a, ops.b, ops.b_sc, bias=np.ones(16, dtype=ml_dtypes.bfloat16), out=out)
    assert r is out
    ref = lowbit.mxfp4_gemm(ops.a, ops.b, ops.b_sc, bias=np.ones(16, np.float32))
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))


NV_CASES = [  # M, N, K, nvfp4 a, amax, bias, a_layout, b_layout, out
    (1, 1, 16, True, False, False, "row_major", "row_major", "bfloat16"),
    (7, 24, 64, True, True, True, "blocked128x4", "blocked128x4", "float16"),
    (130, 9, 48, False, True, True, "row_major", "blocked128x4", "bfloat16"),
    (65, 128, 256, True, True, False, "row_major", "row_major", "bfloat16"),
]


@pytest.mark.parametrize("case", NV_CASES, ids=lambda c: f"m{c[0]}-n{c[1]}-k{c[2]}-{'fp4' if c[3] else 'bf16'}")
def test_nvfp4_gemm_cpu_matches_numpy(case):
    M, N, K, nv_a, amax, bias, la, lb, out_dtype = case
    ops = NvOps(M, N, K, nvfp4_a=nv_a, amax=amax, bias=bias, seed=M + N + K)
    c = lowbit.nvfp4_gemm(ops.a, ops.b, stored(ops.b_sc, lb), a_scale=None if ops.a_sc is None else stored(ops.a_sc, la),
                          amax_a=ops.amax_a, amax_b=ops.amax_b, bias=ops.bias, a_scale_layout=la, b_scale_layout=lb,
                          out_dtype=out_dtype)
    assert c.shape == (M, N) and c.dtype == np.dtype(OUT_DTYPES[out_dtype])
    _close_to_rounded(c, ops.reference(), out_dtype)


def test_nvfp4_gemm_matches_quantize_then_matmul():
    """nvfp4_gemm of lowbit.quantize'd operands (with per-tensor amaxes) ~ the float matmul."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((33, 128), dtype=np.float32)
    w = rng.standard_normal((40, 128), dtype=np.float32) * 0.1
    qa = lowbit.quantize(x, "nvfp4", "row_major", compute_global_amax=True)
    qb = lowbit.quantize(w, "nvfp4", "row_major", compute_global_amax=True)
    c = lowbit.nvfp4_gemm(qa.data, qb.data, qb.scales, a_scale=qa.scales, amax_a=qa.global_amax,
                          amax_b=qb.global_amax, out_dtype="float16")
    da = lowbit.dequantize(qa, "float32").astype(np.float64)
    db = lowbit.dequantize(qb, "float32").astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), da @ db.T, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# nvfp4_gemm with weights prepacked once (nvfp4_gemm_prepack)

@pytest.mark.parametrize("layout", ["row_major", "blocked128x4"])
def test_nvfp4_gemm_prepack_layout_and_bits(layout):
    for nv_a in (False, True):
        ops = NvOps(9, 256, 192, nvfp4_a=nv_a, amax=True, bias=True, seed=5 + nv_a)
        packed = lowbit.nvfp4_gemm_prepack(ops.b, stored(ops.b_sc, layout), b_scale_layout=layout)
        assert packed.dtype == np.uint8 and packed.shape == (lowbit._C.nvfp4_gemm_packed_bytes(256, 192),)
        np.testing.assert_array_equal(packed, np_nvfp4_pack(ops.b, ops.b_sc))
        kw = dict(a_scale=ops.a_sc, amax_a=ops.amax_a, amax_b=ops.amax_b, bias=ops.bias)
        plain = lowbit.nvfp4_gemm(ops.a, ops.b, ops.b_sc, **kw)
        pk = lowbit.nvfp4_gemm(ops.a, packed, None, b_packed=True, n=256, **kw)
        np.testing.assert_array_equal(pk.view(np.uint16), plain.view(np.uint16))


def test_nvfp4_gemm_prepack_errors():
    ops = NvOps(2, 256, 64, nvfp4_a=False, seed=3)
    with pytest.raises(ValueError, match="nvfp4_gemm_prepack: argument 'b'.*multiple of 128 and K of 64"):
        lowbit.nvfp4_gemm_prepack(ops.b[:64], ops.b_sc[:64])
    with pytest.raises(ValueError, match="nvfp4_gemm_prepack: argument 'b'.*multiple of 128 and K of 64"):
        lowbit.nvfp4_gemm_prepack(ops.b[:, :16], ops.b_sc[:, :2])
    with pytest.raises(ValueError, match="nvfp4_gemm_prepack: argument 'b_scale'"):
        lowbit.nvfp4_gemm_prepack(ops.b, ops.b_sc[:, :3])
    packed = lowbit.nvfp4_gemm_prepack(ops.b, ops.b_sc)
    with pytest.raises(ValueError, match="nvfp4_gemm: argument 'b_scale'.*must be None"):
        lowbit.nvfp4_gemm(ops.a, packed, ops.b_sc, b_packed=True, n=256)
    with pytest.raises(ValueError, match="nvfp4_gemm: argument 'n'.*required"):
        lowbit.nvfp4_gemm(ops.a, packed, None, b_packed=True)
    with pytest.raises(ValueError, match="nvfp4_gemm: argument 'b'.*elements"):
        lowbit.nvfp4_gemm(ops.a, packed[:-1], None, b_packed=True, n=256)
    with pytest.raises(ValueError, match="nvfp4_gemm: argument 'out'.*multiple of 128"):
        lowbit.nvfp4_gemm(ops.a, packed, None, b_packed=True, n=192)


# ---------------------------------------------------------------------------------------------
# argument errors: ValueError naming op and argument, the output untouched

def _mx_call(**over):
    ops = MxOps(4, 16, 64, "bf16", seed=1)
    kw = dict(a=ops.a, b=ops.b, b_scale=ops.b_sc)
    kw.update(over)
    return lowbit.mxfp4_gemm(kw.pop("a"), kw.pop("b"), kw.pop("b_scale"), **kw)


@pytest.mark.parametrize("over,arg,msg", [
    ({"a": np.zeros((4, 48), ml_dtypes.bfloat16), "b": np.zeros((16, 24), np.uint8),
      "b_scale": np.zeros((16, 1), np.uint8)}, "a", "multiple of 32"),
    ({"b": np.zeros((12, 32), np.uint8), "b_scale": np.zeros((12, 2), np.uint8)}, "b", "multiple of 8"),
    ({"b": np.zeros((16, 16), np.uint8)}, "b", "to match a"),
    ({"a_scale": np.zeros((4, 2), np.uint8)}, "a_scale", "take no scales"),
    ({"a": np.zeros((4, 64), ml_dtypes.float8_e4m3fn)}, "a_scale", "is required"),
    ({"a": np.zeros((4, 64), np.float32)}, "a", "expected dtype"),
    ({"bias": np.zeros(17, np.float32)}, "bias", "expected shape"),
    ({"b_scale": np.zeros((16, 3), np.uint8)}, "b_scale", "elements"),
    ({"b_scale_layout": "col_major"}, "b_scale_layout", ""),
    ({"b_packed": True}, "n", "is required"),
    ({"b_packed": True, "n": 16}, "b", "group_gemm_mxfp4_prepack"),
    ({"out_dtype": "float32"}, "out", "expected dtype"),
    ({"n": 8}, "n", "does not match"),
])
def test_mxfp4_gemm_errors(over, arg, msg):
    with pytest.raises(ValueError, match=f"mxfp4_gemm: argument '{arg}'.*{msg}"):
        _mx_call(**over)


def test_mxfp4_gemm_error_leaves_out_untouched():
    out = np.full((4, 16), 7, dtype=np.float16)
    with pytest.raises(ValueError, match="argument 'bias'"):
        _mx_call(out=out, bias=np.zeros((2, 8), np.float32))
    assert (out == 7).all()
    ro = np.zeros((4, 16), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="argument 'out'.*read-only"):
        _mx_call(out=ro)


def _nv_call(**over):
    ops = NvOps(4, 8, 32, nvfp4_a=True, seed=2)
    kw = dict(a=ops.a, b=ops.b, b_scale=ops.b_sc, a_scale=ops.a_sc)
    kw.update(over)
    return lowbit.nvfp4_gemm(kw.pop("a"), kw.pop("b"), kw.pop("b_scale"), **kw)


@pytest.mark.parametrize("over,arg,msg", [
    ({"a": np.zeros((4, 4), np.uint8)}, "a", "multiple of 16"),
    ({"b": np.zeros((8, 8), np.uint8)}, "b", "to match a"),
    ({"a_scale": None}, "a_scale", "is required"),
    ({"a": np.zeros((4, 32), ml_dtypes.bfloat16)}, "a_scale", "take no scales"),
    ({"a": np.zeros((4, 32), ml_dtypes.bfloat16), "a_scale": None, "amax_a": np.ones(1, np.float32)},
     "amax_a", "no per-tensor amax"),
    ({"a": np.zeros((4, 32), np.float32)}, "a", "bfloat16 activations or packed NVFP4"),
    ({"amax_b": np.array([-1.0], np.float32)}, "amax_b", ">= 0"),
    ({"amax_b": np.ones(2, np.float32)}, "amax_b", "one element"),
    ({"b_scale_layout": "blocked8x4"}, "b_scale_layout", ""),
    ({"bias": np.zeros(9, np.float32)}, "bias", "expected shape"),
])
def test_nvfp4_gemm_errors(over, arg, msg):
    with pytest.raises(ValueError, match=f"nvfp4_gemm: argument '{arg}'.*{msg}"):
        _nv_call(**over)


def test_nvfp4_gemm_error_leaves_out_untouched():
    out = np.full((4, 8), 7, dtype=np.float16)
    with pytest.raises(ValueError, match="argument 'out'"):
        _nv_call(out=np.full((4, 9), 7, dtype=np.float16))
    with pytest.raises(ValueError, match="argument 'amax_a'"):
        _nv_call(out=out, amax_a=np.array([-2.0], np.float32))
    assert (out == 7).all()


def test_linears_exported():
    for name in ("mxfp4_gemm", "mxfp4_gemm_prepack", "nvfp4_gemm", "nvfp4_gemm_prepack"):
        assert name in lowbit.__all__ and callable(getattr(lowbit, name))


def test_build_info_lists_nvfp4_gemm_where_it_runs():
    info = lowbit.build_info()
    assert "nvfp4_gemm" not in info["cpu_only_ops"]
    assert ("nvfp4_gemm" in info["cuda_ops"]) == ("mxfp4_gemm" in info["cuda_ops"])  # both need the CUTLASS kernels
