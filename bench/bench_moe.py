"""MXFP4 grouped GEMM and the gpt-oss MoE MLP of lowbit against the anchors a user would otherwise run.

    python bench/bench_moe.py [--models 20b,120b] [--tokens 1,16,4096] [--json PATH] [--quick]

Shapes: gpt-oss-20b (32 experts) and gpt-oss-120b (128 experts), top-4 routing, hidden 2880,
intermediate 2880: gate_up GEMM N=5760 K=2880, down GEMM N=2880 K=2880, T tokens -> cum_m = 4 T
rows after routing. Routing: router logits randn [T, E], top-4 distinct experts per token, softmax
of the 4 logits as weights; m_indptr (device int32) and the expert-sorted row order come from it.

Per (model, T, GEMM), in one process:
  moe_<gemm>_w4a8    lowbit.group_gemm_mxfp4_nt_groupwise, MXFP8 E4M3 activations (lowbit.quantize,
                     UE8M0 scales grouped 128x4 with FlashInfer padding; quantize not timed)
  moe_<gemm>_w4a16   the same on bf16 activations
  moe_<gemm>_w4a8_packed / _w4a16_packed   the same on weights prepared once by
                     lowbit.group_gemm_mxfp4_prepack (not timed; check: bits equal to the plain path)
  moe_<gemm>_w4a8_fp8   the opt-in FP8 tensor-core path (precision="fp8") on the same MXFP8
                     activations, weights from group_gemm_mxfp4_prepack(..., precision="fp8"); not
                     bit-exact: check = its error against the exact W4A8 output (rel_l2, max |diff| / max |ref|)
  vs torch_grouped_mm_bf16   torch._grouped_mm on the bf16 dequantized weights (mat_b = the
                             [G, N, K] weights viewed [G, K, N], K-major; offs = m_indptr[1:])
  vs torch_loop_bf16         torch.mm per non-empty expert (bf16; host offsets computed before timing)
  vs triton_kernels_mxfp4    OpenAI triton_kernels matmul_ogs (as vendored by vLLM: what it runs for
                             gpt-oss on Hopper) on the same MXFP4 weights and bf16 rows in expert
                             order, weights prepared as vLLM does (not timed); skipped where it does not import
Per T of the MLP part (20b shapes unless --mlp-models says otherwise):
  moe_mlp_bf16 / moe_mlp_mxfp8   lowbit.gpt_oss_moe_mlp, act="bf16" / "mxfp8" (_packed: on prepacked weights)
  vs torch_eager_grouped_mm / torch_eager_loop   route (argsort of topk_ids) -> gather -> gate_up
     GEMM + bias -> clamped SwiGLU (alpha 1.702, limit 7, gate = h[..., 0::2], up = h[..., 1::2])
     -> down GEMM + bias -> weighted sum (index_add_), GEMMs by torch._grouped_mm / per-expert loop
     (the loop reads the expert counts on the host: one device sync per call, as eager code does)
Columns: lowbit us, anchor us, x = anchor us / lowbit us (> 1: lowbit faster), rate = lowbit TFLOP/s
(2 cum_m N K), %ceil = fraction of the bf16 GEMM peak measured in this process. The note gives the
memory floor: bytes of the packed weights + scales (+ biases) of the ACTIVE experts only, plus
activations and output, over the measured copy bandwidth, and the fraction of it reached
(floor us / lowbit us). Checks (outside the timed region): rel_l2 = ||lowbit - ref|| / ||ref|| on the
first 8192 rows; ref: the bf16 per-expert loop (W4A16, MLP bf16), the loop on lowbit's dequantized
MXFP8 activations (W4A8), the eager loop with both GEMM inputs through MXFP8 and back (MLP mxfp8);
gmm~loop: torch._grouped_mm against the loop.
Until lowbit's CUDA kernels land its rows read "n/a (not implemented)" and the anchors are still
timed. Weights: random E2M1 codes, UE8M0 scales uniform in --weight-scales (default 118:127).

Timing: every row, lowbit's and the anchors', as CUDA-graph replays (--timing graph, the default;
CUDA events, L2 flushed before each replay): at small T an eager call would time the host cost of
whichever op has more Python (triton_kernels' matmul_ogs: 250-550 us per eager call on an H200).
Rows whose op cannot be captured (the per-expert loop reads the counts on the host) are timed as
eager calls and the report's meta says how many. --timing eager times host calls throughout.

The shapes, data helpers and the Bench class are in lowbit_bench/moe.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, import_torch_cuda, measure_ceilings  # noqa: E402
from lowbit_bench import moe  # noqa: E402
from lowbit_bench.moe import (  # noqa: E402
    Bench, DEFAULT_MLP_TOKENS, DEFAULT_TOKENS, _err, FAST_WINDOW, GEMMS, grouped_mm_op, HIDDEN, INTER, MODELS,
    QUICK_MLP_TOKENS, QUICK_TOKENS, TOPK
)

BENCH = "bench_moe"

torch = None  # imported in main() so that --help works without torch
lowbit = None


def _ints(s: str):
    return [int(v) for v in s.split(",") if v.strip()]


def _names(p: argparse.ArgumentParser, s: str, allowed, what: str):
    out = [v.strip() for v in s.split(",") if v.strip()]
    bad = [v for v in out if v not in allowed]
    if bad:
        p.error(f"unknown {what} {', '.join(bad)}: choose from {', '.join(allowed)}")
    return out


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(p)
    p.add_argument("--models", default="20b,120b", help="models of the grouped GEMM part (default 20b,120b)")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help=f"tokens T of the grouped GEMM part, cum_m = 4 T (default {','.join(map(str, DEFAULT_TOKENS))})")
    p.add_argument("--gemms", default="gate_up,down", help="GEMMs: gate_up (N=5760, K=2880), down (N=2880, K=2880)")
    p.add_argument("--mlp-models", default="20b", help="models of the MLP part (default 20b)")
    p.add_argument("--mlp-tokens", default=",".join(map(str, DEFAULT_MLP_TOKENS)),
                   help=f"tokens T of the MLP part (default {','.join(map(str, DEFAULT_MLP_TOKENS))})")
    p.add_argument("--no-gemm", action="store_true", help="skip the grouped GEMM part")
    p.add_argument("--no-mlp", action="store_true", help="skip the MLP part")
    p.add_argument("--b-scale-layout", choices=("blocked128x4", "row_major"), default="blocked128x4",
                   help="weight scale layout given to the grouped GEMM (default blocked128x4)")
    p.add_argument("--weight-scales", default="118:127",
                   help="LO:HI, inclusive range of the random UE8M0 weight scale bytes (default 118:127)")
    p.add_argument("--timing", choices=("graph", "eager"), default="graph",
                   help="graph: CUDA-graph replays of every row (default; eager where a capture fails, said in the "
                        "report); eager: host calls")
    p.add_argument("--small-timing", choices=("device", "host"), default="device",
                   help="--timing eager, T <= 16: 'host' syncs before each call so launch overhead counts "
                        "(default device)")
    p.add_argument("--max-seconds", type=float, default=10.0, help="cap on the timed loop of one measurement")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    try:
        lo, hi = (int(v) for v in args.weight_scales.split(":"))
        if not 0 <= lo <= hi <= 254:
            raise ValueError
    except ValueError:
        p.error(f"--weight-scales: expected LO:HI with 0 <= LO <= HI <= 254, got {args.weight_scales!r}")
    args.weight_scales = (lo, hi)
    args.models = _names(p, args.models, MODELS, "model")
    args.mlp_models = _names(p, args.mlp_models, MODELS, "model")
    args.gemms = _names(p, args.gemms, GEMMS, "GEMM")
    if args.quick and args.models == ["20b", "120b"]:
        args.models = ["20b"]
    tokens_default = args.tokens == ",".join(map(str, DEFAULT_TOKENS))
    mlp_default = args.mlp_tokens == ",".join(map(str, DEFAULT_MLP_TOKENS))
    try:
        args.tokens = QUICK_TOKENS if (args.quick and tokens_default) else _ints(args.tokens)
        args.mlp_tokens = QUICK_MLP_TOKENS if (args.quick and mlp_default) else _ints(args.mlp_tokens)
    except ValueError:
        p.error(f"--tokens / --mlp-tokens: expected comma-separated integers, got {args.tokens!r} / {args.mlp_tokens!r}")
    if any(t <= 0 for t in args.tokens + args.mlp_tokens):
        p.error("token counts must be positive")
    return args


def main(argv=None) -> int:
    global torch, lowbit
    args = parse_args(argv)
    torch = import_torch_cuda()
    if torch is None:
        return 2
    try:
        import lowbit as _lowbit

        lowbit = _lowbit
    except Exception as ex:  # noqa: BLE001
        print(f"lowbit not importable ({_err(ex)}): its rows will carry the error", file=sys.stderr)
        lowbit = None
    moe.torch, moe.lowbit = torch, lowbit  # the late imports, for the helpers and Bench (lowbit_bench/moe.py)
    dev = torch.device("cuda")
    ceilings = measure_ceilings(quick=args.quick)
    gmm = grouped_mm_op()
    lo, hi = args.weight_scales
    meta = {
        "timing": (f"{'CUDA-graph replays' if args.timing == 'graph' else 'eager calls'}, CUDA events, median of "
                   f"{args.iters if not args.quick else max(5, args.iters // 3)}, L2 {'not ' if args.no_flush else ''}"
                   f"flushed" + (f"; T <= 16: {args.small_timing}" if args.timing == "eager" else "")),
        "shapes": (f"hidden {HIDDEN}, intermediate {INTER}, top-{TOPK}; gate_up N={2 * INTER} K={HIDDEN}, "
                   f"down N={HIDDEN} K={INTER}; experts " + ", ".join(f"{m}: {e}" for m, e in MODELS.items())),
        "routing": "randn router logits, top-4 distinct experts per token, softmax of the 4 logits",
        "weights": (f"random E2M1 codes, UE8M0 scale bytes uniform in [{lo}, {hi}]; grouped GEMM b_scale "
                    f"{args.b_scale_layout}; MLP scales row-major; anchors on the bf16 dequantized weights"),
        "activations": "bf16 randn; W4A8: MXFP8 E4M3 (lowbit.quantize, RCEIL, grouped 128x4 FlashInfer pad), "
                       "quantize not timed",
        "grouped_mm": (f"{getattr(gmm, '__module__', '')}.{getattr(gmm, '__name__', '')}, mat_b = W[G,N,K]"
                       ".transpose(-2,-1), offs = m_indptr[1:] int32" if gmm is not None
                       else f"not available in torch {torch.__version__}: its rows are skipped"),
        "floor": "active experts' packed weights + scales (+ biases) + activations + output, / copy bandwidth",
    }
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    bench = Bench(args, report, dev)

    if not args.no_gemm:
        for model in args.models:
            for gemm in args.gemms:
                try:
                    bench.gemm_model(model, gemm, args.tokens)
                except Exception as ex:  # noqa: BLE001
                    report.add(Row(op=f"moe_{gemm}", shape=model, anchor="-", error="bench: " + _err(ex)))
                    if args.verbose:
                        traceback.print_exc()
                    torch.cuda.empty_cache()
    if not args.no_mlp:
        for model in args.mlp_models:
            try:
                bench.mlp_model(model, args.mlp_tokens)
            except Exception as ex:  # noqa: BLE001
                report.add(Row(op="moe_mlp", shape=model, anchor="-", error="bench: " + _err(ex)))
                if args.verbose:
                    traceback.print_exc()
                torch.cuda.empty_cache()

    key = f"weight scale bytes outside the one-multiply window [{FAST_WINDOW[0]}, {FAST_WINDOW[1]}]"
    if bench.scale_bytes:
        frac = bench.scale_outside / bench.scale_bytes
        window = f"{frac:.6f} ({bench.scale_outside} of {bench.scale_bytes} bytes)"
    else:
        window = "no weights generated"
    if bench.graph_failures:
        report.meta["graph_capture_failed"] = f"{len(bench.graph_failures)} rows: " + "; ".join(bench.graph_failures[:3])
    report.print_table(f"== {BENCH} summary ==")
    print(f"# {key}: {window}")
    report.meta[key] = window
    report.write_json()
    if report.json_path:
        print(f"# JSON: {report.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
