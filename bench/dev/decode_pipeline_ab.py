"""Same-process A/B of the fused decode attention's two split kernels, for the GPU machine:
split_kernel and the warp-specialized split_kernel_ws (src/cuda/attention/nf4_decode_ws.cuh),
chosen by LOWBIT_DECODE_PIPELINE=split / =ws (read by the launcher at each call). Every case is
timed with both, interleaved over several rounds; the outputs are compared bit for bit.

    python bench/dev/decode_pipeline_ab.py [--rounds 3] [--json PATH]

Cases: those of decode_kstages_ab.py (GQA 32/8, D 128, b1 at 16k / 32k / 128k, b8 at 32k, b32 at
8k; V bf16 or FP8, with and without the K residual, unpruned and pruned at delta 8). Prints the
median times (us, CUDA events, L2 flushed), ws / split, the split kernels' split counts (grid.x of
the launch, read from a profiler trace) and whether the outputs are the same bits. The two kernels
do the same arithmetic in the same order only at the same split count (the count follows each
kernel's occupancy), so "same bits" is reported as "-" when the counts differ; "False" there is a
bug of split_kernel_ws. A case whose trace did not show the 288-thread ws kernel is flagged. The ws
ring depths are the launcher's unless LOWBIT_DECODE_WS_STAGES=KxV (K 2..4, V 2..8) is set in the
environment; --json PATH also writes the rows (times, ratio, split counts, same bits) as JSON.
"""
import argparse
import json
import math
import os
import sys
import tempfile

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
PIPES = ("split", "ws")


def run(pipe, fn):
    os.environ["LOWBIT_DECODE_PIPELINE"] = pipe
    try:
        return fn()
    finally:
        os.environ.pop("LOWBIT_DECODE_PIPELINE", None)


def split_launches(calls):
    """(grid.x, block.x) of the split kernel that each (pipe, fn) of `calls` launches, from one
    profiler session (the calls in order, one split kernel each); None for all if the trace does
    not hold exactly one per call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for pipe, fn in calls:
            run(pipe, fn)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    found = sorted(
        (e["ts"], int(e["args"]["grid"][0]), int(e["args"]["block"][0]))
        for e in events
        if e.get("cat") == "kernel" and "split_kernel" in e.get("name", "") and "grid" in e.get("args", {})
    )
    if len(found) != len(calls):
        return [None] * len(calls)
    return [(g, b) for _, g, b in found]


rows = []
print(f"{'case':44s} {'split us':>9s} {'ws us':>9s} {'ws/split':>8s} {'splits s/ws':>11s}  same bits", flush=True)
for B, T in SHAPES:
    q, k, v = make_qkv_torch(torch, PATTERNS["sinks_recency_retrieval"], B, T, H, HK, D, D, seed=B * 7 + T, device="cuda")
    c, s, r = lowbit.nf4_kcache_quantize(k)
    v8, vs = lowbit.fp8_vcache_quantize(v)
    del k
    cases = []
    for vname, vv, vsc in (("bf16V", v, None), ("fp8V", v8, vs)):
        for res in (True, False):
            for delta in (math.inf, 8.0):
                kw = dict(delta=delta, use_fp8_residual=res, v_scale=vsc, block_size=64)
                rr = r if res else None
                name = f"b{B}t{T} {vname} {'res' if res else 'nores'} {'d8' if delta == 8.0 else 'unpruned'}"

                def call(rr=rr, vv=vv, kw=kw):
                    return lowbit.attn_forward_decode_nf4(q, c, s, rr, vv, **kw)

                cases.append((name, call))
    found = split_launches([(p, call) for _, call in cases for p in PIPES])
    for i, (name, call) in enumerate(cases):
        launch = dict(zip(PIPES, found[2 * i : 2 * i + 2]))
        outs = {p: run(p, call) for p in PIPES}
        ws_ran = launch["ws"] is not None and launch["ws"][1] == 288
        same_count = launch["split"] is not None and launch["ws"] is not None and launch["split"][0] == launch["ws"][0]
        same = bool(torch.equal(outs["split"].view(torch.int16), outs["ws"].view(torch.int16))) if same_count else None
        t = {p: [] for p in PIPES}
        for _ in range(a.rounds):
            for p in PIPES:
                t[p].append(run(p, lambda: time_fn(call, warmup=3, iters=a.iters)).median_us)
        med = {p: sorted(x)[len(x) // 2] for p, x in t.items()}
        splits = "/".join(str(launch[p][0]) if launch[p] else "?" for p in PIPES)
        rows.append(
            dict(case=name, us_split=med["split"], us_ws=med["ws"], ratio=med["ws"] / med["split"],
                 splits_split=launch["split"][0] if launch["split"] else None,
                 splits_ws=launch["ws"][0] if launch["ws"] else None, ws_ran=ws_ran, same_bits=same))
        flag = "" if ws_ran else "  (ws kernel not seen in the trace)"
        print(f"{name:44s} {med['split']:9.1f} {med['ws']:9.1f} {med['ws'] / med['split']:8.3f} {splits:>11s}  "
              f"{'-' if same is None else same}{flag}", flush=True)
    del q, c, s, r, v, v8, vs, cases
    torch.cuda.empty_cache()
if a.json:
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)
