"""NVFP4 dual GEMM + SiLU (lowbit.nvfp4_dual_gemm_silu) against the anchors a user would otherwise run.

    python bench/bench_dual_gemm.py [--shapes 256x4096x7168,...] [--json PATH] [--quick]

Per M x N x K shape (C = silu(A B1^T) * (A B2^T), N outputs per matrix), in one process:
  lowbit, prepacked weights     vs  torch_bf16_concat: cuBLAS bf16 (torch.matmul) of A against
                                    [B1; B2] concatenated (one GEMM), then silu(g) * u
  lowbit, prepacked weights     vs  torch_fp8_rowwise: torch._scaled_mm e4m3 x e4m3, row-wise fp32
                                    scales, then silu(g) * u (faster, but not exact for NVFP4 data)
  lowbit, one call on the plain GPU MODE layout (prepack included) vs torch_bf16_concat
Rate: TFLOP/s (4 M N K) and its fraction of the bf16 GEMM peak measured in this process; the note
gives the fraction of the memory floor (packed operand bytes / measured copy bandwidth).
Inputs follow the GPU MODE generator (FP4 bytes & 0xBB, E4M3 scales of U(0, 1)). Before timing,
the smallest shape is checked against lowbit's CPU reference with the GPU MODE rule.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn  # noqa: E402

import torch  # noqa: E402

BENCH = "bench_dual_gemm"
DEFAULT_SHAPES = ["256x4096x7168", "512x4096x7168", "256x3072x4096", "512x3072x7168", "16x4096x7168",
                  "64x4096x7168", "4096x4096x7168"]


def _inputs(M, N, K, dev):
    g = torch.Generator(device=dev).manual_seed(M * 7 + N + K)
    fp4 = lambda r: (torch.randint(0, 256, (r, K // 2), dtype=torch.uint8, device=dev, generator=g) & 0xBB)  # noqa: E731
    sf = lambda r: torch.rand((r, K // 16), device=dev, generator=g).to(torch.float8_e4m3fn)  # noqa: E731
    return fp4(M), fp4(N), fp4(N), sf(M), sf(N), sf(N)


def _check(lowbit, M, N, K, dev) -> str:
    a, b1, b2, sa, s1, s2 = _inputs(M, N, K, dev)
    got = lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sa, s1, s2).float().cpu()
    cpu = [t.cpu().view(torch.uint8).numpy() for t in (a, b1, b2, sa, s1, s2)]
    ref = torch.from_numpy(lowbit.nvfp4_dual_gemm_silu(*cpu).astype("float32"))
    bad = int(((got - ref).abs() > 1e-3 + 1e-3 * ref.abs()).sum())
    return f"gpu-vs-ref {M}x{N}x{K}: {bad} misses"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="MxNxK list")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to time", file=sys.stderr)
        return 2
    import lowbit

    dev = torch.device("cuda")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
    if args.quick:
        shapes = shapes[:2]
    ceilings = measure_ceilings(quick=args.quick)
    check = ""
    try:
        smallest = min(shapes, key=lambda s: s[0] * s[1] * s[2])
        check = _check(lowbit, smallest[0], smallest[1], min(smallest[2], 2048), dev)
    except Exception as ex:  # noqa: BLE001
        check = f"check failed: {type(ex).__name__}: {ex}"
    meta = {"timing": f"CUDA events, median of {args.iters}, L2 {'not ' if args.no_flush else ''}flushed",
            "inputs": "GPU MODE distribution (FP4 bytes & 0xBB, E4M3 scales of U(0,1))", "check": check}
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    peak = ceilings.get("bf16_tflops") or float("nan")
    copy = ceilings.get("copy_tbs") or float("nan")
    timing = dict(warmup=args.warmup, iters=args.iters, flush_l2=not args.no_flush)
    for M, N, K in shapes:
        shape = f"{M}x{N}x{K}"
        flops = 4.0 * M * N * K
        nbytes = M * K // 2 + M * K // 16 + 2 * (N * K // 2 + N * K // 16) + M * N * 2
        floor_us = nbytes / (copy * 1e6)
        try:
            a, b1, b2, sa, s1, s2 = _inputs(M, N, K, dev)
            packed = lowbit.nvfp4_dual_gemm_prepack(b1, b2, s1, s2)
            c = torch.empty((M, N), dtype=torch.float16, device=dev)
            t_pre = time_fn(lambda: lowbit.nvfp4_dual_gemm_silu(a, sfa=sa, packed_b=packed, n=N, out=c), **timing)
            t_one = time_fn(lambda: lowbit.nvfp4_dual_gemm_silu(a, b1, b2, sa, s1, s2, out=c), **timing)
            # anchors on operands of the same shapes
            A16 = torch.randn((M, K), dtype=torch.bfloat16, device=dev)
            W16 = torch.randn((2 * N, K), dtype=torch.bfloat16, device=dev)

            def bf16_concat():
                g, u = (A16 @ W16.t()).split(N, dim=1)
                return torch.nn.functional.silu(g) * u

            t_bf16 = time_fn(bf16_concat, **timing)
            t_fp8 = None
            try:
                A8, W8 = A16.to(torch.float8_e4m3fn), W16.to(torch.float8_e4m3fn)
                sa8 = torch.ones((M, 1), dtype=torch.float32, device=dev)
                sw8 = torch.ones((1, 2 * N), dtype=torch.float32, device=dev)

                def fp8_rowwise():
                    gu = torch._scaled_mm(A8, W8.t(), scale_a=sa8, scale_b=sw8, out_dtype=torch.bfloat16)
                    g, u = gu.split(N, dim=1)
                    return torch.nn.functional.silu(g) * u

                t_fp8 = time_fn(fp8_rowwise, **timing)
            except Exception as ex:  # noqa: BLE001
                report.add(Row(op="dual_gemm_prepacked", shape=shape, anchor="torch_fp8_rowwise",
                               error=f"anchor: {type(ex).__name__}: {ex}"))
            rate = flops / (t_pre.median_us * 1e-6) / 1e12
            note = f"memory floor {floor_us:.1f} us = {floor_us / t_pre.median_us:.2f} of lowbit time"
            for label, t in (("torch_bf16_concat", t_bf16), ("torch_fp8_rowwise", t_fp8)):
                if t is None:
                    continue
                report.add(Row(op="dual_gemm_prepacked", shape=shape, lowbit_us=t_pre.median_us, anchor=label,
                               anchor_us=t.median_us, ratio=t.median_us / t_pre.median_us, rate=rate,
                               rate_unit="TFLOP/s", frac_ceiling=rate / peak, ceiling="bf16_tflops", flops=flops,
                               bytes=nbytes, lowbit_p10_us=t_pre.p10_us, lowbit_p90_us=t_pre.p90_us,
                               anchor_p10_us=t.p10_us, anchor_p90_us=t.p90_us, timing=t_pre.mode, note=note))
            rate1 = flops / (t_one.median_us * 1e-6) / 1e12
            report.add(Row(op="dual_gemm_one_call", shape=shape, lowbit_us=t_one.median_us, anchor="torch_bf16_concat",
                           anchor_us=t_bf16.median_us, ratio=t_bf16.median_us / t_one.median_us, rate=rate1,
                           rate_unit="TFLOP/s", frac_ceiling=rate1 / peak, ceiling="bf16_tflops", flops=flops,
                           bytes=nbytes, timing=t_one.mode, note="prepack included"))
        except Exception as ex:  # noqa: BLE001
            report.add(Row(op="dual_gemm", shape=shape, anchor="-", error=f"bench: {type(ex).__name__}: {ex}"))
            traceback.print_exc()
    report.print_table(f"== {BENCH} summary ({check}) ==")
    return 0


if __name__ == "__main__":
    sys.exit(main())
