"""Per-kernel device times of lowbit.attn_forward_decode_nf4 variants (torch.profiler), for kernel
work on the GPU machine: unpruned, pruned (threshold kernel), pruned with a given threshold that
keeps everything (no threshold kernel), and one that skips every middle block.

    python bench/dev/decode_kernel_profile.py [--batch 8] [--context 32768]
"""
import argparse
import math

import torch
from torch.profiler import ProfilerActivity, profile

import lowbit

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--context", type=int, default=32768)
ap.add_argument("--iters", type=int, default=20)
a = ap.parse_args()
B, T, H, HK, D = a.batch, a.context, 32, 8, 128
g = torch.Generator(device="cuda").manual_seed(0)
k = torch.randn((B, T, HK, D), device="cuda", generator=g)
c, s, r = lowbit.nf4_kcache_quantize(k.cpu())
c, s, r = c.cuda(), s.cuda(), r.cuda()
q = torch.randn((B, 1, H, D), device="cuda", generator=g).bfloat16()
v = torch.randn((B, T, HK, D), device="cuda", generator=g).bfloat16()
variants = {
    "unpruned": dict(delta=math.inf),
    "pruned_d8": dict(delta=8.0),
    "prune_keep_all_d1e30": dict(delta=1e30),
    "given_thr_keep_all": dict(precomputed_threshold=torch.full((B, H), -math.inf, device="cuda")),
    "given_thr_skip_all": dict(precomputed_threshold=torch.full((B, H), math.inf, device="cuda")),
    "nores_unpruned": dict(delta=math.inf, use_fp8_residual=False),
}
for name, kw in variants.items():
    rr = None if kw.get("use_fp8_residual", True) is False else r
    for _ in range(3):
        lowbit.attn_forward_decode_nf4(q, c, s, rr, v, **kw)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(a.iters):
        lowbit.attn_forward_decode_nf4(q, c, s, rr, v, **kw)
    e1.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            lowbit.attn_forward_decode_nf4(q, c, s, rr, v, **kw)
        torch.cuda.synchronize()
    parts = []
    for ev in prof.key_averages():
        if ev.device_time_total > 0:
            n = ev.key.split("<")[0].split("::")[-1][:24]
            parts.append(f"{n}={ev.device_time_total / max(ev.count, 1):.1f}us")
    print(f"{name:24s} b{B} t{T}: {e0.elapsed_time(e1) * 1000 / a.iters:8.1f} us/call (warm L2) | " + " ".join(parts), flush=True)
