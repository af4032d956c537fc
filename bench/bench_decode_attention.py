"""Decode attention over lowbit's NF4 + FP8-residual K cache against the decode a user would otherwise run.

    python bench/bench_decode_attention.py [--contexts 4096,...] [--batch 1,8,32] [--delta D] [--json PATH]
                                           [--plot PATH.png] [--budget-s S] [--quick]
    python bench/bench_decode_attention.py --device cpu --contexts 256,512 --batch 1   # smoke run, no GPU
    python bench/bench_decode_attention.py --replot out/bench_decode_attention.json --plot out/decode.png

One query token per sequence, GQA 32/8, D = Dv = 128 (--heads, --d), every sequence at the full
context. Default shapes: b1 at 4k, 16k, 32k, 64k, 128k; b8 and b32 at 4k, 8k, 16k, 32k (--contexts
and --batch give their cross product instead).

Inputs (bench/lowbit_bench/decode_cache.py, --pattern): bf16 keys with attention sinks, recency
and a few retrieved tokens over a Gaussian background, plus outlier channels; bf16 values randn.
lowbit's cache is lowbit.nf4_kcache_quantize of those keys (NF4 per channel + FP8 E5M2 residual,
the bytes kproj_rope_nf4_encode writes); V stays bf16.

lowbit rows (lowbit.attn_forward_decode_nf4, block 64):
  attn_decode_nf4_pruned_dX   delta = X, one row per value of --delta (default 8 and 10: the smallest
                              deltas whose pruning error stays below a quarter of the cache's quantization
                              error on recorded attention (8) and on every synthetic pattern (10) in
                              docs/design/decode_pruning.md)
  attn_decode_nf4_unpruned    delta = inf (plain attention over the cache)
  attn_decode_nf4_nores       delta = inf, use_fp8_residual=False (the residual is not read)
  attn_decode_nf4_v8_*        the same three on an FP8 V cache (lowbit.fp8_vcache_quantize of V, E4M3 codes
                              with a scale per (batch, KV head, channel)): pruned at the first delta,
                              unpruned, and unpruned without the residual (192 B per token and KV head at
                              d128, against 256 for an FP8 KV cache)
anchors, each on its own cache format, timed in the same process:
  sdpa_bf16       torch SDPA on the bf16 cache [B, H_kv, T, D] (enable_gqa), the fastest of the flash,
                  memory-efficient and cuDNN backends for that shape (which one: in the note)
  fa3_kv_bf16     FlashAttention-3 flash_attn_with_kvcache, bf16 cache [B, T, H_kv, D], cache_seqlens
  fa3_kv_fp8      the same with q, K and V in e4m3 and fp32 descales per (batch, KV head)
                  (FA3 rows where flash_attn_interface / fa3_fwd_interface imports on sm_90)
Columns: lowbit us, anchor us, x = anchor us / lowbit us (> 1: lowbit faster), rate = lowbit TB/s of
the bytes it must read: q, NF4 codes and scales of every token, FP8 residuals of every token (the
block maxima that decide the skip are taken on the full key), V of the kept blocks only (kept tokens
= T - skipped blocks x 64, from the returned skip ratio), out written; %ceil = rate / the copy
bandwidth measured in this process. Not counted: the kernel's fp32 score scratch. The JSON adds
bytes_kept_residual (residuals of the kept blocks only: what a kernel that decides on NF4 scores would
read) and anchor_bytes. check: skip ratio; rel_l2 of each output against an fp32 attention on the
unquantized bf16 q, K, V (computed once per shape, outside the timed region).

Timing: CUDA-graph replays of every row, lowbit's and the anchors' (--timing graph, the default;
--timing eager times host calls, which then include each op's Python and launch cost: FA3's
with_kvcache wrapper alone costs ~150 us per call on the H200, far above its kernel), CUDA events,
L2 flushed before every replay (bench/lowbit_bench/timing.py). --device cpu runs
lowbit's CPU reference with the host clock on NumPy arrays (no torch needed; the torch anchors are
timed on the CPU when torch imports, else skipped), and a host memory copy stands in for the ceiling:
it checks the bench code, not the speed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn, time_graph  # noqa: E402
from lowbit_bench.decode_cache import PATTERNS, make_qkv_numpy, make_qkv_torch  # noqa: E402
from lowbit_bench.timing import Timing, host_ceilings, host_time  # noqa: E402

BENCH = "bench_decode_attention"
DEFAULT_DELTAS = "8,10"
BLOCK = 64
FP8_MAX = 448.0
NA = "n/a (not implemented)"
PRUNED = "attn_decode_nf4_pruned"


def lowbit_ops(deltas):
    """(op, delta, use_fp8_residual, fp8 V): one pruned row per delta, then the unpruned ones; the
    same on the FP8 V cache (pruned at the first delta only)."""
    ops = [(f"{PRUNED}_d{d:g}", d, True, False) for d in deltas]
    ops += [("attn_decode_nf4_unpruned", math.inf, True, False), ("attn_decode_nf4_nores", math.inf, False, False)]
    if deltas:
        ops.append((f"attn_decode_nf4_v8_pruned_d{deltas[0]:g}", deltas[0], True, True))
    return ops + [("attn_decode_nf4_v8_unpruned", math.inf, True, True), ("attn_decode_nf4_v8_nores", math.inf, False, True)]
ANCHORS = ["sdpa_bf16", "fa3_kv_bf16", "fa3_kv_fp8"]

torch = None  # imported in main() where available: --help and the CPU smoke run work without torch
lowbit = None
np = None


@dataclasses.dataclass
class DecodeRow(Row):
    batch: int = 0
    context: int = 0
    delta: Optional[float] = None
    skip_ratio: Optional[float] = None
    bytes_kept_residual: Optional[int] = None
    anchor_bytes: Optional[int] = None


def _err(ex: BaseException, limit: int = 300) -> str:
    s = " ".join(f"{type(ex).__name__}: {ex}".split())
    return s if len(s) <= limit else s[: limit - 2] + ".."


def shape_name(b: int, t: int) -> str:
    return f"b{b}t{t}"


def default_shapes():
    return ([(1, t) for t in (4096, 16384, 32768, 65536, 131072)]
            + [(b, t) for b in (8, 32) for t in (4096, 8192, 16384, 32768)])


def lowbit_bytes(B, T, H, HK, D, Dv, skip, residual, kept_residual_only=False, v8=False):
    """Bytes lowbit must read + write for one call (module docstring)."""
    n = -(-T // BLOCK)
    kept = T - skip * n * BLOCK  # skipped blocks are interior, hence full
    per_seq_head = T * D // 2 + D * 4  # codes, fp32 scales
    if residual:
        per_seq_head += (kept if kept_residual_only else T) * D
    per_seq_head += kept * Dv * (1 if v8 else 2) + (Dv * 4 if v8 else 0)  # V (FP8: codes and fp32 scales)
    return int(B * HK * per_seq_head + B * H * D * 2 + B * H * Dv * 2)


def fa3_module():
    """(module, why not): FlashAttention-3's Python interface where it imports on an sm_90 GPU."""
    mod, why = None, "flash_attn_interface / fa3_fwd_interface do not import"
    for name in ("flash_attn_interface", "fa3_fwd_interface"):
        try:
            mod = __import__(name)
            break
        except Exception as ex:  # noqa: BLE001
            why = f"{name}: {_err(ex, 120)}"
    if mod is None:
        return None, why
    if not hasattr(mod, "flash_attn_with_kvcache"):
        return None, f"{mod.__name__} has no flash_attn_with_kvcache"
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9:
        return None, f"FA3 needs sm_90, this GPU is sm_{cap[0]}{cap[1]}"
    return mod, ""


def rel_l2(a, b) -> float:
    if torch is not None and isinstance(a, torch.Tensor):
        a, b = a.float(), b.float()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Bench:
    def __init__(self, args, report: Report):
        self.args = args
        self.report = report
        self.cpu = args.device == "cpu"
        self.t0 = time.perf_counter()
        self.fa3, self.fa3_why = (None, "CPU smoke run") if self.cpu or torch is None else fa3_module()
        self.timing = dict(warmup=args.warmup, iters=args.iters if not args.quick else max(5, args.iters // 3),
                           flush_l2=not args.no_flush)
        self.sdpa_backends = {}
        self.graph_failures: List[str] = []  # captures that failed: those rows were timed eagerly
        if torch is not None:
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                self.sdpa_kernel = sdpa_kernel
                self.sdpa_backends = {"flash": SDPBackend.FLASH_ATTENTION,
                                      "efficient": SDPBackend.EFFICIENT_ATTENTION,
                                      "cudnn": SDPBackend.CUDNN_ATTENTION}
                if self.cpu:
                    self.sdpa_backends = {"math": SDPBackend.MATH}
            except Exception:  # noqa: BLE001
                self.sdpa_backends = {}

    def over_budget(self) -> bool:
        b = self.args.budget_s
        return b is not None and time.perf_counter() - self.t0 > b

    def time(self, fn) -> Timing:
        if self.cpu:
            return host_time(fn, min(1, self.args.warmup), min(3, self.args.iters))
        if self.args.timing == "graph":
            # one decode step is tens of microseconds: eager calls measure the host's Python and
            # launch cost of whichever op has more of it (FA3's wrapper: ~150 us), so every row,
            # lowbit's and the anchors', is a CUDA-graph replay as serving engines run decode
            try:
                return time_graph(fn, warmup=max(1, self.args.warmup), iters=self.timing["iters"],
                                  flush_l2=self.timing["flush_l2"])
            except Exception as ex:  # noqa: BLE001
                self.graph_failures.append(_err(ex, 120))
                torch.cuda.synchronize()
        return time_fn(fn, **self.timing)

    # -- inputs ---------------------------------------------------------------------------------
    def inputs(self, B, T):
        a = self.args
        H, HK = a.heads
        p = PATTERNS[a.pattern]
        seed = 1000 * B + T
        if self.cpu:
            import ml_dtypes

            q, k, v = make_qkv_numpy(p, B, T, H, HK, a.d, a.d, seed=seed)
            bf = ml_dtypes.bfloat16
            return q.astype(bf), k.astype(bf), v.astype(bf), k
        q, k, v = make_qkv_torch(torch, p, B, T, H, HK, a.d, a.d, seed=seed, device="cuda")
        return q, k, v, k

    def reference(self, q, k, v):
        """fp32 attention of the unquantized bf16 inputs, [B, H, Dv] (per sequence: small memory)."""
        H, HK = self.args.heads
        G = H // HK
        scale = 1.0 / math.sqrt(self.args.d)
        if self.cpu:
            qf = np.asarray(q, np.float32)[:, 0].reshape(q.shape[0], HK, G, -1).astype(np.float64)
            kf, vf = np.asarray(k, np.float64), np.asarray(v, np.float64)
            s = np.einsum("bgjd,btgd->bgjt", qf, kf) * scale
            p = np.exp(s - s.max(-1, keepdims=True))
            o = np.einsum("bgjt,btgd->bgjd", p, vf) / p.sum(-1)[..., None]
            return o.reshape(q.shape[0], H, -1)
        outs = []
        for b in range(q.shape[0]):
            qb = q[b, 0].float().reshape(HK, G, -1)
            kb, vb = k[b].float().transpose(0, 1), v[b].float().transpose(0, 1)  # [HK, T, D]
            s = torch.einsum("gjd,gtd->gjt", qb, kb) * scale
            outs.append(torch.einsum("gjt,gtd->gjd", torch.softmax(s, -1), vb).reshape(H, -1))
            del kb, vb, s
        return torch.stack(outs)

    # -- one shape ------------------------------------------------------------------------------
    def shape(self, B, T):
        a = self.args
        H, HK = a.heads
        D = Dv = a.d
        name = shape_name(B, T)
        if self.over_budget():
            for op, *_ in lowbit_ops(a.deltas):
                self.report.add(DecodeRow(op=op, shape=name, anchor="-", batch=B, context=T,
                                          error="skipped: time budget"))
            return
        q, k, v, k_src = self.inputs(B, T)
        ref = self.reference(q, k, v)
        anchor_bytes = {"sdpa_bf16": B * T * HK * (D + Dv) * 2, "fa3_kv_bf16": B * T * HK * (D + Dv) * 2,
                        "fa3_kv_fp8": B * T * HK * (D + Dv)}
        for an in anchor_bytes:
            anchor_bytes[an] += B * H * (D + Dv) * 2

        # lowbit: the cache, the checks, then the timings
        lb = {}
        cache_err = ""
        try:
            c, s, r = lowbit.nf4_kcache_quantize(k_src)
            v8, v8_scale = lowbit.fp8_vcache_quantize(v)
        except Exception as ex:  # noqa: BLE001
            cache_err = "cache: " + _err(ex)
            if a.verbose:
                traceback.print_exc()
        for op, delta, res, fp8v in lowbit_ops(a.deltas):
            info = {"delta": delta, "timing": None, "skip": None, "check": "", "error": cache_err}
            lb[op] = info
            if cache_err:
                continue
            try:
                kw = dict(block_size=BLOCK, delta=delta, use_fp8_residual=res, v_scale=v8_scale if fp8v else None)
                vv = v8 if fp8v else v
                out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r if res else None, vv, return_skip_ratio=True,
                                                            **kw)
                skip = float(ratio.float().mean()) if torch is not None and isinstance(ratio, torch.Tensor) \
                    else float(np.asarray(ratio, np.float64).mean())
                info["skip"] = skip
                o = out.float() if not self.cpu else np.asarray(out, np.float64)
                info["check"] = f"skip {skip:.3f}; rel_l2 vs fp32 {rel_l2(o, ref):.1e}"
                del out, o
                rr = r if res else None
                info["timing"] = self.time(lambda: lowbit.attn_forward_decode_nf4(q, c, s, rr, vv, **kw))
            except NotImplementedError:
                info["error"] = NA
            except Exception as ex:  # noqa: BLE001
                info["error"] = "lowbit: " + _err(ex)
                if a.verbose:
                    traceback.print_exc()

        timed = self.anchors(q, k, v, ref, B, T)
        for op, _, res, fp8v in lowbit_ops(a.deltas):
            info = lb[op]
            skip = info["skip"] if info["skip"] is not None else 0.0
            nbytes = lowbit_bytes(B, T, H, HK, D, Dv, skip, res, v8=fp8v)
            nbytes_kept = lowbit_bytes(B, T, H, HK, D, Dv, skip, res, kept_residual_only=True, v8=fp8v)
            t_lb = info["timing"]
            for an in ANCHORS:
                t_an, an_check, an_note = timed[an]
                an_err = t_an if isinstance(t_an, str) else ""
                t_an = None if isinstance(t_an, str) else t_an
                self.report.add(DecodeRow(
                    op=op, shape=name, lowbit_us=None if t_lb is None else t_lb.median_us, anchor=an,
                    anchor_us=None if t_an is None else t_an.median_us, bytes=nbytes, rate_unit="TB/s",
                    ceiling="copy_tbs",
                    anchor_rate=None if t_an is None else anchor_bytes[an] / (t_an.median_us * 1e-6) / 1e12,
                    lowbit_p10_us=None if t_lb is None else t_lb.p10_us,
                    lowbit_p90_us=None if t_lb is None else t_lb.p90_us,
                    anchor_p10_us=None if t_an is None else t_an.p10_us,
                    anchor_p90_us=None if t_an is None else t_an.p90_us,
                    timing=(t_lb or t_an).mode if (t_lb or t_an) else "",
                    check=info["check"] + (f"; {an} {an_check}" if an_check else ""),
                    note=an_note,
                    error="; ".join(e for e in (info["error"], f"anchor: {an_err}" if an_err else "") if e),
                    batch=B, context=T, delta=info["delta"], skip_ratio=info["skip"],
                    bytes_kept_residual=nbytes_kept, anchor_bytes=anchor_bytes[an]))
        if not self.cpu:
            del q, k, v, ref
            torch.cuda.empty_cache()

    def anchors(self, q, k, v, ref, B, T):
        """anchor -> (Timing or why-not string, check text, note)."""
        H, HK = self.args.heads
        res = {}
        if torch is None:
            why = "skipped: torch not importable"
            return {an: (why, "", "") for an in ANCHORS}
        if self.cpu:  # NumPy inputs: torch CPU tensors of the same values
            q, k, v = (torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16) for x in (q, k, v))
        # SDPA: q [B, H, 1, D], K / V [B, H_kv, T, D] contiguous, GQA
        qh = q.transpose(1, 2).contiguous()
        kh, vh = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        F = torch.nn.functional
        best, times = None, []
        for bname, be in self.sdpa_backends.items():
            def sd(_be=be):
                with self.sdpa_kernel([_be]):
                    return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
            try:
                o = sd()[:, :, 0]
                chk = f"rel_l2 {rel_l2(o.float() if not self.cpu else o.float().numpy(), ref):.1e}"
                t = self.time(sd)
                times.append(f"{bname} {t.median_us:.1f}")
                if best is None or t.median_us < best[1].median_us:
                    best = (bname, t, chk)
            except Exception as ex:  # noqa: BLE001
                times.append(f"{bname} err ({_err(ex, 60)})")
        del kh, vh
        res["sdpa_bf16"] = (best[1], best[2], f"best: {best[0]}; " + ", ".join(times)) if best else \
            ("no SDPA backend ran: " + ", ".join(times) if times else "no SDPA backend", "", "")
        if self.fa3 is None:
            res["fa3_kv_bf16"] = res["fa3_kv_fp8"] = (f"skipped: {self.fa3_why}", "", "")
            return res
        fa3 = self.fa3
        lens = torch.full((B,), T, dtype=torch.int32, device=q.device)

        def first(o):
            return o[0] if isinstance(o, tuple) else o

        try:
            o = first(fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens))[:, 0]
            chk = f"rel_l2 {rel_l2(o, ref):.1e}"
            res["fa3_kv_bf16"] = (self.time(lambda: fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)), chk, "")
        except Exception as ex:  # noqa: BLE001
            res["fa3_kv_bf16"] = (_err(ex, 200), "", "")
        try:
            G = H // HK

            def q8(t, grouped):  # e4m3 with an fp32 descale per (batch, KV head)
                Bt, S, Ht, Dt = t.shape
                x = t.float().reshape(Bt, S, HK, Ht // HK, Dt) if grouped else t.float().reshape(Bt, S, HK, 1, Dt)
                sc = x.abs().amax(dim=(1, 3, 4)).clamp_min(1e-12) / FP8_MAX
                return (x / sc[:, None, :, None, None]).reshape(Bt, S, Ht, Dt).to(torch.float8_e4m3fn), sc.contiguous()

            (q8_, qd), (k8_, kd), (v8_, vd) = q8(q, G > 1), q8(k, False), q8(v, False)

            def f8():
                return fa3.flash_attn_with_kvcache(q8_, k8_, v8_, cache_seqlens=lens, q_descale=qd, k_descale=kd,
                                                   v_descale=vd)
            o = first(f8())[:, 0]
            res["fa3_kv_fp8"] = (self.time(f8), f"rel_l2 {rel_l2(o, ref):.1e}", "q, K, V e4m3, descale per (b, kv head)")
            del k8_, v8_
        except Exception as ex:  # noqa: BLE001
            res["fa3_kv_fp8"] = (_err(ex, 200), "", "")
        return res


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------

def plot(rows: List[dict], path: str, title: str = "") -> str:
    """Latency against context (lowbit pruned / unpruned / no residual and the anchors) and skip
    ratio against context, one row of panels per batch size; PNG at path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows if r.get("batch")})
    if not batches:
        raise ValueError("no rows to plot")
    fig, axes = plt.subplots(len(batches), 2, figsize=(12, 4 * len(batches)), squeeze=False)
    labels = {"attn_decode_nf4_unpruned": "lowbit NF4+FP8 unpruned",
              "attn_decode_nf4_nores": "lowbit NF4 (no residual)",
              "attn_decode_nf4_v8_unpruned": "lowbit NF4+FP8, FP8 V, unpruned",
              "attn_decode_nf4_v8_nores": "lowbit NF4, FP8 V (no residual)", "sdpa_bf16": "torch SDPA bf16 (best backend)",
              "fa3_kv_bf16": "FA3 with_kvcache bf16", "fa3_kv_fp8": "FA3 with_kvcache FP8"}
    styles = {"attn_decode_nf4_unpruned": "s-", "attn_decode_nf4_nores": "^-", "attn_decode_nf4_v8_unpruned": "s:",
              "attn_decode_nf4_v8_nores": "^:",
              "sdpa_bf16": "x--", "fa3_kv_bf16": "d--", "fa3_kv_fp8": "v--"}
    for i, B in enumerate(batches):
        rs = [r for r in rows if r.get("batch") == B]
        series: Dict[str, Dict[int, float]] = {}
        skips: Dict[str, Dict[int, float]] = {}
        for r in rs:
            ctx = r["context"]
            if r.get("lowbit_us"):
                series.setdefault(r["op"], {})[ctx] = r["lowbit_us"]
            if r.get("anchor_us"):
                series.setdefault(r["anchor"], {})[ctx] = r["anchor_us"]
            if r["op"].startswith(PRUNED) and r.get("skip_ratio") is not None:
                skips.setdefault(f"delta {r.get('delta'):g}", {})[ctx] = r["skip_ratio"]
        ax = axes[i][0]
        pruned = sorted((k for k in series if k.startswith(PRUNED)), key=lambda k: float(k.split("_d")[-1]))
        for key in pruned:
            xs = sorted(series[key])
            ax.plot(xs, [series[key][x] for x in xs], "o-", label=f"lowbit NF4+FP8 pruned, delta {key.split('_d')[-1]}")
        for key in labels:
            if key in series:
                xs = sorted(series[key])
                ax.plot(xs, [series[key][x] for x in xs], styles[key], label=labels[key])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("latency (us)")
        ax.set_title(f"decode latency, batch {B}")
        ax.grid(True, which="both", alpha=0.3)
        if series:
            ax.legend(fontsize=8)
        ax = axes[i][1]
        for lab, sk in skips.items():
            xs = sorted(sk)
            ax.plot(xs, [sk[x] for x in xs], "o-", label=lab)
        if skips:
            ax.legend(fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("skip ratio (skipped blocks / blocks)")
        ax.set_title(f"skip ratio of the pruned calls, batch {B}")
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(p)
    p.add_argument("--timing", choices=("graph", "eager"), default="graph",
                   help="graph: CUDA-graph replays of every row (default; eager where a capture fails, said in the "
                        "report); eager: host calls, which include each op's Python and launch cost")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: smoke run on lowbit's CPU reference (small shapes, host clock, no torch needed)")
    p.add_argument("--contexts", default=None, help="comma-separated contexts (with --batch: their cross product)")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default shapes: module docstring)")
    p.add_argument("--delta", default=DEFAULT_DELTAS,
                   help=f"comma-separated pruning deltas, one pruned row each (default {DEFAULT_DELTAS}: "
                        f"docs/design/decode_pruning.md)")
    p.add_argument("--pattern", choices=list(PATTERNS), default="sinks_recency_retrieval",
                   help="structure of the keys (bench/lowbit_bench/decode_cache.py)")
    p.add_argument("--heads", default="32/8", help="H_q/H_kv (default 32/8)")
    p.add_argument("--d", type=int, default=128, choices=(64, 128, 256), help="head dim D = Dv (default 128)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write latency / skip-ratio plots (PNG) here")
    p.add_argument("--replot", default=None, metavar="JSON", help="only redraw --plot from a saved JSON report")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed rows")
    args = p.parse_args(argv)
    try:
        hq, hk = (int(x) for x in args.heads.split("/"))
    except ValueError:
        p.error(f"--heads {args.heads!r}: expected H_q/H_kv")
    if hq < 1 or hk < 1 or hq % hk:
        p.error("--heads: H_q must be a positive multiple of H_kv")
    args.heads = (hq, hk)
    try:
        args.deltas = [float(x) for x in args.delta.split(",") if x.strip()]
    except ValueError:
        p.error(f"--delta {args.delta!r}: expected comma-separated numbers")
    if not args.deltas or not all(d >= 0 for d in args.deltas):
        p.error("--delta: each value must be >= 0 (inf allowed)")
    if args.contexts is None and args.batch is None:
        shapes = default_shapes()
        if args.device == "cpu":
            shapes = [(1, 256), (1, 512)]
        elif args.quick:
            shapes = [(1, 4096), (1, 32768), (8, 8192)]
    else:
        ctxs = [int(x) for x in (args.contexts or ("256,512" if args.device == "cpu" else "4096,16384,32768")).split(",")
                if x.strip()]
        bs = [int(x) for x in (args.batch or "1").split(",") if x.strip()]
        shapes = [(b, t) for b in bs for t in ctxs]
    if any(b < 1 or t < 1 for b, t in shapes):
        p.error("batch and context must be >= 1")
    args.shapes = shapes
    if args.replot and not args.plot:
        p.error("--replot needs --plot PATH")
    return args


def main(argv=None) -> int:
    global torch, lowbit, np
    args = parse_args(argv)
    import numpy as _np

    np = _np
    if args.replot:
        with open(args.replot) as f:
            d = json.load(f)
        print("plot:", plot(d["rows"], args.plot, f"{BENCH}: {d.get('env', {}).get('device')}"))
        return 0
    try:
        import torch as _torch

        torch = _torch
    except Exception as ex:  # noqa: BLE001
        if args.device != "cpu":
            print(f"torch is not importable ({_err(ex)}): nothing to time (this benchmark needs torch with CUDA; "
                  f"--device cpu runs the smoke mode)", file=sys.stderr)
            return 2
        torch = None
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to time (this benchmark needs an H100 / H200 with torch CUDA; "
              "--device cpu runs the smoke mode)", file=sys.stderr)
        return 2
    import lowbit as _lowbit

    lowbit = _lowbit
    ceilings = host_ceilings() if args.device == "cpu" else measure_ceilings(quick=args.quick)
    H, HK = args.heads
    meta = {
        "shapes": f"GQA {H}/{HK}, D = Dv = {args.d}, one query token, every sequence at the full context",
        "timing": ("host clock, CPU reference (smoke run)" if args.device == "cpu"
                   else f"{'CUDA-graph replays' if args.timing == 'graph' else 'eager calls'}, CUDA events, median, "
                        f"L2 {'not ' if args.no_flush else ''}flushed"),
        "inputs": f"pattern {args.pattern}: {PATTERNS[args.pattern].description}; lowbit: nf4_kcache_quantize "
                  f"(NF4 + FP8 E5M2 residual), V bf16, block {BLOCK}",
        "pruned": "delta " + ", ".join(f"{d:g}" for d in args.deltas),
        "bytes": "q + NF4 codes, scales and residuals of every token + V of kept blocks + out; "
                 "%ceil against the copy bandwidth",
    }
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    bench = Bench(args, report)
    report.meta["fa3"] = "ok" if bench.fa3 is not None else bench.fa3_why
    if bench.graph_failures:  # rows timed eagerly after a failed capture (the first few reasons)
        report.meta["graph_capture_failed"] = f"{len(bench.graph_failures)} rows: " + "; ".join(bench.graph_failures[:3])
    for B, T in args.shapes:
        try:
            bench.shape(B, T)
        except Exception as ex:  # noqa: BLE001
            report.add(DecodeRow(op="attn_decode_nf4", shape=shape_name(B, T), anchor="-", batch=B, context=T,
                                 error="bench: " + _err(ex)))
            if args.verbose:
                traceback.print_exc()
            if torch is not None and args.device == "cuda":
                torch.cuda.empty_cache()
    report.print_table(f"== {BENCH} ==")
    if report.json_path:
        print(f"# JSON: {report.json_path}")
    if args.plot:
        try:
            print("# plot:", plot([r.as_dict() for r in report.rows], args.plot,
                                  f"{BENCH}: {report.env.get('device') or args.device}"))
        except Exception as ex:  # noqa: BLE001
            print(f"# plot failed: {_err(ex)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
