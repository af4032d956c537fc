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


# ---------------------------------------------------------------------------------------------
# CUDA

@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,L", [(1, 4096, 7168, 1), (64, 512, 1024, 2), (300, 256, 512, 1)])
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
