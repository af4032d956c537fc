"""Per-call wall time of the lowbit Python entry points on small (decode-step) inputs.

At 1 x 7168 and 16 x 7168 a CUDA kernel of lowbit takes a few microseconds, so what a caller
sees per call is the host-side cost of the Python layer (argument parsing, output allocation,
DLPack conversion, stream lookup) plus one launch. This times each function call by call with
the host clock, with no device synchronisation inside the timed region, and prints the median
(and p10 / p90) over many calls:

  host_us    median wall time of one call (what a decode loop pays per call on the CPU side)
  loop_us    (time of N back-to-back calls + one device sync) / N: the throughput figure;
             it exceeds host_us only when the device, not the host, is the bottleneck
  python_us  median of (wall time - time inside the lowbit._C entry point) per call, from a
             second pass with the _C entry points wrapped: the Python layer's own share (the
             rest is DLPack / nanobind conversion, C++ validation and the launch, or on the
             host the CPU reference's compute)

On CUDA (torch with a GPU and lowbit built with its kernels) the inputs are CUDA tensors; else
the CPU reference runs on NumPy arrays (and on torch CPU tensors when torch is importable),
where the compute of the reference itself is included in the times. Reference rows for
comparison: ``torch: x.float()`` (one torch kernel launch incl. allocation) and, on CUDA,
``torch.empty x2`` (the two output allocations every quantize needs).

    python3 bench/bench_call_overhead.py                 # auto: cuda if available, else cpu
    python3 bench/bench_call_overhead.py --backend numpy --budget-s 0.5
    python3 bench/bench_call_overhead.py --json out.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback


def _percentile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


_KERNEL_ENTRIES = ("quantize", "dequantize", "transcode", "cast", "convert_scale_layout", "tensor_amax",
                   "nf4_kcache_quantize", "nf4_kcache_dequantize", "nvfp4_dual_gemm", "nvfp4_dual_gemm_prepack",
                   "group_gemm_mxfp4", "gpt_oss_moe_mlp")


class _KernelClock:
    """Wraps the op entry points of lowbit._C to add up the time spent inside them (binding
    conversion, C++ validation, the kernel launch or the CPU reference): host time minus this
    is the Python layer's own time. The wrapper itself adds ~0.1 us per call."""

    def __init__(self, C):
        self.C, self.saved, self.t = C, {}, 0.0

    def __enter__(self):
        pc = time.perf_counter
        for name in _KERNEL_ENTRIES:
            f = getattr(self.C, name, None)
            if f is None:
                continue
            self.saved[name] = f

            def wrapped(*a, _f=f, **k):
                t0 = pc()
                try:
                    return _f(*a, **k)
                finally:
                    self.t += pc() - t0

            setattr(self.C, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, f in self.saved.items():
            setattr(self.C, name, f)


def _time_split(fn, C, n):
    """Median over n calls of (host time - time inside lowbit._C), us."""
    pc = time.perf_counter
    out = []
    with _KernelClock(C) as kc:
        for _ in range(n):
            kc.t = 0.0
            a = pc()
            fn()
            out.append((pc() - a - kc.t) * 1e6)
    return statistics.median(out)


def _time_calls(fn, sync, budget_s, max_calls, min_calls=5):
    """Per-call host times (us) and the loop figure (us per call incl. a final sync)."""
    for _ in range(3):  # warm-up: first-call caches, allocator, lazy init
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    n = int(min(max_calls, max(min_calls, budget_s / 2 / one)))
    pc = time.perf_counter
    times = []
    for _ in range(n):
        a = pc()
        fn()
        times.append(pc() - a)
    sync()
    t0 = pc()
    for _ in range(n):
        fn()
    sync()
    loop = (pc() - t0) / n
    times.sort()
    return ([t * 1e6 for t in times], loop * 1e6, n)


def _make_cases(lowbit, backend, M, K, torch):
    """name -> zero-argument callable, inputs built once outside the timed region."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    xn = rng.standard_normal((M, K)).astype(np.float32)
    if backend == "numpy":
        x = xn.astype(ml_dtypes.bfloat16)
    else:
        dev = "cuda" if backend == "cuda" else "cpu"
        x = torch.from_numpy(xn).to(dev).to(torch.bfloat16)
    q8 = lowbit.quantize(x, "mxfp8_e4m3")
    row_scales = lowbit.mxfp8_quantize(x)[1]
    # dual GEMM: A [M, K/2] NVFP4 codes, B1 / B2 [N, K/2], row-major E4M3 scales; N = 128 (its minimum)
    N = 128
    a_q, a_s = lowbit.nvfp4_quantize(x)
    if backend == "numpy":
        w = rng.standard_normal((N, K)).astype(ml_dtypes.bfloat16)
    else:
        w = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)).to(x.device).to(torch.bfloat16)
    b1_q, b1_s = lowbit.nvfp4_quantize(w)
    b2_q, b2_s = lowbit.nvfp4_quantize(-w)
    cases = {
        "quantize(x, 'mxfp8_e4m3')": lambda: lowbit.quantize(x, "mxfp8_e4m3"),
        "mxfp8_quantize(x)": lambda: lowbit.mxfp8_quantize(x),
        "mxfp8_quantize(x, swizzled=True)": lambda: lowbit.mxfp8_quantize(x, swizzled=True),
        "mxfp4_quantize(x)": lambda: lowbit.mxfp4_quantize(x),
        "nvfp4_quantize(x)": lambda: lowbit.nvfp4_quantize(x),
        "per_token_group_quant(x)": lambda: lowbit.per_token_group_quant(x),
        "per_token_group_quant(x, col-major, tma)": lambda: lowbit.per_token_group_quant(
            x, column_major_scales=True, tma_aligned=True),
        "dequantize(mxfp8 -> bf16)": lambda: lowbit.dequantize(q8, "bfloat16"),
        "cast(x, fp8_e4m3)": lambda: lowbit.cast(x),
        "block_scale_interleave(scales)": lambda: lowbit.block_scale_interleave(row_scales),
        "nvfp4_dual_gemm_silu (N=128)": lambda: lowbit.nvfp4_dual_gemm_silu(a_q, b1_q, b2_q, a_s, b1_s, b2_s),
    }
    refs = {}
    # the binding alone: _C.quantize (MXFP8 E4M3, row-major) on prepared outputs, no Python layer
    C = lowbit._C
    fa = (lowbit.Format("mxfp8_e4m3").c_format,)
    tail = (C.ScaleLayout(C.ScaleLayoutKind.row_major, 1, C.GroupPad.none),)
    D = C.DType
    if backend == "numpy":
        xv = x.view(np.uint16)
        qb = np.empty((M, K), np.uint8)
        sb = np.empty((M, K // 32), np.uint8)
        refs["_C.quantize direct (mxfp8)"] = lambda: C.quantize(xv, D.bfloat16, qb, D.float8_e4m3fn, sb,
                                                                D.float8_e8m0fnu, *fa, *tail, None, None, False,
                                                                None, 0)
    else:
        dl = getattr(torch._C, "_to_dlpack", None) or (lambda t: t)
        qb = torch.empty((M, K), dtype=torch.uint8, device=x.device)
        sb = torch.empty((M, K // 32), dtype=torch.uint8, device=x.device)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        dev = x.device.index or 0
        stream = (lambda: raw(dev)) if backend == "cuda" and raw is not None else (lambda: 0)
        refs["_C.quantize direct (mxfp8)"] = lambda: C.quantize(dl(x), D.bfloat16, dl(qb), D.float8_e4m3fn, dl(sb),
                                                                D.float8_e8m0fnu, *fa, *tail, None, None, False,
                                                                None, stream())
    if backend == "numpy":
        refs["numpy: x.astype(float32)"] = lambda: x.astype(np.float32)
    else:
        refs["torch: x.float()"] = lambda: x.float()
        if backend == "cuda":
            refs["torch.empty x2"] = lambda: (torch.empty((M, K), dtype=torch.uint8, device=x.device),
                                              torch.empty((M, K // 32), dtype=torch.uint8, device=x.device))
    return cases, refs


def _run_backend(lowbit, backend, shapes, args, torch):
    sync = (lambda: torch.cuda.synchronize()) if backend == "cuda" else (lambda: None)
    rows = []
    for (M, K) in shapes:
        try:
            cases, refs = _make_cases(lowbit, backend, M, K, torch)
        except Exception as e:  # noqa: BLE001 - report and go on
            rows.append({"backend": backend, "shape": f"{M}x{K}", "op": "(setup)", "error": repr(e)})
            continue
        for kind, table in (("lowbit", cases), ("reference", refs)):
            for name, fn in table.items():
                row = {"backend": backend, "shape": f"{M}x{K}", "op": name, "kind": kind}
                try:
                    times, loop, n = _time_calls(fn, sync, args.budget_s, args.max_calls)
                    row.update(host_us=statistics.median(times), p10_us=_percentile(times, 0.1),
                               p90_us=_percentile(times, 0.9), loop_us=loop, calls=n)
                    if args.split and kind == "lowbit":
                        sync()
                        row["python_us"] = _time_split(fn, lowbit._C, n)
                        sync()
                except NotImplementedError as e:
                    row["error"] = f"not built: {e}".splitlines()[0][:80]
                except Exception as e:  # noqa: BLE001
                    row["error"] = repr(e).splitlines()[0][:120]
                    if args.verbose:
                        traceback.print_exc()
                rows.append(row)
                _print_row(row)
    return rows


def _print_header(backend, device):
    print(f"\n== backend {backend} ({device}) ==")
    print(f"{'shape':>8}  {'op':42s} {'host_us':>9} {'p10':>8} {'p90':>8} {'loop_us':>9} {'calls':>6} "
          f"{'python_us':>9}")


def _print_row(r):
    if "error" in r:
        print(f"{r['shape']:>8}  {r['op']:42s} {r['error']}")
    else:
        py = f"{r['python_us']:9.2f}" if "python_us" in r else f"{'':>9}"
        print(f"{r['shape']:>8}  {r['op']:42s} {r['host_us']:9.2f} {r['p10_us']:8.2f} {r['p90_us']:8.2f} "
              f"{r['loop_us']:9.2f} {r['calls']:6d} {py}")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("auto", "cuda", "torch", "numpy"), default="auto",
                    help="auto: cuda when torch sees a GPU and lowbit has CUDA kernels, else numpy (+ torch CPU)")
    ap.add_argument("--shapes", default="1x7168,16x7168", help="comma-separated MxK")
    ap.add_argument("--budget-s", type=float, default=1.0, help="time per (op, shape), seconds (default 1)")
    ap.add_argument("--max-calls", type=int, default=20000, help="upper bound of timed calls per (op, shape)")
    ap.add_argument("--json", default=None, help="write the rows as JSON here (default $OUT/call_overhead.json "
                                                 "when $OUT is set)")
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="skip the python_us column (a second timing pass per row)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    try:
        import lowbit
    except ImportError as e:
        print(f"bench_call_overhead: cannot import lowbit ({e}); install the package first "
              f"(pip install .)", file=sys.stderr)
        return 2
    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F811
    info = lowbit.build_info()
    cuda_ok = torch is not None and torch.cuda.is_available() and info.get("cuda_built", False)

    shapes = []
    for s in args.shapes.split(","):
        m, k = s.lower().split("x")
        shapes.append((int(m), int(k)))

    if args.backend == "auto":
        backends = ["cuda"] if cuda_ok else (["numpy", "torch"] if torch is not None else ["numpy"])
    else:
        backends = [args.backend]
    print(f"lowbit {info.get('version')} cuda_built={info.get('cuda_built')} device={info.get('device_name') or '-'}"
          f"; torch {torch.__version__ if torch is not None else '(not installed)'}; python "
          f"{sys.version.split()[0]}")
    rows = []
    for be in backends:
        if be == "cuda" and not cuda_ok:
            print("backend cuda: not available (torch without CUDA, no GPU, or lowbit built without CUDA)")
            continue
        if be in ("torch", "cuda") and torch is None:
            print(f"backend {be}: torch is not installed")
            continue
        device = torch.cuda.get_device_name() if be == "cuda" else "host CPU reference"
        _print_header(be, device)
        rows += _run_backend(lowbit, be, shapes, args, torch)

    path = args.json or (os.path.join(os.environ["OUT"], "call_overhead.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"build_info": info, "rows": rows}, f, indent=1, default=str)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
