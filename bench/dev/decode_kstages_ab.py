"""Same-process A/B of the fused decode attention's K buffers (one or two:
src/cuda/attention/decode_heuristics.hpp), for the GPU machine: every case timed with
LOWBIT_DECODE_K_STAGES=1 and =2 (read by the launcher at each call), interleaved over several
rounds, and with the launcher's own choice; outputs of the two compared bit for bit (the same
arithmetic in the same order).

    python bench/dev/decode_kstages_ab.py [--rounds 3] [--json PATH]

Cases: GQA 32/8, D 128, b1 at 16k / 32k / 128k, b8 at 32k, b32 at 8k; V bf16 or FP8 (E4M3 V
cache), with and without the K residual, unpruned and pruned at delta 8. Prints a table of the
median times (us, CUDA events, L2 flushed) and stage-2 / stage-1 ratios; the design record
(docs/design/decode_kernel.md) takes the default from it.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lowbit_bench import time_fn  # noqa: E402
from lowbit_bench.decode_cache import PATTERNS, make_qkv_torch  # noqa: E402

import torch  # noqa: E402

import lowbit  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--iters", type=int, default=30)
ap.add_argument("--json", default=None)
a = ap.parse_args()

SHAPES = [(1, 16384), (1, 32768), (1, 131072), (8, 32768), (32, 8192)]
H, HK, D = 32, 8, 128


def run(stages, fn):
    if stages:
        os.environ["LOWBIT_DECODE_K_STAGES"] = str(stages)
    else:
        os.environ.pop("LOWBIT_DECODE_K_STAGES", None)
    try:
        return fn()
    finally:
        os.environ.pop("LOWBIT_DECODE_K_STAGES", None)


rows = []
print(f"{'case':44s} {'1 buf us':>9s} {'2 buf us':>9s} {'2/1':>6s} {'default':>8s}  same bits", flush=True)
for B, T in SHAPES:
    q, k, v = make_qkv_torch(torch, PATTERNS["sinks_recency_retrieval"], B, T, H, HK, D, D, seed=B * 7 + T, device="cuda")
    c, s, r = lowbit.nf4_kcache_quantize(k)
    v8, vs = lowbit.fp8_vcache_quantize(v)
    del k
    for vname, vv, vsc in (("bf16V", v, None), ("fp8V", v8, vs)):
        for res in (True, False):
            for delta in (math.inf, 8.0):
                kw = dict(delta=delta, use_fp8_residual=res, v_scale=vsc, block_size=64)
                rr = r if res else None
                name = f"b{B}t{T} {vname} {'res' if res else 'nores'} {'d8' if delta == 8.0 else 'unpruned'}"

                def call():
                    return lowbit.attn_forward_decode_nf4(q, c, s, rr, vv, **kw)

                o1 = run(1, call)
                o2 = run(2, call)
                same = bool(torch.equal(o1.view(torch.int16), o2.view(torch.int16)))
                t = {1: [], 2: [], 0: []}
                for _ in range(a.rounds):
                    for st in (1, 2, 0):
                        t[st].append(run(st, lambda: time_fn(call, warmup=3, iters=a.iters)).median_us)
                med = {st: sorted(x)[len(x) // 2] for st, x in t.items()}
                rows.append(dict(case=name, us_1=med[1], us_2=med[2], us_default=med[0], same_bits=same))
                print(f"{name:44s} {med[1]:9.1f} {med[2]:9.1f} {med[2] / med[1]:6.3f} {med[0]:8.1f}  {same}", flush=True)
    del q, c, s, r, v, v8, vs
    torch.cuda.empty_cache()
if a.json:
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)
