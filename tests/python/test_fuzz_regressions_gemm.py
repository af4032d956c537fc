"""Regressions of the API fuzzer's wrong-result findings on the GEMM operands and tensor_amax: a
scale tensor of a documented index shape in another memory order (Fortran-ordered, transposed,
C-contiguous where the documented view is batch-last) is read by index, never in memory order;
the C++ API refuses what it cannot read by index, naming the argument and the expected strides."""

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import _C

RNG = np.random.default_rng(1234)
E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn


def _ue8m0(shape):
    return RNG.integers(120, 134, size=shape, dtype=np.uint8).view(E8M0)


def _e4m3(shape):
    return RNG.integers(0x30, 0x40, size=shape, dtype=np.uint8).view(E4M3)


def _codes(shape):
    return RNG.integers(0, 256, size=shape, dtype=np.uint8)


def _same(x, y):
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype
    np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def _batch_last(x):
    """[R, C, L] view of (L, R, C) storage holding the index values of x."""
    return np.ascontiguousarray(np.transpose(x, (2, 0, 1))).transpose(1, 2, 0)


# --- group_gemm_mxfp4_nt_groupwise (fuzz calls #10808, #24334) ---

@pytest.mark.parametrize("layout, scale_shape", [("blocked128x4", (1, 128, 4)), ("row_major", (1, 32, 4))])
def test_group_gemm_fortran_b_scale_read_by_index(layout, scale_shape):
    a = RNG.standard_normal((17, 128)).astype(ml_dtypes.bfloat16)
    b = _codes((1, 32, 64))
    bs = _ue8m0(scale_shape)
    ind = np.array([0, 17], np.int64)
    want = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, bs, ind, a_scale_layout="row_major",
                                                b_scale_layout=layout)
    got = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, np.asfortranarray(bs), ind, a_scale_layout="row_major",
                                               b_scale_layout=layout)
    _same(got, want)
    out = np.zeros((17, 32), np.float16)
    lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, np.asfortranarray(bs), ind, a_scale_layout="row_major",
                                         b_scale_layout=layout, out=out)
    _same(out, lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, bs, ind, "float16", a_scale_layout="row_major",
                                                    b_scale_layout=layout))


def test_group_gemm_fortran_a_scale_and_strided_b_read_by_index():
    a = RNG.integers(0, 0x70, size=(14, 128), dtype=np.uint8).view(E4M3)
    a_s = _ue8m0((14, 4))
    b = _codes((2, 16, 64))
    bs = _ue8m0((2, 128, 4))
    ind = np.array([0, 5, 14], np.int32)
    want = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, a_s, bs, ind, a_scale_layout="row_major")
    b_strided = np.zeros((2, 32, 64), np.uint8)[:, ::2]
    b_strided[...] = b
    got = lowbit.group_gemm_mxfp4_nt_groupwise(a, b_strided, np.asfortranarray(a_s), np.asfortranarray(bs), ind,
                                               a_scale_layout="row_major")
    _same(got, want)
    # a transposed view of the stored shape is read by index too
    got = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, np.ascontiguousarray(a_s.T).T, bs, ind,
                                               a_scale_layout="row_major")
    _same(got, want)


def test_group_gemm_cpp_refuses_fortran_b_scale():
    a = RNG.standard_normal((17, 128)).astype(ml_dtypes.bfloat16)
    b = _codes((1, 32, 64))
    bs = np.asfortranarray(_ue8m0((1, 128, 4)).view(np.uint8))
    out = np.zeros((17, 32), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="group_gemm_mxfp4_nt_groupwise: argument 'b_scale': .*index order"):
        _C.group_gemm_mxfp4(*_C_view(a), None, _C.ScaleLayoutKind.row_major, _C.GroupPad.none, b, bs,
                            _C.ScaleLayoutKind.blocked128x4, np.array([0, 17], np.int64), *_C_view(out),
                            b_packed=False, stream=0)


def _C_view(x):
    from lowbit._arrays import c_view
    return c_view(x, "test", "x")


# --- group_gemm_mxfp4_prepack (fuzz calls #11654, #17146, #33477, #35452, #39248, #39612, #40577, #42641) ---

@pytest.mark.parametrize("b_shape, s_shape, layout", [
    ((1, 152, 128), (1, 256, 8), "blocked128x4"),
    ((1, 56, 144), (1, 128, 12), "blocked128x4"),
    ((1, 144, 32), (1, 256, 4), "blocked128x4"),
    ((1, 152, 144), (1, 152, 9), "row_major"),
    ((1, 48, 80), (1, 48, 5), "row_major"),
    ((2, 64, 128), (2, 64, 8), "row_major"),
])
def test_group_gemm_prepack_fortran_b_scale_read_by_index(b_shape, s_shape, layout):
    b = _codes(b_shape)
    bs = _ue8m0(s_shape).view(np.uint8)
    want = lowbit.group_gemm_mxfp4_prepack(b, bs, b_scale_layout=layout)
    got = lowbit.group_gemm_mxfp4_prepack(b, np.asfortranarray(bs), b_scale_layout=layout)
    _same(got[0], want[0])
    _same(got[1], want[1])
    # packed codes must have their K bytes contiguous: a Fortran-ordered b is refused, not misread
    with pytest.raises(ValueError, match="group_gemm_mxfp4_prepack: argument 'b': the last dimension must be contiguous"):
        lowbit.group_gemm_mxfp4_prepack(np.asfortranarray(b), bs, b_scale_layout=layout)


def test_group_gemm_prepack_cpp_refuses_fortran_b_scale():
    b = _codes((1, 152, 128))
    bs = np.asfortranarray(_ue8m0((1, 256, 8)).view(np.uint8))
    pb = np.zeros((1, 256, 128), np.uint8)
    ps = np.zeros((1, 256, 8), np.uint8)
    with pytest.raises(ValueError, match="group_gemm_mxfp4_prepack: argument 'b_scale': .*index order"):
        _C.group_gemm_mxfp4_prepack(b, bs, _C.ScaleLayoutKind.blocked128x4, pb, ps, 0)


# --- nvfp4_dual_gemm_silu (fuzz calls #4327, #32933, #41814, #43003, #43994, #49687) ---

def _dual_operands(M, N, K, L):
    a = np.transpose(_codes((L, M, K // 2)), (1, 2, 0))       # GPU MODE [M, K/2, L] views
    b1 = np.transpose(_codes((L, N, K // 2)), (1, 2, 0))
    b2 = np.transpose(_codes((L, N, K // 2)), (1, 2, 0))
    sfa = np.transpose(_e4m3((L, M, K // 16)), (1, 2, 0))
    sfb1 = np.transpose(_e4m3((L, N, K // 16)), (1, 2, 0))
    sfb2 = np.transpose(_e4m3((L, N, K // 16)), (1, 2, 0))
    return a, b1, b2, sfa, sfb1, sfb2


@pytest.mark.parametrize("M, N, K, L", [(5, 256, 64, 2), (3, 256, 128, 2), (33, 128, 128, 2), (127, 128, 64, 2)])
def test_dual_gemm_scales_in_any_memory_order_read_by_index(M, N, K, L):
    a, b1, b2, sfa, sfb1, sfb2 = _dual_operands(M, N, K, L)
    want = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2)
    for order in (np.ascontiguousarray, np.asfortranarray):  # C-contiguous [MN, K/16, L]: L innermost
        got = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, order(sfa), order(sfb1), sfb2)
        _same(got, want)
        got = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, order(sfb2))
        _same(got, want)
    # operands in other strides (K contiguous) are read by index
    pad = np.zeros((M + 3, L, K // 2 + 16), np.uint8)[:M, :, 16:].transpose(0, 2, 1)
    pad[...] = a
    got = lowbit.nvfp4_dual_gemm_silu(pad, b1, b2, sfa, sfb1, sfb2)
    _same(got, want)
    # a C-contiguous [M, K/2, L] operand has its K bytes L apart: refused, not misread
    with pytest.raises(ValueError, match="nvfp4_dual_gemm_silu: argument 'a': the packed K dimension"):
        lowbit.nvfp4_dual_gemm_silu(np.ascontiguousarray(a), b1, b2, sfa, sfb1, sfb2)
    # and the reference computed from the row-major matrices of each batch agrees
    for l in range(L):
        one = lowbit.nvfp4_dual_gemm_silu(np.ascontiguousarray(a[:, :, l]), np.ascontiguousarray(b1[:, :, l]),
                                          np.ascontiguousarray(b2[:, :, l]), np.ascontiguousarray(sfa[:, :, l]),
                                          np.ascontiguousarray(sfb1[:, :, l]), np.ascontiguousarray(sfb2[:, :, l]))
        _same(np.ascontiguousarray(got[:, :, l]), one)


def test_dual_gemm_blocked_6d_view_in_any_memory_order_read_by_index():
    M, N, K, L = 130, 256, 128, 2
    a, b1, b2, sfa, sfb1, sfb2 = _dual_operands(M, N, K, L)
    want = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2)

    def permuted(s, R):  # the GPU MODE [32, 4, Rp/128, 4, K/64, L] view of the blocked storage
        Rp = -(-R // 128) * 128
        st = np.zeros((L, Rp, K // 16), np.uint8)
        st[:, :R] = np.transpose(s.view(np.uint8), (2, 0, 1))
        blk = st.reshape(L, Rp // 128, 4, 32, K // 64, 4).transpose(0, 1, 4, 3, 2, 5)  # (L, rb, cb, 32, 4, 4)
        return np.ascontiguousarray(blk).transpose(3, 4, 1, 5, 2, 0).view(E4M3)

    pa, pb1, pb2 = permuted(sfa, M), permuted(sfb1, N), permuted(sfb2, N)
    got = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, pa, pb1, pb2, scale_layout="blocked128x4")
    _same(got, want)
    got = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, np.ascontiguousarray(pa), np.asfortranarray(pb1),
                                      np.ascontiguousarray(pb2), scale_layout="blocked128x4")
    _same(got, want)


def test_dual_gemm_cpp_refuses_interleaved_batch_scales():
    M, N, K, L = 5, 256, 64, 2
    a, b1, b2, sfa, sfb1, sfb2 = _dual_operands(M, N, K, L)
    out = np.zeros((L, M, N), np.float16).transpose(1, 2, 0)
    cview = _C_view(out)
    with pytest.raises(ValueError, match=r"nvfp4_dual_gemm_silu: argument 'sfb1': .*expected element strides \(4, 1, 1024\)"):
        _C.nvfp4_dual_gemm(a, b1, b2, sfa.view(np.uint8), np.ascontiguousarray(sfb1.view(np.uint8)),
                           sfb2.view(np.uint8), _C.ScaleLayoutKind.row_major, None, None, None, *cview, None, 0)


# --- tensor_amax (fuzz call #1259) ---

def test_tensor_amax_negative_strides():
    base = np.array([[np.inf, 6.8, -0.43, -7.9, -1.8], [12.1, 37.25, -0.008, -0.019, 0.1]], np.float32)
    x = np.flip(np.flip(base[:, :, None], 0).copy(), 0)
    assert x.strides[0] < 0
    np.testing.assert_array_equal(lowbit.tensor_amax(x), np.array([37.25], np.float32))  # +-Inf / NaN ignored
    y = RNG.standard_normal((2, 7, 9)).astype(np.float32)
    for v in (y[::-1], y[:, ::-1], y[::-1, ::-2], np.flip(np.flip(y, 0).copy(), 0)):
        np.testing.assert_array_equal(lowbit.tensor_amax(v), np.array([np.abs(v).max()], np.float32))


# --- sweep: gpt_oss_moe_mlp operands are read by index or refused ---

def _strided(x, pad=16):
    """x in a buffer whose rows are `pad` elements longer (last dimension contiguous)."""
    buf = np.zeros(x.shape[:-1] + (x.shape[-1] + pad,), x.dtype)
    v = buf[..., pad:]
    v[...] = x
    return v


def test_moe_mlp_strided_weights_read_by_index_fortran_refused():
    T, H, I, E = 3, 64, 64, 2
    x = RNG.standard_normal((T, H)).astype(np.float32)
    ids = np.array([[0, 1], [1, -1], [1, 0]], np.int32)
    w = RNG.random((T, 2)).astype(np.float32)
    w1, w1s, b1 = _codes((E, 2 * I, H // 2)), _ue8m0((E, 2 * I, H // 32)), RNG.standard_normal((E, 2 * I)).astype(np.float32)
    w2, w2s, b2 = _codes((E, H, I // 2)), _ue8m0((E, H, I // 32)), RNG.standard_normal((E, H)).astype(np.float32)
    want = lowbit.gpt_oss_moe_mlp(x, ids, w, w1, w1s, b1, w2, w2s, b2)
    got = lowbit.gpt_oss_moe_mlp(_strided(x), ids, w, _strided(w1), _strided(w1s.view(np.uint8)).view(E8M0), _strided(b1),
                                 _strided(w2), _strided(w2s.view(np.uint8)).view(E8M0), _strided(b2))
    _same(got, want)
    for name, i in (("w1", 3), ("w1_scale", 4), ("b1", 5), ("w2", 6), ("w2_scale", 7), ("b2", 8)):
        args = [x, ids, w, w1, w1s, b1, w2, w2s, b2]
        args[i] = np.asfortranarray(args[i])
        with pytest.raises(ValueError, match=f"gpt_oss_moe_mlp: argument '{name}': the last dimension must be contiguous"):
            lowbit.gpt_oss_moe_mlp(*args)


def test_dual_gemm_prepack_scales_reordered_before_the_checks():
    N, K, L = 128, 64, 2
    _, b1, b2, _, sfb1, sfb2 = _dual_operands(4, N, K, L)
    # host arrays reach the CUDA-only refusal: the C-contiguous / Fortran scales passed the layout checks
    for s in (np.ascontiguousarray(sfb1), np.asfortranarray(sfb1)):
        with pytest.raises(ValueError, match="nvfp4_dual_gemm_prepack: argument 'packed': prepacking produces the CUDA"):
            lowbit.nvfp4_dual_gemm_prepack(b1, b2, s, sfb2)
    with pytest.raises(ValueError, match=r"nvfp4_dual_gemm_prepack: argument 'sfb1': .*expected element strides \(4, 1, 512\)"):
        _C.nvfp4_dual_gemm_prepack(b1, b2, np.ascontiguousarray(sfb1.view(np.uint8)), sfb2.view(np.uint8),
                                   _C.ScaleLayoutKind.row_major, np.zeros(_C.nvfp4_dual_gemm_packed_bytes(N, K, L), np.uint8), 0)
