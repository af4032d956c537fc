"""The MXFP4 grouped GEMM across the whole range of weight scale bytes, against cuBLAS bf16.

Dense W4A16 through one group (16384 x 7168 weights, bf16 activations, M tokens), with weights
randn * mult quantized to MXFP4 (RCEIL): mult = 1 keeps every scale byte at or below 128 (the
range the kernel once decoded alone), mult = 3 puts a few above it, mult = 30 nearly all; "full"
draws the scale bytes uniformly from [0, 254] (every finite value, mixed within each tile and
K loop). A slow path for any of them would show as a step in the lowbit column. W4A8 rows (x1
weights, MXFP8 E4M3 activations): "a8" quantized randn, "a8low" the same codes with every other
activation scale byte set to 0..2 (values below bf16's subnormal step unless shifted). Anchor:
cuBLAS bf16 (torch.mm on the dequantized weights) in the same process.

    python bench/bench_scale_range.py [--tokens 1,16,256] [--json out/scale_range.json]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench.report import Report, Row, add_common_args  # noqa: E402
from lowbit_bench.timing import measure_ceilings, time_fn  # noqa: E402

N, K = 16384, 7168
CASES = ("x1", "x3", "x30", "full", "a8", "a8low")


def make_weights(torch, case, seed):
    import lowbit

    g = torch.Generator(device="cuda").manual_seed(seed)
    if case.startswith("a8"):
        case = "x1"
    if case == "full":
        codes = torch.randint(0, 256, (1, N, K // 2), dtype=torch.uint8, device="cuda", generator=g)
        scales = torch.randint(0, 255, (1, N, K // 32), dtype=torch.uint8, device="cuda", generator=g)
        return codes, scales
    mult = float(case[1:])
    w = torch.randn((N, K), device="cuda", generator=g, dtype=torch.float32) * mult
    qt = lowbit.quantize(w.to(torch.bfloat16), "mxfp4", "row_major")
    return qt.data.view(torch.uint8).reshape(1, N, K // 2), qt.scales.view(torch.uint8).reshape(1, N, K // 32)


def dequant(torch, codes, scales):
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
    c = codes.reshape(N, K // 2)
    vals = torch.stack([e2m1[(c & 15).long()], e2m1[(c >> 4).long()]], dim=-1).reshape(N, K)
    sc = torch.exp2(scales.reshape(N, K // 32).float() - 127).repeat_interleave(32, dim=1)
    return (vals * sc).to(torch.bfloat16)


def main(argv=None) -> int:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--tokens", default="1,16,256")
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args(argv)
    import torch

    import lowbit

    tokens = [int(t) for t in args.tokens.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    ceil = measure_ceilings(quick=True)
    rep = Report("bench_scale_range", args.json, meta={"N": N, "K": K, "cases": cases}, ceilings=ceil)
    flush = not args.no_flush
    for case in cases:
        codes, scales = make_weights(torch, case, seed=1)
        sb = scales.flatten()
        above = float((sb > 128).float().mean().item())
        wb16 = dequant(torch, codes, scales)
        pk, pks = lowbit.group_gemm_mxfp4_prepack(codes, scales, b_scale_layout="row_major")
        for T in tokens:
            a = (torch.randn((T, K), device="cuda") * 0.5).to(torch.bfloat16)
            a_sc = None
            if case.startswith("a8"):
                qa = lowbit.quantize(a, "mxfp8_e4m3", "row_major")
                a, a_sc = qa.data, qa.scales.view(torch.uint8).clone()
                if case == "a8low":
                    a_sc[:, ::2] = torch.randint(0, 3, a_sc[:, ::2].shape, dtype=torch.uint8, device="cuda")
            ind = torch.tensor([0, T], dtype=torch.int32, device="cuda")
            out = torch.empty((T, N), dtype=torch.bfloat16, device="cuda")
            outp = torch.empty_like(out)

            def plain():
                lowbit.group_gemm_mxfp4_nt_groupwise(a, codes, a_sc, scales, ind, "bfloat16", a_scale_layout="row_major",
                                                     b_scale_layout="row_major", out=out)

            def packed():
                lowbit.group_gemm_mxfp4_nt_groupwise(a, pk, a_sc, pks, ind, "bfloat16", a_scale_layout="row_major",
                                                     b_scale_layout="row_major", out=outp, b_packed=True)

            a16 = a if a_sc is None else (a.float() * torch.exp2(a_sc.float() - 127).repeat_interleave(32, dim=1)).to(
                torch.bfloat16)

            def anchor():
                return torch.mm(a16, wb16.t())

            t_pl = time_fn(plain, warmup=args.warmup, iters=args.iters, flush_l2=flush)
            t_pk = time_fn(packed, warmup=args.warmup, iters=args.iters, flush_l2=flush)
            t_an = time_fn(anchor, warmup=args.warmup, iters=args.iters, flush_l2=flush)
            ref = anchor().float()
            fin = torch.isfinite(ref) & torch.isfinite(out.float())  # "full" weights overflow some sums
            err = ((out.float() - ref).abs()[fin].max() / ref.abs()[fin].max().clamp_min(1e-30)).item() if fin.any() else 0.0
            same = bool(torch.equal(out.view(torch.int16), outp.view(torch.int16)))
            nbytes = N * K // 2 + N * K // 32 + T * K * 2 + T * N * 2
            for name, t in (("plain", t_pl), ("packed", t_pk)):
                rep.add(Row(op=f"{'w4a8' if a_sc is not None else 'w4a16'}_{name}_{case}", shape=f"{T}x{K}x{N}", lowbit_us=t.median_us,
                            lowbit_p10_us=t.p10_us, lowbit_p90_us=t.p90_us, anchor="cublas_bf16",
                            anchor_us=t_an.median_us, bytes=nbytes, timing=t.mode,
                            check=f"max|err|/max|ref|={err:.1e} packed==plain:{same}",
                            note=f"scale bytes > 128: {above:.4f}"))
    rep.print_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
