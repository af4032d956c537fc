"""Same-machine A/B of lowbit's pre-attention kernels across builds of the package.

Times one fixed set of calls that every build since the grouped GEMM's prepack exposes with the
same signature (conversions, the NF4 K cache encode, the NVFP4 dual GEMM, the MXFP4 grouped GEMM
W4A16 / W4A8 and the gpt-oss MoE MLP), so that two builds (say, before and after a code move)
can be compared kernel by kernel on one machine. Run it once per build, alternating, then
compare the JSON files:

    python bench/dev/ab_kernels.py --site /tmp/before --label before --json $OUT/ab_before_1.json
    python bench/dev/ab_kernels.py --site /tmp/after  --label after  --json $OUT/ab_after_1.json
    python bench/dev/ab_kernels.py --compare $OUT/ab_before_*.json -- $OUT/ab_after_*.json

`--site` is a `pip install --target` folder (put first on sys.path); the timing helper is this
repository's (bench/lowbit_bench). Every call is timed as CUDA-graph replays (L2 flushed before
each), or as eager calls where a build's call cannot be captured (the row says which). Inputs
are seeded and identical across builds; each row also records a checksum of its output, so a
compare shows whether the builds computed the same bits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))


def _cases(lowbit, torch, dev, smoke=False) -> Dict[str, Callable[[], object]]:
    # smoke: small shapes on the CPU reference, to check this script without a GPU
    sz = (lambda big, small: small if smoke else big)
    g = torch.Generator(device="cpu").manual_seed(1234)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dev, torch.bfloat16)

    def rbytes(shape, lo, hi):
        return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32).to(torch.uint8).to(dev)

    cases: Dict[str, Callable[[], object]] = {}
    # conversions: bf16 [16384, 7168] into each block format and back
    x = randn(sz(16384, 64), sz(7168, 256))
    amax = torch.tensor([float(x.float().abs().max())], device=dev, dtype=torch.float32)
    for fmt in ("mxfp8_e4m3", "mxfp4", "nvfp4", "fp8_e4m3", "int4", "nf4"):
        kw = {"global_amax": amax} if fmt == "nvfp4" else {}
        q = lowbit.quantize(x, fmt, **kw)
        cases[f"quantize_{fmt}"] = (lambda f=fmt, k=kw: lowbit.quantize(x, f, **k))
        cases[f"dequantize_{fmt}"] = (lambda q=q: lowbit.dequantize(q, "bfloat16"))
    # NF4 + FP8 residual K cache encode, [B, T, H, D]
    k = randn(sz(8, 1), sz(4096, 64), sz(8, 2), 128)
    cases["nf4_kcache_quantize_b8_t4096"] = lambda: lowbit.nf4_kcache_quantize(k)
    # NVFP4 dual GEMM + SiLU on prepacked weights (random codes, E4M3 scale bytes 0x30..0x40)
    N, K = sz(4096, 128), sz(7168, 256)
    b1, b2 = rbytes((N, K // 2), 0, 255), rbytes((N, K // 2), 0, 255)
    s1, s2 = rbytes((N, K // 16), 0x30, 0x40), rbytes((N, K // 16), 0x30, 0x40)
    packed = None if smoke else lowbit.nvfp4_dual_gemm_prepack(b1, b2, s1, s2)  # prepack is CUDA-only
    wkw = dict(b1=b1, b2=b2, sfb1=s1, sfb2=s2) if smoke else dict(packed_b=packed, n=N)
    for M in sz((16, 256, 4096), (16,)):
        a, sa = rbytes((M, K // 2), 0, 255), rbytes((M, K // 16), 0x30, 0x40)
        out = torch.empty(M, N, dtype=torch.float16, device=dev)
        cases[f"dual_gemm_{M}x{N}x{K}"] = (lambda a=a, sa=sa, out=out, M=M: lowbit.nvfp4_dual_gemm_silu(
            a, sfa=sa, out=out, **wkw))
    # MXFP4 grouped GEMM, gpt-oss-20b gate_up (32 experts, top-4), prepacked weights
    G, N, K = 32, sz(5760, 128), sz(2880, 256)
    w, ws = rbytes((G, N, K // 2), 0, 255), rbytes((G, N, K // 32), 118, 127)
    if smoke:
        pb, ps, gkw = w, ws, dict(b_scale_layout="row_major")
    else:
        pb, ps = lowbit.group_gemm_mxfp4_prepack(w, ws, b_scale_layout="row_major")
        gkw = dict(b_packed=True)
    for T in sz((16, 256, 4096), (16,)):
        ids = torch.stack([torch.randperm(G, generator=g)[:4] for _ in range(T)]).flatten()
        counts = torch.bincount(ids, minlength=G)
        m_indptr = torch.zeros(G + 1, dtype=torch.int32)
        m_indptr[1:] = counts.cumsum(0)
        m_indptr = m_indptr.to(dev)
        a16 = randn(4 * T, K)
        out = torch.empty(4 * T, N, dtype=torch.bfloat16, device=dev)
        qa = lowbit.quantize(a16, "mxfp8_e4m3", "blocked128x4", m_indptr=m_indptr, group_pad="flashinfer")
        cases[f"group_gemm_w4a16_T{T}"] = (lambda a16=a16, mi=m_indptr, out=out: lowbit.group_gemm_mxfp4_nt_groupwise(
            a16, pb, None, ps, mi, "bfloat16", out=out, **gkw))
        cases[f"group_gemm_w4a8_T{T}"] = (lambda qa=qa, mi=m_indptr, out=out: lowbit.group_gemm_mxfp4_nt_groupwise(
            qa.data, pb, qa.scales, ps, mi, "bfloat16", out=out, **gkw))
    # gpt-oss-20b expert MLP (hidden 2880, intermediate 2880, 32 experts, top-4), prepacked
    E, H, I = 32, sz(2880, 256), sz(2880, 256)
    w1, w1s = rbytes((E, 2 * I, H // 2), 0, 255), rbytes((E, 2 * I, H // 32), 118, 125)
    w2, w2s = rbytes((E, H, I // 2), 0, 255), rbytes((E, H, I // 32), 118, 125)
    bias1, bias2 = randn(E, 2 * I).float(), randn(E, H).float()
    if smoke:
        p1, p2 = (w1, w1s), (w2, w2s)
    else:
        p1 = lowbit.group_gemm_mxfp4_prepack(w1, w1s, b_scale_layout="row_major")
        p2 = lowbit.group_gemm_mxfp4_prepack(w2, w2s, b_scale_layout="row_major")
    for T in sz((16, 4096), (16,)):
        xt = randn(T, H)
        ids = torch.stack([torch.randperm(E, generator=g)[:4] for _ in range(T)]).to(dev, torch.int32)
        wts = torch.softmax(torch.randn(T, 4, generator=g), -1).to(dev, torch.float32)
        for act in ("bf16", "mxfp8"):
            cases[f"moe_mlp_{act}_T{T}"] = (lambda xt=xt, ids=ids, wts=wts, act=act: lowbit.gpt_oss_moe_mlp(
                xt, ids, wts, p1[0], p1[1], bias1, p2[0], p2[1], bias2, act=act, packed=not smoke))
    return cases


def _checksum(torch, o) -> str:
    if o is None:
        return "-"
    if isinstance(o, (tuple, list)):
        return "|".join(_checksum(torch, t) for t in o)
    if not torch.is_tensor(o) and hasattr(o, "data"):  # a lowbit.Quantized: its tensors
        parts = [getattr(o, a) for a in ("data", "scales", "zeros", "global_amax") if torch.is_tensor(getattr(o, a, None))]
        return "|".join(_checksum(torch, t) for t in parts)
    if not torch.is_tensor(o):
        return type(o).__name__
    b = o.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    w = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return f"{int((b * w).sum()) & 0xFFFFFFFF:08x}"


def run(args) -> int:
    sys.path.insert(0, args.site)
    sys.path.insert(0, os.path.join(HERE, ".."))
    import torch
    import lowbit
    from lowbit_bench.timing import time_fn, time_graph

    if args.smoke:
        for name, fn in _cases(lowbit, torch, "cpu", smoke=True).items():
            print(f"{name:<34} {_checksum(torch, fn())}", flush=True)
        return 0
    dev = "cuda"
    cases = _cases(lowbit, torch, dev)
    rows = []
    if args.kernels:  # the device kernels of one call each, with their times (torch.profiler)
        from torch.profiler import ProfilerActivity, profile
        for name, fn in cases.items():
            if args.only and not any(s in name for s in args.only.split(",")):
                continue
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0:
                    us = getattr(e, "self_device_time_total", 0.0) / max(1, e.count)
                    print(f"{args.label:>8} {name:<30} {e.count:3d}x {us:9.1f} us  {e.key[:110]}", flush=True)
        return 0
    for name, fn in cases.items():
        if args.only and not any(s in name for s in args.only.split(",")):
            continue
        o = fn()
        torch.cuda.synchronize()
        mode = "graph"
        try:
            t = time_graph(fn, iters=args.iters)
        except Exception as ex:  # a build's call that cannot be captured is timed eagerly
            mode = f"eager ({type(ex).__name__})"
            torch.cuda.synchronize()
            t = time_fn(fn, iters=args.iters)
        rows.append({"case": name, "us": t.median_us, "p10": t.p10_us, "p90": t.p90_us, "mode": mode,
                     "sum": _checksum(torch, o)})
        print(f"{args.label:>8} {name:<34} {t.median_us:10.1f} us  [{mode}]", flush=True)
    meta = {"label": args.label, "site": args.site, "lowbit": getattr(lowbit, "__file__", "?"),
            "device": torch.cuda.get_device_name(0)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


def compare(a_files: List[str], b_files: List[str]) -> int:
    def load(files):
        per: Dict[str, List[float]] = {}
        sums: Dict[str, set] = {}
        modes: Dict[str, str] = {}
        for fn in files:
            for r in json.load(open(fn))["rows"]:
                per.setdefault(r["case"], []).append(r["us"])
                sums.setdefault(r["case"], set()).add(r["sum"])
                modes[r["case"]] = r["mode"]
        return per, sums, modes

    pa, sa, ma = load(a_files)
    pb, sb, mb = load(b_files)
    print("| case | A us | B us | B / A | same bits | timing |")
    print("|---|---|---|---|---|---|")
    for c in pa:
        if c not in pb:
            continue
        a, b = min(pa[c]), min(pb[c])  # best of the alternating runs
        same = "yes" if sa[c] == sb[c] and len(sa[c]) == 1 else "NO"
        print(f"| {c} | {a:.1f} | {b:.1f} | {b / a:.3f} | {same} | {ma[c]} / {mb[c]} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", help="folder holding the lowbit build to time (pip install --target)")
    p.add_argument("--label", default="build")
    p.add_argument("--json")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--kernels", action="store_true", help="list each call's device kernels and times (no table)")
    p.add_argument("--smoke", action="store_true", help="small shapes on the CPU, untimed (checks the script)")
    p.add_argument("--only", default="", help="comma-separated substrings of case names")
    p.add_argument("--compare", nargs="+", help="A json files, then -- and the B json files")
    args, rest = p.parse_known_args(argv)
    if args.compare:
        b = [r for r in rest if r != "--"]
        return compare(args.compare, b)
    if not args.site:
        p.error("--site is required")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
