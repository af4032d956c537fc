"""Conversion kernels of lowbit against the PyTorch formulas and any peer kernel, in one run.

For every conversion op of the Python API that runs on the GPU (quantize to per-token-group
FP8, INT4 / UINT4, MXFP8, MXFP4, NVFP4, NF4; dequantize of each back to bf16; transcode
INT4 -> FP8 and MXFP4 -> MXFP8; FP8 -> bf16 cast; block_scale_interleave) this times lowbit
and, on the same inputs in the same process:
  torch_eager    the PyTorch formula written below (the recipe serving engines use)
  torch_compile  the same function through torch.compile (compile time excluded: warmed up;
                 mode "default" unless --compile-mode says otherwise; dynamic=False)
  peer:<pkg>     kernels of sgl_kernel / vllm / flashinfer / bitsandbytes where importable
Each row gives TB/s (bytes read + written, scales included), the fraction of the copy
bandwidth measured in this process, and anchor_us / lowbit_us (> 1: lowbit faster).

Checks, outside the timed region, once per op and shape:
  cpu=ok   lowbit's CUDA output is byte-equal to lowbit's CPU reference on a slice of rows
  val=F    fraction of elements where lowbit's result and the anchor's agree in value (decoded
           to fp32, within 1e-5 relative; dequantize anchors decode lowbit's own codes, so 1.0
           is expected); "(LOW)" below 0.999 (quantize) or 0.9999 (exact ops)

Large shapes (16384x7168 = 224 MiB bf16, 32768x8192 = 512 MiB) are timed with the queue fed
(device time); small launch-bound shapes (1x7168, 16x7168) with a device sync before each
call, so the host's launch overhead is included (timing "host"). L2 is flushed before every
timed call.

Run from the repository root on a machine with the package installed:
    python bench/bench_conversions.py                  # all ops, all shapes
    python bench/bench_conversions.py --ops mxfp8,nvfp4 --shapes 16384x7168 --json out.json
    python bench/bench_conversions.py --device cpu --quick   # smoke run of the bench itself

The PyTorch formulas, value tables and decoders are in lowbit_bench/conversion_refs.py, the peer
kernels in lowbit_bench/conversion_peers.py.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lowbit_bench import Report, Row, add_common_args, measure_ceilings, time_fn  # noqa: E402

import torch  # noqa: E402

from lowbit_bench.conversion_refs import (  # noqa: E402
    as_u8, dec_fp8_group, dec_int4, dec_mxfp4, dec_mxfp8, dec_nf4, dec_nvfp4, dec_uint4, FP8_MAX,
    nbytes, q_fields, tensors_of, to_blocked128x4, torch_cast_bf16, torch_dq_fp8_group, torch_dq_int4,
    torch_dq_mxfp4, torch_dq_mxfp8, torch_dq_nf4, torch_dq_nvfp4, torch_dq_uint4, torch_int4,
    torch_mxfp4, torch_mxfp8, torch_nf4, torch_nvfp4, torch_ptgq_fp8, torch_tc_int4_fp8,
    torch_tc_mxfp4_mxfp8, torch_uint4
)
from lowbit_bench.conversion_peers import (  # noqa: E402
    _peer_bnb_nf4_dequant, _peer_bnb_nf4_quant, _peer_flashinfer_mxfp4, _peer_flashinfer_mxfp8,
    _peer_flashinfer_nvfp4, PEER_MODULES, _peer_sgl_ptgq, _peer_vllm_ptgq
)


BENCH = "bench_conversions"
DEFAULT_SHAPES = ["16384x7168", "16x7168", "1x7168", "32768x8192"]


lowbit = None  # imported in main()


# Cases
# =============================================================================================

class Case:
    """One op: how to prepare inputs, call lowbit and the anchor, count bytes and compare.

    lb_prep(x) -> args        lowbit's inputs made from the bf16 input x (on x's device)
    lb_call(*args) -> out
    an_prep(x, lb_args) -> args     the anchor's inputs (dequantize anchors take lowbit's codes)
    an_call(*args) -> out     a pure PyTorch function (also compiled)
    nbytes(args, out) -> int  bytes read + written by one call (scales and zero points included)
    lb_value(out, m, k) / an_value(out, m, k) -> tensor compared element-wise (fp32 values)
    peers: [(label, module, make(x) -> (fn, args))]
    """

    def __init__(self, name, lb_prep, lb_call, an_prep, an_call, nbytes_fn, lb_value, an_value,
                 peers=(), note="", min_agree=0.999):
        self.name = name
        self.lb_prep = lb_prep
        self.lb_call = lb_call
        self.an_prep = an_prep
        self.an_call = an_call
        self.nbytes = nbytes_fn
        self.lb_value = lb_value
        self.an_value = an_value
        self.peers = list(peers)
        self.note = note
        self.min_agree = min_agree


def _quant_bytes(args, out):
    return nbytes(args[0]) + nbytes(out)


def _dequant_bytes(args, out):
    return nbytes(args) + nbytes(out)


def build_cases() -> List[Case]:
    lb = lambda: lowbit  # noqa: E731  (late binding: lowbit is imported in main)
    cases: List[Case] = []

    # --- per-token-group FP8 (group 128), fp32 and UE8M0 scales, row- and column-major --------
    for ue8m0 in (False, True):
        for col in (False, True):
            name = f"ptgq_fp8_g128_{'ue8m0' if ue8m0 else 'f32'}_{'col' if col else 'row'}"
            layout = "col_major" if col else "row_major"

            def lb_call(x, _u=ue8m0, _c=col):
                return lb().per_token_group_quant(x, group_size=128, dtype="float8_e4m3fn",
                                                  scale_ue8m0=_u, column_major_scales=_c)

            def an_call(x, _u=ue8m0, _c=col):
                return torch_ptgq_fp8(x, 128, _u, _c)

            peers = [("peer:sgl_kernel", "sgl_kernel", _peer_sgl_ptgq(ue8m0, col))]
            if not ue8m0:
                peers.append(("peer:vllm", "vllm", _peer_vllm_ptgq(col)))
            cases.append(Case(
                name, lambda x: (x,), lb_call, lambda x, a: (x,), an_call, _quant_bytes,
                lambda o, m, k, _l=layout: dec_fp8_group(o[0], o[1], m, k, 128, _l),
                lambda o, m, k, _l=layout: dec_fp8_group(o[0], o[1], m, k, 128, _l),
                peers=peers))

    # --- INT4 / UINT4 groups of 128 ---------------------------------------------------------
    cases.append(Case(
        "quant_int4_g128_sym", lambda x: (x,), lambda x: lb().quantize(x, "int4"),
        lambda x, a: (x,), torch_int4, _quant_bytes,
        lambda o, m, k: dec_int4(*q_fields(o)[:2], m, k),
        lambda o, m, k: dec_int4(o[0], o[1], m, k)))
    cases.append(Case(
        "quant_uint4_g128_zp", lambda x: (x,), lambda x: lb().quantize(x, "uint4"),
        lambda x, a: (x,), torch_uint4, _quant_bytes,
        lambda o, m, k: dec_uint4(*q_fields(o)[:3], m, k),
        lambda o, m, k: dec_uint4(o[0], o[1], o[2], m, k)))

    # --- MXFP8 (RCEIL), row-major and swizzled scales ----------------------------------------
    for sw in (False, True):
        layout = "blocked128x4" if sw else "row_major"
        cases.append(Case(
            f"mxfp8_quantize_{'swizzled' if sw else 'row'}", lambda x: (x,),
            lambda x, _s=sw: lb().mxfp8_quantize(x, swizzled=_s, rounding="rceil"),
            lambda x, a: (x,), lambda x, _s=sw: torch_mxfp8(x, _s), _quant_bytes,
            lambda o, m, k, _l=layout: dec_mxfp8(o[0], o[1], m, k, _l),
            lambda o, m, k, _l=layout: dec_mxfp8(o[0], o[1], m, k, _l),
            peers=[("peer:flashinfer", "flashinfer", _peer_flashinfer_mxfp8(sw))]))

    # --- MXFP4 -------------------------------------------------------------------------------
    cases.append(Case(
        "mxfp4_quantize_row", lambda x: (x,), lambda x: lb().mxfp4_quantize(x, swizzled=False, rounding="rceil"),
        lambda x, a: (x,), torch_mxfp4, _quant_bytes,
        lambda o, m, k: dec_mxfp4(o[0], o[1], m, k),
        lambda o, m, k: dec_mxfp4(o[0], o[1], m, k),
        peers=[("peer:flashinfer", "flashinfer", _peer_flashinfer_mxfp4())]))

    # --- NVFP4: global amax computed in the call, and passed in ------------------------------
    cases.append(Case(
        "nvfp4_quantize_amax_in_call", lambda x: (x,),
        lambda x: lb().quantize(x, "nvfp4", compute_global_amax=True),
        lambda x, a: (x,), lambda x: torch_nvfp4(x, None),
        lambda a, o: 2 * nbytes(a[0]) + nbytes(o),
        lambda o, m, k: dec_nvfp4(*[q_fields(o)[i] for i in (0, 1, 3)], m, k),
        lambda o, m, k: dec_nvfp4(o[0], o[1], o[2], m, k),
        note="x read twice: amax pass + quantize pass"))

    def _amax_args(x):
        return (x, x.abs().amax().float().reshape(1))

    def lb_nvfp4_given(x, g):
        q, s = q_fields(lb().nvfp4_quantize(x, global_amax=g, swizzled=False))[:2]
        return q, s, g  # g is the input amax, kept for decoding

    cases.append(Case(
        "nvfp4_quantize_amax_given", _amax_args, lb_nvfp4_given,
        lambda x, a: (x, a[1]), lambda x, g: torch_nvfp4(x, g),
        lambda a, o: nbytes(a[0]) + nbytes(o[0], o[1]),
        lambda o, m, k: dec_nvfp4(o[0], o[1], o[2], m, k),
        lambda o, m, k: dec_nvfp4(o[0], o[1], o[2], m, k),
        peers=[("peer:flashinfer", "flashinfer", _peer_flashinfer_nvfp4())]))

    # --- NF4 (block 64) ----------------------------------------------------------------------
    cases.append(Case(
        "quant_nf4_b64", lambda x: (x,), lambda x: lb().quantize(x, "nf4"),
        lambda x, a: (x,), torch_nf4, _quant_bytes,
        lambda o, m, k: dec_nf4(*q_fields(o)[:2], m, k),
        lambda o, m, k: dec_nf4(o[0], o[1], m, k),
        peers=[("peer:bitsandbytes", "bitsandbytes", _peer_bnb_nf4_quant())]))

    # --- dequantize of each back to bf16 (the anchors decode lowbit's own codes) -------------
    def dq_case(name, fmt, an_fn, fields, qkw=None, peers=()):
        qkw = dict(qkw or {})

        def lb_prep(x):
            return (lb().quantize(x, fmt, **qkw),)

        def an_prep(x, a):
            d, s, z, g = q_fields(a[0])
            m = x.shape[0]
            pick = {"d": as_u8(d.reshape(m, -1)), "s": None if s is None else as_u8(s.reshape(m, -1)),
                    "z": None if z is None else z.reshape(m, -1), "g": g}
            return tuple(pick[f] for f in fields)

        cases.append(Case(
            name, lb_prep, lambda qt: lb().dequantize(qt, out_dtype="bfloat16"),
            an_prep, an_fn, lambda a, o: nbytes(q_fields(a[0])) + nbytes(o),
            lambda o, m, k: o.reshape(m, k).float(), lambda o, m, k: o.reshape(m, k).float(),
            peers=peers, min_agree=0.9999))

    dq_case("dequant_fp8_g128_f32", "fp8_e4m3", torch_dq_fp8_group, "ds")
    dq_case("dequant_int4_g128", "int4", torch_dq_int4, "ds")
    dq_case("dequant_uint4_g128", "uint4", torch_dq_uint4, "dsz")
    dq_case("dequant_mxfp8", "mxfp8_e4m3", torch_dq_mxfp8, "ds")
    dq_case("dequant_mxfp4", "mxfp4", torch_dq_mxfp4, "ds")
    dq_case("dequant_nvfp4", "nvfp4", torch_dq_nvfp4, "dsg", qkw={"compute_global_amax": True})
    dq_case("dequant_nf4_b64", "nf4", torch_dq_nf4, "ds",
            peers=[("peer:bitsandbytes", "bitsandbytes", _peer_bnb_nf4_dequant())])

    # --- transcode (exact code conversion, scales kept) --------------------------------------
    def tc_case(name, fmt, an_fn):
        def an_prep(x, a):
            d = q_fields(a[0])[0]
            return (as_u8(d.reshape(x.shape[0], -1)),)

        def data_of(o):
            return q_fields(o)[0]

        cases.append(Case(
            name, lambda x: (lb().quantize(x, fmt),),
            lambda qt: lb().transcode(qt, out_dtype="float8_e4m3fn"),
            an_prep, an_fn, lambda a, o: nbytes(q_fields(a[0])[0]) + nbytes(data_of(o)),
            lambda o, m, k: data_of(o).reshape(m, k).view(torch.float8_e4m3fn).float(),
            lambda o, m, k: o.reshape(m, k).float(),
            note="codes only: scales are kept, not copied", min_agree=0.9999))

    tc_case("transcode_int4_to_fp8", "int4", torch_tc_int4_fp8)
    tc_case("transcode_mxfp4_to_mxfp8", "mxfp4", torch_tc_mxfp4_mxfp8)

    # --- cast and scale layout ---------------------------------------------------------------
    def x8_prep(x):
        return (x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn),)

    cases.append(Case(
        "cast_fp8_to_bf16", x8_prep, lambda x8: lb().cast(x8, "bfloat16"),
        lambda x, a: a, torch_cast_bf16, lambda a, o: nbytes(a) + nbytes(o),
        lambda o, m, k: o.reshape(m, k).float(), lambda o, m, k: o.reshape(m, k).float(), min_agree=0.9999))

    def sc_prep(x):
        _, s = lb().mxfp8_quantize(x, swizzled=False)
        return (s.reshape(x.shape[0], -1),)

    cases.append(Case(
        "block_scale_interleave_mxfp8", sc_prep, lambda s: lb().block_scale_interleave(s),
        lambda x, a: (as_u8(a[0]),), to_blocked128x4, lambda a, o: nbytes(a) + nbytes(o),
        lambda o, m, k: o.contiguous().view(torch.uint8).reshape(-1).float(),
        lambda o, m, k: o.contiguous().view(torch.uint8).reshape(-1).float(),
        note="input: the [M, K/32] UE8M0 scales of the shape", min_agree=0.9999))

    return cases


# =============================================================================================
# Running
# =============================================================================================

def _err(ex: BaseException) -> str:
    return f"{type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"[:300]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    b = b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return a.shape == b.shape and bool(torch.equal(a, b))


AGREE_RTOL = 1e-5


def _agree(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements with |a - b| <= 1e-5 |b| (or both NaN).

    NOTE: not exact equality: torch on CUDA divides by a Python scalar as a multiply by its
    reciprocal and Inductor does the same for constant divisors, so an anchor's fp32 scale can
    sit one ulp away from lowbit's IEEE division; the decoded values then differ by ~1e-7
    relative. A different code (a rounding boundary crossed) still counts as disagreement."""
    a = a.reshape(-1).float()
    b = b.reshape(-1).to(a.device).float()
    if a.numel() != b.numel():
        raise ValueError(f"{a.numel()} vs {b.numel()} elements")
    ok = ((a - b).abs() <= AGREE_RTOL * b.abs()) | (a == b) | (torch.isnan(a) & torch.isnan(b))
    return float(ok.float().mean().item()) if a.numel() else 1.0


CPU_CHECK_DEVICES = ("cuda",)  # devices whose results are compared with the CPU reference


def verify(case: Case, x: torch.Tensor, lb_args, lb_out, an_out, slice_rows: int) -> str:
    """'cpu=... val=...': GPU vs CPU reference on a slice (byte-equal), lowbit vs anchor values."""
    m, k = x.shape
    parts = []
    if x.device.type in CPU_CHECK_DEVICES:
        try:
            xs = x[: min(m, slice_rows)].contiguous()
            g_out = case.lb_call(*case.lb_prep(xs))
            c_out = case.lb_call(*case.lb_prep(xs.cpu()))
            tg, tc = tensors_of(g_out), tensors_of(c_out)
            if len(tg) != len(tc) or not tg:
                parts.append(f"cpu=MISMATCH({len(tg)} vs {len(tc)} outputs)")
            else:
                bad = [i for i, (a, b) in enumerate(zip(tg, tc)) if not _bytes_equal(a, b)]
                parts.append("cpu=ok" if not bad else f"cpu=MISMATCH(outputs {bad})")
        except Exception as ex:  # noqa: BLE001
            parts.append(f"cpu=ERR({_err(ex)})")
    if lb_out is not None and an_out is not None:
        try:
            f = _agree(case.lb_value(lb_out, m, k), case.an_value(an_out, m, k))
            parts.append(f"val={f:.4f}" + ("" if f >= case.min_agree else "(LOW)"))
        except Exception as ex:  # noqa: BLE001
            parts.append(f"val=ERR({_err(ex)})")
    return " ".join(parts)


def parse_shape(s: str) -> Tuple[int, int]:
    m, k = s.lower().split("x")
    return int(m), int(k)


def set_compile_limits():
    try:
        import torch._dynamo.config as dc

        for name, val in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                          ("accumulated_recompile_limit", 8192), ("accumulated_cache_size_limit", 8192)):
            if hasattr(dc, name):
                setattr(dc, name, val)
        # NOTE: a hit limit would silently run eager code under the "torch_compile" label.
        for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
            if hasattr(dc, name):
                setattr(dc, name, True)
    except Exception:  # noqa: BLE001
        pass


class Runner:
    def __init__(self, args, report: Report, device: torch.device, peers: Dict[str, str]):
        self.args = args
        self.report = report
        self.device = device
        self.peers = peers
        self.t_start = time.perf_counter()

    def over_budget(self) -> bool:
        b = self.args.budget_s
        return b is not None and time.perf_counter() - self.t_start > b

    def timer(self, small: bool):
        a = self.args
        sync = small and a.small_timing == "host"
        warm = a.warmup
        iters = a.iters if not a.quick else max(5, a.iters // 3)
        if self.device.type != "cuda":
            return lambda fn, inputs: _time_cpu(fn, inputs, warm, iters)
        return lambda fn, inputs: time_fn(fn, inputs=inputs, warmup=warm, iters=iters,
                                          flush_l2=not a.no_flush, sync=sync, max_seconds=a.max_seconds)

    def run_case(self, case: Case, shape: str) -> None:
        args = self.args
        m, k = parse_shape(shape)
        small = m * k * 2 < (8 << 20)
        if self.over_budget():
            self.report.add(Row(op=case.name, shape=shape, anchor="-", error="skipped: time budget"))
            return
        timed = self.timer(small)
        n_rot = 1 if not small else 8
        gen = torch.Generator(device=self.device).manual_seed(1234 + m + k)
        base_row = dict(op=case.name, shape=shape, timing=("host" if small and args.small_timing == "host"
                                                          and self.device.type == "cuda" else
                                                          ("device" if self.device.type == "cuda" else "cpu")))
        lb_t = lb_err = None
        lb_args_list = lb_out = None
        nb = None
        xs: List[torch.Tensor] = []
        try:
            xs = [torch.randn(m, k, device=self.device, dtype=torch.float32, generator=gen).mul_(3.0)
                  .to(torch.bfloat16) for _ in range(n_rot)]
        except Exception as ex:  # noqa: BLE001
            self.report.add(Row(anchor="-", error=f"input: {_err(ex)}", **base_row))
            return
        # lowbit
        try:
            lb_args_list = [case.lb_prep(x) for x in xs]
            lb_out = case.lb_call(*lb_args_list[0])
            _sync(self.device)
            nb = case.nbytes(lb_args_list[0], lb_out)
            lb_t = timed(case.lb_call, lb_args_list)
        except Exception as ex:  # noqa: BLE001
            lb_err = "lowbit: " + _err(ex)
            if args.verbose:
                traceback.print_exc()
        # anchors: eager, compiled, peers
        an_out = None
        an_args_list = None
        rows: List[Row] = []
        try:
            an_args_list = [case.an_prep(x, a) for x, a in zip(xs, lb_args_list or [None] * len(xs))]
            an_out = case.an_call(*an_args_list[0])
            _sync(self.device)
            if nb is None:
                nb = case.nbytes((xs[0],), an_out)
            t = timed(case.an_call, an_args_list)
            rows.append(Row(anchor="torch_eager", anchor_us=t.median_us, anchor_p10_us=t.p10_us,
                            anchor_p90_us=t.p90_us, **base_row))
        except Exception as ex:  # noqa: BLE001
            rows.append(Row(anchor="torch_eager", error="anchor: " + _err(ex), **base_row))
            if args.verbose:
                traceback.print_exc()
        if not args.no_compile and an_args_list is not None and self.over_budget():
            rows.append(Row(anchor="torch_compile", error="skipped: time budget", **base_row))
        elif not args.no_compile and an_args_list is not None:
            try:
                cfn = torch.compile(case.an_call, mode=args.compile_mode, dynamic=False)
                t0 = time.perf_counter()
                c_out = cfn(*an_args_list[0])
                _sync(self.device)
                compile_s = time.perf_counter() - t0
                note = f"compile {compile_s:.1f}s"
                if lb_out is not None:  # the compiled code's values too (Inductor may reassociate)
                    try:
                        f = _agree(case.lb_value(lb_out, m, k), case.an_value(c_out, m, k))
                        note += f", compiled val={f:.4f}" + ("" if f >= case.min_agree else "(LOW)")
                    except Exception as ex:  # noqa: BLE001
                        note += f", compiled val=ERR({_err(ex)})"
                del c_out
                t = timed(cfn, an_args_list)
                rows.append(Row(anchor="torch_compile", anchor_us=t.median_us, anchor_p10_us=t.p10_us,
                                anchor_p90_us=t.p90_us, note=note, **base_row))
            except Exception as ex:  # noqa: BLE001
                rows.append(Row(anchor="torch_compile", error="anchor: " + _err(ex), **base_row))
                if args.verbose:
                    traceback.print_exc()
        for label, module, make in case.peers:
            if not self.peers.get(module, "").startswith("available"):
                continue
            try:
                fn, pargs = make(xs[0])
                t = timed(fn, [pargs])
                rows.append(Row(anchor=label, anchor_us=t.median_us, anchor_p10_us=t.p10_us,
                                anchor_p90_us=t.p90_us, note="peer output not compared", **base_row))
            except Exception as ex:  # noqa: BLE001
                rows.append(Row(anchor=label, error="peer: " + _err(ex), **base_row))
        # checks (outside timing)
        check = ""
        if lb_out is not None:
            try:
                check = verify(case, xs[0], lb_args_list[0], lb_out, an_out, args.check_rows)
            except Exception as ex:  # noqa: BLE001
                check = f"check=ERR({_err(ex)})"
        if not rows:
            rows.append(Row(anchor="-", **base_row))
        for r in rows:
            if lb_t is not None:
                r.lowbit_us, r.lowbit_p10_us, r.lowbit_p90_us = lb_t.median_us, lb_t.p10_us, lb_t.p90_us
            r.bytes = nb
            r.check = check
            if lb_err:
                r.error = lb_err + ("; " + r.error if r.error else "")
            if case.note and not r.note:
                r.note = case.note
            elif case.note:
                r.note = r.note + "; " + case.note
            self.report.add(r)
        del xs, lb_args_list, lb_out, an_out, an_args_list
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _time_cpu(fn, inputs, warmup, iters):
    """CPU fallback (smoke runs only): host clock, same result shape as time_fn."""
    from lowbit_bench.timing import Timing, quantile

    n = len(inputs)
    for i in range(max(1, min(warmup, 2))):
        fn(*inputs[i % n])
    ts = []
    for i in range(max(3, min(iters, 5))):
        t0 = time.perf_counter()
        fn(*inputs[i % n])
        ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return Timing(quantile(ts, 0.5), quantile(ts, 0.1), quantile(ts, 0.9), len(ts), "cpu")


def probe_peers() -> Dict[str, str]:
    out = {}
    for name in PEER_MODULES:
        try:
            mod = importlib.import_module(name)
            out[name] = f"available {getattr(mod, '__version__', '')}".strip()
        except Exception as ex:  # noqa: BLE001
            out[name] = f"not available ({type(ex).__name__})"
    return out


def main(argv=None) -> int:
    global lowbit
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--ops", default="", help="comma-separated substrings of op names to run (default: all)")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"MxK list (default {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile anchor")
    p.add_argument("--compile-mode", default="default",
                   help='torch.compile mode: "default" (the default), "max-autotune-no-cudagraphs", ...')
    p.add_argument("--small-timing", choices=("host", "device"), default="host",
                   help="small shapes: 'host' syncs before each call so launch overhead counts (default)")
    p.add_argument("--max-seconds", type=float, default=10.0, help="cap on the timed loop of one measurement")
    p.add_argument("--check-rows", type=int, default=256, help="rows of the GPU-vs-CPU reference check")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke run of the bench itself)")
    p.add_argument("--list", action="store_true", help="list the ops and exit")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)

    cases = build_cases()
    if args.list:
        for c in cases:
            print(c.name)
        return 0
    if args.ops:
        keys = [s.strip() for s in args.ops.split(",") if s.strip()]
        cases = [c for c in cases if any(key in c.name for key in keys)]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.quick and args.shapes == ",".join(DEFAULT_SHAPES):
        shapes = ["16384x7168", "16x7168"] if args.device == "cuda" else ["256x1024", "1x1024"]

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to time (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    try:
        lowbit = importlib.import_module("lowbit")
    except Exception as ex:  # noqa: BLE001
        print(f"lowbit not importable ({_err(ex)}): rows will carry the error", file=sys.stderr)
        lowbit = None
    set_compile_limits()
    peers = probe_peers()
    ceilings = measure_ceilings(quick=args.quick) if device.type == "cuda" else {}
    meta = {
        "torch.compile": "off" if args.no_compile else f'mode="{args.compile_mode}", dynamic=False, warmed up',
        "timing": (f"CUDA events, median of {args.iters}, L2 {'not ' if args.no_flush else ''}flushed; "
                   f"small shapes: {args.small_timing}" if device.type == "cuda" else "CPU host clock (smoke run)"),
        "inputs": "bf16 randn * 3; small shapes rotate 8 input sets",
        "peers": ", ".join(f"{k} {v}" for k, v in peers.items()),
    }
    report = Report(BENCH, json_path=args.json, meta=meta, ceilings=ceilings)
    runner = Runner(args, report, device, peers)

    for shape in shapes:
        for case in cases:
            try:
                runner.run_case(case, shape)
            except Exception as ex:  # noqa: BLE001
                report.add(Row(op=case.name, shape=shape, anchor="-", error="bench: " + _err(ex)))
                if args.verbose:
                    traceback.print_exc()
    report.print_table(f"== {BENCH} summary ==")
    if report.json_path:
        print(f"# JSON: {report.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
