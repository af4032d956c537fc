"""The fixed repros of the defects known when the fuzzer was written (fuzzlib.py runs them first
in every run) and get_call."""

from __future__ import annotations

import sys

import numpy as np

from fuzzlib_core import Call
from fuzzlib_checks import (check_dequantized, huge_view, misaligned_copy, quant_error_bound, rand_x,
                            readonly, readonly_memmap, same_bytes)
from fuzzlib_specs import _compare_results
from fuzzlib_gen_formats import gen_convert_raw, _lb
from fuzzlib_gen_ops import gen_dual_gemm, gen_group_gemm, gen_moe, make_call


# ---------------------------------------------------------------------------------------------
# Fixed repros of the defects known when the fuzzer was written (run first in every run)

def _known_calls():
    lb = _lb()
    rng = np.random.default_rng(12)
    calls = []

    def add(op, fn, kwargs, expect, check=None, note="", outputs=(), must_say=None):
        calls.append(Call(op, fn, (), kwargs, expect, check, outputs, note, must_say))

    ss = lambda **p: lb.scale_shape(p.pop("fmt"), p.pop("layout"), p.pop("L"), p.pop("M"), p.pop("K"),  # noqa: E731
                                    p.pop("groups", 0))
    add("scale_shape", ss, dict(fmt="mxfp4", layout="row_major", L=1, M=-5, K=32), "refuse", note="negative M")
    add("scale_shape", ss, dict(fmt="mxfp4", layout="blocked128x4", L=1, M=2 ** 63 - 1, K=32), "refuse",
        note="M = 2**63-1 pads past int64")
    add("scale_shape", ss, dict(fmt="mxfp4", layout="blocked128x4", L=1, M=128, K=64, groups=2 ** 62), "refuse",
        note="groups = 2**62")
    add("scale_shape", ss, dict(fmt="mxfp4", layout="row_major", L=1, M=2 ** 64, K=32), "refuse",
        note="M = 2**64 (out of int64)")
    add("_C.nvfp4_dual_gemm_packed_bytes", lambda N, K, L: _check_nonneg(lb._C.nvfp4_dual_gemm_packed_bytes(N, K, L)),
        dict(N=2 ** 40, K=2 ** 40, L=1), "refuse", note="byte count overflows int64")
    spec = gen_convert_raw(rng)
    add("_C.convert_scale_layout", spec.fn, dict(a=np.zeros(64, np.uint8), o=np.zeros(64, np.uint8), R=2 ** 62, C=4),
        "refuse", note="R = 2**62, C = 4 (SIGFPE)", outputs=("o",))
    x = rand_x(rng, (8, 64), np.float32)
    add("quantize", lambda x, fmt, **k: lb.quantize(x, fmt, **k),
        dict(x=x, fmt="nvfp4", global_amax=readonly(np.zeros(1, np.float32)), compute_global_amax=True), "refuse",
        note="read-only global_amax output")
    add("quantize", lambda x, fmt, **k: lb.quantize(x, fmt, **k),
        dict(x=x, fmt="nvfp4", global_amax=readonly_memmap(np.zeros(1, np.float32)), compute_global_amax=True),
        "refuse", note="read-only np.memmap global_amax output")
    xm = misaligned_copy(x)
    add("quantize", lambda x, fmt: lb.quantize(x, fmt), dict(x=xm, fmt="mxfp8_e4m3"), "either",
        lambda r: _compare_results(r, lb.quantize(np.ascontiguousarray(xm), "mxfp8_e4m3"), "misaligned x"),
        note="x one byte off its alignment")
    xf = rand_x(rng, (5, 128), np.float32)
    qt = lb.quantize(xf, "mxfp4")
    sF = np.asfortranarray(qt.scales)

    def deq_f(data, scales):
        return lb.dequantize(lb.Quantized(data, scales, format="mxfp4", shape=(5, 128)), "float32")

    add("dequantize", deq_f, dict(data=qt.data, scales=sF), "either",
        lambda r: check_dequantized(r, lb.Quantized(qt.data, sF, format="mxfp4", shape=(5, 128)), "float32"),
        note="Fortran-ordered scales")
    s = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    sF2 = np.asfortranarray(s)
    add("block_scale_interleave+deinterleave", lambda scales: lb.block_scale_deinterleave(
        lb.block_scale_interleave(scales), 3, 4), dict(scales=sF2), "either",
        lambda r: same_bytes(r, s, "round trip of Fortran-ordered scales"), note="Fortran-ordered scales")
    q = lambda x, fmt, **k: lb.quantize(x, fmt, **k)  # noqa: E731
    for fmt in ("fp8_e4m3", "int4", "mxfp4", "nvfp4", "nf4"):
        add("quantize", q, dict(x=xf, fmt=fmt, eps=float("inf")), "refuse", note="eps=inf")
    add("quantize", q, dict(x=xf, fmt="fp8_e4m3", eps=0.0), "refuse", note="eps=0")
    add("quantize", q, dict(x=xf, fmt="mxfp8_e4m3", group_pad="x"), "refuse", note="group_pad='x'")
    add("quantize", q, dict(x=xf, fmt="mxfp4", layout="col_major", row_align=1.5), "refuse", note="row_align=1.5")
    add("quantize", q, dict(x=xf, fmt="nvfp4", global_amax=-3.0), "refuse", note="global_amax=-3")
    add("nvfp4_quantize", lambda **k: lb.nvfp4_quantize(**k), dict(x=xf, zero_scale=0), "refuse", note="zero_scale=0")
    # grouped GEMM: a_scale with bf16 activations, float m_indptr
    g = gen_group_gemm(np.random.default_rng(5))
    while g.kinds["a"] != "in":
        g = gen_group_gemm(np.random.default_rng(int(rng.integers(1 << 30))))
    M = int(np.asarray(g.params["m_indptr"])[-1])
    K = int(g.params["a"].shape[1])
    add(g.op, g.fn, {**g.params, "a_scale": np.full((max(M, 1), K // 32), 127, np.uint8)}, "refuse",
        note="a_scale with bf16 activations", outputs=g.outputs)
    add(g.op, g.fn, {**g.params, "m_indptr": [0.0] + [float(v) + (0.7 if i == 0 else 0.0)
                                                       for i, v in enumerate(np.asarray(g.params["m_indptr"])[1:])]},
        "refuse", note="float m_indptr", outputs=g.outputs)
    add(g.op, g.fn, {**g.params, "group_pad": "x", "a_scale_layout": "row_major"}, "refuse", note="group_pad='x'",
        outputs=g.outputs)
    d = gen_dual_gemm(np.random.default_rng(3))
    add(d.op, d.fn, {**d.params, "a": np.asarray(d.params["a"]) > 3}, "refuse", note="bool codes", outputs=d.outputs)
    add("dequantize", lambda data, scales: lb.dequantize(lb.Quantized(data, scales, format="mxfp4"), "float32"),
        dict(data=np.asarray(qt.data) > 7, scales=qt.scales), "refuse", note="bool codes")
    m = gen_moe(np.random.default_rng(4))
    add(m.op, m.fn, {**m.params, "topk_ids": np.asarray(m.params["topk_ids"]).astype(np.int64)}, "either",
        m.check, note="int64 topk_ids (torch.topk's dtype)", must_say="int32")
    add("Quantized", lambda **k: lb.dequantize(lb.Quantized(**k)),
        dict(data=qt.data, scales=qt.scales, format="mxfp4", m_indptr=[0, 5]), "either", note="m_indptr as a list")
    add("Quantized", lambda **k: lb.dequantize(lb.Quantized(**k)),
        dict(data=qt.data, scales=qt.scales, format="mxfp4", shape=(-5, 128)), "refuse", note="negative shape")
    huge = huge_view(np.zeros((1, 32), np.float32))
    add("quantize", q, dict(x=huge, fmt="mxfp8_e4m3"), "either", note="huge stride-0 view")
    # NaN / Inf policy
    xn = rand_x(rng, (16, 64), np.float32)
    xn[3, 5] = np.nan
    add("quantize", q, dict(x=xn, fmt="nvfp4", compute_global_amax=True), "ok", _finite_blocks_check(xn, "nvfp4"),
        note="one NaN, compute_global_amax")
    xu = rand_x(rng, (4, 128), np.float32)
    xu[1, 7] = 2e38
    xu[1, 9] = -2e38
    add("quantize", q, dict(x=xu, fmt="uint4"), "ok", _finite_blocks_check(xu, "uint4"), note="UINT4 block of +-2e38")
    k = rand_x(rng, (1, 6, 2, 8), np.float32)
    k[0, 2, 1, 3] = np.inf
    add("nf4_kcache_quantize", lambda k: lb.nf4_kcache_quantize(k), dict(k=k), "ok", _nf4_inf_check(k),
        note="+Inf in the K cache")
    xs = (np.random.default_rng(17).standard_normal((64, 256)) * 0.002).astype(np.float32)
    add("quantize", q, dict(x=xs, fmt="nvfp4"), "ok", _sqnr_check(xs), note="std 0.002 without a global amax")
    add("quantize (m_indptr changed by another thread)", _race_m_indptr, {}, "ok", None,
        note="a second thread rewrites m_indptr during the calls")
    return calls


def _check_nonneg(v):
    if v < 0:
        raise AssertionError(f"negative size {v}")
    return v


def _finite_blocks_check(x, fmt):
    lb = _lb()
    f = lb.Format(fmt)

    def check(qt):
        y = np.asarray(lb.dequantize(qt, "float32"), np.float64)
        xf = x.astype(np.float64)
        fin = np.repeat(np.isfinite(xf.reshape(xf.shape[0], -1, f.block)).all(-1), f.block, axis=-1)
        bad = fin & ~np.isfinite(y)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return ("precision_loss", f"{fmt}: finite {xf[i]:.4g} at {i} decodes to {y[i]}")
        bound = quant_error_bound(f, np.where(np.isfinite(xf), xf, 0))
        bad = fin & (np.abs(y - xf) > bound)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return ("precision_loss", f"{fmt}: finite {xf[i]:.4g} at {i} decodes to {y[i]:.4g} "
                                      f"({int(bad.sum())} of {bad.size} elements beyond the bound)")
        return None

    return check


def _nf4_inf_check(k):
    lb = _lb()

    def check(res):
        y = np.asarray(lb.nf4_kcache_dequantize(*res), np.float64)
        kf = k.astype(np.float64)
        if not (y[np.isposinf(kf)] > 0).all():
            return ("precision_loss", f"+Inf comes back as {y[np.isposinf(kf)]}")
        bad = np.isfinite(kf) & ~np.isfinite(y)
        if bad.any():
            return ("precision_loss", f"{int(bad.sum())} finite tokens decode to NaN/Inf")
        return None

    return check


def _sqnr_check(x):
    lb = _lb()

    def check(qt):
        xf = x.astype(np.float64)
        y1 = np.asarray(lb.dequantize(qt, "float32"), np.float64)
        y2 = np.asarray(lb.dequantize(lb.quantize(x, "nvfp4", compute_global_amax=True), "float32"), np.float64)
        s1 = 10 * np.log10(np.sum(xf ** 2) / max(np.sum((y1 - xf) ** 2), 1e-300))
        s2 = 10 * np.log10(np.sum(xf ** 2) / max(np.sum((y2 - xf) ** 2), 1e-300))
        if s1 < s2 - 1.0:
            return ("precision_loss", f"nvfp4 default SQNR {s1:.2f} dB vs {s2:.2f} dB with the per-tensor amax")
        return None

    return check


def _race_m_indptr():
    """quantize and convert_scale_layout with an m_indptr that another thread rewrites during the
    calls (the binding runs without the GIL): each call refuses or succeeds, no crash and no
    sanitizer report. The thread switch interval is shortened so that the writes interleave."""
    import threading

    lb = _lb()
    M, K = 4096, 64
    x = np.ones((M, K), np.float32)
    ind = np.array([0, M // 2, M], np.int64)
    s = np.ones((M, 2), np.uint8)
    stop = threading.Event()
    bad = [2 ** 40, -2 ** 40, M + 1000, -7]

    def flip():
        k = 0
        while not stop.is_set():
            ind[1] = bad[k % 4]
            ind[1] = M // 2
            k += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=flip, daemon=True)
    t.start()
    try:
        for i in range(150):
            try:
                if i % 2:
                    lb.quantize(x, "mxfp8_e4m3", "blocked128x4", m_indptr=ind, group_pad="cumsum" if i % 4 == 1
                                else "flashinfer")
                else:
                    lb.convert_scale_layout(s, M, 2, "row_major", "blocked128x4", m_indptr=ind)
            except ValueError:
                pass
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    return None


def known_count():
    return len(_known_calls())


def get_call(seed, i, known=None):
    """Call i: the known repros first, then the random calls."""
    known = known if known is not None else _known_calls()
    if i < len(known):
        return known[i]
    return make_call(seed, i - len(known))
