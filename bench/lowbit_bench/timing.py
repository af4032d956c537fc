"""The one timing helper of lowbit's Python benchmarks, and the measured ceilings.

time_fn() times a callable with CUDA events: warm-up first (module load, autotuning and
torch.compile stay out), an L2 flush before every timed call (outside the timed region),
input sets rotated per call, median with p10/p90 in microseconds. time_graph() times the replays
of a callable captured once in a CUDA graph the same way.

measure_ceilings() measures, once per process, the figures a result is compared with:
device-to-device copy bandwidth (bytes read + written), bf16 GEMM and FP8 row-wise
_scaled_mm rates at 8192^3.

Nothing here imports torch at module import time, so the report code stays importable on a
machine without torch.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["Timing", "time_fn", "time_graph", "l2_flush", "measure_ceilings", "quantile", "import_torch_cuda"]


@dataclasses.dataclass
class Timing:
    """Times of one timed callable, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    iters: int
    mode: str  # "device": events with the queue fed; "host": synchronised before each call

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty sequence (q in [0, 1])."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac)


_FLUSH: Dict[str, Any] = {}


def l2_flush(device=None) -> Callable[[], None]:
    """A callable that overwrites a buffer of max(256 MiB, 2 x L2 size) on the device.

    Writing (not reading) evicts every line the previous call left in L2, dirty ones included.
    The buffer is allocated once per process and device.
    """
    import torch

    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = str(dev)
    if key not in _FLUSH:
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20))
        nbytes = max(256 << 20, 2 * l2)
        _FLUSH[key] = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    buf = _FLUSH[key]

    def flush() -> None:
        buf.zero_()

    return flush


def time_fn(
    fn: Callable[..., Any],
    *,
    inputs: Optional[Sequence[tuple]] = None,
    warmup: int = 10,
    iters: int = 50,
    flush_l2: bool = True,
    sync: bool = False,
    max_seconds: Optional[float] = None,
    device: str = "cuda",
) -> Timing:
    """Median / p10 / p90 time of fn(*inputs[i % len(inputs)]) in microseconds.

    inputs: argument tuples, rotated per call so that one buffer staying in cache does not
        flatter the result (None: fn is called with no arguments).
    warmup: untimed calls first (compilation, autotuning, allocator growth).
    flush_l2: overwrite a >= 2 x L2 buffer before each timed call, outside the events.
    sync: synchronise the device before each call, so that the host's launch overhead (Python,
        argument checks, launches) lands inside the events: the latency a caller sees for
        launch-bound sizes. Without it the queue stays fed and the events measure device time.
    max_seconds: stop timing early (after at least 5 calls) once this much host time has passed.
    device: "cuda" (CUDA events, as above) or "cpu" (the host clock around each call, no L2
        flush; for smoke runs of a benchmark on a machine without a GPU: mode "host").
    """
    import time

    import torch

    if inputs is None or len(inputs) == 0:
        arg_sets: List[tuple] = [()]
    else:
        arg_sets = [tuple(a) for a in inputs]
    n = len(arg_sets)
    if device == "cpu":
        return _time_fn_cpu(fn, arg_sets, warmup, iters, max_seconds)
    flush = l2_flush() if flush_l2 else None

    for i in range(max(0, warmup)):
        fn(*arg_sets[i % n])
    torch.cuda.synchronize()

    iters = max(1, int(iters))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    t0 = time.perf_counter()
    done = 0
    for i in range(iters):
        args = arg_sets[i % n]
        if flush is not None:
            flush()
        if sync:
            torch.cuda.synchronize()
        starts[i].record()
        fn(*args)
        ends[i].record()
        done += 1
        if sync:
            ends[i].synchronize()
        if max_seconds is not None and done >= 5 and time.perf_counter() - t0 > max_seconds:
            break
    torch.cuda.synchronize()
    times = sorted(starts[i].elapsed_time(ends[i]) * 1e3 for i in range(done))
    return Timing(
        median_us=quantile(times, 0.5),
        p10_us=quantile(times, 0.1),
        p90_us=quantile(times, 0.9),
        iters=done,
        mode="host" if sync else "device",
    )


def time_graph(fn: Callable[[], Any], *, warmup: int = 3, iters: int = 50, flush_l2: bool = True,
               max_seconds: Optional[float] = None) -> Timing:
    """fn captured once in a CUDA graph (after `warmup` eager calls on a side stream, the usual
    warm-up before a capture), then its replays timed as time_fn times a call (mode "graph"): the
    device time without the host's Python and launch cost, as serving engines replay decode steps.
    Raises what the capture raises (an op that synchronises with the host cannot be captured)."""
    import torch

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    t = time_fn(graph.replay, warmup=2, iters=iters, flush_l2=flush_l2, max_seconds=max_seconds)
    return dataclasses.replace(t, mode="graph")


def _time_fn_cpu(fn, arg_sets, warmup, iters, max_seconds) -> Timing:
    import time

    n = len(arg_sets)
    for i in range(max(0, warmup)):
        fn(*arg_sets[i % n])
    times: List[float] = []
    t0 = time.perf_counter()
    for i in range(max(1, int(iters))):
        a = time.perf_counter()
        fn(*arg_sets[i % n])
        times.append((time.perf_counter() - a) * 1e6)
        if max_seconds is not None and len(times) >= 5 and time.perf_counter() - t0 > max_seconds:
            break
    times.sort()
    return Timing(median_us=quantile(times, 0.5), p10_us=quantile(times, 0.1), p90_us=quantile(times, 0.9),
                  iters=len(times), mode="host")


def host_time(fn: Callable[[], Any], warmup: int, iters: int) -> Timing:
    """Host clock (CPU smoke run): median / p10 / p90 of fn() in us."""
    return _time_fn_cpu(fn, [()], warmup, iters, None)


def host_ceilings() -> Dict[str, object]:
    """CPU smoke run: a NumPy copy of 64 MiB as the copy ceiling (read + written)."""
    import numpy as np

    a = np.ones(64 << 20, np.uint8)
    b = np.empty_like(a)
    t = host_time(lambda: np.copyto(b, a), 1, 5)
    return {"copy_tbs": 2 * a.nbytes / (t.median_us * 1e-6) / 1e12,
            "copy_note": "CPU smoke run: numpy copyto of 64 MiB on the host, (read + written) bytes"}


_CEILINGS: Dict[str, Any] = {}


def measure_ceilings(*, copy_bytes: int = 1 << 30, gemm_n: int = 8192, quick: bool = False) -> Dict[str, Any]:
    """Ceilings measured in this process (cached): a result is reported as a fraction of these.

    copy_tbs:       device-to-device copy of `copy_bytes` (1 GiB) with Tensor.copy_,
                    (bytes read + bytes written) / time, TB/s
    bf16_tflops:    cuBLAS bf16 GEMM gemm_n^3 through torch.matmul, TFLOP/s
    fp8_tflops:     torch._scaled_mm e4m3 x e4m3 -> bf16 with row-wise fp32 scales, TFLOP/s
                    (None where it is not available)
    Each entry has a *_note with the method; failures are recorded, never raised.
    """
    if _CEILINGS:
        return _CEILINGS
    import torch

    iters = 10 if quick else 30
    out: Dict[str, Any] = {}
    try:
        src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        t = time_fn(lambda s, d: d.copy_(s), inputs=[(src, dst)], warmup=3, iters=iters, flush_l2=False)
        out["copy_tbs"] = 2 * copy_bytes / (t.median_us * 1e-6) / 1e12
        out["copy_note"] = f"Tensor.copy_ of {copy_bytes >> 20} MiB, (read + written) bytes, median of {t.iters}"
        del src, dst
    except Exception as ex:  # noqa: BLE001
        out["copy_tbs"] = None
        out["copy_note"] = f"failed: {type(ex).__name__}: {ex}"
    n = gemm_n
    flops = 2.0 * n * n * n
    a = b = None
    try:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        t = time_fn(lambda x, y: torch.matmul(x, y.t()), inputs=[(a, b)], warmup=3, iters=iters, flush_l2=False)
        out["bf16_tflops"] = flops / (t.median_us * 1e-6) / 1e12
        out["bf16_note"] = f"torch.matmul bf16 {n}^3 (cuBLAS), median of {t.iters}"
    except Exception as ex:  # noqa: BLE001
        out["bf16_tflops"] = None
        out["bf16_note"] = f"failed: {type(ex).__name__}: {ex}"
    try:
        if a is None or not hasattr(torch, "_scaled_mm"):
            raise RuntimeError("torch._scaled_mm not available")
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn)
        sa = torch.ones(n, 1, device="cuda", dtype=torch.float32)
        sb = torch.ones(1, n, device="cuda", dtype=torch.float32)
        t = time_fn(lambda x, y: torch._scaled_mm(x, y.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                    inputs=[(a8, b8)], warmup=3, iters=iters, flush_l2=False)
        out["fp8_tflops"] = flops / (t.median_us * 1e-6) / 1e12
        out["fp8_note"] = f"torch._scaled_mm e4m3 row-wise scales {n}^3, median of {t.iters}"
        del a8, b8
    except Exception as ex:  # noqa: BLE001
        out["fp8_tflops"] = None
        out["fp8_note"] = f"not available: {type(ex).__name__}: {ex}"
    del a, b
    torch.cuda.empty_cache()
    _CEILINGS.update(out)
    return _CEILINGS


def import_torch_cuda():
    """torch when it imports and sees a CUDA device; otherwise None, after saying why on stderr (a
    benchmark then has nothing to time)."""
    import sys

    try:
        import torch
    except Exception as ex:  # noqa: BLE001
        msg = " ".join(f"{type(ex).__name__}: {ex}".split())
        msg = msg if len(msg) <= 300 else msg[:298] + ".."
        print(f"torch is not importable ({msg}): nothing to time (this benchmark needs torch with CUDA)",
              file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to time (this benchmark needs an H100 / H200 with torch CUDA)",
              file=sys.stderr)
        return None
    return torch
