"""One kernel of interest, run a few times, for Nsight Compute (bench/dev/ncu_profile.sh).

    python bench/dev/ncu_targets.py TARGET [--iters 3]

Targets (the shapes where the design records say a profile is needed):
  attn_fp8       flash_attn_mxfp8_func precision="fp8", b1 s8192 h32 d128, not causal
  attn_fp8_d256  the same at b2 s4096 h16 d256
  attn_fp8_s2048 the same at b4 s2048 h32 d128 (attn_fp8_s2048c: causal)
  attn_exact     the exact path at b1 s8192 h32 d128
  moe_fp8        group_gemm_mxfp4_nt_groupwise precision="fp8", gpt-oss-20b gate_up (32 experts,
                 N 5760, K 2880), T 4096 x top-4 uniform routing
  moe_exact      the same on the exact path (prepacked weights)
  moe_exact_t16  the exact path at T 16 (64 rows over the 32 experts: the warp-specialized kernel)
  decode         attn_forward_decode_nf4, b8 ctx 32768 h32/8 d128, unpruned
  linear_m16     nvfp4_gemm W4A16 on prepacked weights, M 16, N x K 4096 x 4096 (the decode side)
  linear_m256    the same at M 256 (the mid-size tiles)
  linear_m4096   the same at M 4096 (the mainloop's steady state)
"""
import argparse

import torch

import lowbit


def attn(b, s, h, d, precision, causal=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, s, h, d), device="cuda", generator=g).bfloat16() for _ in range(3))
    (qc, qs), (kc, ks), (vc, vs) = (lowbit.quantize_mxfp8_attn(t) for t in (q, k, v))
    return lambda: lowbit.flash_attn_mxfp8_func(qc, kc, vc, qs, ks, vs, precision=precision, causal=causal)


def moe(precision, T=4096):
    G, N, K, topk = 32, 5760, 2880, 4
    g = torch.Generator(device="cuda").manual_seed(0)
    codes = torch.randint(0, 256, (G, N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 128, (G, N, K // 32), device="cuda", dtype=torch.uint8, generator=g)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(codes, scales, b_scale_layout="row_major", precision=precision)
    counts = torch.full((G,), T * topk // G, dtype=torch.int64)
    counts[: T * topk - int(counts.sum())] += 1  # T * topk rows over the G experts
    m_indptr = torch.zeros(G + 1, dtype=torch.int32)
    m_indptr[1:] = counts.cumsum(0).to(torch.int32)
    m_indptr = m_indptr.cuda()
    a = torch.randn((T * topk, K), device="cuda", generator=g).bfloat16()
    qa = lowbit.quantize(a, "mxfp8_e4m3", "blocked128x4", m_indptr=m_indptr, group_pad="flashinfer")
    out = torch.empty((T * topk, N), device="cuda", dtype=torch.bfloat16)
    return lambda: lowbit.group_gemm_mxfp4_nt_groupwise(
        qa.data, pb, qa.scales, ps, m_indptr, "bfloat16", a_scale_layout="blocked128x4",
        b_scale_layout="row_major", group_pad="flashinfer", out=out, b_packed=True, precision=precision)


def decode():
    B, T, H, HK, D = 8, 32768, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn((B, T, HK, D), device="cuda", generator=g)
    c, s, r = lowbit.nf4_kcache_quantize(k)
    q = torch.randn((B, 1, H, D), device="cuda", generator=g).bfloat16()
    v = torch.randn((B, T, HK, D), device="cuda", generator=g).bfloat16()
    return lambda: lowbit.attn_forward_decode_nf4(q, c, s, r, v, delta=float("inf"))


def linear(M, N=4096, K=4096):
    g = torch.Generator(device="cuda").manual_seed(0)
    b = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    b_sc = torch.randint(0x20, 0x40, (N, K // 16), device="cuda", dtype=torch.uint8, generator=g)
    packed = lowbit.nvfp4_gemm_prepack(b, b_sc)
    a = torch.randn((M, K), device="cuda", generator=g).bfloat16()
    out = torch.empty((M, N), device="cuda", dtype=torch.bfloat16)
    return lambda: lowbit.nvfp4_gemm(a, packed, None, b_packed=True, out=out)


TARGETS = {
    "attn_fp8": lambda: attn(1, 8192, 32, 128, "fp8"),
    "attn_fp8_d256": lambda: attn(2, 4096, 16, 256, "fp8"),
    "attn_fp8_s2048": lambda: attn(4, 2048, 32, 128, "fp8"),
    "attn_fp8_s2048c": lambda: attn(4, 2048, 32, 128, "fp8", causal=True),
    "attn_exact": lambda: attn(1, 8192, 32, 128, "exact"),
    "moe_fp8": lambda: moe("fp8"),
    "moe_exact": lambda: moe("exact"),
    "moe_exact_t16": lambda: moe("exact", 16),
    "decode": decode,
    "linear_m16": lambda: linear(16),
    "linear_m256": lambda: linear(256),
    "linear_m4096": lambda: linear(4096),
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    fn = TARGETS[a.target]()
    for _ in range(a.iters):
        fn()
    torch.cuda.synchronize()
    print(a.target, "ok")
