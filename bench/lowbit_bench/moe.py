"""bench_moe.py's shapes, data (MXFP4 weights, routing, activations, the bf16 anchors' helpers)
and the Bench class that times and checks lowbit and the anchors. torch and lowbit are imported
by bench_moe.main(), which sets this module's `torch` and `lowbit`."""

from __future__ import annotations

import time
import traceback

from .report import Report, Row
from .timing import time_fn, time_graph
from .triton_mxfp4 import tk_weights


HIDDEN = 2880
INTER = 2880
TOPK = 4
MODELS = {"20b": 32, "120b": 128}  # model -> experts
GEMMS = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}  # gemm -> (N, K)
DEFAULT_TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384]
DEFAULT_MLP_TOKENS = [1, 16, 256, 4096]
QUICK_TOKENS = [1, 256, 4096]
QUICK_MLP_TOKENS = [16, 256]
ALPHA, LIMIT = 1.702, 7.0
FAST_WINDOW = (0, 133)  # weight scale bytes in this range decode with one multiply (above: two)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
CHECK_ROWS = 8192  # rows compared by the rel_l2 checks
NA = "n/a (not implemented)"

torch = None  # imported in main() so that --help works without torch
lowbit = None


def _err(ex: BaseException, limit: int = 400) -> str:
    s = " ".join(f"{type(ex).__name__}: {ex}".split())
    return s if len(s) <= limit else s[: limit - 2] + ".."


def _not_implemented(ex: BaseException) -> bool:
    """True for the errors lowbit raises where a CUDA kernel is not in the build."""
    nse = getattr(lowbit, "NotSupportedError", None) if lowbit is not None else None
    if isinstance(ex, NotImplementedError) or (isinstance(nse, type) and isinstance(ex, nse)):
        return True
    msg = str(ex).lower()
    return isinstance(ex, RuntimeError) and ("not in this build" in msg or "not implemented" in msg
                                             or "no sm_90a" in msg)


# ---------------------------------------------------------------------------------------------
# data

def make_weights(G, N, K, scale_lo, scale_hi, seed, dev):
    """Random MXFP4 weights: codes uint8 [G, N, K/2] (element 2k in the low nibble) and UE8M0
    scale bytes uint8 [G, N, K/32], row-major, uniform in [scale_lo, scale_hi]."""
    g = torch.Generator(device=dev).manual_seed(seed)
    codes = torch.randint(0, 256, (G, N, K // 2), dtype=torch.uint8, device=dev, generator=g)
    scales = torch.randint(scale_lo, scale_hi + 1, (G, N, K // 32), dtype=torch.uint8, device=dev, generator=g)
    return codes, scales


def swizzle_128x4_torch(s):
    """Row-major [G, R, C] -> 128x4 blocked [G, round_up(R,128), round_up(C,4)], zero padded:
    offset ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4 per matrix."""
    G, R, C = s.shape
    Rp, Cp = (R + 127) // 128 * 128, (C + 3) // 4 * 4
    p = torch.zeros((G, Rp, Cp), dtype=s.dtype, device=s.device)
    p[:, :R, :C] = s
    p = p.view(G, Rp // 128, 4, 32, Cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return p.reshape(G, Rp, Cp).contiguous()


def blocked_scales(s):
    """(128x4 blocked scales, how they were made): lowbit.block_scale_interleave on the device,
    else the torch formula above; where both run their bytes are compared."""
    ref = swizzle_128x4_torch(s)
    if lowbit is None:
        return ref, "torch formula (lowbit not importable)"
    try:
        got = lowbit.block_scale_interleave(s)
        if got.device != s.device:
            got = got.to(s.device)
        got = got.view(torch.uint8) if got.dtype != torch.uint8 else got
        same = tuple(got.shape) == tuple(ref.shape) and torch.equal(got, ref)
        return got, "lowbit.block_scale_interleave" + (" (== torch formula)" if same else " (DIFFERS from torch formula)")
    except Exception as ex:  # noqa: BLE001
        return ref, f"torch formula (lowbit.block_scale_interleave: {_err(ex, 120)})"


def dequant_bf16(codes, scales):
    """bf16 [G, N, K] = e2m1(code) * 2^(scale - 127), one expert at a time."""
    G, N, K2 = codes.shape
    lut = torch.tensor(E2M1, dtype=torch.float32, device=codes.device)
    out = torch.empty((G, N, 2 * K2), dtype=torch.bfloat16, device=codes.device)
    for g in range(G):
        c = codes[g].long()
        v = torch.stack([lut[c & 0xF], lut[c >> 4]], dim=-1).reshape(N, 2 * K2)
        s = torch.exp2(scales[g].float() - 127.0).repeat_interleave(32, dim=1)
        out[g] = (v * s).to(torch.bfloat16)
    return out


def make_routing(T, E, seed, dev):
    """Top-4 distinct experts per token from random router logits, softmax weights, and what the
    grouped GEMM takes: expert-sorted row order, m_indptr (int32 [E+1]) and offs (= m_indptr[1:])."""
    g = torch.Generator(device=dev).manual_seed(seed)
    logits = torch.randn((T, E), device=dev, generator=g)
    vals, ids = logits.topk(TOPK, dim=-1)
    weights = torch.softmax(vals, dim=-1).float().contiguous()
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=dev).index_add_(0, flat, torch.ones_like(flat))
    m_indptr = torch.zeros(E + 1, dtype=torch.int32, device=dev)
    m_indptr[1:] = counts.cumsum(0).to(torch.int32)
    counts_host = counts.tolist()
    starts = [0]
    for c in counts_host:
        starts.append(starts[-1] + c)
    return dict(ids=ids.to(torch.int32).contiguous(), weights=weights, order=order, tok=order // TOPK,
                m_indptr=m_indptr, offs=m_indptr[1:].contiguous(), counts=counts_host, starts=starts,
                active=sum(1 for c in counts_host if c > 0), cum_m=T * TOPK, logits=logits)


def quantize_acts(a, m_indptr):
    """MXFP8 E4M3 codes [cum_m, K] and UE8M0 scales in the grouped 128x4 layout (FlashInfer
    padding) by lowbit.quantize: on the device, else lowbit's CPU reference copied over.
    Returns (codes, scales, how, the lowbit.Quantized)."""
    try:
        qa = lowbit.quantize(a, "mxfp8_e4m3", "blocked128x4", m_indptr=m_indptr, group_pad="flashinfer")
        return qa.data, qa.scales, "lowbit.quantize on the device", qa
    except Exception as ex:  # noqa: BLE001
        first = _err(ex, 120)
    qa = lowbit.quantize(a.cpu(), "mxfp8_e4m3", "blocked128x4", m_indptr=m_indptr.cpu(), group_pad="flashinfer")
    return qa.data.to(a.device), qa.scales.to(a.device), f"lowbit.quantize on the CPU ({first})", qa


def dequant_acts(qa, dev):
    """bf16 values of MXFP8 activations (exact: e4m3 * 2^k fits bf16), None where lowbit cannot."""
    try:
        return lowbit.dequantize(qa, "bfloat16").to(dev)
    except Exception:  # noqa: BLE001
        return None


def qdq_mxfp8(t):
    """t through MXFP8 E4M3 (RCEIL, row-major scales) and back to bf16 with lowbit."""
    return lowbit.dequantize(lowbit.quantize(t, "mxfp8_e4m3"), "bfloat16")


def err_vs(x, ref, rows: int = CHECK_ROWS) -> str:
    """The FP8 path's error against the exact path's output: relative L2 and the largest
    |difference| over the largest |ref| (first `rows` rows)."""
    a, b = x[:rows].float(), ref[:rows].float()
    m = b.abs().max().item()
    mx = (a - b).abs().max().item() / m if m > 0 else float("nan")
    return f"fp8~exact rel_l2={rel_l2(x, ref, rows):.1e} max={mx:.1e}"


def loop_gemm(a, w16, starts, out):
    """out[rows of g] = a[rows of g] @ w16[g]^T per non-empty group (bf16, torch.mm)."""
    for g, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
        if e > s:
            torch.mm(a[s:e], w16[g].t(), out=out[s:e])
    return out


def grouped_mm_op():
    """torch._grouped_mm (or torch.nn.functional.grouped_mm), None where this torch has neither."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        fn = getattr(torch.nn.functional, "grouped_mm", None)
    return fn


def rel_l2(x, ref, rows: int = CHECK_ROWS) -> float:
    a = x[:rows].float()
    b = ref[:rows].float()
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else float("inf") if num > 0 else 0.0


# ---------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args, report: Report, dev):
        self.args = args
        self.report = report
        self.dev = dev
        self.t_start = time.perf_counter()
        self.peak = report.ceilings.get("bf16_tflops") or None
        self.copy = report.ceilings.get("copy_tbs") or None
        self.gmm = grouped_mm_op()
        self.scale_bytes = 0
        self.scale_outside = 0
        self.tk, self.tk_routing, self.tk_why = None, None, ""
        self.graph_failures = []  # captures that failed: those rows were timed eagerly
        try:  # OpenAI triton_kernels (vendored by vLLM): the W4A16 anchor of the grouped GEMM rows
            from triton_kernels.matmul_ogs import matmul_ogs
            from triton_kernels.routing import routing

            self.tk, self.tk_routing = matmul_ogs, routing
        except Exception as ex:  # noqa: BLE001
            self.tk_why = "triton_kernels does not import: " + _err(ex, 120)

    def over_budget(self) -> bool:
        b = self.args.budget_s
        return b is not None and time.perf_counter() - self.t_start > b

    def time(self, fn, T):
        a = self.args
        iters = a.iters if not a.quick else max(5, a.iters // 3)
        if a.timing == "graph":
            # every row, lowbit's and the anchors', as CUDA-graph replays: at small T an eager call
            # measures the host cost of whichever op has more Python (triton_kernels: ~250-500 us)
            try:
                return time_graph(fn, warmup=max(1, a.warmup), iters=iters, flush_l2=not a.no_flush,
                                  max_seconds=a.max_seconds)
            except Exception as ex:  # noqa: BLE001
                self.graph_failures.append(_err(ex, 120))
                torch.cuda.synchronize()
        sync = a.small_timing == "host" and T <= 16
        return time_fn(fn, warmup=a.warmup, iters=iters, flush_l2=not a.no_flush, sync=sync,
                       max_seconds=a.max_seconds)

    def count_scales(self, s) -> None:
        self.scale_bytes += s.numel()
        self.scale_outside += int(((s < FAST_WINDOW[0]) | (s > FAST_WINDOW[1])).sum().item())

    def floor_us(self, nbytes):
        return nbytes / (self.copy * 1e6) if self.copy else None

    def weights(self, model, gemm):
        G = MODELS[model]
        N, K = GEMMS[gemm]
        lo, hi = self.args.weight_scales
        codes, scales = make_weights(G, N, K, lo, hi, seed=1000 * G + N + 7 * K, dev=self.dev)
        self.count_scales(scales)
        return codes, scales

    # -- rows ---------------------------------------------------------------------------------
    def run_lowbit(self, fn, T):
        """(Timing or None, status, message, output of one untimed call)."""
        if lowbit is None:
            return None, "error", "lowbit not importable", None
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as ex:  # noqa: BLE001
            if _not_implemented(ex):
                return None, "na", _err(ex, 200), None
            if self.args.verbose:
                traceback.print_exc()
            return None, "error", _err(ex), None
        try:
            return self.time(fn, T), "ok", "", out
        except Exception as ex:  # noqa: BLE001
            return None, "error", "timing: " + _err(ex), out

    def run_anchor(self, fn, T):
        """(Timing or None, error message, output of one untimed call)."""
        try:
            out = fn()
            torch.cuda.synchronize()
            return self.time(fn, T), "", out
        except Exception as ex:  # noqa: BLE001
            if self.args.verbose:
                traceback.print_exc()
            return None, _err(ex), None

    def emit(self, op, shape, lb, anchors, flops, floor_bytes, info):
        """One row per anchor. lb: (Timing, status, message, check); anchors: [(name, Timing,
        error, check)]; info: note text shared by the rows."""
        t_lb, status, msg, lb_check = lb
        floor = self.floor_us(floor_bytes)
        rate = flops / (t_lb.median_us * 1e-6) / 1e12 if t_lb else None
        frac = rate / self.peak if (rate is not None and self.peak) else None
        for name, t_an, an_err, an_check in anchors:
            parts = []
            if t_lb is not None and floor is not None:
                parts.append(f"floor {floor:.1f} us, {floor / t_lb.median_us:.2f} reached")
            elif floor is not None:
                parts.append(f"floor {floor:.1f} us")
            if t_an is not None:
                ar = flops / (t_an.median_us * 1e-6) / 1e12
                parts.append(f"anchor {ar:.1f} TFLOP/s" + (f" = {100 * ar / self.peak:.0f}% peak" if self.peak else ""))
            parts.append(info)
            check = []
            error = ""
            if status == "na":
                check.append(NA)
                parts.append(f"lowbit: {msg}")
            elif status == "error":
                error = f"lowbit: {msg}"
            elif lb_check:
                check.append(lb_check)
            if an_check:
                check.append(an_check)
            if an_err:
                error = (error + "; " if error else "") + f"anchor: {an_err}"
            self.report.add(Row(
                op=op, shape=shape, lowbit_us=t_lb.median_us if t_lb else None, anchor=name,
                anchor_us=t_an.median_us if t_an else None,
                ratio=(t_an.median_us / t_lb.median_us) if (t_lb and t_an) else None,
                rate=rate, rate_unit="TFLOP/s", frac_ceiling=frac, ceiling="bf16_tflops", flops=flops,
                bytes=floor_bytes, lowbit_p10_us=t_lb.p10_us if t_lb else None,
                lowbit_p90_us=t_lb.p90_us if t_lb else None, anchor_p10_us=t_an.p10_us if t_an else None,
                anchor_p90_us=t_an.p90_us if t_an else None,
                timing=(t_lb or t_an).mode if (t_lb or t_an) else "", check=" ".join(check),
                note="; ".join(p for p in parts if p), error=error))

    def skip(self, op, shape, why="skipped: time budget"):
        self.report.add(Row(op=op, shape=shape, anchor="-", error=why))

    # -- the grouped GEMMs ----------------------------------------------------------------------
    def gemm_model(self, model, gemm, tokens):
        G = MODELS[model]
        N, K = GEMMS[gemm]
        ops = [f"moe_{gemm}_w4a8", f"moe_{gemm}_w4a16", f"moe_{gemm}_w4a8_packed", f"moe_{gemm}_w4a16_packed",
               f"moe_{gemm}_w4a8_fp8"]
        if self.over_budget():
            for T in tokens:
                for op in ops:
                    self.skip(op, f"{model}/T{T}")
            return
        codes, scales = self.weights(model, gemm)
        if self.args.b_scale_layout == "blocked128x4":
            b_scale, how = blocked_scales(scales)
            self.report.meta.setdefault("weight scales (blocked128x4)", how)
        else:
            b_scale = scales
        w16 = dequant_bf16(codes, scales)
        w16t = w16.transpose(-2, -1)  # [G, K, N], K-major: the mat_b layout of torch._grouped_mm
        packed = None  # group_gemm_mxfp4_prepack of the weights (load time: not timed)
        packed8 = None  # the same for the FP8 tensor-core path (precision="fp8")
        if lowbit is not None:
            try:
                packed = lowbit.group_gemm_mxfp4_prepack(codes, b_scale, b_scale_layout=self.args.b_scale_layout)
            except Exception as ex:  # noqa: BLE001
                packed = _err(ex)
            try:
                packed8 = lowbit.group_gemm_mxfp4_prepack(codes, b_scale, b_scale_layout=self.args.b_scale_layout,
                                                          precision="fp8")
            except Exception as ex:  # noqa: BLE001
                packed8 = _err(ex)
        tk = None  # triton_kernels' weights (load time: not timed)
        if self.tk is not None:
            try:
                tk = tk_weights(codes, scales)
            except Exception as ex:  # noqa: BLE001
                tk = "triton_kernels weights: " + _err(ex, 160)
        else:
            tk = self.tk_why
        # bytes of one expert's packed weights and scales (unpadded scale count: a lower bound)
        w_bytes = N * K // 2 + N * K // 32
        try:
            for T in tokens:
                shape = f"{model}/T{T}"
                if self.over_budget():
                    for op in ops:
                        self.skip(op, shape)
                    continue
                try:
                    self.gemm_shape(model, gemm, T, G, N, K, codes, b_scale, packed, w16, w16t, w_bytes, ops, shape,
                                    packed8, tk)
                except Exception as ex:  # noqa: BLE001
                    self.report.add(Row(op=f"moe_{gemm}", shape=shape, anchor="-", error="bench: " + _err(ex)))
                    if self.args.verbose:
                        traceback.print_exc()
                torch.cuda.empty_cache()
        finally:
            del codes, scales, b_scale, w16, w16t, packed, packed8, tk
            torch.cuda.empty_cache()

    def gemm_shape(self, model, gemm, T, G, N, K, codes, b_scale, packed, w16, w16t, w_bytes, ops, shape,
                   packed8=None, tk=None):
        dev = self.dev
        r = make_routing(T, G, seed=17 * T + G, dev=dev)
        cum_m, active = r["cum_m"], r["active"]
        gen = torch.Generator(device=dev).manual_seed(31 * T + N + K)
        if gemm == "gate_up":
            x = torch.randn((T, K), device=dev, generator=gen).to(torch.bfloat16)
            a16 = x.index_select(0, r["tok"]).contiguous()  # expert-sorted rows
        else:
            a16 = torch.randn((cum_m, K), device=dev, generator=gen).to(torch.bfloat16)
        flops = 2.0 * cum_m * N * K
        info = f"active {active}/{G} experts, cum_m {cum_m}"

        # anchors
        anchors = []
        out_loop = torch.empty((cum_m, N), dtype=torch.bfloat16, device=dev)
        jobs = [(a16[s:e], w16[g].t(), out_loop[s:e])
                for g, (s, e) in enumerate(zip(r["starts"][:-1], r["starts"][1:])) if e > s]

        def loop():
            for a, w, o in jobs:
                torch.mm(a, w, out=o)
            return out_loop

        t_loop, e_loop, ref_loop = self.run_anchor(loop, T)
        if self.gmm is None:
            anchors.append(("torch_grouped_mm_bf16", None,
                            f"skipped: torch {torch.__version__} has neither torch._grouped_mm nor "
                            "torch.nn.functional.grouped_mm", ""))
            ref_gmm = None
        else:
            offs = r["offs"]
            t_gmm, e_gmm, ref_gmm = self.run_anchor(lambda: self.gmm(a16, w16t, offs=offs), T)
            chk = f"gmm~loop={rel_l2(ref_gmm, ref_loop):.1e}" if (ref_gmm is not None and ref_loop is not None) else ""
            anchors.append(("torch_grouped_mm_bf16", t_gmm, e_gmm, chk))
        anchors.append(("torch_loop_bf16", t_loop, e_loop, ""))
        ref = ref_loop if ref_loop is not None else ref_gmm
        if isinstance(tk, tuple):  # triton_kernels matmul_ogs on the expert-sorted bf16 rows (its own order)
            try:
                w_tk, pc = tk
                rdata, _, _ = self.tk_routing(r["logits"], TOPK, sm_first=False)
                xs = a16  # timing needs [cum_m, K] rows in expert order; values do not change it
                t_tk, e_tk, o_tk = self.run_anchor(lambda: self.tk(xs, w_tk, None, rdata, precision_config=pc), T)
                anchors.append(("triton_kernels_mxfp4", t_tk, e_tk, ""))
            except Exception as ex:  # noqa: BLE001
                anchors.append(("triton_kernels_mxfp4", None, _err(ex, 200), ""))
        elif tk:
            anchors.append(("triton_kernels_mxfp4", None, f"skipped: {tk}", ""))

        out = torch.empty((cum_m, N), dtype=torch.bfloat16, device=dev)
        lay = self.args.b_scale_layout
        # memory floor: active experts' weights + scales, activations (+ scales), m_indptr, output
        common = active * w_bytes + (G + 1) * 4 + cum_m * N * 2

        plain_out = {}
        for pk in (False, True):
            if pk and not isinstance(packed, tuple):
                for op in ops[2:4]:
                    self.report.add(Row(op=op, shape=shape, anchor="-", error="prepack: " + str(packed)))
                break
            b_, s_ = packed if pk else (codes, b_scale)
            kw = dict(b_packed=True) if pk else dict(b_scale_layout=lay)
            sfx = "_packed" if pk else ""

            def same_as_plain(o, act):  # the packed weights give the plain path's bits
                return "" if not pk or act not in plain_out or o is None else f"==plain:{bool(torch.equal(o, plain_out[act]))}"

            # W4A8: MXFP8 activations
            lb = (None, "error", "lowbit not importable", "")
            if lowbit is not None:
                try:
                    qa, qs, how, qobj = quantize_acts(a16, r["m_indptr"])
                    self.report.meta.setdefault("activation quantize", how)
                    ind = r["m_indptr"]
                    t, st, msg, o = self.run_lowbit(
                        lambda: lowbit.group_gemm_mxfp4_nt_groupwise(
                            qa, b_, qs, s_, ind, "bfloat16", a_scale_layout="blocked128x4", group_pad="flashinfer",
                            out=out, **kw), T)
                    chk = same_as_plain(o, "a8")
                    if o is not None and not pk:
                        plain_out["a8"] = o.clone()
                        # reference: the bf16 loop on the dequantized MXFP8 activations (kernel error only)
                        a_dq = dequant_acts(qobj, dev)
                        if a_dq is not None:
                            ref8 = loop_gemm(a_dq, w16, r["starts"], torch.empty_like(out))
                            chk = f"rel_l2={rel_l2(o, ref8):.1e}"
                            del a_dq, ref8
                        elif ref is not None:
                            chk = f"rel_l2={rel_l2(o, ref):.1e}(bf16 acts)"
                    lb = (t, st, msg, chk)
                    del qa, qs, qobj
                except Exception as ex:  # noqa: BLE001
                    lb = (None, "na" if _not_implemented(ex) else "error", "activations: " + _err(ex), "")
            self.emit(ops[0] + sfx, shape, lb, anchors, flops, common + cum_m * K + cum_m * K // 32, info)

            # W4A16: bf16 activations
            lb = (None, "error", "lowbit not importable", "")
            if lowbit is not None:
                ind = r["m_indptr"]
                t, st, msg, o = self.run_lowbit(
                    lambda: lowbit.group_gemm_mxfp4_nt_groupwise(a16, b_, None, s_, ind, "bfloat16", out=out, **kw), T)
                chk = same_as_plain(o, "a16")
                if o is not None and not pk:
                    plain_out["a16"] = o.clone()
                    chk = f"rel_l2={rel_l2(o, ref):.1e}" if ref is not None else ""
                lb = (t, st, msg, chk)
            self.emit(ops[1] + sfx, shape, lb, anchors, flops, common + cum_m * K * 2, info)

        # W4A8 on the FP8 tensor cores (precision="fp8", opt-in, not bit-exact): the check is its
        # error against the exact W4A8 path's output on the same operands
        if not isinstance(packed8, tuple):
            self.report.add(Row(op=ops[4], shape=shape, anchor="-", error="prepack: " + str(packed8)))
            return
        lb = (None, "error", "lowbit not importable", "")
        try:
            qa, qs, _, _ = quantize_acts(a16, r["m_indptr"])
            ind = r["m_indptr"]
            pb8, ps8 = packed8
            t, st, msg, o = self.run_lowbit(
                lambda: lowbit.group_gemm_mxfp4_nt_groupwise(
                    qa, pb8, qs, ps8, ind, "bfloat16", a_scale_layout="blocked128x4", group_pad="flashinfer",
                    out=out, b_packed=True, precision="fp8"), T)
            chk = err_vs(o, plain_out["a8"]) if (o is not None and "a8" in plain_out) else ""
            lb = (t, st, msg, chk)
            del qa, qs
        except Exception as ex:  # noqa: BLE001
            lb = (None, "na" if _not_implemented(ex) else "error", "fp8 path: " + _err(ex), "")
        self.emit(ops[4], shape, lb, anchors, flops, common + cum_m * K + cum_m * K // 32, info)

    # -- the whole MLP --------------------------------------------------------------------------
    def mlp_model(self, model, tokens):
        E = MODELS[model]
        ops = ["moe_mlp_bf16", "moe_mlp_mxfp8", "moe_mlp_bf16_packed", "moe_mlp_mxfp8_packed"]
        if self.over_budget():
            for T in tokens:
                for op in ops:
                    self.skip(op, f"{model}/T{T}")
            return
        dev = self.dev
        w1, w1s = self.weights(model, "gate_up")  # [E, 2I, H/2], [E, 2I, H/32]
        w2, w2s = self.weights(model, "down")  # [E, H, I/2], [E, H, I/32]
        gen = torch.Generator(device=dev).manual_seed(4242 + E)
        b1 = (0.1 * torch.randn((E, 2 * INTER), device=dev, generator=gen)).to(torch.bfloat16)
        b2 = (0.1 * torch.randn((E, HIDDEN), device=dev, generator=gen)).to(torch.bfloat16)
        W1 = dequant_bf16(w1, w1s)
        W2 = dequant_bf16(w2, w2s)
        packed = None
        if lowbit is not None:
            try:
                packed = (lowbit.group_gemm_mxfp4_prepack(w1, w1s, b_scale_layout="row_major")
                          + lowbit.group_gemm_mxfp4_prepack(w2, w2s, b_scale_layout="row_major"))
            except Exception as ex:  # noqa: BLE001
                packed = _err(ex)
        try:
            for T in tokens:
                shape = f"{model}/T{T}"
                if self.over_budget():
                    for op in ops:
                        self.skip(op, shape)
                    continue
                try:
                    self.mlp_shape(model, T, E, w1, w1s, b1, w2, w2s, b2, W1, W2, packed, ops, shape)
                except Exception as ex:  # noqa: BLE001
                    self.report.add(Row(op="moe_mlp", shape=shape, anchor="-", error="bench: " + _err(ex)))
                    if self.args.verbose:
                        traceback.print_exc()
                torch.cuda.empty_cache()
        finally:
            del w1, w1s, w2, w2s, b1, b2, W1, W2, packed
            torch.cuda.empty_cache()

    def mlp_shape(self, model, T, E, w1, w1s, b1, w2, w2s, b2, W1, W2, packed, ops, shape):
        dev = self.dev
        H, I = HIDDEN, INTER
        r = make_routing(T, E, seed=17 * T + E, dev=dev)
        cum_m, active = r["cum_m"], r["active"]
        gen = torch.Generator(device=dev).manual_seed(77 * T + E)
        x = torch.randn((T, H), device=dev, generator=gen).to(torch.bfloat16)
        ids, wts = r["ids"], r["weights"]
        W1t, W2t = W1.transpose(-2, -1), W2.transpose(-2, -1)
        b1f, b2f = b1.float(), b2.float()
        gmm = self.gmm

        def eager(grouped: bool, qdq=None):
            flat = ids.reshape(-1).long()
            order = torch.argsort(flat, stable=True)
            eid = flat[order]
            tok = order // TOPK
            wrow = wts.reshape(-1)[order]
            xs = x.index_select(0, tok)
            if qdq is not None:
                xs = qdq(xs)
            if grouped:
                counts = torch.zeros(E, dtype=torch.int64, device=dev).index_add_(0, flat, torch.ones_like(flat))
                offs = counts.cumsum(0).to(torch.int32)
                h = gmm(xs, W1t, offs=offs)
            else:
                counts = torch.bincount(flat, minlength=E).tolist()
                h = torch.empty((cum_m, 2 * I), dtype=torch.bfloat16, device=dev)
                s = 0
                for e, c in enumerate(counts):
                    if c:
                        torch.mm(xs[s:s + c], W1[e].t(), out=h[s:s + c])
                        s += c
            h = h.float() + b1f.index_select(0, eid)
            g = h[:, 0::2].clamp(max=LIMIT)
            u = h[:, 1::2].clamp(min=-LIMIT, max=LIMIT)
            y = (g * torch.sigmoid(ALPHA * g) * (u + 1.0)).to(torch.bfloat16)
            if qdq is not None:
                y = qdq(y)
            if grouped:
                o = gmm(y, W2t, offs=offs)
            else:
                o = torch.empty((cum_m, H), dtype=torch.bfloat16, device=dev)
                s = 0
                for e, c in enumerate(counts):
                    if c:
                        torch.mm(y[s:s + c], W2[e].t(), out=o[s:s + c])
                        s += c
            o = (o.float() + b2f.index_select(0, eid)) * wrow[:, None]
            return torch.zeros((T, H), dtype=torch.float32, device=dev).index_add_(0, tok, o).to(torch.bfloat16)

        anchors = []
        t_loop, e_loop, ref_loop = self.run_anchor(lambda: eager(False), T)
        if gmm is None:
            anchors.append(("torch_eager_grouped_mm", None,
                            f"skipped: torch {torch.__version__} has neither torch._grouped_mm nor "
                            "torch.nn.functional.grouped_mm", ""))
            ref_gmm = None
        else:
            t_gmm, e_gmm, ref_gmm = self.run_anchor(lambda: eager(True), T)
            chk = f"gmm~loop={rel_l2(ref_gmm, ref_loop):.1e}" if (ref_gmm is not None and ref_loop is not None) else ""
            anchors.append(("torch_eager_grouped_mm", t_gmm, e_gmm, chk))
        anchors.append(("torch_eager_loop", t_loop, e_loop, ""))
        ref = ref_loop if ref_loop is not None else ref_gmm

        flops = 2.0 * cum_m * (2 * I * H + H * I)
        per_expert = (2 * I * H // 2 + 2 * I * H // 32 + 2 * I * 2) + (H * I // 2 + H * I // 32 + H * 2)
        floor_bytes = active * per_expert + T * H * 2 + T * TOPK * 8 + T * H * 2
        info = f"active {active}/{E} experts, T {T}"
        out = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
        plain_out = {}
        for op, act, pk in zip(ops, ("bf16", "mxfp8") * 2, (False, False, True, True)):
            if pk and not isinstance(packed, tuple):
                self.report.add(Row(op=op, shape=shape, anchor="-", error="prepack: " + str(packed)))
                continue
            ws = packed if pk else (w1, w1s, w2, w2s)
            lb = (None, "error", "lowbit not importable", "")
            if lowbit is not None:
                t, st, msg, o = self.run_lowbit(
                    lambda: lowbit.gpt_oss_moe_mlp(x, ids, wts, ws[0], ws[1], b1, ws[2], ws[3], b2, alpha=ALPHA,
                                                   limit=LIMIT, act=act, out=out, packed=pk), T)
                chk = ""
                if pk:  # prepacked weights give the plain path's bits
                    if o is not None and act in plain_out:
                        chk = f"==plain:{bool(torch.equal(o, plain_out[act]))}"
                elif o is not None and act == "mxfp8":
                    plain_out[act] = o.clone()
                    # reference: the eager loop with the two GEMM inputs through MXFP8 and back
                    try:
                        chk = f"rel_l2={rel_l2(o, eager(False, qdq_mxfp8)):.1e}"
                    except Exception:  # noqa: BLE001
                        chk = f"rel_l2={rel_l2(o, ref):.1e}(bf16 acts)" if ref is not None else ""
                elif o is not None:
                    plain_out[act] = o.clone()
                    chk = f"rel_l2={rel_l2(o, ref):.1e}" if ref is not None else ""
                lb = (t, st, msg, chk)
            self.emit(op, shape, lb, anchors, flops, floor_bytes, info)
