"""Forward latency of small transformers models on lowbit's torch modules against the same
model in bfloat16 (the dequantized weights), eager and captured in a CUDA graph.

    python bench/bench_nn.py [--cases llama:nvfp4,gpt-oss:mxfp4] [--shapes 1x1,1x128,8x256] [--json PATH]
    python bench/bench_nn.py --device cpu --quick      # smoke run on the CPU reference (no GPU)

Models (random, bfloat16, 2 layers; tests/python/nn_models.py): llama (hidden 256, intermediate
512), gpt-oss (hidden 256, 4 experts top 2), bert (MiniLM-like, hidden 384). lowbit.nn.quantize_model
puts NVFP4Linear / MXFP4Linear / GptOssExperts in; the anchor is the model before it, holding the
dequantized weights in bfloat16 (cuBLAS GEMMs, transformers' own MoE loop).

Rows per (model:format, batch x sequence):
  <model>_<fmt>_eager   lowbit model, eager forward        vs bf16_eager  the bf16 model, eager
  <model>_<fmt>_graph   lowbit model replayed from a CUDA graph   vs bf16_graph   the same for bf16
                        (not gpt-oss: transformers' expert loop syncs with the host, so its bf16
                        model cannot be captured)
Columns: lowbit us, anchor us (median, CUDA events; the models are small, so these are mostly
launch and host time), x = anchor us / lowbit us (> 1: lowbit faster). check: the per-token
relative error of the lowbit model's output against the bf16 model (max over tokens; the
tolerance of tests/python/test_nn.py). --device cpu times the CPU reference with the host clock
(mode "host"): a smoke run of the script, not a performance figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

from lowbit_bench import Report, Row, add_common_args, import_torch_cuda, time_fn  # noqa: E402

BENCH = "bench_nn"
DEFAULT_SHAPES = "1x1,1x128,8x256"
QUICK_SHAPES = "1x16"


def _shapes(s):
    out = []
    for part in s.split(","):
        b, t = part.lower().split("x")
        out.append((int(b), int(t)))
    return out


def _graphed(case, model, torch):
    """A zero-argument callable replaying one forward of `model` captured in a CUDA graph."""
    static = dict(case.inputs)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(2):  # warm-up outside the capture
            case.run(model, **static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        case.run(model, **static)
    return g.replay


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--cases", default=None, help="model:format list (default: all of nn_models.MODEL_CASES)")
    p.add_argument("--shapes", default=None, help=f"batch x sequence list (default {DEFAULT_SHAPES}; --quick "
                                                  f"{QUICK_SHAPES})")
    p.add_argument("--no-graph", action="store_true", help="eager rows only")
    add_common_args(p)
    args = p.parse_args(argv)

    if args.device == "cuda":
        torch = import_torch_cuda()
        if torch is None:
            return 0
    else:
        import torch
    try:
        from nn_models import MODEL_CASES, TOL, build_case, forward_fn, token_rel_errors
    except ImportError as ex:
        print(f"bench_nn needs transformers ({ex}): nothing to time", file=sys.stderr)
        return 0
    cases = MODEL_CASES if not args.cases else [tuple(c.split(":")) for c in args.cases.split(",")]
    shapes = _shapes(args.shapes or (QUICK_SHAPES if args.quick or args.device == "cpu" else DEFAULT_SHAPES))
    iters, warmup = (5, 2) if args.quick or args.device == "cpu" else (args.iters, args.warmup)
    report = Report(BENCH, args.json, meta={"device": args.device, "cases": cases, "shapes": shapes,
                                            "tolerance": TOL})
    t_start = time.perf_counter()
    rc = 0
    for name, fmt in cases:
        for (B, T) in shapes:
            shape = f"{B}x{T}"
            if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
                report.add(Row(op=f"{name}_{fmt}_eager", shape=shape, anchor="bf16_eager", note="skipped (budget)"))
                continue
            try:
                case = build_case(name, fmt, args.device, batch=B, seq=T)
                errs = token_rel_errors(case)
                err = float(errs.max())
                try:
                    case.check(errs)  # gpt-oss: 90% of the tokens within the tolerance (routing ties)
                    ok = True
                except AssertionError:
                    ok = False
                check = f"{'ok' if ok else 'FAIL'} err {err:.3g} (tol {TOL[fmt]:g})"
                rc |= 0 if ok else 1
                kw = dict(warmup=warmup, iters=iters, flush_l2=not args.no_flush, device=args.device)
                lo = time_fn(forward_fn(case, "lowbit"), **kw)
                an = time_fn(forward_fn(case, "bf16"), **kw)
                report.add(Row(op=f"{name}_{fmt}_eager", shape=shape, lowbit_us=lo.median_us, anchor="bf16_eager",
                               anchor_us=an.median_us, lowbit_p10_us=lo.p10_us, lowbit_p90_us=lo.p90_us,
                               anchor_p10_us=an.p10_us, anchor_p90_us=an.p90_us, timing=lo.mode, check=check,
                               note=f"{len(case.report.replaced)} modules replaced"))
                if args.device == "cuda" and not args.no_graph and name == "gpt-oss":
                    report.add(Row(op=f"{name}_{fmt}_graph", shape=shape, anchor="bf16_graph",
                                   note="not captured: transformers' expert loop reads the routing on the host"))
                elif args.device == "cuda" and not args.no_graph:
                    try:
                        glo = time_fn(_graphed(case, case.model, torch), **kw)
                        gan = time_fn(_graphed(case, case.ref, torch), **kw)
                        report.add(Row(op=f"{name}_{fmt}_graph", shape=shape, lowbit_us=glo.median_us,
                                       anchor="bf16_graph", anchor_us=gan.median_us, lowbit_p10_us=glo.p10_us,
                                       lowbit_p90_us=glo.p90_us, anchor_p10_us=gan.p10_us,
                                       anchor_p90_us=gan.p90_us, timing=glo.mode, check=check))
                    except Exception as ex:  # noqa: BLE001 - a model that cannot be captured: say so
                        report.add(Row(op=f"{name}_{fmt}_graph", shape=shape, anchor="bf16_graph",
                                       error=f"capture failed: {type(ex).__name__}: {ex}"[:200]))
            except Exception as ex:  # noqa: BLE001 - report and go on
                traceback.print_exc()
                report.add(Row(op=f"{name}_{fmt}_eager", shape=shape, anchor="bf16_eager",
                               error=f"{type(ex).__name__}: {ex}"[:200]))
                rc = 1
    report.print_table(f"{BENCH} ({args.device})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
