"""The dense 4-bit linears (lowbit.nvfp4_gemm, lowbit.mxfp4_gemm) against the GEMMs a user would
otherwise run, on Llama-style shapes.

    python bench/bench_linear.py [--shapes MxNxK,...] [--ms 1,16,...] [--json PATH] [--quick] [--budget-s S]
    python bench/bench_linear.py --device cpu        # smoke run on the CPU reference (no GPU)

C[M, N] = A[M, K] @ W[N, K]^T with bf16 activations (W4A16) unless said. Default shapes: N x K in
4096x4096, 6144x4096, 28672x4096, 4096x14336, 8192x8192 (q/k/v/o, gate/up, down, a 70B-size
projection), M in 1, 16, 64, 256, 4096 (--ms, or --shapes MxNxK for explicit triples).

Rows, each timed eagerly (CUDA events, L2 flushed; "eager") and as CUDA-graph replays ("graph",
the device time a serving engine's captured decode step sees):
  nvfp4_gemm_prepacked    weights laid out once by nvfp4_gemm_prepack (what lowbit.nn runs)
  nvfp4_gemm_one_call     the plain weights (the layout is made inside every call)
  mxfp4_gemm_prepacked    weights from mxfp4_gemm_prepack
  mxfp4_gemm_w4a8         mxfp4_gemm_prepacked with MXFP8 (E4M3) activations quantized beforehand
anchors in the same process:
  torch_bf16              cuBLAS bf16 (torch.matmul of bf16 A and a bf16 W of the same shape)
  triton_kernels_mxfp4    OpenAI triton_kernels matmul_ogs with the MXFP4 weights (no routing: one
                          dense matmul; weights prepared as vLLM prepares them on Hopper), where it
                          imports (mxfp4 rows only)
Columns: x = anchor us / lowbit us (> 1: lowbit faster); rate = lowbit TFLOP/s (2 M N K) and %ceil
its fraction of the bf16 GEMM peak measured in this process; the note gives the fraction of the
memory floor (4-bit weights with their scales + bf16 A + bf16 C at the copy bandwidth) and the
check (rel_l2 of lowbit's output against an fp32 product of the dequantized weights).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn, time_graph  # noqa: E402
from lowbit_bench.triton_mxfp4 import tk_weights  # noqa: E402

BENCH = "bench_linear"
DEFAULT_NK = ["4096x4096", "6144x4096", "28672x4096", "4096x14336", "8192x8192"]
DEFAULT_MS = "1,16,64,256,4096"
OPS = ["nvfp4_gemm_prepacked", "nvfp4_gemm_one_call", "mxfp4_gemm_prepacked", "mxfp4_gemm_w4a8"]

torch = None  # imported in main()
lowbit = None


def _err(ex: BaseException, limit: int = 240) -> str:
    s = " ".join(f"{type(ex).__name__}: {ex}".split())
    return s if len(s) <= limit else s[: limit - 2] + ".."


def rel_l2(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class Bench:
    def __init__(self, args, report: Report, ceilings):
        self.args, self.report = args, report
        self.cpu = args.device == "cpu"
        self.peak = ceilings.get("bf16_tflops") or float("nan")
        self.copy = ceilings.get("copy_tbs") or float("nan")
        self.t0 = time.perf_counter()
        self.tk, self.tk_why = None, "CPU smoke run"
        if not self.cpu:
            try:
                from triton_kernels.matmul_ogs import matmul_ogs

                self.tk, self.tk_why = matmul_ogs, ""
            except Exception as ex:  # noqa: BLE001
                self.tk_why = "triton_kernels does not import: " + _err(ex, 120)

    def over_budget(self) -> bool:
        return self.args.budget_s is not None and time.perf_counter() - self.t0 > self.args.budget_s

    def times(self, fn):
        """(eager, graph) Timings; graph None on the CPU, the reason when the capture fails."""
        if self.cpu:
            return time_fn(fn, warmup=1, iters=3, device="cpu"), None
        kw = dict(iters=self.args.iters if not self.args.quick else max(10, self.args.iters // 3),
                  flush_l2=not self.args.no_flush, max_seconds=20.0)
        eager = time_fn(fn, warmup=self.args.warmup, **kw)
        try:
            graph = time_graph(fn, **kw)
        except Exception as ex:  # noqa: BLE001
            graph = "capture failed: " + _err(ex, 120)
        return eager, graph

    def shape(self, M, N, K):
        shape = f"{M}x{N}x{K}"
        if self.over_budget():
            self.report.add(Row(op="linear", shape=shape, error="skipped: --budget-s"))
            return
        dev = "cpu" if self.cpu else "cuda"
        g = torch.Generator(device=dev).manual_seed(M + N + K)
        w = torch.randn((N, K), generator=g, device=dev) * 0.05
        a = torch.randn((M, K), generator=g, device=dev).to(torch.bfloat16)
        flops = 2.0 * M * N * K
        wbytes = {"nvfp4": N * K // 2 + N * K // 16, "mxfp4": N * K // 2 + N * K // 32}
        fns, refs, notes = {}, {}, {}
        try:
            qn = lowbit.quantize(w, "nvfp4", "row_major", compute_global_amax=True)
            pn = lowbit.nvfp4_gemm_prepack(qn.data, qn.scales)
            refs["nvfp4"] = a.float() @ lowbit.dequantize(qn, "float32").t()
            fns["nvfp4_gemm_prepacked"] = lambda: lowbit.nvfp4_gemm(a, pn, None, amax_b=qn.global_amax, b_packed=True,
                                                                   n=N)
            fns["nvfp4_gemm_one_call"] = lambda: lowbit.nvfp4_gemm(a, qn.data, qn.scales, amax_b=qn.global_amax)
        except Exception as ex:  # noqa: BLE001
            notes["nvfp4"] = "nvfp4 setup: " + _err(ex)
        try:
            qm = lowbit.quantize(w, "mxfp4", "row_major")
            pb, ps = lowbit.mxfp4_gemm_prepack(qm.data, qm.scales)
            refs["mxfp4"] = a.float() @ lowbit.dequantize(qm, "float32").t()
            a8, s8 = lowbit.mxfp8_quantize(a, swizzled=False, rounding="rceil")
            fns["mxfp4_gemm_prepacked"] = lambda: lowbit.mxfp4_gemm(a, pb, ps, b_packed=True, n=N)
            fns["mxfp4_gemm_w4a8"] = lambda: lowbit.mxfp4_gemm(a8, pb, ps, a_scale=s8, b_packed=True, n=N)
        except Exception as ex:  # noqa: BLE001
            notes["mxfp4"] = "mxfp4 setup: " + _err(ex)
        # anchors
        anchors = {}
        wb = w.to(torch.bfloat16)
        anchors["torch_bf16"] = self.times(lambda: a @ wb.t())  # cuBLAS on CUDA, the CPU GEMM in a smoke run
        tk_row = self.tk_why
        if self.tk is not None and "mxfp4" in refs:
            try:
                w_tk, pc = tk_weights(qm.data[None], qm.scales[None])  # one expert
                out_tk = self.tk(a, w_tk, None, None, precision_config=pc)
                tk_row = f"triton_kernels rel_l2 {rel_l2(out_tk.reshape(M, N), refs['mxfp4']):.1e}"
                anchors["triton_kernels_mxfp4"] = self.times(lambda: self.tk(a, w_tk, None, None, precision_config=pc))
            except Exception as ex:  # noqa: BLE001
                tk_row = "triton_kernels: " + _err(ex, 160)
        for op in OPS:
            fmt = op.split("_")[0]
            if op not in fns:
                self.report.add(Row(op=op, shape=shape, anchor="-", error=notes.get(fmt, "not run")))
                continue
            nbytes = wbytes[fmt] + (M * K if op.endswith("w4a8") else 2 * M * K) + 2 * M * N
            floor_us = nbytes / (self.copy * 1e6)
            try:
                out = fns[op]()
                check = f"rel_l2 {rel_l2(out, refs[fmt]):.1e}"
                if op.endswith("w4a8"):
                    check += " (MXFP8 activations)"
                t_eager, t_graph = self.times(fns[op])
            except NotImplementedError as ex:
                self.report.add(Row(op=op, shape=shape, anchor="-", error="not supported: " + _err(ex, 160)))
                continue
            except Exception as ex:  # noqa: BLE001
                self.report.add(Row(op=op, shape=shape, anchor="-", error=_err(ex)))
                if self.args.verbose:
                    traceback.print_exc()
                continue
            for mode, t in (("eager", t_eager), ("graph", t_graph)):
                if t is None:  # CPU smoke run: no graph replays
                    continue
                if isinstance(t, str):
                    self.report.add(Row(op=f"{op}_{mode}", shape=shape, anchor="-", error=t))
                    continue
                mine = [an for an in anchors if not (an == "triton_kernels_mxfp4" and fmt != "mxfp4")]
                if not mine:  # a row even when no anchor was timed
                    self.report.add(Row(op=f"{op}_{mode}", shape=shape, lowbit_us=t.median_us, anchor="-", flops=flops,
                                        bytes=nbytes, rate_unit="TFLOP/s", ceiling="bf16_tflops", timing=t.mode,
                                        check=check, note="no anchor timed"))
                for an in mine:
                    a_eager, a_graph = anchors[an]
                    ta = a_eager if mode == "eager" else a_graph
                    note = (f"floor {floor_us:.1f} us = {floor_us / t.median_us:.2f} of lowbit's time"
                            if math.isfinite(floor_us) else "no copy bandwidth measured (CPU)")
                    if an == "triton_kernels_mxfp4":
                        note += f"; {tk_row}"
                    self.report.add(Row(
                        op=f"{op}_{mode}", shape=shape, lowbit_us=t.median_us, lowbit_p10_us=t.p10_us,
                        lowbit_p90_us=t.p90_us, anchor=an, anchor_us=None if isinstance(ta, str) else ta.median_us,
                        flops=flops, bytes=nbytes, rate_unit="TFLOP/s", ceiling="bf16_tflops", timing=t.mode,
                        check=check, note=note, error=ta if isinstance(ta, str) else ""))


def main(argv=None) -> int:
    global torch, lowbit
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--shapes", default=None, help="explicit MxNxK list (overrides --nk / --ms)")
    p.add_argument("--nk", default=",".join(DEFAULT_NK), help="NxK list")
    p.add_argument("--ms", default=DEFAULT_MS, help="M list")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of this script on lowbit's CPU reference (small shapes, host clock)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    import torch as _torch

    import lowbit as _lowbit

    torch, lowbit = _torch, _lowbit
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to time (--device cpu runs the smoke run)", file=sys.stderr)
        return 2
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
    elif args.device == "cpu":
        shapes = [(3, 256, 128), (17, 128, 256)]
    else:
        ms = [int(v) for v in args.ms.split(",") if v.strip()]
        nks = [tuple(int(v) for v in s.split("x")) for s in args.nk.split(",") if s.strip()]
        shapes = [(m, n, k) for n, k in nks for m in ms]
    if args.quick:
        shapes = shapes[:3]
    if args.device == "cpu":
        ceilings = {}
    else:
        ceilings = measure_ceilings(quick=args.quick)
    meta = {"timing": "CUDA events, L2 flushed; eager calls and CUDA-graph replays" if args.device == "cuda"
            else "host clock (CPU smoke run)"}
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    bench = Bench(args, report, ceilings)
    for M, N, K in shapes:
        try:
            bench.shape(M, N, K)
        except Exception as ex:  # noqa: BLE001
            report.add(Row(op="linear", shape=f"{M}x{N}x{K}", anchor="-", error=_err(ex)))
            if args.verbose:
                traceback.print_exc()
    report.print_table(f"== {BENCH} summary ==")
    return 0


if __name__ == "__main__":
    sys.exit(main())
