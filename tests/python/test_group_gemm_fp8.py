"""The opt-in FP8 tensor-core path of the grouped MXFP4 GEMM (precision="fp8") on the CPU: the
FP8-path prepack (shapes, lossless, padding) against a NumPy model of the layout, the CPU result
(the exact reference, by definition within the FP8 path's bound) for every row layout and both
MXFP8 element types, and the argument checks. The CUDA kernel: test_moe_fp8_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

import lowbit


def unpack_fp8_layout(pb, ps, N, K):
    """Natural E2M1 codes [G, N, K] and scale bytes [G, N, K/32] of FP8-path packed weights
    (lowbit/mxfp4_pack.hpp): word 4t + b of a row's tile holds K = 32b + 4t + i (elements 0..3)
    and 32b + 16 + 4t + i (elements 4..7); magnitudes at bits 4e, signs at 8e + 7 / 8(e-4) + 3."""
    G, RT, KT = pb.shape[:3]
    words = np.ascontiguousarray(pb).view("<u4").reshape(G, RT, KT, 128, 4, 4).astype(np.uint64)  # [.., t, b]
    codes = np.zeros((G, RT, KT, 128, 128), np.uint8)
    for t in range(4):
        for b in range(4):
            x = words[..., t, b]
            for e in range(8):
                sign_bit = 8 * e + 7 if e < 4 else 8 * (e - 4) + 3
                code = ((x >> (4 * e)) & 7) | (((x >> sign_bit) & 1) << 3)
                k = 32 * b + (0 if e < 4 else 16) + 4 * t + (e & 3)
                codes[..., k] = code
    codes = codes.transpose(0, 1, 3, 2, 4).reshape(G, RT * 128, KT * 128)
    scales = np.ascontiguousarray(ps).reshape(G, RT, KT, 128, 4).transpose(0, 1, 3, 2, 4).reshape(G, RT * 128, KT * 4)
    return codes, scales


def natural_codes(b):
    return np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], b.shape[1], 2 * b.shape[2])


@pytest.mark.parametrize("G,N,K", [(2, 136, 160), (1, 128, 128), (3, 8, 32), (1, 264, 288)])
@pytest.mark.parametrize("layout", ["row_major", "blocked128x4"])
def test_prepack_fp8_is_lossless(G, N, K, layout):
    rng = np.random.default_rng(G + N + K)
    b = rng.integers(0, 256, (G, N, K // 2), dtype=np.uint8)
    sc = rng.integers(0, 256, (G, N, K // 32), dtype=np.uint8)
    st = sc if layout == "row_major" else lowbit.convert_scale_layout(sc, N, K // 32, "row_major", "blocked128x4")
    pb, ps = lowbit.group_gemm_mxfp4_prepack(b, st, b_scale_layout=layout, precision="fp8")
    Np, Kq = -(-N // 128) * 128, -(-K // 128) * 128
    assert pb.shape == (G, Np // 128, Kq // 128, 128, 64) and ps.shape == (G, Np // 128, Kq // 128, 128, 4)
    assert pb.dtype == np.uint8 and ps.dtype == np.uint8
    codes, scales = unpack_fp8_layout(pb, ps, N, K)
    want = np.zeros((G, Np, Kq), np.uint8)
    want[:, :N, :K] = natural_codes(b)
    np.testing.assert_array_equal(codes, want)
    want_s = np.full((G, Np, Kq // 32), 127, np.uint8)
    want_s[:, :N, :K // 32] = sc
    np.testing.assert_array_equal(scales, want_s)


def _operands(sizes, N, K, act, seed):
    rng = np.random.default_rng(seed)
    ind = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    M, G = int(ind[-1]), len(sizes)
    x = rng.standard_normal((M, K)).astype(np.float32)
    qb = lowbit.quantize((rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32), "mxfp4", "row_major")
    qa = lowbit.quantize(x, "mxfp8_" + act, "row_major")
    return ind, qa, qb


@pytest.mark.parametrize("act", ["e4m3", "e5m2"])
def test_fp8_cpu_equals_exact(act):
    sizes = [3, 0, 40, 1, 0]
    N, K = 136, 160
    ind, qa, qb = _operands(sizes, N, K, act, 5)
    want = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, qb.data, qa.scales, qb.scales, ind, "float16",
                                                a_scale_layout="row_major", b_scale_layout="row_major")
    pb, ps = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major", precision="fp8")
    got = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, qa.scales, ps, ind, "float16", a_scale_layout="row_major",
                                               b_packed=True, n=N, precision="fp8")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    # grouped 128x4 activation scales (FlashInfer padding) and the m_counts layouts
    M = int(ind[-1])
    sa_blk = lowbit.convert_scale_layout(np.asarray(qa.scales).view(np.uint8), M, K // 32, "row_major", "blocked128x4",
                                         m_indptr=ind, group_pad="flashinfer")
    got = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, sa_blk, ps, ind, "float16", b_packed=True, n=N,
                                               precision="fp8")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    counts = np.diff(ind).astype(np.int64)
    got = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, qa.scales, ps, m_counts=counts, out_dtype="float16",
                                               a_scale_layout="row_major", b_packed=True, n=N, precision="fp8")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


def test_fp8_masked_layout_cpu():
    G, T, N, K = 3, 5, 128, 128
    rng = np.random.default_rng(7)
    x = rng.standard_normal((G, T, K)).astype(np.float32)
    qa = lowbit.quantize(x.reshape(G * T, K), "mxfp8_e4m3", "row_major")
    qb = lowbit.quantize((rng.standard_normal((G, N, K)) / 8).astype(np.float32), "mxfp4", "row_major")
    counts = np.array([2, 0, 5], np.int32)
    a3 = qa.data.reshape(G, T, K)
    s3 = np.asarray(qa.scales).reshape(G, T, K // 32)
    want = np.full((G, T, N), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    lowbit.group_gemm_mxfp4_nt_groupwise(a3, qb.data, s3, qb.scales, m_counts=counts, a_scale_layout="row_major",
                                         b_scale_layout="row_major", out=want)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major", precision="fp8")
    got = np.full((G, T, N), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    lowbit.group_gemm_mxfp4_nt_groupwise(a3, pb, s3, ps, m_counts=counts, a_scale_layout="row_major", b_packed=True,
                                         out=got, precision="fp8")
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_fp8_argument_errors():
    ind, qa, qb = _operands([4, 4], 128, 128, "e4m3", 9)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major", precision="fp8")
    a16 = lowbit.dequantize(qa, "float32").astype(ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="argument 'precision': .*MXFP8"):
        lowbit.group_gemm_mxfp4_nt_groupwise(a16, pb, None, ps, ind, b_packed=True, n=128, precision="fp8")
    with pytest.raises(NotImplementedError, match="group_gemm_mxfp4_prepack_fp8"):  # plain weights
        lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, qb.data, qa.scales, qb.scales, ind, a_scale_layout="row_major",
                                             b_scale_layout="row_major", precision="fp8")
    pb16, ps16 = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major")
    with pytest.raises(ValueError, match="argument 'b': .*FP8-path packed layout"):  # the exact path's layout
        lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb16, qa.scales, ps16, ind, a_scale_layout="row_major",
                                             b_packed=True, n=128, precision="fp8")
    with pytest.raises(ValueError, match="argument 'b'"):  # the FP8 layout on the exact path
        lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, qa.scales, ps, ind, a_scale_layout="row_major",
                                             b_packed=True, n=128)
    with pytest.raises(ValueError, match="argument 'precision'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, qa.scales, ps, ind, b_packed=True, n=128, precision="fp16")
    with pytest.raises(ValueError, match="argument 'precision'"):
        lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major", precision="bf16")
    with pytest.raises(ValueError, match="argument 'b_scale'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, pb, qa.scales, ps[..., :2].copy(), ind,
                                             a_scale_layout="row_major", b_packed=True, n=128, precision="fp8")


def test_default_precision_is_exact():
    import inspect

    sig = inspect.signature(lowbit.group_gemm_mxfp4_nt_groupwise)
    assert sig.parameters["precision"].default == "exact"
    assert inspect.signature(lowbit.group_gemm_mxfp4_prepack).parameters["precision"].default == "exact"


def test_torch_op_takes_precision():
    torch = pytest.importorskip("torch")
    from lowbit import torch_ops  # noqa: F401  (registers torch.ops.lowbit)

    ind, qa, qb = _operands([3, 5], 128, 128, "e4m3", 11)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales, b_scale_layout="row_major", precision="fp8")
    a = torch.from_numpy(np.ascontiguousarray(qa.data).view(np.uint8)).view(torch.float8_e4m3fn)
    sa = torch.from_numpy(np.ascontiguousarray(qa.scales).view(np.uint8))
    got = torch.ops.lowbit.group_gemm_mxfp4_nt_groupwise(a, torch.from_numpy(pb), sa, torch.from_numpy(ps),
                                                         m_indptr=torch.from_numpy(ind), a_scale_layout="row_major",
                                                         b_packed=True, n=128, precision="fp8")
    want = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, qb.data, qa.scales, qb.scales, ind, a_scale_layout="row_major",
                                                b_scale_layout="row_major")
    np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), np.asarray(want).view(np.uint16))
