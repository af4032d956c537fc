"""The ops that fill lowbit's NF4 + FP8-residual K cache: the fused K projection + RoPE + encode of a
prefill (lowbit.kproj_rope_nf4_encode) and the append of decode tokens (lowbit.nf4_kcache_append).

    python bench/bench_kcache_encode.py [--json PATH] [--quick] [--budget-s S]
    python bench/bench_kcache_encode.py --device cpu     # smoke run on the CPU reference, no GPU

Rows (shape: b<B>_t<T>_e<hidden> for the encode, b<B>_t<T>_n<N> for the append; H_kv = 8,
D = 128, bf16 x / w_k / k_new (--fp32: float32 x / w_k), E5M2 residual):
  kproj_rope_nf4_encode   the whole op. rate = (x + w_k + positions read, codes + scales +
                          residuals written) / time; %ceil = rate / copy bandwidth. anchor:
                          torch.matmul(x, w_k.T) in bf16 (cuBLAS), the projection alone.
                          note: the split of the op's device time by kernel (torch.profiler):
                          gemm% = the projection + RoPE + amax kernel (bf16 operands: mma.sync
                          tensor cores with fp32 sums; --fp32 operands: the exact CUDA-core fp64
                          GEMM) and its TFLOP/s: whether the GEMM dominates
  kproj_encode_pass       the encode kernel alone (its device time from the profiler): fp32 keys
                          + scales read, codes + residuals written; %ceil against the copy bandwidth
  nf4_kcache_append       N new tokens, no channel outgrows its scale (the common decode step):
                          k_new + scales read, the new tokens' codes + residuals written. The time
                          includes the host round trip of the lengths (validated on the host)
  nf4_kcache_append_rescale  every channel outgrows its scale (the worst case): the cached tokens'
                          codes + residuals read and written besides (the scales are reset by a
                          small copy inside the timed call)

Timing: CUDA events, L2 flushed before every call (bench/lowbit_bench/timing.py). --device cpu times
lowbit's CPU reference with the host clock on NumPy arrays and a small shape (no torch needed); a
host memory copy stands in for the ceiling: it checks the bench code, not the speed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn  # noqa: E402
from lowbit_bench.timing import Timing, host_ceilings, host_time  # noqa: E402

BENCH = "bench_kcache_encode"
HK, D = 8, 128
ENCODE_SHAPES = [(1, 4096, 4096), (1, 16384, 4096), (8, 1024, 4096), (1, 4096, 8192)]
APPEND_SHAPES = [(32, 32768, 1), (1, 131072, 1), (8, 8192, 16)]
CPU_ENCODE = [(1, 64, 256)]
CPU_APPEND = [(2, 256, 1)]

torch = None
np = None
lowbit = None


def _err(ex: BaseException, limit: int = 300) -> str:
    s = f"{type(ex).__name__}: {ex}"
    return s if len(s) <= limit else s[:limit] + "..."


def kernel_split(fn, calls: int = 3):
    """{kernel name: device us per call} of fn() from torch.profiler (CUDA kernels), or None."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        out = {}
        for ev in prof.key_averages():
            us = getattr(ev, "device_time_total", None)
            if us is None:
                us = getattr(ev, "cuda_time_total", 0.0)
            if us:
                out[ev.key] = out.get(ev.key, 0.0) + us / calls
        return out or None
    except Exception:  # noqa: BLE001
        return None


class Bench:
    def __init__(self, args, report: Report):
        self.args, self.report = args, report
        self.cpu = args.device == "cpu"
        self.t0 = time.perf_counter()

    def over_budget(self) -> bool:
        return self.args.budget_s is not None and time.perf_counter() - self.t0 > self.args.budget_s

    def time(self, fn) -> Timing:
        if self.cpu:
            return host_time(fn, min(1, self.args.warmup), min(3, self.args.iters))
        return time_fn(fn, warmup=self.args.warmup, iters=self.args.iters, flush_l2=not self.args.no_flush,
                       max_seconds=20.0)

    # -- encode -------------------------------------------------------------------------------
    def encode(self, B, T, E):
        shape = f"b{B}_t{T}_e{E}"
        if self.over_budget():
            self.report.add(Row(op="kproj_rope_nf4_encode", shape=shape, error="skipped: --budget-s"))
            return
        rng = np.random.default_rng(B + T + E)
        x = rng.standard_normal((B, T, E), np.float32)
        w = (rng.standard_normal((HK * D, E), np.float32) / np.sqrt(E)).astype(np.float32)
        pos = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy()
        if self.cpu:
            xx, ww, pp = x, w, pos
        else:
            dt = torch.float32 if self.args.fp32 else torch.bfloat16
            xx = torch.from_numpy(x).cuda().to(dt)
            ww = torch.from_numpy(w).cuda().to(dt)
            pp = torch.from_numpy(pos).cuda()
        kw = dict(head_dim=D, rope_theta=500000.0)
        fn = lambda: lowbit.kproj_rope_nf4_encode(xx, ww, pp, **kw)  # noqa: E731
        c, s, r = fn()
        # check: the cache decodes to the rotated keys within the NF4 + E5M2 error
        k = lowbit.kproj_rope_nf4_encode(xx, ww, pp, return_k=True, **kw)[3]
        deq = lowbit.nf4_kcache_dequantize(c, s, r)
        if self.cpu:
            err = float(np.abs(np.asarray(deq, np.float64) - np.asarray(k, np.float64)).max() / np.abs(k).max())
        else:
            err = float(((deq.float() - k).abs().max() / k.abs().max()).item())
        check = f"max err {err:.1e} of amax" + ("" if err < 0.02 else " (too large)")
        t = self.time(fn)
        esz = 4 if self.cpu else 2
        n = B * T * HK * D
        nbytes = esz * (B * T * E + HK * D * E) + 4 * B * T + n // 2 + n + 4 * B * HK * D
        flops = 2.0 * B * T * E * HK * D
        note = f"GEMM {flops / 1e9:.1f} GFLOP; whole op {flops / (t.median_us * 1e-6) / 1e12:.2f} TFLOP/s"
        anchor, anchor_t = "", None
        split = None
        if not self.cpu:
            anchor = "torch_mm_bf16"
            xb, wb = xx.to(torch.bfloat16), ww.to(torch.bfloat16)
            anchor_t = self.time(lambda: torch.matmul(xb, wb.t()))
            split = kernel_split(fn)
        if not self.cpu and not split:  # no profiler: the encode passes bounded by a quantize of the keys
            tq = self.time(lambda: lowbit.nf4_kcache_quantize(k))
            share = max(0.0, 1.0 - tq.median_us / t.median_us)
            note += (f"; no profiler: nf4_kcache_quantize of the keys (zero + amax + encode passes) takes "
                     f"{tq.median_us:.0f} us, so the GEMM is >= {100 * share:.0f}% of the op and "
                     f"{'dominates' if share > 0.5 else 'does not dominate'}")
        if split:
            tot = sum(split.values())
            gemm = sum(v for k_, v in split.items() if "kproj_rope_amax" in k_)
            enc = sum(v for k_, v in split.items() if "kc_encode" in k_)
            note += (f"; kernels: gemm {gemm:.0f} us ({100 * gemm / tot:.0f}%, "
                     f"{flops / (gemm * 1e-6) / 1e12:.2f} TFLOP/s; torch bf16 matmul "
                     f"{flops / (anchor_t.median_us * 1e-6) / 1e12:.0f} TFLOP/s), encode {enc:.0f} us, "
                     f"other {tot - gemm - enc:.0f} us; the GEMM {'dominates' if gemm > 0.5 * tot else 'does not dominate'}")
        self.report.add(Row(op="kproj_rope_nf4_encode", shape=shape, lowbit_us=t.median_us, lowbit_p10_us=t.p10_us,
                            lowbit_p90_us=t.p90_us, anchor=anchor, anchor_us=anchor_t.median_us if anchor_t else None,
                            bytes=nbytes, timing=t.mode, check=check, note=note))
        if split:
            enc = sum(v for k_, v in split.items() if "kc_encode" in k_)
            if enc > 0:
                enc_bytes = 4 * n + 4 * B * HK * D + n // 2 + n
                self.report.add(Row(op="kproj_encode_pass", shape=shape, lowbit_us=enc, bytes=enc_bytes,
                                    timing="profiler", check=check,
                                    note="encode kernel alone: fp32 keys + scales read, codes + residuals written"))

    # -- append -------------------------------------------------------------------------------
    def append(self, B, T, N, rescale):
        op = "nf4_kcache_append_rescale" if rescale else "nf4_kcache_append"
        shape = f"b{B}_t{T}_n{N}"
        if self.over_budget():
            self.report.add(Row(op=op, shape=shape, error="skipped: --budget-s"))
            return
        rng = np.random.default_rng(B + T + N)
        L = T - N
        g = rng.standard_normal((B, N, HK, D), np.float32)
        # below the unit scales (|x| > 1 about once in 2e6), or above them everywhere
        new = (np.sign(g) * (2.0 + np.abs(g)) if rescale else 0.2 * g).astype(np.float32)
        lens = np.full((B,), L, np.int32)
        # a cache of unit scales with random codes / residuals (the bytes do not change the speed)
        c0 = rng.integers(0, 256, (B, T, HK, D // 2), dtype=np.uint8)
        r0 = rng.integers(0, 0x30, (B, T, HK, D), dtype=np.uint8)
        s0 = np.ones((B, HK, D), np.float32)
        if self.cpu:
            import ml_dtypes

            c, r, s, kn, ln = c0.copy(), r0.view(ml_dtypes.float8_e5m2).copy(), s0.copy(), new, lens
            reset = lambda: np.copyto(s, s0)  # noqa: E731
        else:
            c = torch.from_numpy(c0).cuda()
            r = torch.from_numpy(r0).cuda().view(torch.float8_e5m2)
            s = torch.from_numpy(s0).cuda()
            s_init = s.clone()
            kn = torch.from_numpy(new).cuda().to(torch.bfloat16)
            ln = torch.from_numpy(lens).cuda()
            reset = lambda: s.copy_(s_init)  # noqa: E731

        def fn():
            if rescale:
                reset()
            lowbit.nf4_kcache_append(kn, c, s, r, ln)

        fn()
        grown = float((np.asarray(s.cpu() if not self.cpu else s) > 1.0).mean())
        check = f"rescaled {100 * grown:.0f}% of channels"
        t = self.time(fn)
        n_new = B * N * HK * D
        nbytes = (4 if self.cpu else 2) * n_new + 4 * B + 2 * 4 * B * HK * D + n_new // 2 + n_new
        if rescale:
            n_old = B * L * HK * D
            nbytes += 2 * (n_old // 2 + n_old)
        self.report.add(Row(op=op, shape=shape, lowbit_us=t.median_us, lowbit_p10_us=t.p10_us, lowbit_p90_us=t.p90_us,
                            bytes=nbytes, timing=t.mode, check=check,
                            note="includes the host round trip of the lengths" + (
                                "; the cached tokens rewritten" if rescale else "")))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(p)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: smoke run on lowbit's CPU reference (small shapes, host clock, no torch needed)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed rows")
    p.add_argument("--fp32", action="store_true",
                   help="float32 x / w_k for the encode rows (the exact CUDA-core fp64 projection instead of tensor cores)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    global torch, np, lowbit
    args = parse_args(argv)
    import numpy as _np

    np = _np
    if args.device == "cuda":
        try:
            import torch as _torch
        except Exception as ex:  # noqa: BLE001
            print(f"torch is not importable ({_err(ex)}): nothing to time (--device cpu runs the smoke mode)",
                  file=sys.stderr)
            return 2
        torch = _torch
        if not torch.cuda.is_available():
            print("CUDA is not available: nothing to time (--device cpu runs the smoke mode)", file=sys.stderr)
            return 2
    import lowbit as _lowbit

    lowbit = _lowbit
    ceilings = host_ceilings() if args.device == "cpu" else measure_ceilings(quick=args.quick)
    meta = {"shapes": f"H_kv {HK}, D {D}, bf16 inputs (CPU: float32), E5M2 residual, rope_theta 5e5",
            "timing": ("host clock, CPU reference (smoke run)" if args.device == "cpu"
                       else f"CUDA events, median, L2 {'not ' if args.no_flush else ''}flushed"),
            "bytes": "the op's own inputs read and cache bytes written (module docstring); %ceil against copy"}
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    bench = Bench(args, report)
    enc_shapes = CPU_ENCODE if args.device == "cpu" else (ENCODE_SHAPES[:1] if args.quick else ENCODE_SHAPES)
    app_shapes = CPU_APPEND if args.device == "cpu" else (APPEND_SHAPES[:1] if args.quick else APPEND_SHAPES)
    jobs = [(bench.encode, s) for s in enc_shapes]
    jobs += [(bench.append, s + (rescale,)) for s in app_shapes for rescale in (False, True)]
    for fn, a in jobs:
        try:
            fn(*a)
        except Exception as ex:  # noqa: BLE001
            report.add(Row(op=fn.__name__, shape="x".join(str(v) for v in a), error="bench: " + _err(ex)))
            if args.verbose:
                traceback.print_exc()
            if torch is not None:
                torch.cuda.empty_cache()
    report.print_table(f"== {BENCH} ==")
    if report.json_path:
        print(f"# JSON: {report.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
