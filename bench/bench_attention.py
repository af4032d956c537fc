"""MXFP8 flash-attention forward of lowbit against the attention a user would otherwise run.

    python bench/bench_attention.py [--shapes b4s2048h32d128,...] [--causal both|yes|no] [--json PATH]
                                    [--quick] [--budget-s S]

Shapes (s_q = s_k = s; name bBsSh H[/H_kv] dD): b4 s2048 h32 d128, b1 s8192 h32 d128,
b2 s16384 h16 d128, b4 s2048 h32 d64, b2 s4096 h16 d256, and GQA b1 s8192 h32/8 d128; causal
and not. Inputs: bf16 randn Q, K, V in [b, s, h, d].

Table 1, kernel time (inputs already in each kernel's format, nothing converted in the timed call):
  attn_mxfp8          lowbit.flash_attn_mxfp8_func on MXFP8 operands (quantize_mxfp8_attn, RCEIL)
  attn_mxfp8_fp8      the same with precision="fp8" (QK^T and PV on FP8 tensor cores, P in E4M3)
  vs sdpa_flash_bf16  torch SDPA, flash backend (torch.nn.attention.sdpa_kernel), bf16 [b, h, s, d]
                      (GQA: enable_gqa, or KV heads expanded before timing where the backend lacks it)
  vs sdpa_cudnn_bf16  torch SDPA, cuDNN backend, bf16
  vs fa3_bf16         FlashAttention-3 flash_attn_func, bf16 (where flash_attn_interface imports, sm_90)
  vs fa3_fp8          FlashAttention-3 FP8 e4m3 with per-(batch, KV head) descales
Table 2, end to end from bf16 activations:
  attn_mxfp8_e2e      quantize_mxfp8_attn of Q, K and V (device kernels) + flash_attn_mxfp8_func
  attn_mxfp8_fp8_e2e  the same with precision="fp8"
  vs sdpa_*_bf16_e2e  SDPA on the same bf16 tensors (a [b, h, s, d] view of [b, s, h, d] storage)
  vs fa3_bf16         FlashAttention-3 bf16 on the same tensors (as in table 1)
Columns: lowbit us, anchor us, x = anchor us / lowbit us (> 1: lowbit faster), rate = lowbit
TFLOP/s = 4 b h s_q s_k d / t (halved for causal), %ceil = fraction of the FP8 dense peak measured
in this process (torch._scaled_mm e4m3 at 8192^3). Check (outside the timed region): rel_l2 of
lowbit's output against SDPA flash bf16 on the unquantized inputs (MXFP8 quantization error; the
FP8 path adds P's E4M3 rounding). Every anchor is timed once per shape and reported beside both
lowbit paths.
Where lowbit's CUDA kernel is not in the build its rows read "n/a (not implemented)" and the
anchors are still timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, import_torch_cuda, measure_ceilings, time_fn  # noqa: E402

BENCH = "bench_attention"
DEFAULT_SHAPES = ["b4s2048h32d128", "b1s8192h32d128", "b2s16384h16d128", "b4s2048h32d64", "b2s4096h16d256",
                  "b1s8192h32/8d128"]
QUICK_SHAPES = ["b4s2048h32d128", "b1s8192h32/8d128"]
FP8_MAX = 448.0
NA = "n/a (not implemented)"

torch = None  # imported in main() so that --help works without torch
lowbit = None


def _err(ex: BaseException, limit: int = 300) -> str:
    s = " ".join(f"{type(ex).__name__}: {ex}".split())
    return s if len(s) <= limit else s[: limit - 2] + ".."


def parse_shape(s: str):
    """'b4s2048h32d128' or 'b1s8192h32/8d128' -> (b, s, h, h_kv, d)."""
    import re

    m = re.fullmatch(r"b(\d+)s(\d+)h(\d+)(?:/(\d+))?d(\d+)", s.strip())
    if not m:
        raise ValueError(f"bad shape {s!r}: expected bBsSh H[/H_kv]dD, e.g. b1s8192h32/8d128")
    b, sq, h, hk, d = m.groups()
    return int(b), int(sq), int(h), int(hk or h), int(d)


def shape_name(b, s, h, hk, d, causal):
    heads = f"h{h}" if hk == h else f"h{h}/{hk}"
    return f"b{b}s{s}{heads}d{d}{'c' if causal else ''}"


def fa3_module():
    """(module, why not): FlashAttention-3's Python interface where it imports on an sm_90 GPU."""
    mod, why = None, "flash_attn_interface does not import"
    for name in ("flash_attn_interface", "fa3_fwd_interface"):
        try:
            mod = __import__(name)
            break
        except Exception as ex:  # noqa: BLE001
            why = f"{name}: {_err(ex, 120)}"
    if mod is None:
        return None, why
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9:
        return None, f"FA3 needs sm_90, this GPU is sm_{cap[0]}{cap[1]}"
    return mod, ""


def rel_l2(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class Bench:
    def __init__(self, args, report: Report):
        self.args = args
        self.report = report
        self.t0 = time.perf_counter()
        self.fa3, self.fa3_why = fa3_module()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.backends = {"sdpa_flash_bf16": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn_bf16": SDPBackend.CUDNN_ATTENTION}
        self.sdpa_kernel = sdpa_kernel
        self.timing = dict(warmup=args.warmup, iters=args.iters if not args.quick else max(5, args.iters // 3),
                           flush_l2=not args.no_flush)

    def over_budget(self) -> bool:
        b = self.args.budget_s
        return b is not None and time.perf_counter() - self.t0 > b

    def time(self, fn):
        return time_fn(fn, **self.timing)

    def sdpa(self, backend, qh, kh, vh, causal, gqa):
        F = torch.nn.functional
        with self.sdpa_kernel([backend]):
            if gqa:
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)

    def rows(self, op, shape, t_lb, anchors, flops, check, error=""):
        """One row per anchor (name, Timing or error string) beside lowbit's Timing (or error)."""
        for name, t_an in anchors:
            an_err = t_an if isinstance(t_an, str) else ""
            t_an = None if isinstance(t_an, str) else t_an
            lb_err = error if t_lb is None else ""
            self.report.add(Row(
                op=op, shape=shape, lowbit_us=None if t_lb is None else t_lb.median_us, anchor=name,
                anchor_us=None if t_an is None else t_an.median_us, flops=flops, rate_unit="TFLOP/s",
                ceiling="fp8_tflops", lowbit_p10_us=None if t_lb is None else t_lb.p10_us,
                lowbit_p90_us=None if t_lb is None else t_lb.p90_us, anchor_p10_us=None if t_an is None else t_an.p10_us,
                anchor_p90_us=None if t_an is None else t_an.p90_us,
                timing=(t_lb or t_an).mode if (t_lb or t_an) else "", check=check,
                error="; ".join(e for e in (lb_err, f"anchor: {an_err}" if an_err else "") if e)))

    def shape(self, b, s, h, hk, d, causal):
        name = shape_name(b, s, h, hk, d, causal)
        anchors = ["sdpa_flash_bf16", "sdpa_cudnn_bf16", "fa3_bf16", "fa3_fp8"]
        if self.over_budget():
            for op in ("attn_mxfp8", "attn_mxfp8_fp8", "attn_mxfp8_e2e", "attn_mxfp8_fp8_e2e"):
                self.report.add(Row(op=op, shape=name, anchor="-", error="skipped: time budget"))
            return
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        gqa = hk != h
        g = torch.Generator(device="cuda").manual_seed(b * 131 + s + h + d)
        q = torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hk, d, generator=g, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, hk, d, generator=g, device="cuda", dtype=torch.bfloat16)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d] views
        qhc, khc, vhc = (t.contiguous() for t in (qh, kh, vh))

        # lowbit, kernel only: both paths on the same operands
        lb = {}  # precision -> (kernel Timing, e2e Timing, error, check)
        ref = None
        for prec in ("exact", "fp8"):
            t_lb, t_e2e, err, check = None, None, "", ""
            try:
                parts = [lowbit.quantize_mxfp8_attn(t) for t in (q, k, v)]
                (qc, qs), (kc, ks), (vc, vs) = parts
                out, _ = lowbit.flash_attn_mxfp8_func(qc, kc, vc, qs, ks, vs, causal=causal, precision=prec)
                if ref is None:  # the check's reference reads KV heads expanded (no GQA support needed)
                    rep = h // hk
                    ref = self.sdpa(self.backends["sdpa_flash_bf16"], qhc, khc.repeat_interleave(rep, 1),
                                    vhc.repeat_interleave(rep, 1), causal, False).transpose(1, 2)
                check = f"rel_l2 vs sdpa bf16 {rel_l2(out, ref):.1e}"
                del out
                t_lb = self.time(lambda: lowbit.flash_attn_mxfp8_func(qc, kc, vc, qs, ks, vs, causal=causal,
                                                                      precision=prec))
                t_e2e = self.time(lambda: lowbit.flash_attn_mxfp8_quantized(q, k, v, causal=causal, precision=prec))
            except NotImplementedError:
                err = NA
            except Exception as ex:  # noqa: BLE001
                err = "lowbit: " + _err(ex)
                if self.args.verbose:
                    traceback.print_exc()
            lb[prec] = (t_lb, t_e2e, err, check)
        del ref

        timed = {}
        for an in ("sdpa_flash_bf16", "sdpa_cudnn_bf16"):
            be = self.backends[an]
            try:
                args, views, g_ = (qhc, khc, vhc), (qh, kh, vh), gqa
                try:
                    self.sdpa(be, *args, causal, g_)
                except Exception:  # noqa: BLE001 - no enable_gqa in this backend: KV heads expanded, untimed
                    if not gqa:
                        raise
                    args = (qhc, khc.repeat_interleave(h // hk, 1), vhc.repeat_interleave(h // hk, 1))
                    views, g_ = (qh, args[1], args[2]), False
                timed[an] = self.time(lambda: self.sdpa(be, *args, causal, g_))
                timed[an + "_views"] = self.time(lambda: self.sdpa(be, *views, causal, g_))
            except Exception as ex:  # noqa: BLE001
                timed[an] = timed[an + "_views"] = _err(ex, 200)
        if self.fa3 is None:
            timed["fa3_bf16"] = timed["fa3_fp8"] = f"skipped: {self.fa3_why}"
        else:
            fa3 = self.fa3

            def first(o):
                return o[0] if isinstance(o, tuple) else o

            try:
                timed["fa3_bf16"] = self.time(lambda: first(fa3.flash_attn_func(q, k, v, causal=causal)))
            except Exception as ex:  # noqa: BLE001
                timed["fa3_bf16"] = _err(ex, 200)
            try:
                def q8(t, heads_kv):  # e4m3 with an fp32 descale per (batch, KV head)
                    B, S, H, D = t.shape
                    a = t.float().reshape(B, S, heads_kv, H // heads_kv, D).abs().amax(dim=(1, 3, 4))
                    sc = a.clamp_min(1e-12) / FP8_MAX
                    x = t.float().reshape(B, S, heads_kv, H // heads_kv, D) / sc[:, None, :, None, None]
                    return x.reshape(B, S, H, D).to(torch.float8_e4m3fn), sc.contiguous()

                (q8_, qd), (k8_, kd), (v8_, vd) = q8(q, hk), q8(k, hk), q8(v, hk)
                timed["fa3_fp8"] = self.time(lambda: first(fa3.flash_attn_func(
                    q8_, k8_, v8_, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)))
            except Exception as ex:  # noqa: BLE001
                timed["fa3_fp8"] = _err(ex, 200)
        for prec, op in (("exact", "attn_mxfp8"), ("fp8", "attn_mxfp8_fp8")):
            t_lb, t_e2e, err, check = lb[prec]
            self.rows(op, name, t_lb, [(a, timed[a]) for a in anchors], flops, check, err)
            self.rows(op + "_e2e", name, t_e2e,
                      [(a + "_e2e", timed[a + "_views"]) for a in ("sdpa_flash_bf16", "sdpa_cudnn_bf16")]
                      + [("fa3_bf16", timed["fa3_bf16"])], flops, "quantize of q, k, v included", err)
        torch.cuda.empty_cache()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(p)
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                   help="comma-separated bBsSh H[/H_kv]dD list (default: the six shapes above)")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both", help="causal, non-causal or both")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed rows")
    args = p.parse_args(argv)
    default = args.shapes == ",".join(DEFAULT_SHAPES)
    try:
        args.shapes = [parse_shape(s) for s in (QUICK_SHAPES if args.quick and default else args.shapes.split(","))
                       if s.strip()]
    except ValueError as ex:
        p.error(str(ex))
    for b, s, h, hk, d in args.shapes:
        if min(b, s, h, hk) < 1 or h % hk or d not in (64, 128, 256):
            p.error(f"shape b{b}s{s}h{h}/{hk}d{d}: need b, s, h, h_kv >= 1, h % h_kv == 0, d in 64/128/256")
    return args


def main(argv=None) -> int:
    global torch, lowbit
    args = parse_args(argv)
    torch = import_torch_cuda()
    if torch is None:
        return 2
    import lowbit as _lowbit

    lowbit = _lowbit
    ceilings = measure_ceilings(quick=args.quick)
    meta = {
        "timing": f"CUDA events, median, L2 {'not ' if args.no_flush else ''}flushed",
        "inputs": "bf16 randn [b, s, h, d]; lowbit: MXFP8 E4M3 RCEIL per 32 (quantize_mxfp8_attn); "
                  "FA3 fp8: e4m3 with per-(batch, KV head) descales",
        "rate": "4 b h s_q s_k d / t, halved for causal; %ceil against the FP8 _scaled_mm peak",
        "e2e": "lowbit: quantize of bf16 q, k, v + attention; SDPA on [b, h, s, d] views of the same tensors",
    }
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    bench = Bench(args, report)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    for b, s, h, hk, d in args.shapes:
        for causal in causals:
            try:
                bench.shape(b, s, h, hk, d, causal)
            except Exception as ex:  # noqa: BLE001
                report.add(Row(op="attn_mxfp8", shape=shape_name(b, s, h, hk, d, causal), anchor="-",
                               error="bench: " + _err(ex)))
                if args.verbose:
                    traceback.print_exc()
                torch.cuda.empty_cache()
    rows = report.rows
    for title, e2e in (("kernel time (inputs in each kernel's format)", False),
                       ("end to end from bf16 q, k, v (lowbit: quantize included)", True)):
        report.rows = [r for r in rows if r.op.endswith("_e2e") == e2e]
        report.print_table(f"== {BENCH}: {title} ==")
    report.rows = rows
    if report.json_path:
        print(f"# JSON: {report.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
