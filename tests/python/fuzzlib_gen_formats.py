"""Generators of valid calls (fuzzlib.py), format family: quantize, dequantize, transcode, cast,
scale shapes and scale layout conversions."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fuzzlib_core import BF16, describe, E4M3, E5M2, E8M0, FLOAT_IN, FORMAT_INFO, LAYOUT_NAMES
from fuzzlib_checks import (check_dequantized, check_roundtrip, compare, element_values, grouped_to_layout,
                            odd_dim, pick, quant_error_bound, rand_x, readonly, readonly_memmap, round_up,
                            same_bytes, stored_dims, to_layout, unlayout)
from fuzzlib_specs import Spec


# ---------------------------------------------------------------------------------------------
# Generators of valid calls (one per op family)

def _lb():
    import lowbit

    return lowbit


def random_format_kwargs(rng, name):
    elem, blocks, packed = FORMAT_INFO[name]
    kw = {}
    if len(blocks) > 1:
        kw["block"] = int(pick(rng, blocks))
    if name.startswith("mx") and rng.random() < 0.5:
        kw["rounding"] = pick(rng, ["rceil", "floor"])
    if name in ("fp8_e4m3", "fp8_e5m2", "int4") and rng.random() < 0.4:
        kw["scale_dtype"] = pick(rng, ["float32", "ue8m0"])
    if packed and rng.random() < 0.2:
        kw["nibble_order"] = pick(rng, ["low", "high"])
    if name == "nvfp4" and rng.random() < 0.2:
        kw["zero_scale"] = pick(rng, ["zero", "min", "one"])
    return kw


def reference_quantize(xf, f, global_amax=None):
    """(codes bytes, row-major scale bytes / values, zeros) from npref, or None where npref has
    no recipe (nf4, high nibble order, NVFP4 zero_scale other than "zero")."""
    import npref

    elem = FORMAT_INFO[f.name][0]
    if f.nibble_order == "high" and f.packed:
        return None
    if f.name.startswith("mx"):
        q, s = npref.mx_quantize(xf, elem, f.rounding)
        return q, s, None
    if f.name == "nvfp4":
        if f.zero_scale != "zero":
            return None
        q, s = npref.nvfp4_quantize(xf, None if global_amax is None else float(global_amax))
        return q, s, None
    if f.name in ("fp8_e4m3", "fp8_e5m2", "int4"):
        q, s = npref.group_quantize(xf, elem, f.block, ue8m0=f.scale_dtype != "float32", eps=f.eps)
        return q, s, None
    if f.name == "uint4":
        return npref.uint4_quantize(xf, f.block, eps=f.eps)
    return None


def check_quantized(qt, x, f, layout, row_align, ind, group_pad):
    """qt against npref (codes and scales in their layout) and its round trip."""
    xf = np.asarray(x).astype(np.float32)
    gam = None
    if f.name == "nvfp4" and qt.global_amax is not None:
        gam = np.asarray(qt.global_amax, np.float32).reshape(-1)[0]
    ref = reference_quantize(xf, f, gam)
    if ref is not None:
        q, s, z = ref
        p = same_bytes(np.asarray(qt.data).view(np.uint8), np.asarray(q).view(np.uint8), "quantize codes")
        if p:
            return p
        C = xf.shape[-1] // f.block
        M = xf.shape[-2]

        def lay(a):
            a = np.asarray(a)
            if ind is not None:
                return grouped_to_layout(a, ind, group_pad)
            if a.ndim == 3:
                return np.stack([to_layout(a[i], layout, row_align) for i in range(a.shape[0])])
            return to_layout(a, layout, row_align)

        got_s = np.asarray(qt.scales)
        want_s = lay(np.asarray(s))
        if ind is not None:  # grouped: compare the rows that hold groups (padding is zero)
            want_s = want_s.reshape(got_s.shape) if want_s.size == got_s.size else want_s
        p = same_bytes(got_s.view(np.uint8) if got_s.dtype.itemsize == 1 else got_s,
                       want_s.view(np.uint8) if want_s.dtype.itemsize == 1 else want_s.astype(np.float32),
                       f"quantize scales ({layout})")
        if p:
            return p
        if z is not None:
            p = same_bytes(np.asarray(qt.zeros), lay(z), "quantize zero points")
            if p:
                return p
        del M, C
    p = check_dequantized(_lb().dequantize(qt, "float32"), qt, "float32")
    if p:
        return p
    return check_roundtrip(xf, qt)


def gen_quantize(rng):
    lb = _lb()
    name = pick(rng, list(FORMAT_INFO))
    kw = random_format_kwargs(rng, name)
    f = lb.Format(name, **kw)
    layout = pick(rng, LAYOUT_NAMES)
    row_align = int(pick(rng, [1, 4, 16])) if layout == "col_major" else 1
    M = odd_dim(rng)
    K = f.block * int(rng.integers(1, 5))
    batched = rng.random() < 0.25
    shape = (int(rng.integers(1, 4)), M, K) if batched else (M, K)
    dt = pick(rng, FLOAT_IN)
    # NVFP4's E4M3 block scales span 2^17 under one per-tensor scale: rows within 2^6 of each other
    x = rand_x(rng, shape, dt, f.block, spread=3 if name == "nvfp4" else 8)
    params = {"x": x, "fmt": name, "layout": layout}
    kinds = {"x": "in", "fmt": "fmt", "layout": "choice"}
    params.update(kw)
    for k in kw:
        kinds[k] = "eps" if k == "eps" else ("int" if k == "block" else "choice")
    if layout == "col_major" or rng.random() < 0.1:
        params["row_align"] = row_align
        kinds["row_align"] = "int"
    ind = None
    gpad = "flashinfer"
    if not batched and layout == "blocked128x4" and rng.random() < 0.3:
        G = int(rng.integers(1, 5))
        cuts = np.sort(rng.integers(0, M + 1, size=G - 1))
        ind = np.concatenate([[0], cuts, [M]]).astype(pick(rng, [np.int32, np.int64]))
        gpad = pick(rng, ["flashinfer", "cumsum"])
        params["m_indptr"] = ind
        params["group_pad"] = gpad
        kinds["m_indptr"] = "indptr"
        kinds["group_pad"] = "choice"
    if name in ("fp8_e4m3", "fp8_e5m2", "int4", "uint4") and rng.random() < 0.3:
        params["eps"] = float(pick(rng, [1e-10, 1e-6, 1e-3]))
        kinds["eps"] = "eps"
    outputs = set()
    if name == "nvfp4":
        r = rng.random()
        if r < 0.3:
            params["compute_global_amax"] = True
            kinds["compute_global_amax"] = "bool"
            if rng.random() < 0.5:
                params["global_amax"] = np.zeros(1, np.float32)
                kinds["global_amax"] = "out"
                outputs.add("global_amax")
        elif r < 0.6:
            params["global_amax"] = float(np.max(np.abs(x.astype(np.float32)))) * float(pick(rng, [1.0, 2.0, 0.5]))
            kinds["global_amax"] = "amax"
    elif rng.random() < 0.1:  # eps is accepted by every format; out-of-range values must be refused
        params["eps"] = 1e-10
        kinds["eps"] = "eps"
    f = lb.Format(name, **{k: v for k, v in params.items() if k in ("block", "rounding", "scale_dtype",
                                                                   "nibble_order", "zero_scale", "eps")})
    extra = []
    if name == "nvfp4":
        extra.append(("read-only global_amax with compute_global_amax",
                      {"global_amax": readonly(np.zeros(1, np.float32)), "compute_global_amax": True}, "refuse"))
        extra.append(("read-only memmap global_amax with compute_global_amax",
                      {"global_amax": readonly_memmap(np.zeros(1, np.float32)), "compute_global_amax": True},
                      "refuse"))
        extra.append(("negative global_amax", {"global_amax": -3.0, "compute_global_amax": False}, "refuse"))
    extra.append(("bool input", {"x": np.asarray(x, np.float32) > 0}, "refuse"))
    extra.append(("row_align=1.5", {"row_align": 1.5, "layout": "col_major"}, "refuse"))
    extra.append(("group_pad='x'", {"group_pad": "x", "m_indptr": np.array([0, M], np.int32),
                                    "layout": "blocked128x4"}, "refuse"))
    extra.append(("eps=inf", {"eps": float("inf")}, "refuse"))
    extra.append(("eps=0", {"eps": 0.0}, "refuse"))

    def fn(x, fmt, layout="row_major", **kwargs):
        return lb.quantize(x, fmt, layout, **kwargs)

    def check(res):
        return check_quantized(res, x, f, layout, row_align, ind, gpad)

    return Spec("quantize", fn, params, kinds, check, outputs, required={"x", "fmt"}, extra=extra,
                choices={"layout": LAYOUT_NAMES, "fmt": tuple(FORMAT_INFO), "group_pad": ("flashinfer", "cumsum")})


def gen_quantize_special(rng):
    """Valid calls on inputs with NaN / Inf / huge finite values: finite blocks decode finite and
    within the format's bound, the NaN policy aside."""
    lb = _lb()
    name = pick(rng, list(FORMAT_INFO))
    f = lb.Format(name)
    M, K = odd_dim(rng, 40), f.block * int(rng.integers(1, 4))
    x = rand_x(rng, (M, K), np.float32, f.block, spread=3 if name == "nvfp4" else 8)
    special = pick(rng, ["nan", "inf", "-inf", "huge", "tiny"])
    n = int(rng.integers(1, 3))
    idx = (rng.integers(M, size=n), rng.integers(K, size=n))
    if special == "huge":
        x[idx] = np.float32(pick(rng, [2e38, -2e38, 1e30]))
    elif special == "tiny":
        x = (x * np.float32(pick(rng, [2e-3, 1e-4, 1e-6]))).astype(np.float32)
    else:
        x[idx] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[special]
    kwargs = {}
    if name == "nvfp4" and rng.random() < 0.6:
        kwargs["compute_global_amax"] = True

    def check(qt):
        y = np.asarray(lb.dequantize(qt, "float32"), np.float64)
        xf = x.astype(np.float64)
        fin_blocks = np.isfinite(xf.reshape(M, -1, f.block)).all(-1)
        fin = np.repeat(fin_blocks, f.block, axis=-1)
        if special == "tiny" and name == "nvfp4" and not kwargs:
            # without a global amax a small-scale tensor loses its precision (SQNR vs the per-tensor recipe)
            q2 = lb.quantize(x, "nvfp4", compute_global_amax=True)
            y2 = np.asarray(lb.dequantize(q2, "float32"), np.float64)
            e1, e2 = np.sum((y - xf) ** 2), np.sum((y2 - xf) ** 2)
            sig = np.sum(xf ** 2)
            if e1 > 0 and sig > 0:
                s1, s2 = 10 * np.log10(sig / e1), 10 * np.log10(sig / max(e2, 1e-300))
                if s1 < s2 - 1.0:
                    return ("precision_loss", f"nvfp4 without a global amax: SQNR {s1:.2f} dB vs {s2:.2f} dB "
                                              f"with it (x scale {special})")
        if not np.isfinite(y[fin]).all():
            i = tuple(int(v) for v in np.argwhere(fin & ~np.isfinite(y))[0])
            return ("precision_loss", f"{name} with {special} elsewhere: finite block element {xf[i]:.4g} at {i} "
                                      f"decodes to {y[i]}")
        if name == "nvfp4" and special != "nan":
            return None  # one E4M3 block scale range under a per-tensor scale: small blocks may underflow
        bound = quant_error_bound(f, np.where(np.isfinite(xf), xf, 0))
        bad = fin & (np.abs(y - xf) > bound)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return ("precision_loss", f"{name} with {special} elsewhere: finite {xf[i]:.4g} at {i} decodes to "
                                      f"{y[i]:.4g} ({int(bad.sum())} elements beyond the bound)")
        return None

    def fn(x, fmt, **kw):
        return lb.quantize(x, fmt, **kw)

    return Spec("quantize", fn, {"x": x, "fmt": name, **kwargs}, {"x": "fixed", "fmt": "fixed"}, check)


def _valid_qt(rng, names=None, layouts=LAYOUT_NAMES):
    lb = _lb()
    name = pick(rng, names or list(FORMAT_INFO))
    kw = random_format_kwargs(rng, name)
    f = lb.Format(name, **kw)
    layout = pick(rng, layouts)
    row_align = int(pick(rng, [1, 4])) if layout == "col_major" else 1
    M, K = odd_dim(rng, 100), f.block * int(rng.integers(1, 4))
    x = rand_x(rng, (M, K), np.float32, f.block)
    kwargs = dict(kw)
    if name == "nvfp4" and rng.random() < 0.5:
        kwargs["compute_global_amax"] = True
    qt = lb.quantize(x, f, layout, row_align=row_align, **{k: v for k, v in kwargs.items() if k not in kw})
    return qt, x


def gen_dequantize(rng):
    """Quantized(...) built from (possibly mutated) fields, then dequantize."""
    lb = _lb()
    qt, _ = _valid_qt(rng)
    out_dtype = pick(rng, ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
    params = {"data": qt.data, "scales": qt.scales, "zeros": qt.zeros, "global_amax": qt.global_amax,
              "format": qt.format.name, "format_kwargs": qt.format.kwargs(), "layout": qt.layout,
              "shape": qt.shape, "row_align": qt.row_align, "out_dtype": out_dtype}
    kinds = {"data": "in_bytes", "scales": "in_bytes", "layout": "choice", "shape": "shape",
             "row_align": "int", "out_dtype": "dtype", "format": "fmt"}
    if qt.zeros is not None:
        kinds["zeros"] = "in_bytes"
    if qt.global_amax is not None:
        kinds["global_amax"] = "in"

    def fn(data, scales, zeros, global_amax, format, format_kwargs, layout, shape, row_align, out_dtype,
           m_indptr=None):
        fmt = lb.Format(format, **format_kwargs) if isinstance(format, str) and format in FORMAT_INFO else format
        q = lb.Quantized(data, scales, zeros, global_amax, fmt, layout, shape, row_align, m_indptr=m_indptr)
        return lb.dequantize(q, out_dtype)

    def check_of(p):
        def check(res):
            fmt = lb.Format(p["format"], **p["format_kwargs"])
            q = lb.Quantized(p["data"], p["scales"], p["zeros"], p["global_amax"], fmt, p["layout"],
                             p["shape"], p["row_align"], m_indptr=p.get("m_indptr"))
            return check_dequantized(res, q, p["out_dtype"])
        return check

    M, K = qt.shape
    extra = [
        ("negative shape", {"shape": (-M, K)}, "refuse"),
        ("shape of 3 dims that do not match data", {"shape": (2, M, K)}, "refuse"),
        ("K not a multiple of the block", {"shape": (M, K + 2)}, "refuse"),
        ("m_indptr as a list on a row-major layout", {"m_indptr": [0, M]}, "either"),
        ("huge shape", {"shape": (2 ** 62, K)}, "refuse"),
        ("float shape", {"shape": (M + 0.5, K)}, "refuse"),
        ("row_align=0", {"row_align": 0}, "refuse"),  # row_align >= 1 for every layout (none ignores it)
        ("Fortran-ordered scales", {"scales": np.asfortranarray(qt.scales)}, "either"),
        ("bool codes", {"data": np.asarray(qt.data).view(np.uint8) > 7}, "refuse"),
    ]
    if qt.format.name == "nvfp4":
        extra += [("negative global_amax", {"global_amax": np.array([-3.0], np.float32)}, "refuse")]
    spec = Spec("dequantize", fn, params, kinds, check_of(params), required={"data", "scales"}, extra=extra,
                choices={"layout": LAYOUT_NAMES, "format": tuple(FORMAT_INFO),
                         "out_dtype": ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")})
    spec.check_of = check_of
    return spec


def gen_transcode(rng):
    lb = _lb()
    qt, _ = _valid_qt(rng, ["mxfp4", "nvfp4", "int4", "uint4"], ("row_major", "blocked128x4", "col_major"))
    vals = element_values(qt)
    if qt.zeros is not None:
        M, K = qt.shape
        z = unlayout(qt.zeros, qt.layout, M, K // qt.format.block, qt.row_align).astype(np.float64)
        vals = vals - np.repeat(z, qt.format.block, axis=-1)

    def check(res):
        return compare(np.asarray(res).astype(np.float64), vals, 0.0, "transcode")

    def fn(qt, out_dtype):
        return lb.transcode(qt, out_dtype)

    return Spec("transcode", fn, {"qt": qt, "out_dtype": "float8_e4m3fn"}, {"out_dtype": "dtype"}, check,
                choices={"out_dtype": ("float8_e4m3fn",) if qt.zeros is not None else
                         ("float8_e4m3fn", "float8_e5m2")})


CAST_DT = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16,
           "float8_e4m3fn": E4M3, "float8_e5m2": E5M2}
FMAX = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": float(ml_dtypes.finfo(BF16).max),
        "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def gen_cast(rng):
    lb = _lb()
    src, dst = pick(rng, list(CAST_DT)), pick(rng, list(CAST_DT))
    nd = int(rng.integers(1, 4))
    shape = tuple(odd_dim(rng, 40) for _ in range(nd))
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 18))).astype(np.float32)
    if x.size and rng.random() < 0.3:
        x.reshape(-1)[int(rng.integers(x.size))] = pick(rng, [np.nan, np.inf, -np.inf, 1e30])
    x = x.astype(CAST_DT[src])
    sat = bool(rng.random() < 0.7)

    def check(res):
        with np.errstate(all="ignore"):
            xf = np.asarray(x).astype(np.float32)
            if sat and dst.startswith("float8"):  # satfinite: the fp8 destinations
                xf = np.where(np.isnan(xf), xf, np.clip(xf, -FMAX[dst], FMAX[dst])).astype(np.float32)
            want = xf.astype(CAST_DT[dst])
        got = np.asarray(res)
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"cast {src}->{dst}: got {describe(got)}, expected {describe(want)}"
        gb, wb = got.view(np.uint8 if got.dtype.itemsize == 1 else f"u{got.dtype.itemsize}"), \
            want.view(np.uint8 if want.dtype.itemsize == 1 else f"u{want.dtype.itemsize}")
        nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
        bad = (gb != wb) & ~nan
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            return (f"cast {src}->{dst} (saturate={sat}): {int(bad.sum())} of {bad.size} differ; first at {i}: "
                    f"{float(np.asarray(x)[i].astype(np.float32))!r} -> {float(got[i].astype(np.float32))!r}, "
                    f"expected {float(want[i].astype(np.float32))!r}")
        return None

    return Spec("cast", lambda x, dtype, saturate: lb.cast(x, dtype, saturate), {"x": x, "dtype": dst, "saturate": sat},
                {"x": "in", "dtype": "dtype", "saturate": "bool"}, check, required={"x"},
                choices={"dtype": tuple(CAST_DT)})


def scale_shape_formula(fmt, layout, L, M, K, groups, row_align=1, group_pad="flashinfer"):
    block = {"mxfp8_e4m3": 32, "mxfp8_e5m2": 32, "mxfp4": 32, "nvfp4": 16, "fp8_e4m3": 128, "fp8_e5m2": 128,
             "int4": 128, "uint4": 128, "nf4": 64}[fmt]
    C = K // block
    if groups > 0:
        rows = (M + groups * 127) // 128 * 128 if group_pad == "flashinfer" else round_up(M + groups * 127, 128)
        return (1, rows, round_up(C, 4))
    a, b = stored_dims(layout, M, C, row_align)
    return (L, a, b)


def gen_scale_shape(rng):
    lb = _lb()
    fmt = pick(rng, list(FORMAT_INFO))
    layout = pick(rng, LAYOUT_NAMES)
    block = FORMAT_INFO[fmt][1][-1] if len(FORMAT_INFO[fmt][1]) > 1 else FORMAT_INFO[fmt][1][0]
    block = {"fp8_e4m3": 128, "fp8_e5m2": 128, "int4": 128, "uint4": 128, "nf4": 64}.get(fmt, block)
    L, M, K = int(rng.integers(1, 4)), odd_dim(rng, 1000), block * int(rng.integers(0, 9))
    groups = int(rng.integers(1, 5)) if layout == "blocked128x4" and rng.random() < 0.3 else 0
    row_align = int(pick(rng, [1, 4, 16])) if layout == "col_major" else 1

    def check_of(p):
        def check(res):
            try:
                want = scale_shape_formula(p["fmt"], p["layout"], p["L"], p["M"], p["K"], p["groups"], p["row_align"])
            except Exception:  # noqa: BLE001
                return None
            if any(not isinstance(v, int) or v < 0 or v >= 2 ** 63 for v in want):
                return f"scale_shape returned {res}; the exact size {want} does not fit int64 (must be refused)"
            if tuple(res) != want:
                return f"scale_shape returned {tuple(res)}, expected {want}"
            return None
        return check

    params = {"fmt": fmt, "layout": layout, "L": L, "M": M, "K": K, "groups": groups, "row_align": row_align}
    spec = Spec("scale_shape", lambda fmt, layout, L, M, K, groups, row_align:
                lb.scale_shape(fmt, layout, L, M, K, groups, row_align=row_align), params,
                {"fmt": "fmt", "layout": "choice", "L": "size", "M": "size", "K": "size", "groups": "size",
                 "row_align": "int"}, check_of(params),
                extra=[("negative M", {"M": -5}, "refuse"), ("M = 2**63-1", {"M": 2 ** 63 - 1}, "either"),
                       ("groups = 2**62", {"groups": 2 ** 62, "layout": "blocked128x4"}, "either")],
                choices={"layout": LAYOUT_NAMES, "fmt": tuple(FORMAT_INFO)})
    spec.check_of = check_of
    return spec


def gen_convert_layout(rng):
    lb = _lb()
    R, C = odd_dim(rng, 300), odd_dim(rng, 20)
    L = int(rng.integers(1, 3))
    dt = pick(rng, [np.uint8, np.float32, E8M0, E4M3])
    s = rng.integers(0, 255, size=(L, R, C)).astype(np.uint8)
    if np.dtype(dt).itemsize == 4:
        s = rng.standard_normal((L, R, C)).astype(np.float32)
    else:
        s = s.view(dt)
    src, dst = pick(rng, LAYOUT_NAMES), pick(rng, LAYOUT_NAMES)
    sra = int(pick(rng, [1, 4])) if src == "col_major" else 1
    dra = int(pick(rng, [1, 8])) if dst == "col_major" else 1
    stored = np.stack([to_layout(s[i], src, sra) for i in range(L)])
    if L == 1 and rng.random() < 0.5:
        stored = stored[0]
    want = np.stack([to_layout(s[i], dst, dra) for i in range(L)])
    if stored.ndim == 2:
        want = want[0]

    def check_of(p):
        st_ = np.asarray(p["scales"])
        s_ = st_.reshape((-1,) + stored_dims(src, R, C, sra)) if st_.ndim != 3 else st_
        w = np.stack([to_layout(unlayout(s_[i], src, R, C, sra), dst, dra) for i in range(s_.shape[0])])
        if st_.ndim == 2:
            w = w[0]

        def check(res):
            return same_bytes(np.asarray(res), w, f"convert {src}->{dst}")
        return check

    check = check_of({"scales": stored})
    params = {"scales": stored, "rows": R, "cols": C, "src": src, "dst": dst, "src_row_align": sra,
              "dst_row_align": dra}
    spec = Spec("convert_scale_layout", lambda scales, rows, cols, src, dst, **kw:
                lb.convert_scale_layout(scales, rows, cols, src, dst, **kw), params,
                {"scales": "in_any", "rows": "int", "cols": "int", "src": "choice", "dst": "choice",
                 "src_row_align": "int", "dst_row_align": "int"}, check, required={"scales"},
                extra=[("R = 2**62, C = 4", {"rows": 2 ** 62, "cols": 4}, "refuse"),
                       ("rows = -3", {"rows": -3}, "refuse"),
                       ("rows = 2**63 - 1", {"rows": 2 ** 63 - 1, "cols": 2 ** 20}, "refuse")],
                choices={"src": LAYOUT_NAMES, "dst": LAYOUT_NAMES})
    spec.check_of = check_of
    return spec


def gen_convert_raw(rng):
    """_C.convert_scale_layout with huge R x C (the binding's own size arithmetic)."""
    lb = _lb()
    C_ = lb._C
    R = int(pick(rng, [2 ** 62, 2 ** 61 + 1, 2 ** 40, 2 ** 63 - 1, 3]))
    C = int(pick(rng, [4, 1, 2 ** 30]))
    a = np.zeros(64, np.uint8)
    o = np.zeros(64, np.uint8)
    K = C_.ScaleLayoutKind
    P = C_.GroupPad

    def fn(a, o, R, C):
        return C_.convert_scale_layout(a, o, C_.DType.uint8, K.row_major, 1, P.none, K.blocked128x4, 1, P.none,
                                       R, C, None, 0)

    spec = Spec("_C.convert_scale_layout", fn, {"a": a, "o": o, "R": R, "C": C}, {}, None, outputs={"o"})
    return spec.call(expect="refuse" if R * C > 64 else "either", note="R x C against 64-byte buffers")


def gen_interleave(rng):
    lb = _lb()
    R, C = odd_dim(rng, 300), odd_dim(rng, 20)
    batched = rng.random() < 0.3
    dt = pick(rng, [np.uint8, E8M0, E4M3, np.float32])
    shape = (int(rng.integers(1, 3)), R, C) if batched else (R, C)
    s = (rng.standard_normal(shape).astype(np.float32) if np.dtype(dt).itemsize == 4
         else rng.integers(0, 255, shape).astype(np.uint8).view(dt))
    roundtrip = rng.random() < 0.5

    def fn(scales, rows=None, cols=None):
        b = lb.block_scale_interleave(scales)
        return lb.block_scale_deinterleave(b, rows, cols) if roundtrip else b

    def want_of(v):
        v = np.asarray(v)
        if roundtrip:
            return np.ascontiguousarray(v)
        if v.ndim == 3:
            return np.stack([to_layout(v[i], "blocked128x4") for i in range(v.shape[0])])
        return to_layout(v, "blocked128x4")

    def check_of(p):
        w = want_of(p["scales"])

        def check(res):
            return same_bytes(np.asarray(res), w, "block_scale_interleave" + (" round trip" if roundtrip else ""))
        return check

    spec = Spec("block_scale_interleave" + ("+deinterleave" if roundtrip else ""), fn,
                {"scales": s, "rows": R, "cols": C},
                {"scales": "in_any", "rows": "int", "cols": "int"} if roundtrip else {"scales": "in_any"},
                check_of({"scales": s}),
                required={"scales"},
                extra=[("Fortran-ordered scales", {"scales": np.asfortranarray(s) if s.ndim == 2 else s}, "either")])
    spec.check_of = check_of
    return spec
