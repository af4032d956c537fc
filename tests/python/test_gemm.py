"""GEMM ops through the Python API: the NVFP4 dual GEMM (GPU MODE layouts, custom_kernel), the
MXFP4 x MXFP8 grouped GEMM and the gpt-oss expert MLP. CPU results are checked against NumPy
float64 formulations written here; CUDA results (gpu marker) against the CPU reference."""

import ml_dtypes
import numpy as np
import pytest

import lowbit

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def _gpumode_inputs(M, N, K, L, seed, mask=0xBB):
    rng = np.random.default_rng(seed)

    def fp4(rows):  # GPU MODE: [rows, K/2, L] view of (L, rows, K/2) storage
        st = (rng.integers(0, 256, size=(L, rows, K // 2), dtype=np.uint8) & mask).astype(np.uint8)
        return np.transpose(st, (1, 2, 0))

    def sf(rows):
        st = rng.random(size=(L, rows, K // 16)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
        return np.transpose(st, (1, 2, 0))

    return fp4(M), fp4(N), fp4(N), sf(M), sf(N), sf(N)


def _decode(q, sf):
    """[R, K/2, L] codes + [R, K/16, L] scales -> float64 [L, R, K]."""
    q = np.transpose(q, (2, 0, 1))
    codes = np.stack([q & 0xF, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], -1)
    s = np.transpose(sf, (2, 0, 1)).astype(np.float64)
    return E2M1[codes] * np.repeat(s, 16, axis=-1)


def _ref_dual(a, b1, b2, sfa, sfb1, sfb2):
    A, B1, B2 = _decode(a, sfa), _decode(b1, sfb1), _decode(b2, sfb2)
    g = A @ np.swapaxes(B1, 1, 2)
    u = A @ np.swapaxes(B2, 1, 2)
    return np.transpose(g / (1 + np.exp(-g)) * u, (1, 2, 0))  # [M, N, L]


def _gpumode_ok(got, ref):
    got = np.asarray(got, dtype=np.float64)
    return np.abs(got - ref) <= 1e-3 + 1e-3 * np.abs(ref)


@pytest.mark.parametrize("M,N,K,L", [(1, 128, 64, 1), (37, 256, 192, 2), (130, 128, 128, 1)])
def test_dual_gemm_cpu_matches_numpy(M, N, K, L):
    a, b1, b2, sfa, sfb1, sfb2 = _gpumode_inputs(M, N, K, L, seed=M + N + K)
    c = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2)
    assert c.shape == (M, N, L) and c.dtype == np.float16
    ref = _ref_dual(a, b1, b2, sfa, sfb1, sfb2)
    ok = _gpumode_ok(c, np.float64(ref.astype(np.float16)))
    assert ok.all(), f"{(~ok).sum()} elements outside the GPU MODE rule"


def test_dual_gemm_permuted_scales_equal_reference_layout():
    M, N, K, L = 150, 256, 128, 2
    a, b1, b2, sfa, sfb1, sfb2 = _gpumode_inputs(M, N, K, L, seed=5)

    def permute(sf):  # reference [R, K/16, L] -> 128x4 blocked storage per L
        return np.stack([lowbit.block_scale_interleave(np.ascontiguousarray(sf[:, :, l])) for l in range(L)])

    c_ref = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2)
    c_perm = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, permute(sfa), permute(sfb1), permute(sfb2),
                                         scale_layout="blocked128x4")
    np.testing.assert_array_equal(c_ref.view(np.uint16), c_perm.view(np.uint16))


def test_dual_gemm_refuses_bad_shapes():
    a, b1, b2, sfa, sfb1, sfb2 = _gpumode_inputs(16, 100, 64, 1, seed=1)  # N = 100
    out = np.full((16, 100, 1), 7, dtype=np.float16)
    with pytest.raises(ValueError, match="argument 'b1'.*multiple of 128"):
        lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2, out=out)
    assert (out == 7).all()


def test_group_gemm_cpu_matches_numpy():
    rng = np.random.default_rng(3)
    sizes = [5, 0, 130, 1]
    ind = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    M, N, K, G = int(ind[-1]), 64, 96, len(sizes)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    qa = lowbit.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=ind)
    qb = lowbit.quantize(w, "mxfp4", "blocked128x4", rounding="floor")
    out = lowbit.group_gemm_mxfp4_nt_groupwise(qa.data, qb.data, qa.scales, qb.scales, ind, "bfloat16")
    A = lowbit.dequantize(qa).astype(np.float64)
    B = lowbit.dequantize(qb).astype(np.float64)
    ref = np.concatenate([A[ind[g]:ind[g + 1]] @ B[g].T for g in range(G)])
    got = out.astype(np.float64)
    # one bf16 ulp of the exact sum
    assert np.all(np.abs(got - ref) <= np.abs(ref) * 2.0 ** -7 + 1e-30)


def test_group_gemm_cpu_no_rows():
    """cum_m = 0: NumPy gives the empty activations strides (0, 0); the call returns an empty
    output instead of refusing the layout."""
    G, N, K = 3, 64, 96
    a = np.zeros((0, K), dtype=ml_dtypes.bfloat16)
    assert a.strides == (0, 0) or a.size == 0
    b = np.full((G, N, K // 2), 0x22, dtype=np.uint8)
    bs = np.full((G, N, K // 32), 127, dtype=np.uint8)
    ind = np.zeros(G + 1, dtype=np.int32)
    out = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, bs, ind, "bfloat16", b_scale_layout="row_major")
    assert out.shape == (0, N)


def test_moe_mlp_cpu_matches_numpy():
    rng = np.random.default_rng(4)
    T, H, I, E, k = 3, 64, 32, 3, 2
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.array([[0, 2], [1, -1], [2, 2]], dtype=np.int32)
    wts = np.array([[0.7, 0.3], [1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    out = lowbit.gpt_oss_moe_mlp(x, ids, wts, w1.data, w1.scales, b1, w2.data, w2.scales, b2, out_dtype="float32")
    W1, W2 = lowbit.dequantize(w1).astype(np.float64), lowbit.dequantize(w2).astype(np.float64)
    xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    ref = np.zeros((T, H))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            if e < 0:
                continue
            h = W1[e] @ xb[t] + b1[e]
            g, u = np.minimum(h[0::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
            y = (g / (1 + np.exp(-1.702 * g)) * (u + 1)).astype(np.float32).astype(ml_dtypes.bfloat16)
            ref[t] += wts[t, j] * (W2[e] @ y.astype(np.float64) + b2[e])
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3)


def _tiny_bf16_pair(lo, hi):
    """bf16x2 bits of e2m1 codes lo / hi times 2^-126 (sign -> bit 15, code bits 2..0 -> 8..6)."""
    f = lambda c: ((c & 7) << 6) | ((c & 8) << 12)
    return f(lo) | (f(hi) << 16)


@pytest.mark.parametrize("n,k,layout", [(136, 160, "row_major"), (128, 256, "blocked128x4"), (8, 32, "blocked128x4")])
def test_group_gemm_prepack_layout(n, k, layout):
    """The packed words decode with the four masks of lowbit/mxfp4_pack.hpp into the bf16x2 pairs
    (e0, e1), (e2, e3), (e4, e5), (e6, e7) of the natural word; padding rows and K are zero codes
    with scale byte 127; the scales are the row-major bytes."""
    rng = np.random.default_rng(n + k)
    G = 2
    b = rng.integers(0, 256, (G, n, k // 2), dtype=np.uint8)
    sc = rng.integers(0, 256, (G, n, k // 32), dtype=np.uint8)
    st = sc if layout == "row_major" else lowbit.convert_scale_layout(sc, n, k // 32, "row_major", "blocked128x4")
    pb, ps = lowbit.group_gemm_mxfp4_prepack(b, st, b_scale_layout=layout)
    Np, Kp = -(-n // 128) * 128, -(-k // 256) * 256
    assert pb.shape == (G, Np, Kp // 2) and ps.shape == (G, Np, Kp // 32)
    assert pb.dtype == np.uint8 and ps.dtype == np.uint8
    x = np.ascontiguousarray(pb).view("<u4").astype(np.uint64)
    M = 0x81C081C0
    pairs = [x & M, (x << 3) & M, (x << 6) & M,
             ((x >> 4) & 0x00C000C0) | ((x >> 5) & 0x01000100) | ((x << 1) & 0x80008000)]
    nat = np.zeros((G, Np, Kp // 2), np.uint8)
    nat[:, :n, :k // 2] = b
    w = nat.view("<u4").astype(np.uint64)
    for q in range(4):
        want = _tiny_bf16_pair((w >> (8 * q)) & 15, (w >> (8 * q + 4)) & 15)
        np.testing.assert_array_equal(pairs[q] & 0xFFFFFFFF, want, err_msg=f"pair {q}")
    want_s = np.full((G, Np, Kp // 32), 127, np.uint8)
    want_s[:, :n, :k // 32] = sc
    np.testing.assert_array_equal(np.asarray(ps), want_s)


@pytest.mark.parametrize("act", ["e4m3", "bf16"])
def test_group_gemm_packed_cpu_equals_plain(act):
    rng = np.random.default_rng(5)
    sizes = [3, 0, 40, 1]
    ind = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    M, N, K, G = int(ind[-1]), 136, 160, len(sizes)
    x = rng.standard_normal((M, K)).astype(np.float32)
    qb = lowbit.quantize((rng.standard_normal((G, N, K)) / 8).astype(np.float32), "mxfp4", "blocked128x4")
    if act == "bf16":
        a, a_sc, la = x.astype(ml_dtypes.bfloat16), None, "row_major"
    else:
        qa = lowbit.quantize(x, "mxfp8_e4m3", "row_major")
        a, a_sc, la = qa.data, qa.scales, "row_major"
    plain = lowbit.group_gemm_mxfp4_nt_groupwise(a, qb.data, a_sc, qb.scales, ind, "float16", a_scale_layout=la)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(qb.data, qb.scales)
    got = lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, a_sc, ps, ind, "float16", a_scale_layout=la, b_packed=True, n=N)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(plain).view(np.uint16))
    out = np.full((M, N), np.nan, np.float16)
    lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, a_sc, ps, ind, a_scale_layout=la, b_packed=True, out=out)
    np.testing.assert_array_equal(out.view(np.uint16), np.asarray(plain).view(np.uint16))


def test_group_gemm_packed_argument_errors():
    rng = np.random.default_rng(6)
    b = rng.integers(0, 256, (2, 136, 80), dtype=np.uint8)
    sc = np.full((2, 136, 5), 127, np.uint8)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(b, sc, b_scale_layout="row_major")
    a = rng.standard_normal((4, 160)).astype(np.float32).astype(ml_dtypes.bfloat16)
    ind = np.array([0, 4, 4], np.int32)
    with pytest.raises(ValueError, match="'n'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, None, ps, ind, b_packed=True)
    with pytest.raises(ValueError, match="argument 'b'.*shape"):  # N = 264 needs Np = 384 rows
        lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, None, ps, ind, b_packed=True, n=264)
    with pytest.raises(ValueError, match="argument 'b_scale'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, None, ps[:, :, :4].copy(), ind, b_packed=True, n=136)
    with pytest.raises(ValueError, match="argument 'b'.*shape"):  # plain weights passed as packed
        lowbit.group_gemm_mxfp4_nt_groupwise(a, b, None, sc, ind, b_packed=True, n=136)
    with pytest.raises(ValueError, match="argument 'packed_scale'|argument 'b_scale'"):
        lowbit.group_gemm_mxfp4_prepack(b, sc[:, :, :4].copy(), b_scale_layout="row_major")


def test_moe_mlp_packed_cpu_equals_plain():
    rng = np.random.default_rng(7)
    T, H, I, E = 4, 96, 64, 3
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.array([[0, 2], [1, -1], [2, 2], [1, 0]], dtype=np.int32)
    wts = rng.random((T, 2)).astype(np.float32)
    for act in ("bf16", "mxfp8"):
        plain = lowbit.gpt_oss_moe_mlp(x, ids, wts, w1.data, w1.scales, b1, w2.data, w2.scales, b2, act=act,
                                       out_dtype="float32")
        p1, s1 = lowbit.group_gemm_mxfp4_prepack(w1.data, w1.scales, b_scale_layout="row_major")
        p2, s2 = lowbit.group_gemm_mxfp4_prepack(w2.data, w2.scales, b_scale_layout="row_major")
        got = lowbit.gpt_oss_moe_mlp(x, ids, wts, p1, s1, b1, p2, s2, b2, act=act, out_dtype="float32", packed=True)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(plain))


# ---------------------------------------------------------------------------------------------
# CUDA

@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,L", [(1, 4096, 7168, 1), (64, 512, 1024, 2), (300, 256, 512, 1),
                                     (300, 2176, 512, 2)])  # 34 CTA columns: launch order in groups
def test_dual_gemm_cuda_custom_kernel(M, N, K, L):
    import torch

    a, b1, b2, sfa, sfb1, sfb2 = _gpumode_inputs(M, N, K, L, seed=M + K)
    ref = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2).astype(np.float64)

    def cuda_fp4(x):  # (L, R, K/2) storage viewed [R, K/2, L], as the GPU MODE generator makes it
        st = torch.from_numpy(np.ascontiguousarray(np.transpose(x, (2, 0, 1)))).cuda()
        return st.permute(1, 2, 0).view(torch.float4_e2m1fn_x2) if hasattr(torch, "float4_e2m1fn_x2") else st.permute(1, 2, 0)

    def cuda_sf(sf):
        st = torch.from_numpy(np.ascontiguousarray(np.transpose(sf, (2, 0, 1))).view(np.uint8)).cuda()
        return st.view(torch.float8_e4m3fn).permute(1, 2, 0)

    def cuda_perm(sf):  # [32, 4, R/128, 4, K/64, L] view of (L, R/128, K/64, 32, 4, 4)
        R = sf.shape[0]
        blocks = np.stack([lowbit.block_scale_interleave(np.ascontiguousarray(sf[:, :, l])) for l in range(L)])
        st = torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8)).cuda()
        st = st.reshape(L, (R + 127) // 128, K // 64, 32, 4, 4).view(torch.float8_e4m3fn)
        return st.permute(3, 4, 1, 5, 2, 0)

    c = torch.empty((L, M, N), dtype=torch.float16, device="cuda").permute(1, 2, 0).fill_(float("nan"))
    data = (cuda_fp4(a), cuda_fp4(b1), cuda_fp4(b2), cuda_sf(sfa), cuda_sf(sfb1), cuda_sf(sfb2),
            cuda_perm(sfa), cuda_perm(sfb1), cuda_perm(sfb2), c)
    out = lowbit.custom_kernel(data)
    torch.cuda.synchronize()
    got = out.float().cpu().numpy().astype(np.float64)
    ok = _gpumode_ok(got, ref)
    assert ok.all(), f"{(~ok).sum()} of {ok.size} elements outside the GPU MODE rule"


@pytest.mark.gpu
def test_dual_gemm_cuda_prepacked_matches_one_call():
    import torch

    M, N, K = 16, 384, 512
    a, b1, b2, sfa, sfb1, sfb2 = (x[:, :, 0] for x in _gpumode_inputs(M, N, K, 1, seed=9))
    ref = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2).astype(np.float64)
    t = [torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).cuda() for x in (a, b1, b2, sfa, sfb1, sfb2)]
    # outputs poisoned with NaN: a kernel that writes nothing cannot pass
    c1 = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    c2 = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    lowbit.nvfp4_dual_gemm_silu(*t, out=c1)
    packed = lowbit.nvfp4_dual_gemm_prepack(t[1], t[2], t[4], t[5])
    lowbit.nvfp4_dual_gemm_silu(t[0], sfa=t[3], packed_b=packed, out=c2)
    torch.cuda.synchronize()
    ok = _gpumode_ok(c1.float().cpu().numpy(), ref)
    assert ok.all(), f"{(~ok).sum()} of {ok.size} elements outside the GPU MODE rule"
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))


def test_gemm_argument_errors_name_the_argument():
    a, b1, b2, sfa, sfb1, sfb2 = (x[:, :, 0] for x in _gpumode_inputs(16, 128, 64, 1, seed=2))
    out = np.zeros((16, 128), dtype=np.float16)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="argument 'out': is read-only"):
        lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sfa, sfb1, sfb2, out=out)
    with pytest.raises(ValueError, match="argument 'b': is required"):
        lowbit.group_gemm_mxfp4_nt_groupwise(np.zeros((4, 64), np.uint8), None, None, None, [0, 4])
    w = np.zeros((1, 64, 16), np.uint8)
    with pytest.raises(ValueError, match="argument 'alpha'"):
        lowbit.gpt_oss_moe_mlp(np.zeros((1, 32), np.float32), np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32),
                               np.zeros((1, 64, 16), np.uint8), np.full((1, 64, 1), 127, np.uint8),
                               np.zeros((1, 64), np.float32), w[:, :32, :16], np.full((1, 32, 1), 127, np.uint8),
                               np.zeros((1, 32), np.float32), alpha=float("nan"))
