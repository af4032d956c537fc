"""Expert-parallel gpt-oss MoE layer (lowbit.moe.ExpertParallelMoE) scaling over GPUs: tokens/s and
per-layer latency of gpt-oss-120b's MoE layer at the world size it is launched with, the
all-to-all time shown apart.

    torchrun --nproc-per-node N bench/bench_moe_ep.py [--tokens 256,1024,4096,16384] [--json PATH]
    python bench/bench_moe_ep.py --nproc N ...              (spawns the N ranks itself)
    python bench/bench_moe_ep.py --device cpu --backend gloo --nproc 2 --quick   (CPU smoke run)

NVLink multicast stays off: the process sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
and NVSHMEM_DISABLE_NVLS=1 (lowbit.moe.set_nvls_env) before torch.distributed starts, and the ranks
it spawns inherit them; under torchrun they are set in each rank before init_process_group.

Shapes (gpt-oss-120b): hidden 2880, intermediate 2880, 128 experts, top-4; each rank holds 128 / N
experts (random MXFP4 codes, UE8M0 scale bytes uniform in [118, 127], prepacked with
group_gemm_mxfp4_prepack; random biases). A step of T tokens (--tokens, the whole step's tokens)
gives every rank T / N of them; routing: randn router logits, top-4, softmax of the 4 logits
(lowbit.moe.route's rule). The layer runs in capacity mode (static splits, no host
synchronisation; rows per rank pair = --capacity-factor (default 2) x their mean T/N x 4 / N, at
most the worst case T/N x 4; pairs beyond it would be dropped and counted in the row's note, their
tokens NaN; --mode exact exchanges the counts first), the experts on the contiguous layout
(--layout masked: the masked one), activations dispatched as bf16 (--dispatch mxfp8: MXFP8 with
act="mxfp8"), expert outputs combined in float32 (--combine bfloat16: bf16).

Per T, rank 0 reports (one row each):
  moe_ep_<N>gpu_<dispatch>    the layer's step as a CUDA-graph replay (--timing graph, the default;
                              eager calls time the layer's Python and launches too: 1.1 ms of the
                              1.9 ms step at T = 256 on one H200), CUDA events around it on every
                              rank (the same step on all of them), L2 flushed before each step; the median of the
                              slowest rank's times. Note: tokens/s = T / step, the all-to-alls'
                              device time per step (dispatch, combine: CUDA events around each
                              dist.all_to_all_single in a second timed loop, mean over the steps,
                              slowest rank; it includes waiting for the slowest peer), their bytes.
  anchor gpt_oss_moe_mlp_1gpu the single-GPU lowbit.gpt_oss_moe_mlp on all T tokens with all 128
                              experts (rank 0's GPU, the same weights and routing), timed in the
                              same run; x = anchor / step: the speedup of N GPUs.
rate: TFLOP/s of the expert GEMMs (2 T k (2I H + H I)) at the step's latency, %ceil: against the
bf16 GEMM peak measured in this process. The CPU smoke run (tiny shapes, gloo, the CPU reference
experts, the host clock) checks that the code runs, not the speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn, time_graph  # noqa: E402

BENCH = "bench_moe_ep"
HIDDEN, INTER, EXPERTS, TOPK = 2880, 2880, 128, 4
DEFAULT_TOKENS = (256, 1024, 4096, 16384)
QUICK_TOKENS = (256, 4096)
SMOKE = dict(hidden=64, inter=32, experts=8, tokens=(16, 32))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(p)
    p.add_argument("--tokens", default=None, help="tokens per step over all ranks (default 256,1024,4096,16384)")
    p.add_argument("--nproc", type=int, default=1, help="ranks to spawn when not run under torchrun (default 1)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the smoke run (tiny shapes)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default nccl (cuda), gloo (cpu)")
    p.add_argument("--dispatch", choices=("bf16", "mxfp8"), default="bf16", help="dispatched activations")
    p.add_argument("--combine", choices=("float32", "bfloat16"), default="float32", help="combined expert outputs")
    p.add_argument("--layout", choices=("contiguous", "masked"), default="contiguous", help="the experts' layout")
    p.add_argument("--mode", choices=("capacity", "exact"), default="capacity",
                   help="capacity (static splits, no host sync) or exact (counts exchanged first, one host sync)")
    p.add_argument("--capacity-factor", type=float, default=2.0,
                   help="capacity mode: rows per rank pair = factor x the mean (T/N x top-4 / N), at most the "
                        "worst case T/N x top-4; 0: the worst case (default 2)")
    p.add_argument("--no-anchor", action="store_true", help="skip the single-GPU gpt_oss_moe_mlp anchor")
    p.add_argument("--timing", choices=("graph", "eager"), default="graph",
                   help="graph (default, CUDA): the step and the anchor as CUDA-graph replays, as serving engines "
                        "run decode steps (capacity mode is capturable; where a capture fails on any rank every "
                        "rank times eager calls and the row says so); eager: host calls, which include the "
                        "layer's Python and launch cost")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    if args.backend is None:
        args.backend = "gloo" if args.device == "cpu" else "nccl"
    default = SMOKE["tokens"] if args.device == "cpu" else (QUICK_TOKENS if args.quick else DEFAULT_TOKENS)
    try:
        args.tokens = [int(v) for v in args.tokens.split(",")] if args.tokens else list(default)
    except ValueError:
        p.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
    if any(t <= 0 for t in args.tokens) or args.nproc <= 0:
        p.error("token counts and --nproc must be positive")
    return args


def _shapes(args):
    if args.device == "cpu":
        return SMOKE["hidden"], SMOKE["inter"], SMOKE["experts"]
    return HIDDEN, INTER, EXPERTS


def _weights(torch, lowbit, E, H, I, dev, gen):
    """Random MXFP4 expert weights (codes, UE8M0 scale bytes in [118, 127]) prepacked for the kernels
    (on CUDA; the CPU smoke run keeps them plain), random biases."""
    def w(rows, k):
        codes = torch.randint(0, 256, (E, rows, k // 2), dtype=torch.uint8, device=dev, generator=gen)
        scales = torch.randint(118, 128, (E, rows, k // 32), dtype=torch.uint8, device=dev, generator=gen)
        if dev.type == "cuda":
            return lowbit.group_gemm_mxfp4_prepack(codes, scales, b_scale_layout="row_major")
        return codes, scales

    w1, s1 = w(2 * I, H)
    w2, s2 = w(H, I)
    b1 = torch.randn((E, 2 * I), device=dev, generator=gen) * 0.1
    b2 = torch.randn((E, H), device=dev, generator=gen) * 0.1
    return [w1, s1, b1, w2, s2, b2]


def _routing(torch, T, E, dev, gen):
    logits = torch.randn((T, E), device=dev, generator=gen)
    vals, idx = torch.topk(logits, TOPK, dim=-1)
    return idx.to(torch.int32), torch.softmax(vals, dim=1).float()


def run_rank(rank, world, args, port=None):
    import torch
    import torch.distributed as dist

    import lowbit
    from lowbit.moe import ExpertParallelMoE, set_nvls_env, shard_experts

    set_nvls_env()
    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if world > 1:
        if port is not None:
            dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        else:
            dist.init_process_group(args.backend)
    H, I, E = _shapes(args)
    timing = "cpu" if not cuda else "cuda"
    iters = max(5, args.iters // 3) if args.quick else args.iters
    report = None
    if rank == 0:
        meta = {
            "world": f"{world} rank(s), backend {args.backend if world > 1 else 'none'}, device {args.device}",
            "shapes": f"hidden {H}, intermediate {I}, {E} experts ({E // world} per rank), top-{TOPK}",
            "layer": (f"{args.mode} mode (capacity factor {args.capacity_factor:g} of the mean rows per rank pair), "
                      f"{args.layout} layout, dispatch {args.dispatch}, combine {args.combine}, "
                      f"act {'mxfp8' if args.dispatch == 'mxfp8' else 'bf16'}"),
            "nvlink_multicast": "off: " + ", ".join(f"{k}={os.environ.get(k)}" for k in
                                                    ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                     "NVSHMEM_DISABLE_NVLS")),
            "timing": (f"{'CUDA-graph replays, ' if cuda and args.timing == 'graph' else ''}"
                       f"{'CUDA events' if cuda else 'host clock'}, median of {iters}, slowest rank; L2 "
                       f"{'not ' if args.no_flush or not cuda else ''}flushed; all-to-alls: "
                       f"{'CUDA events' if cuda else 'the host clock'} around each, mean per step, slowest rank "
                       f"(incl. waiting for peers)"),
        }
        ceilings = measure_ceilings(quick=True) if cuda else {}
        report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    gen = torch.Generator(device=dev).manual_seed(1234)
    full = _weights(torch, lowbit, E, H, I, dev, gen)
    mine = shard_experts(full, rank, world)
    if rank != 0 or args.no_anchor:
        del full
        full = None
    reduce = (lambda v: _max_over(torch, dist, v, dev)) if world > 1 else (lambda v: v)
    import time

    def timed(fn, collective):
        """(Timing, note prefix): CUDA-graph replays (--timing graph on CUDA), else eager calls. A failed
        capture on any rank (collective: decided together, so that every rank times the same way) falls
        back to eager calls, said in the note."""
        how = ""
        if cuda and args.timing == "graph":
            got, why = None, "on another rank"
            try:
                got = time_graph(fn, warmup=max(1, args.warmup), iters=iters, flush_l2=not args.no_flush)
            except Exception as ex:  # noqa: BLE001
                why = f"{type(ex).__name__}: {str(ex)[:100]}"
                torch.cuda.synchronize()
            failed = reduce(float(got is None)) if collective else float(got is None)
            if not failed:
                return got, ""
            how = f"eager calls (graph capture failed: {why}); "
        return time_fn(fn, warmup=args.warmup, iters=iters, flush_l2=cuda and not args.no_flush, device=timing), how

    t0 = time.perf_counter()
    for T in args.tokens:
        Tr = max(1, T // world)
        # --budget-s: rank 0 decides, every rank follows (the steps are collective)
        over = float(args.budget_s is not None and time.perf_counter() - t0 > args.budget_s)
        if reduce(over) > 0:
            if report is not None:
                report.add(Row(op=f"moe_ep_{world}{'gpu' if cuda else 'cpu'}_{args.dispatch}", shape=f"T{T}",
                               note="skipped: time budget"))
            continue
        gen.manual_seed(4321 + T)
        # every rank draws all ranks' routings from one seed and takes its own slice
        ids_all, w_all = _routing(torch, Tr * world, E, dev, gen)
        x_all = torch.randn((Tr * world, H), device=dev, generator=gen).to(torch.bfloat16)
        sl = slice(rank * Tr, (rank + 1) * Tr)
        x, ids, wts = x_all[sl].contiguous(), ids_all[sl].contiguous(), w_all[sl].contiguous()
        act = "mxfp8" if args.dispatch == "mxfp8" else "bf16"
        row = Row(op=f"moe_ep_{world}{'gpu' if cuda else 'cpu'}_{args.dispatch}", shape=f"T{T}",
                  flops=2.0 * T * TOPK * (2 * I * H + H * I), timing="device" if cuda else "host")
        try:
            worst = Tr * TOPK
            cap = worst if args.capacity_factor <= 0 else min(worst, int(args.capacity_factor * worst / world + 0.999))
            layer = ExpertParallelMoE(*mine, num_experts=E, top_k=TOPK, act=act,
                                      quantize_dispatch=args.dispatch == "mxfp8", combine_dtype=args.combine,
                                      mode=args.mode, max_tokens_per_rank=Tr, capacity=cap,
                                      expert_layout=args.layout if args.mode == "capacity" else "contiguous",
                                      expected_m=max(1, Tr * world * TOPK // E), packed=cuda,
                                      on_overflow="nan")
            t, how = timed(lambda: layer(x, ids, wts), world > 1)
            ph = layer.record_phases()
            for _ in range(iters):
                layer(x, ids, wts)
            if cuda:
                torch.cuda.synchronize()
            ms = ph.elapsed_ms()
            layer.record_phases(False)
            dropped = layer.dropped.clone()  # pairs beyond the capacity (their tokens' rows are NaN)
            if world > 1:
                dist.all_reduce(dropped)
            dropped = int(dropped.item())
            med, p10, p90 = reduce(t.median_us), reduce(t.p10_us), reduce(t.p90_us)
            disp = reduce(1e3 * (ms.get("dispatch", 0.0) + ms.get("dispatch_counts", 0.0)) / iters)
            comb = reduce(1e3 * ms.get("combine", 0.0) / iters)
            row.lowbit_us, row.lowbit_p10_us, row.lowbit_p90_us = med, p10, p90
            rb = -(-(16 + (H + H // 32 if args.dispatch == "mxfp8" else 2 * H)) // 16) * 16
            cb = H * (4 if args.combine == "float32" else 2)
            rows = world * cap if args.mode == "capacity" else Tr * TOPK  # rows one rank sends per all-to-all
            row.bytes = world * rows * (rb + cb)  # all-to-all bytes sent by all ranks in one step
            row.note = (how + f"{T / (med * 1e-6):.4g} tokens/s; all-to-all dispatch {disp:.1f} us + combine {comb:.1f} us "
                        f"({100 * (disp + comb) / med:.0f}% of the step); each rank sends {rows} rows x "
                        f"({rb} + {cb}) B ({args.mode}, capacity {cap} per rank pair); dropped {dropped}"
                        + (" (NaN rows: raise --capacity-factor)" if dropped else ""))
        except Exception as ex:  # noqa: BLE001
            row.error = f"{type(ex).__name__}: {ex}"
            if args.verbose:
                traceback.print_exc()
        if rank == 0 and full is not None and not row.error:
            try:
                row.anchor = "gpt_oss_moe_mlp_1gpu" if cuda else "gpt_oss_moe_mlp_1cpu"
                w1, s1, b1, w2, s2, b2 = full
                a, how_a = timed(lambda: lowbit.gpt_oss_moe_mlp(x_all, ids_all, w_all, w1, s1, b1, w2, s2, b2,
                                                                act=act, packed=cuda), False)
                if how_a:
                    row.note += "; anchor " + how_a.rstrip("; ")
                row.anchor_us, row.anchor_p10_us, row.anchor_p90_us = a.median_us, a.p10_us, a.p90_us
            except Exception as ex:  # noqa: BLE001
                row.note += f"; anchor failed: {type(ex).__name__}: {ex}"
        if world > 1:
            dist.barrier()
        if report is not None:
            report.add(row)
    if report is not None:
        report.print_table(f"{BENCH}: {world} rank(s)")
    if world > 1:
        dist.destroy_process_group()
    return 0


def _max_over(torch, dist, v, dev):
    t = torch.tensor([float(v)], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _spawned(rank, world, args, port):
    run_rank(rank, world, args, port)


def main(argv=None) -> int:
    args = parse_args(argv)
    from lowbit.moe import set_nvls_env

    set_nvls_env()  # before torch.distributed, inherited by spawned ranks
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        return run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    if args.nproc == 1:
        return run_rank(0, 1, args)
    import socket

    import torch.multiprocessing as mp

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(_spawned, args=(args.nproc, args, port), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
