"""Seeded random-call fuzzer over lowbit's public Python API (NumPy inputs, CPU reference).

Every call i of a run is generated from np.random.default_rng([seed, i]) alone, so a finding is
reproduced by its (seed, index):

    python tests/python/fuzzlib.py --seed 1 --replay 1234      # prints the call and its verdict

A call is a valid call (random odd shapes, every format / layout / dtype) or a mutated one
(wrong dtypes or shapes, negative / huge integers, floats where integers are expected,
NaN / Inf, read-only outputs, misaligned, Fortran-ordered, strided or stride-0 views, bool
arrays, None, strings). Oracles:

  a) a call succeeds or raises lowbit's own error (ValueError / NotImplementedError) whose
     message names an argument ("op: argument 'name': ...");
  b) a refused call changes none of its array arguments (snapshots before and after);
  c) a successful call's result equals the independent NumPy reference (npref.py and the
     decoders below), or, for a mutated storage (Fortran, strided, misaligned), the result of the
     same call on contiguous copies; a read-only array is never written;
  d) no crash: the calls run in a worker process; a signal or a sanitizer report ends the worker,
     the finding is recorded and the run goes on from the next call (run_api_fuzz).

Categories of findings: see CATEGORIES. The first calls of every run are the fixed repros of
KNOWN (the defects listed when the fuzzer was written), then random calls.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import traceback

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

CATEGORIES = {
    "crash": "the process died of a signal (no sanitizer report)",
    "sanitizer": "AddressSanitizer / UndefinedBehaviorSanitizer report",
    "hang": "a call did not return within the per-call limit",
    "foreign_error": "refused with an exception other than lowbit's ValueError / NotImplementedError",
    "unnamed_refusal": "refused with a message that names no argument",
    "output_changed": "an array argument was changed by a refused call",
    "readonly_written": "a read-only array was written",
    "input_changed": "an input array was changed by a successful call",
    "accepted_invalid": "an invalid argument was accepted",
    "wrong_result": "a successful call's result differs from the reference",
    "precision_loss": "a finite input decodes to NaN/Inf or to an error beyond the format's bound",
    "refused_valid": "a valid call was refused",
    "unclear_refusal": "a refusal that does not say what is expected",
    "temp_file_left": "a temporary file was left in the output directory",
    "stray_file": "a file other than the named output was written, or a non-regular path was replaced",
    "slow": "an input was processed far slower than its size warrants",
    "harness_error": "the fuzzer itself failed on a call",
}

ARG_RE = re.compile(r"argument '[A-Za-z_][\w.\[\]]*'")
SANITIZER_RE = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: UndefinedBehaviorSanitizer|"
                          r"ERROR: LeakSanitizer|AddressSanitizer:DEADLYSIGNAL")

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
FLOAT_IN = [np.dtype(np.float32), np.dtype(np.float16), BF16]
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float64)
FORMAT_INFO = {  # name -> (element, block choices, packed)
    "mxfp8_e4m3": ("e4m3", (32,), False), "mxfp8_e5m2": ("e5m2", (32,), False), "mxfp4": ("e2m1", (32,), True),
    "nvfp4": ("e2m1", (16,), True), "fp8_e4m3": ("e4m3", (32, 64, 128), False),
    "fp8_e5m2": ("e5m2", (32, 64, 128), False), "int4": ("int4", (32, 64, 128), True),
    "uint4": ("uint4", (32, 64, 128), True), "nf4": ("nf4", (32, 64), True),
}
LAYOUT_NAMES = ("row_major", "col_major", "blocked128x4", "blocked8x4")


def lowbit_errors():
    """The exception types that count as lowbit's own refusals."""
    import lowbit

    types = [ValueError, NotImplementedError]
    for name in ("ArgumentError", "LowbitError", "Error"):
        t = getattr(lowbit, name, None)
        if isinstance(t, type) and issubclass(t, BaseException):
            types.append(t)
    return tuple(types)


# ---------------------------------------------------------------------------------------------
# Descriptions (one line per call, enough to rebuild it by hand)

def describe(v, depth=0) -> str:
    if isinstance(v, np.ndarray):
        flags = []
        if not v.flags.writeable:
            flags.append("ro")
        if isinstance(v, np.memmap):
            flags.append("memmap")
        if v.ndim > 1 and v.flags.f_contiguous and not v.flags.c_contiguous:
            flags.append("F")
        elif not v.flags.c_contiguous:
            flags.append(f"strides={v.strides}")
        if v.size and (v.__array_interface__["data"][0] % max(1, v.dtype.itemsize)):
            flags.append("misaligned")
        extra = ""
        if v.size <= 6:
            try:
                extra = "=" + " ".join(np.array2string(v.astype(np.float64) if v.dtype.kind == "V" else v,
                                                       separator=",").split())
            except Exception:  # noqa: BLE001
                extra = ""
        return f"{v.dtype.name}{list(v.shape)}{'[' + ','.join(flags) + ']' if flags else ''}{extra}"
    if depth < 2 and type(v).__name__ == "Quantized":
        import dataclasses

        return "Quantized(" + ", ".join(f"{f.name}={describe(getattr(v, f.name), depth + 1)}"
                                        for f in dataclasses.fields(v)) + ")"
    if isinstance(v, (list, tuple)) and depth < 2:
        inner = ", ".join(describe(x, depth + 1) for x in v[:8])
        return ("[" + inner + (", ..." if len(v) > 8 else "") + "]") if isinstance(v, list) else "(" + inner + ")"
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


class Call:
    """One API call: fn(*args, **kwargs) plus what is expected of it.

    expect: "ok" (valid: must succeed and pass `check`), "refuse" (invalid: must be refused with
    lowbit's error naming an argument) or "either" (success is fine when `check` passes).
    check(result) -> None or a failure message; outputs: names of the arguments the call may
    write on success."""

    def __init__(self, op, fn, args=(), kwargs=None, expect="ok", check=None, outputs=(), note="", must_say=None):
        self.op, self.fn, self.args, self.kwargs = op, fn, tuple(args), dict(kwargs or {})
        self.expect, self.check, self.outputs, self.note = expect, check, set(outputs), note
        self.must_say = must_say  # a refusal's message must contain this

    def describe(self) -> str:
        parts = [describe(a) for a in self.args] + [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        s = f"{self.op}({', '.join(parts)})"
        return s + (f"  # {self.note}" if self.note else "")


# ---------------------------------------------------------------------------------------------
# Snapshots (oracle b and the read-only check)

def _arrays(v, path, out, depth=0):
    if isinstance(v, np.ndarray):
        out.append((path, v))
    elif depth < 3 and type(v).__name__ == "Quantized":
        for k in ("data", "scales", "zeros", "global_amax", "m_indptr"):
            _arrays(getattr(v, k), f"{path}.{k}", out, depth + 1)
    elif depth < 3 and isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _arrays(x, f"{path}[{i}]", out, depth + 1)


def snapshot(call):
    found = []
    for i, a in enumerate(call.args):
        _arrays(a, f"arg{i}", found)
    for k, v in call.kwargs.items():
        _arrays(v, k, found)
    snaps = []
    for path, a in found:
        if a.size > 1 << 24:  # huge (stride-0) views: not copied
            continue
        try:
            raw = np.lib.stride_tricks.as_strided(a, a.shape, a.strides).copy() if a.size else a.copy()
            snaps.append((path, a, raw, bool(a.flags.writeable)))
        except Exception:  # noqa: BLE001 - e.g. a huge stride-0 view: compare nothing
            pass
    return snaps


def _same(a, b) -> bool:
    if a.shape != b.shape:
        return False
    if a.size == 0:
        return True
    try:
        return bool(np.array_equal(a.view(np.uint8) if a.dtype.itemsize == 1 else a, b.view(np.uint8)
                                   if b.dtype.itemsize == 1 else b, equal_nan=a.dtype.kind in "fc"))
    except (TypeError, ValueError):
        return a.tobytes() == b.tobytes()


def changed(snaps):
    """[(path, read-only?)] of the snapshot arrays whose contents differ now."""
    out = []
    for path, a, raw, writeable in snaps:
        try:
            now = a.copy()
        except Exception:  # noqa: BLE001
            continue
        if not _same(np.ascontiguousarray(now).view(np.uint8).reshape(-1) if now.size else now,
                     np.ascontiguousarray(raw).view(np.uint8).reshape(-1) if raw.size else raw):
            out.append((path, not writeable))
    return out


# ---------------------------------------------------------------------------------------------
# Running one call through the oracles

def run_call(call, errors=None):
    """[(category, message)] of the findings of one call (empty when it behaved)."""
    errors = errors or lowbit_errors()
    snaps = snapshot(call)
    findings = []
    try:
        res = call.fn(*call.args, **call.kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every exception type is judged below
        msg = " ".join(str(e).split())[:300]
        if not isinstance(e, errors):
            findings.append(("foreign_error", f"{type(e).__name__}: {msg}"))
        elif not ARG_RE.search(str(e)):
            findings.append(("unnamed_refusal", f"{type(e).__name__}: {msg}"))
        elif call.expect == "ok":
            findings.append(("refused_valid", f"{type(e).__name__}: {msg}"))
        elif call.must_say and call.must_say not in str(e):
            findings.append(("unclear_refusal", f"the message does not say {call.must_say!r}: {msg}"))
        for path, ro in changed(snaps):
            findings.append(("readonly_written" if ro else "output_changed",
                             f"{path} changed although the call raised {type(e).__name__}: {msg[:120]}"))
        return findings
    for path, ro in changed(snaps):
        name = path.split(".")[0].split("[")[0]
        if ro:
            findings.append(("readonly_written", f"read-only {path} was written"))
        elif name not in call.outputs:
            findings.append(("input_changed", f"input {path} was written"))
    if call.expect == "refuse":
        findings.append(("accepted_invalid", f"accepted ({call.note or 'invalid argument'}); "
                                             f"returned {describe(res)}"))
        return findings
    if call.check is not None:
        try:
            with np.errstate(all="ignore"):
                problem = call.check(res)
        except Exception as e:  # noqa: BLE001
            problem = ("harness_error", f"check failed: {type(e).__name__}: {e}")
        if problem:
            if isinstance(problem, tuple):
                findings.append(problem)
            else:
                findings.append(("wrong_result", str(problem)))
    return findings


# ---------------------------------------------------------------------------------------------
# Independent decoders (NumPy, float64) for the checks

def round_up(a, m):
    return (a + m - 1) // m * m


def stored_dims(layout, R, C, row_align=1):
    if layout == "row_major":
        return R, C
    if layout == "col_major":
        return C, round_up(R, row_align)
    if layout == "blocked128x4":
        return round_up(R, 128), round_up(C, 4)
    return round_up(R, 8), round_up(C, 4)


def layout_offsets(layout, R, C, row_align=1):
    """Flat offsets [R, C] of (r, c) in one stored matrix."""
    r, c = np.meshgrid(np.arange(R, dtype=np.int64), np.arange(C, dtype=np.int64), indexing="ij")
    Rp, Cp = stored_dims(layout, R, C, row_align)
    if layout == "row_major":
        return r * C + c
    if layout == "col_major":
        return c * Cp + r
    cp4 = round_up(C, 4) // 4
    if layout == "blocked128x4":
        return ((r // 128) * cp4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return (r // 8) * cp4 * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4


def unlayout(stored, layout, R, C, row_align=1):
    """Row-major [L?, R, C] from stored scale matrices, read by index (whatever the strides)."""
    st = np.asarray(stored)
    lead = st.shape[:-2] if st.ndim >= 2 else ()
    L = int(np.prod(lead)) if lead else 1
    Rp, Cp = stored_dims(layout, R, C, row_align)
    flat = np.array(st).reshape(L, Rp * Cp)
    off = layout_offsets(layout, R, C, row_align)
    return flat[:, off].reshape(lead + (R, C)) if lead else flat[0, off]


def to_layout(s, layout, row_align=1):
    """Stored matrix of a row-major [R, C] (zero padding)."""
    R, C = s.shape
    Rp, Cp = stored_dims(layout, R, C, row_align)
    flat = np.zeros(Rp * Cp, dtype=s.dtype)
    flat[layout_offsets(layout, R, C, row_align)] = s
    return flat.reshape(Rp, Cp)


def grouped_to_layout(s, ind, rule):
    R, C = s.shape
    G = len(ind) - 1
    rows = (R + G * 127) // 128 * 128 if rule == "flashinfer" else round_up(R + G * 127, 128)
    big = np.zeros((max(rows, 1), C), dtype=s.dtype)
    for g in range(G):
        if rule == "flashinfer":
            start = (int(ind[g]) + g * 127) // 128 * 128
        else:
            start = sum(round_up(int(ind[i + 1]) - int(ind[i]), 128) for i in range(g))
        big[start:start + int(ind[g + 1]) - int(ind[g])] = s[int(ind[g]):int(ind[g + 1])]
    return to_layout(big, "blocked128x4")[:rows]


def grouped_unlayout(stored, ind, rule, R, C):
    st = np.array(stored)
    Rp = st.shape[-2]
    if st.size == 0 or R == 0:
        return np.zeros((R, C), dtype=st.dtype)
    full = unlayout(st.reshape(Rp, -1), "blocked128x4", Rp, C)
    out = np.zeros((R, C), dtype=st.dtype)
    G = len(ind) - 1
    for g in range(G):
        if rule == "flashinfer":
            start = (int(ind[g]) + g * 127) // 128 * 128
        else:
            start = sum(round_up(int(ind[i + 1]) - int(ind[i]), 128) for i in range(g))
        out[int(ind[g]):int(ind[g + 1])] = full[start:start + int(ind[g + 1]) - int(ind[g])]
    return out


def unpack(codes, high_first=False):
    c = np.asarray(codes).view(np.uint8) if np.asarray(codes).dtype.itemsize == 1 else np.asarray(codes)
    lo, hi = c & 0xF, c >> 4
    if high_first:
        lo, hi = hi, lo
    return np.stack([lo, hi], axis=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],))


def scale_values(s, scale_dtype):
    s = np.asarray(s)
    if scale_dtype == "float32":
        return s.astype(np.float64)
    b = s.view(np.uint8).astype(np.int64)
    if scale_dtype == "float8_e8m0fnu":
        v = np.ldexp(1.0, b - 127)
        return np.where(b == 255, np.nan, v)
    return s.view(E4M3).astype(np.float64)


def element_values(qt):
    """float64 element values (before scaling) [.., K] and the zero points of a Quantized."""
    f = qt.format
    elem = FORMAT_INFO[f.name][0]
    d = np.asarray(qt.data)
    if elem in ("e4m3", "e5m2"):
        return d.view(E4M3 if elem == "e4m3" else E5M2).astype(np.float64)
    c = unpack(d, f.nibble_order == "high").astype(np.int64)
    if elem == "e2m1":
        return E2M1[c]
    if elem == "int4":
        return np.where(c >= 8, c - 16, c).astype(np.float64)
    if elem == "nf4":
        return NF4[c]
    return c.astype(np.float64)  # uint4: q, zero point subtracted by the caller


def decode(qt):
    """float64 [L?, M, K] values of a Quantized, read by index (the lowbit.dequantize formulas)."""
    f = qt.format
    shape = tuple(qt.shape)
    L = shape[0] if len(shape) == 3 else None
    M, K = shape[-2], shape[-1]
    C = K // f.block
    q = element_values(qt).reshape(shape)

    def rm(a):
        if a is None:
            return None
        if qt.m_indptr is not None:
            return grouped_unlayout(a, np.asarray(qt.m_indptr), qt.group_pad or "flashinfer", M, C)
        return unlayout(a, qt.layout, M, C, qt.row_align)

    s = scale_values(rm(qt.scales), f.scale_dtype)
    if qt.zeros is not None:
        q = q - np.repeat(rm(qt.zeros).astype(np.float64), f.block, axis=-1)
    v = q * np.repeat(s, f.block, axis=-1)
    if f.name == "nvfp4" and qt.global_amax is not None:
        g = np.float32(np.asarray(qt.global_amax, dtype=np.float32).reshape(-1)[0])
        v = v * (np.float64(g) / 2688.0)
    return v.reshape(shape) if L is not None or True else v


def compare(got, want, rtol, what, atol=0.0):
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    g = got.astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    bad = ~((np.abs(g - w) <= atol + rtol * np.abs(w)) | (np.isnan(g) & np.isnan(w)) | (g == w))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{what}: {int(bad.sum())} of {bad.size} differ; first at {idx}: got {g[idx]!r}, expected {w[idx]!r}"
    return None


def same_bytes(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    gb = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    wb = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    if gb.size != wb.size:
        return f"{what}: {gb.size} bytes, expected {wb.size}"
    bad = gb != wb
    if bad.any():
        i = int(np.argmax(bad))
        return f"{what}: {int(bad.sum())} of {bad.size} bytes differ; first at byte {i}: {gb[i]} vs {wb[i]}"
    return None


def out_tolerance(dtype_name):
    return {"float32": 2.0 ** -20, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float8_e4m3fn": 2.0 ** -3,
            "float8_e5m2": 2.0 ** -2}.get(dtype_name, 2.0 ** -20)


def _round_to(v, dtype_name):
    """float64 values as the out dtype rounds them (saturating 8-bit)."""
    with np.errstate(all="ignore"):
        if dtype_name == "float8_e4m3fn":
            return np.clip(v, -448, 448).astype(E4M3).astype(np.float64)
        if dtype_name == "float8_e5m2":
            return np.clip(v, -57344, 57344).astype(E5M2).astype(np.float64)
        return v.astype(np.float32).astype({"float32": np.float32, "float16": np.float16,
                                            "bfloat16": BF16}[dtype_name]).astype(np.float64)


def check_dequantized(res, qt, out_dtype):
    want = decode(qt)
    return compare(res, _round_to(want, out_dtype), out_tolerance(out_dtype), "dequantize", atol=1e-30)


def quant_error_bound(f, x):
    """Per element bound on |dequantize(quantize(x)) - x| (loose; finite blocks of x)."""
    xf = np.asarray(x, dtype=np.float64)
    xb = xf.reshape(xf.shape[:-1] + (xf.shape[-1] // f.block, f.block))
    amax = np.max(np.abs(xb), axis=-1)
    frac = {"e4m3": 2.0 ** -3, "e5m2": 2.0 ** -2, "e2m1": 0.5, "int4": 0.1, "uint4": 0.1, "nf4": 0.2}
    b = amax * frac[FORMAT_INFO[f.name][0]] + 1e-30
    if f.scale_dtype != "float32" and f.name.startswith(("fp8", "int4")):
        b = b * 2  # UE8M0 scales are rounded up to a power of two
    return np.repeat(b, f.block, axis=-1).reshape(xf.shape)


def check_roundtrip(x, qt):
    """The decoded values of a quantization of finite x are finite and within the bound."""
    import lowbit

    xf = np.asarray(x, dtype=np.float64)
    if not np.isfinite(xf).all():
        return None
    y = np.asarray(lowbit.dequantize(qt, "float32"), dtype=np.float64)
    if y.shape != xf.shape:
        return ("wrong_result", f"dequantize shape {y.shape}, expected {xf.shape}")
    if not np.isfinite(y).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(y))[0])
        return ("precision_loss", f"{qt.format.name}: finite input decodes to {y[idx]} at {idx} (x = {xf[idx]})")
    err = np.abs(y - xf)
    bound = quant_error_bound(qt.format, xf)
    if qt.format.name == "nvfp4" and qt.global_amax is not None:
        g = float(np.asarray(qt.global_amax, np.float32).reshape(-1)[0])
        if np.isfinite(g) and g > 0:
            # docs/formats.md "NaN, Inf and overflow", NVFP4: a given global amax below a block's
            # amax saturates the block scale to 448, so the block decodes to at most
            # 6 * 448 * g / 2688 = g: elements above g are clipped to +-g (by |x| - g, no more)
            bound = bound + np.maximum(np.abs(xf) - g * (1 + 2.0 ** -20), 0.0)
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return ("precision_loss", f"{qt.format.name}: |error| {err[idx]:.3g} > bound {bound[idx]:.3g} at {idx} "
                                  f"(x = {xf[idx]:.4g}, decoded {y[idx]:.4g}; {int(bad.sum())} elements)")
    return None


# ---------------------------------------------------------------------------------------------
# Random inputs

def pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def odd_dim(rng, hi=150):
    return int(pick(rng, [1, 2, 3, 5, 7, 8, 31, 33, 127, 128, 129, int(rng.integers(1, hi + 1))]))


def rand_x(rng, shape, dtype=np.float32, block=None, spread=8):
    """Normal values, each row scaled by 2^e, e uniform in [-spread, spread]."""
    x = rng.standard_normal(shape).astype(np.float32)
    if len(shape):
        x *= np.exp2(rng.integers(-spread, spread + 1, size=tuple(shape[:-1]) + (1,))).astype(np.float32)
    if block and x.size and rng.random() < 0.3:  # an all-zero block
        x.reshape(-1, block)[int(rng.integers(x.size // block))] = 0
    return x.astype(dtype)


def misaligned_copy(a):
    """A copy of `a` whose data pointer is one byte off its alignment (np.frombuffer offset=1)."""
    a = np.asarray(a)
    buf = bytearray(a.nbytes + 1)
    out = np.frombuffer(buf, dtype=a.dtype, offset=1, count=a.size).reshape(a.shape)
    out[...] = a
    return out


def strided_copy(a):
    """Same values, every other element of a larger buffer along the last axis."""
    a = np.asarray(a)
    if a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def reversed_view(a):
    a = np.asarray(a)
    if a.ndim == 0:
        return a
    return np.flip(np.flip(a, 0).copy(), 0)


def huge_view(v):
    """A read-only stride-0 view of 2^40 rows of v's first element (no memory behind it)."""
    v = np.asarray(v)
    one = (v.reshape(-1)[:1] if v.size else np.zeros(1, v.dtype)).copy()
    base = one.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(one.dtype.itemsize, np.uint8)) \
        if one.dtype.kind == "V" or one.dtype in (BF16, E4M3, E5M2, E8M0) else one
    h = np.lib.stride_tricks.as_strided(base, shape=(2 ** 40,) + tuple(v.shape[1:]), strides=(0,) * max(v.ndim, 1),
                                        writeable=False)
    return h.view(one.dtype) if base.dtype != one.dtype else h


def readonly(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


_MEMMAPS = []


def readonly_memmap(a):
    a = np.ascontiguousarray(a)
    fd, path = tempfile.mkstemp(prefix="lowbit-fuzz-", suffix=".bin")
    with os.fdopen(fd, "wb") as fh:
        fh.write(a.tobytes() or b"\0")
    mm = np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape) if a.size else readonly(a)
    os.unlink(path)  # the mapping stays valid
    _MEMMAPS.append(mm)
    del _MEMMAPS[:-8]
    return mm


STORAGE = {
    "fortran": lambda a: np.asfortranarray(a),
    "strided": strided_copy,
    "misaligned": misaligned_copy,
    "negative_strides": reversed_view,
    "readonly": readonly,
}


# ---------------------------------------------------------------------------------------------
# Specs: an op, its valid parameters, what kind each one is, and its check

class Spec:
    """A valid call of `fn(**params)` and how to mutate it.

    kinds: param -> kind ("in", "in_bytes", "out", "indptr", "int", "size", "eps", "amax",
    "float", "choice", "bool", "fmt", "dtype", "fixed"); required: params that may not be None;
    check(result, params) for the valid call; extra: generator-specific mutations
    [(note, {param: value}, expect)]."""

    def __init__(self, op, fn, params, kinds, check=None, outputs=(), required=(), extra=(), choices=None):
        self.op, self.fn, self.params, self.kinds = op, fn, dict(params), dict(kinds)
        self.check, self.outputs, self.required = check, set(outputs), set(required)
        self.extra, self.choices = list(extra), dict(choices or {})
        self.none_ok = {"block", "row_align", "rows", "cols"} & set(self.params)
        self.check_of = None    # params -> check, valid for any values of the arguments
        self.value_check = True  # `check` holds for any storage of the same values
        self.no_huge = False     # huge stride-0 inputs are not refused by an allocation
        self.dtype_ok = {}       # param -> dtypes the op accepts as well (same values, same result)

    def call(self, params=None, expect="ok", check=None, note=""):
        p = self.params if params is None else params
        return Call(self.op, self.fn, (), p, expect, check, self.outputs, note)


def _metamorphic(spec, params, name):
    """Check of a call whose argument `name` is a different storage of the same values: the
    result equals the call on a contiguous copy (outputs compared by content)."""

    def check(res):
        ref_params = dict(params)
        v = params[name]
        ref_params[name] = np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v
        if name in spec.outputs and isinstance(v, np.ndarray):
            ref_params[name] = np.zeros_like(np.ascontiguousarray(v))
        ref = spec.fn(**ref_params)
        if name in spec.outputs and isinstance(v, np.ndarray):
            return same_bytes(np.ascontiguousarray(v), ref_params[name], f"{name} written through a {spec.op} call")
        return _compare_results(res, ref, spec.op)

    return check


def _compare_results(res, ref, what):
    if isinstance(res, tuple) or isinstance(ref, tuple) or type(res).__name__ == "Quantized":
        a = list(res) if not type(res).__name__ == "Quantized" else [res.data, res.scales, res.zeros, res.global_amax]
        b = list(ref) if not type(ref).__name__ == "Quantized" else [ref.data, ref.scales, ref.zeros, ref.global_amax]
        for i, (x, y) in enumerate(zip(a, b)):
            if (x is None) != (y is None):
                return f"{what}: part {i} is {describe(x)}, expected {describe(y)}"
            if x is not None:
                p = _compare_results(x, y, f"{what} part {i}")
                if p:
                    return p
        return None
    if isinstance(res, np.ndarray) or isinstance(ref, np.ndarray):
        return same_bytes(res, ref, what)
    return None if res == ref else f"{what}: {res!r}, expected {ref!r}"


INT_BAD = [(-1, "refuse"), (-5, "refuse"), (2 ** 40, "refuse"), (2 ** 62, "refuse"), (2 ** 63 - 1, "refuse"),
           (2 ** 64, "refuse"), (-2 ** 63, "refuse"), (1.5, "refuse"), ("4", "refuse"), (None, "refuse"),
           (float("nan"), "refuse")]
EPS_BAD = [(float("inf"), "refuse"), (float("nan"), "refuse"), (0.0, "refuse"), (-1.0, "refuse"),
           (float("-inf"), "refuse"), ("1e-10", "refuse"), (None, "refuse"), (1e300, "either")]
CHOICE_BAD = ["x", "", "ROW_MAJOR", 0, 1.5, b"row_major", ["row_major"], None]


def mutate(spec, rng):
    """A mutated call of `spec` (one argument changed)."""
    if spec.extra and rng.random() < 0.3:
        note, change, expect = pick(rng, spec.extra)
        p = dict(spec.params)
        p.update(change)
        chk = spec.check_of(p) if expect == "either" and spec.check_of else None
        return spec.call(p, expect, chk, note)
    names = [n for n, k in spec.kinds.items() if k != "fixed"]
    name = pick(rng, names)
    kind = spec.kinds[name]
    v = spec.params.get(name)
    p = dict(spec.params)

    def done(val, expect, note, check=None):
        p[name] = val
        return spec.call(p, expect, check, f"{name}: {note}")

    if kind in ("in", "in_bytes", "in_any", "out", "indptr") and isinstance(v, np.ndarray):
        r = rng.random()
        if r < 0.4:  # the same values in another storage
            how = pick(rng, list(STORAGE))
            if how == "fortran" and v.ndim < 2:
                how = "strided"
            if how == "readonly" and kind == "out":
                return done(readonly(v) if rng.random() < 0.5 else readonly_memmap(v), "refuse",
                            "read-only output")
            w = STORAGE[how](v)
            # the same values: the valid call's check holds (by index), else the result of the call
            # on contiguous copies
            q = {**p, name: w}
            chk = spec.check_of(q) if spec.check_of else (spec.check if spec.value_check else
                                                           _metamorphic(spec, q, name))
            return done(w, "either", how, chk)
        if r < 0.6:  # wrong dtype
            bad = {"in": [np.bool_, np.int32, np.int8, np.uint8, np.complex64, np.int64],
                   "in_bytes": [np.bool_, np.float32, np.int32, np.float16],
                   "out": [np.bool_, np.int32, np.float64, np.uint8],
                   "indptr": [np.bool_, np.float32, np.float64, np.uint8],
                   "in_any": [np.bool_, np.int32, np.int8, np.float16, np.int64, np.uint16]}[kind]
            dt = np.dtype(pick(rng, bad))
            if dt == v.dtype:
                dt = np.dtype(np.bool_)
            if dt in spec.dtype_ok.get(name, ()):  # another dtype the op documents for these values
                w = np.asarray(v).astype(dt)
                return done(w, "either", f"dtype {dt.name} (accepted)",
                            spec.check_of({**p, name: w}) if spec.check_of else spec.check)
            with np.errstate(all="ignore"):
                w = (v.astype(np.float64) != 0) if dt == np.bool_ else np.asarray(v.astype(np.float64)
                                                                                    if v.dtype.kind == "V" or v.dtype in (BF16, E4M3, E5M2, E8M0)
                                                                                    else v).astype(dt)
            if kind == "in" and dt == np.float64:
                return done(w, "either", "float64 input")
            if kind == "in_any":  # layout ops move 1- and 4-byte elements whatever their type
                ok = dt.itemsize in (1, 4)
                return done(w, "either" if ok else "refuse", f"dtype {dt.name}",
                            spec.check_of({**p, name: w}) if ok and spec.check_of else None)
            return done(w, "refuse", f"dtype {dt.name} instead of {v.dtype.name}")
        if r < 0.75:  # wrong shape
            shp = list(v.shape)
            how = int(rng.integers(4))
            if how == 0 or not shp:
                w = v.reshape(shp + [1])
                note = "extra dimension"
            elif how == 1:
                w = v.reshape(-1) if v.ndim > 1 else v.reshape(1, -1)
                note = "dimensions merged"
            elif how == 2:
                w = np.concatenate([v, v[..., :1]], axis=-1) if shp[-1] else np.zeros(shp[:-1] + [1], v.dtype)
                note = "last dimension + 1"
            else:
                w = v[..., : max(shp[-1] - 1, 0)] if shp[-1] > 1 else v[..., :0]
                note = "last dimension - 1"
            return done(np.ascontiguousarray(w), "either", note)
        if r < 0.82 and not spec.no_huge:
            return done(huge_view(v), "either", "huge stride-0 view")
        if r < 0.9:
            val = pick(rng, [None, "x", 1.5, [[1.0, 2.0]], object()])
            expect = "either" if name not in spec.required or isinstance(val, (list, float)) else "refuse"
            return done(val, expect, "not an array")
        if kind == "indptr":
            return mutate_indptr(spec, rng, name, p)
        return done(v[..., :0] if v.ndim else v, "either", "empty")
    if kind == "indptr":
        return mutate_indptr(spec, rng, name, p)
    if kind == "int":
        val, expect = pick(rng, INT_BAD)
        if val is None and name in spec.none_ok:
            expect = "either"
        return done(val, expect, "bad integer")
    if kind == "size":
        val = pick(rng, [-1, -5, 0, 2 ** 31, 2 ** 62, 2 ** 63 - 1, 2 ** 64, 1.5, "3", None])
        expect = "refuse" if (not isinstance(val, int) or val < 0 or val >= 2 ** 63) else "either"
        return done(val, expect, "size", spec.check_of(p | {name: val}) if expect == "either" and spec.check_of
                    else None)
    if kind == "shape":
        val = pick(rng, [(-1,) + tuple(v[1:]), (2 ** 62,) + tuple(v[1:]), (v[0] + 0.5,) + tuple(v[1:]),
                         tuple(v) + (1,), (0,) + tuple(v[1:]), "x", [v[0], "a"], (2 ** 64,) + tuple(v[1:])])
        expect = "either" if (isinstance(val, tuple) and val[0] == 0) else "refuse"
        return done(val, expect, "bad shape")
    if kind == "eps":
        val, expect = pick(rng, EPS_BAD)
        return done(val, expect, "bad eps")
    if kind == "amax":
        val = pick(rng, [-3.0, -1e-30, float("nan"), float("inf"), 0.0, "1.0", [1.0, 2.0], np.float32(-3)])
        expect = "refuse" if (isinstance(val, str) or (isinstance(val, (float, np.floating)) and val < 0)
                              or isinstance(val, list)) else "either"
        return done(val, expect, "global amax")
    if kind == "float":
        val = pick(rng, [float("nan"), float("inf"), -1.0, "1.0", None])
        return done(val, "refuse" if val is None or isinstance(val, str) else "either", "bad float")
    if kind in ("choice", "fmt", "dtype"):
        val = pick(rng, CHOICE_BAD + ["int4" if kind == "dtype" else "bfloat16"])
        ok = spec.choices.get(name)
        expect = "either" if (ok is not None and _hashable_in(val, ok)) or (val is None and name not in spec.required) \
            else "refuse"
        return done(val, expect, "bad choice")
    if kind == "bool":
        val = pick(rng, ["yes", "no", 2, None, np.bool_(True), [True]])
        expect = "either"  # flags are read as truthy values (not refused)
        return done(val, expect, "not a bool")
    return spec.call()


def _hashable_in(v, seq):
    try:
        return v in seq
    except TypeError:
        return False


def mutate_indptr(spec, rng, name, p):
    v = np.asarray(spec.params[name])
    M = int(v[-1])
    how = int(rng.integers(8))
    if how == 0:
        w, e, note = [0, M / 2 + 0.7, M] if M else [0, 0.5], "refuse", "float boundaries"
    elif how == 1:
        w, e, note = np.array([0, M + 1, M], v.dtype), "refuse", "non-monotonic"
    elif how == 2:
        w, e, note = np.array([0, -7, M], v.dtype), "refuse", "negative boundary"
    elif how == 3:
        w, e, note = np.array([0, 2 ** 30, M], np.int64), "refuse", "boundary past the rows"
    elif how == 4:
        w, e, note = np.array([0, M + 3], v.dtype), "refuse", "last boundary != rows"
    elif how == 5:
        w, e, note = np.array([1, M], v.dtype), "refuse", "first boundary != 0"
    elif how == 6:
        w = v.astype(np.int64 if v.dtype == np.int32 else np.int32)
        p[name] = w
        return spec.call(p, "either", _metamorphic(spec, p, name), f"{name}: {w.dtype.name} boundaries")
    else:
        w, e, note = v.reshape(1, -1), "refuse", "2-D"
    p[name] = w
    return spec.call(p, e, None, f"{name}: {note}")


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


def gen_nf4k(rng):
    lb = _lb()
    B, T, H, D = int(rng.integers(1, 3)), odd_dim(rng, 20), int(rng.integers(1, 4)), 2 * int(rng.integers(1, 20))
    k = rand_x(rng, (B, T, H, D), pick(rng, FLOAT_IN))
    rdt = pick(rng, ["float8_e5m2", "float8_e4m3fn"])
    nib = pick(rng, ["low", "high"])
    special = rng.random() < 0.2
    if special:
        k = np.asarray(k, np.float32)
        k[0, int(rng.integers(T)), 0, 0] = pick(rng, [np.inf, -np.inf, 3e38])

    def check(res):
        codes, scale, residual = res
        kf = np.asarray(k, np.float64)
        y = np.asarray(lb.nf4_kcache_dequantize(codes, scale, residual, "float32", nib), np.float64)
        y0 = np.asarray(lb.nf4_kcache_dequantize(codes, scale, None, "float32", nib), np.float64)
        finite_ch = np.isfinite(kf).all(axis=1, keepdims=True)  # per (b, h, d) channel over T
        fin = np.broadcast_to(finite_ch, kf.shape)
        amax = np.max(np.abs(np.where(np.isfinite(kf), kf, 0)), axis=1, keepdims=True)
        if special:
            # the finite tokens of a channel holding +-Inf / NaN stay finite; +Inf keeps its sign
            pos_inf = np.isposinf(kf)
            # docs/formats.md "NaN, Inf and overflow", NF4 K cache: the +-Inf residual is stored
            # without saturation: E5M2 keeps +Inf (the token decodes to +Inf); E4M3 has no Inf and
            # stores NaN (the token decodes to NaN)
            inf_ok = np.isnan(y[pos_inf]) if rdt == "float8_e4m3fn" else np.isposinf(y[pos_inf])
            if pos_inf.any() and not inf_ok.all():
                return ("precision_loss", f"nf4 K cache ({rdt} residual): +Inf comes back as "
                                          f"{y[pos_inf][~inf_ok][0]}")
            bad = np.isfinite(kf) & ~np.isfinite(y)
            if bad.any():
                i = tuple(int(v) for v in np.argwhere(bad)[0])
                return ("precision_loss", f"nf4 K cache: finite token {kf[i]:.4g} at {i} decodes to {y[i]} "
                                          f"(a non-finite value in its channel)")
            return None
        if not np.isfinite(y[fin]).all():
            return ("precision_loss", "nf4 K cache: finite input decodes to NaN/Inf")
        e0 = np.abs(y0 - kf)
        if (e0 > 0.16 * amax + 1e-30).any():
            return ("precision_loss", f"nf4 K cache without residual: error {e0.max():.3g} beyond 0.16 x amax")
        e = np.abs(y - kf)
        # the residual is rounded to fp8: relative 2^-3 / 2^-4, absolute half the smallest subnormal
        bound = 0.16 * amax * (2.0 ** -2 if rdt == "float8_e5m2" else 2.0 ** -3) + \
            (2.0 ** -17 if rdt == "float8_e5m2" else 2.0 ** -10)
        if (e > bound + 1e-6 * amax).any():
            return f"nf4 K cache with residual: error {e.max():.3g} beyond the residual's precision"
        want_scale = np.max(np.abs(kf), axis=1)  # [B, H, D]
        return compare(scale, want_scale, 0.0, "nf4 K cache scale")

    return Spec("nf4_kcache_quantize", lambda k, residual_dtype, nibble_order:
                lb.nf4_kcache_quantize(k, residual_dtype, nibble_order),
                {"k": k, "residual_dtype": rdt, "nibble_order": nib},
                {"k": "in", "residual_dtype": "dtype", "nibble_order": "choice"}, check, required={"k"},
                choices={"residual_dtype": ("float8_e5m2", "float8_e4m3fn"), "nibble_order": ("low", "high")})


def gen_nf4k_dequant(rng):
    lb = _lb()
    B, T, H, D = int(rng.integers(1, 3)), odd_dim(rng, 20), int(rng.integers(1, 4)), 2 * int(rng.integers(1, 20))
    k = rand_x(rng, (B, T, H, D), np.float32)
    codes, scale, residual = lb.nf4_kcache_quantize(k)
    with_res = rng.random() < 0.5
    out_dtype = pick(rng, ["float32", "float16", "bfloat16"])

    def check(res):
        c = unpack(codes).astype(np.int64)  # [B, T, H, D]
        v = NF4[c] * np.asarray(scale, np.float64)[:, None, :, :]
        if with_res:
            v = v + np.asarray(residual).astype(np.float64)
        return compare(res, _round_to(v, out_dtype), out_tolerance(out_dtype) * 2, "nf4_kcache_dequantize",
                       atol=1e-30)

    return Spec("nf4_kcache_dequantize", lambda codes, scale, residual, out_dtype:
                lb.nf4_kcache_dequantize(codes, scale, residual, out_dtype),
                {"codes": codes, "scale": scale, "residual": residual if with_res else None, "out_dtype": out_dtype},
                {"codes": "in_bytes", "scale": "in", "residual": "in_bytes", "out_dtype": "dtype"}, check,
                required={"codes", "scale"}, choices={"out_dtype": ("float32", "float16", "bfloat16")})


def gen_entry(rng):
    lb = _lb()
    import npref

    which = pick(rng, ["mxfp8_quantize", "mxfp4_quantize", "nvfp4_quantize", "per_token_group_quant"])
    M = odd_dim(rng, 200)
    if which == "per_token_group_quant":
        gs = int(pick(rng, [32, 64, 128]))
        K = gs * int(rng.integers(1, 4))
        x = rand_x(rng, (M, K), pick(rng, FLOAT_IN))
        dtype = pick(rng, ["float8_e4m3fn", "float8_e5m2", "int4"])
        ue = bool(rng.random() < 0.4)
        cm = bool(rng.random() < 0.4)
        tma = bool(rng.random() < 0.5)
        eps = 1e-10
        params = {"x": x, "group_size": gs, "dtype": dtype, "scale_ue8m0": ue, "column_major_scales": cm,
                  "tma_aligned": tma, "eps": eps}
        kinds = {"x": "in", "group_size": "int", "dtype": "dtype", "scale_ue8m0": "bool",
                 "column_major_scales": "bool", "tma_aligned": "bool", "eps": "eps"}
        elem = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "int4": "int4"}[dtype]

        def check(res):
            q, s = res
            q_ref, s_ref = npref.group_quantize(np.asarray(x, np.float32), elem, gs, ue8m0=ue, eps=eps)
            p = same_bytes(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8), "codes")
            if p:
                return p
            s = np.asarray(s)
            return same_bytes(np.ascontiguousarray(s).view(np.uint8) if ue else np.ascontiguousarray(s),
                              np.asarray(s_ref), "scales")

        fn = lambda **p: lb.per_token_group_quant(**p)  # noqa: E731
        return Spec(which, fn, params, kinds, check, required={"x"},
                    choices={"dtype": ("float8_e4m3fn", "float8_e5m2", "int4")},
                    extra=[("eps=inf", {"eps": float("inf")}, "refuse"), ("eps=0", {"eps": 0.0}, "refuse"),
                           ("group_size=1.5", {"group_size": 1.5}, "refuse")])
    block = 16 if which == "nvfp4_quantize" else 32
    K = block * int(rng.integers(1, 5))
    x = rand_x(rng, (M, K), pick(rng, FLOAT_IN))
    sw = bool(rng.random() < 0.4)
    params = {"x": x, "swizzled": sw}
    kinds = {"x": "in", "swizzled": "bool"}
    extra = []
    if which == "nvfp4_quantize":
        if rng.random() < 0.5:
            params["global_amax"] = float(np.max(np.abs(np.asarray(x, np.float32))))
            kinds["global_amax"] = "amax"
        extra.append(("zero_scale=0", {"zero_scale": 0}, "refuse"))
        extra.append(("global_amax=-3", {"global_amax": -3.0}, "refuse"))
    else:
        params["rounding"] = pick(rng, ["rceil", "floor"])
        kinds["rounding"] = "choice"
    if which == "mxfp8_quantize" and rng.random() < 0.3:
        params["dtype"] = "float8_e5m2"
        kinds["dtype"] = "dtype"

    def check(res):
        q, s = res
        xf = np.asarray(x, np.float32)
        if which == "nvfp4_quantize":
            q_ref, s_ref = npref.nvfp4_quantize(xf, params.get("global_amax"))
        else:
            elem = "e2m1" if which == "mxfp4_quantize" else ("e5m2" if params.get("dtype") == "float8_e5m2" else "e4m3")
            q_ref, s_ref = npref.mx_quantize(xf, elem, params["rounding"])
        if sw:
            s_ref = to_layout(np.asarray(s_ref), "blocked128x4")
        p = same_bytes(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8), "codes")
        return p or same_bytes(np.asarray(s).view(np.uint8), np.asarray(s_ref).view(np.uint8), "scales")

    fn = getattr(lb, which)
    return Spec(which, lambda **p: fn(**p), params, kinds, check, required={"x"}, extra=extra,
                choices={"rounding": ("rceil", "floor"), "dtype": ("float8_e4m3fn", "float8_e5m2")})


def gen_amax(rng):
    lb = _lb()
    shape = (odd_dim(rng, 60), odd_dim(rng, 60)) if rng.random() < 0.7 else (2, odd_dim(rng, 30), odd_dim(rng, 30))
    x = rand_x(rng, shape, pick(rng, FLOAT_IN))
    if rng.random() < 0.2:
        x = np.asarray(x, np.float32)
        x.reshape(-1)[0] = pick(rng, [np.nan, np.inf, -np.inf])

    def check(res):  # the finite amax: NaN / Inf are ignored (docs/formats.md), 0 if none is left
        a = np.abs(np.asarray(x, np.float64))
        a = a[np.isfinite(a)]
        return compare(res, np.array([a.max() if a.size else 0.0]), 0.0, "tensor_amax")

    spec = Spec("tensor_amax", lambda x: lb.tensor_amax(x), {"x": x}, {"x": "in"}, check, required={"x"})
    spec.no_huge = True  # amax over 2^40 elements runs, it is not refused
    return spec


def _e2m1_codes(rng, shape, mask=0xBB):
    return (rng.integers(0, 256, size=shape, dtype=np.uint8) & mask).astype(np.uint8)


def gen_dual_gemm(rng):
    lb = _lb()
    M, N, K = odd_dim(rng, 40), int(pick(rng, [128, 256])), int(pick(rng, [64, 128]))
    three = rng.random() < 0.5
    L = int(rng.integers(1, 3)) if three else 1
    a = _e2m1_codes(rng, (L, M, K // 2))
    b1, b2 = _e2m1_codes(rng, (L, N, K // 2)), _e2m1_codes(rng, (L, N, K // 2))

    def sf(rows):
        return rng.random(size=(L, rows, K // 16)).astype(np.float32).astype(E4M3)

    sfa, sfb1, sfb2 = sf(M), sf(N), sf(N)
    if three:
        T = lambda v: np.transpose(v, (1, 2, 0))  # noqa: E731
    else:
        T = lambda v: v[0]  # noqa: E731
    params = {"a": T(a), "b1": T(b1), "b2": T(b2), "sfa": T(sfa), "sfb1": T(sfb1), "sfb2": T(sfb2)}
    kinds = {k: "in_bytes" for k in params}
    amax = rng.random() < 0.3
    if amax:
        for k in ("amax_a", "amax_b1", "amax_b2"):
            params[k] = float(rng.uniform(0.5, 4))
            kinds[k] = "amax"
    outputs = set()
    if rng.random() < 0.4:
        od = pick(rng, [np.float16, BF16])
        o = np.full((L, M, N), np.nan, od)
        params["out"] = np.transpose(o, (1, 2, 0)) if three else o[0]
        kinds["out"] = "out"
        outputs.add("out")
    else:
        params["out_dtype"] = pick(rng, ["float16", "bfloat16"])
        kinds["out_dtype"] = "dtype"

    def dec(q, s, amx):
        codes = np.stack([q & 0xF, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], -1)
        v = E2M1[codes] * np.repeat(s.astype(np.float64), 16, axis=-1)
        return v * (amx / 2688.0) if amx is not None else v

    def check(res):
        A = dec(a, sfa, params.get("amax_a"))
        B1, B2 = dec(b1, sfb1, params.get("amax_b1")), dec(b2, sfb2, params.get("amax_b2"))
        g = A @ np.swapaxes(B1, 1, 2)
        u = A @ np.swapaxes(B2, 1, 2)
        ref = g / (1 + np.exp(-g)) * u  # [L, M, N]
        ref = np.transpose(ref, (1, 2, 0)) if three else ref[0]
        got = np.asarray(res)
        odt = got.dtype
        return compare(got, ref.astype(np.float32).astype(odt).astype(np.float64), 2.0 ** -7, "dual gemm",
                       atol=1e-3)

    return Spec("nvfp4_dual_gemm_silu", lambda **p: lb.nvfp4_dual_gemm_silu(**p), params, kinds, check, outputs,
                required={"a", "b1", "b2", "sfa", "sfb1", "sfb2"},
                extra=[("amax_a=-3", {"amax_a": -3.0}, "refuse"),
                       ("bool a", {"a": np.asarray(params["a"]) > 3}, "refuse"),
                       ("prepack on host arrays", {"packed_b": np.zeros(16, np.uint8), "n": 2 ** 62}, "refuse")],
                choices={"out_dtype": ("float16", "bfloat16")})


def gen_prepack(rng):
    lb = _lb()
    N = int(pick(rng, [128, 256, 2 ** 40, -128]))
    K = int(pick(rng, [64, 128]))
    L = int(pick(rng, [1, 2, 2 ** 40]))

    def fn(N, K, L):
        return lb._C.nvfp4_dual_gemm_packed_bytes(N, K, L)

    exact = L * (2 * N // 64) * (K // 64) * (128 * 16 + 64 * 4)

    def check(res):
        if N < 0 or exact < 0 or exact >= 2 ** 63:
            return f"nvfp4_dual_gemm_packed_bytes({N}, {K}, {L}) returned {res} (exact size {exact}: must be refused)"
        if res != exact:
            return f"nvfp4_dual_gemm_packed_bytes({N}, {K}, {L}) returned {res}, expected {exact}"
        return None

    bad = N < 0 or exact < 0 or exact >= 2 ** 63
    return Spec("_C.nvfp4_dual_gemm_packed_bytes", fn, {"N": N, "K": K, "L": L}, {}, None).call(
        expect="refuse" if bad else "ok", check=check, note="negative or overflowing size" if bad else "")


def gen_group_gemm(rng):
    lb = _lb()
    G = int(rng.integers(1, 4))
    sizes = [int(pick(rng, [0, 1, 3, 17, 130, int(rng.integers(0, 40))])) for _ in range(G)]
    ind = np.concatenate([[0], np.cumsum(sizes)]).astype(pick(rng, [np.int32, np.int64]))
    M, N, K = int(ind[-1]), 8 * int(rng.integers(1, 9)), 32 * int(rng.integers(1, 5))
    act = pick(rng, ["bf16", "mxfp8"])
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    bl = pick(rng, ["row_major", "blocked128x4"])
    qb = lb.quantize(w, "mxfp4", bl)
    if act == "bf16":
        a, a_sc, al = x.astype(BF16), None, "row_major"
        A = a.astype(np.float64)
    else:
        al = pick(rng, ["row_major", "blocked128x4"])
        qa = lb.quantize(x, "mxfp8_e4m3", al, m_indptr=ind if al == "blocked128x4" else None)
        a, a_sc = qa.data, qa.scales
        A = decode(qa)
    B = decode(qb)
    params = {"a": a, "b": qb.data, "a_scale": a_sc, "b_scale": qb.scales, "m_indptr": ind,
              "out_dtype": pick(rng, ["bfloat16", "float16"]), "a_scale_layout": al, "b_scale_layout": bl}
    kinds = {"a": "in_bytes" if act == "mxfp8" else "in", "b": "in_bytes", "b_scale": "in_bytes",
             "m_indptr": "indptr", "out_dtype": "dtype", "a_scale_layout": "choice", "b_scale_layout": "choice"}
    if a_sc is not None:
        kinds["a_scale"] = "in_bytes"
    outputs = set()
    if rng.random() < 0.3:
        params["out"] = np.full((M, N), np.nan, np.float16)
        kinds["out"] = "out"
        kinds["out_dtype"] = "fixed"  # unused when out is given
        outputs.add("out")
    ref = np.concatenate([A[int(ind[g]):int(ind[g + 1])] @ B[g].T for g in range(G)]) if M else np.zeros((0, N))

    def check(res):
        got = np.asarray(res).astype(np.float64)
        return compare(got, ref, 2.0 ** -6, "grouped gemm", atol=1e-3)

    extra = [("float m_indptr", {"m_indptr": [0, M / 2 + 0.7, M] if G == 1 else [0.0] + [float(v) for v in ind[1:]]},
              "refuse")]
    if act == "bf16":
        extra.append(("a_scale with bf16 activations", {"a_scale": np.full((M, K // 32), 127, np.uint8)}, "refuse"))
    return Spec("group_gemm_mxfp4_nt_groupwise", lambda **p: lb.group_gemm_mxfp4_nt_groupwise(**p), params, kinds,
                check, outputs, required={"a", "b", "b_scale", "m_indptr"}, extra=extra,
                choices={"out_dtype": ("bfloat16", "float16"), "a_scale_layout": ("row_major", "blocked128x4"),
                         "b_scale_layout": ("row_major", "blocked128x4")})


def gen_group_prepack(rng):
    lb = _lb()
    G, N, K = int(rng.integers(1, 3)), 8 * int(rng.integers(1, 20)), 32 * int(rng.integers(1, 10))
    b = rng.integers(0, 256, (G, N, K // 2), dtype=np.uint8)
    sc = rng.integers(100, 150, (G, N, K // 32), dtype=np.uint8)
    layout = pick(rng, ["row_major", "blocked128x4"])
    st = sc if layout == "row_major" else lb.convert_scale_layout(sc, N, K // 32, "row_major", "blocked128x4")

    def check(res):
        pb, ps = res
        Np, Kp = round_up(N, 128), round_up(K, 256)
        if pb.shape != (G, Np, Kp // 2) or ps.shape != (G, Np, Kp // 32):
            return f"prepack shapes {pb.shape} {ps.shape}"
        want = np.full((G, Np, Kp // 32), 127, np.uint8)
        want[:, :N, :K // 32] = sc
        return same_bytes(ps, want, "prepacked scales")

    return Spec("group_gemm_mxfp4_prepack", lambda b, b_scale, b_scale_layout:
                lb.group_gemm_mxfp4_prepack(b, b_scale, b_scale_layout=b_scale_layout),
                {"b": b, "b_scale": st, "b_scale_layout": layout},
                {"b": "in_bytes", "b_scale": "in_bytes", "b_scale_layout": "choice"}, check, required={"b", "b_scale"},
                choices={"b_scale_layout": ("row_major", "blocked128x4")})


def gen_moe(rng):
    lb = _lb()
    T, H, I, E, k = int(rng.integers(1, 6)), 32 * int(rng.integers(1, 4)), 32 * int(rng.integers(1, 3)), \
        int(rng.integers(1, 4)), int(rng.integers(1, 3))
    w1 = lb.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lb.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = rng.integers(-1, E, size=(T, k)).astype(np.int32)
    wts = rng.random((T, k)).astype(np.float32)
    act = pick(rng, ["bf16", "mxfp8"])
    W1, W2 = decode(w1), decode(w2)

    def check(res):
        if act != "bf16":
            return None if np.isfinite(np.asarray(res, np.float64)).all() else "non-finite MoE output"
        xb = x.astype(BF16).astype(np.float64)
        ref = np.zeros((T, H))
        for t in range(T):
            for j in range(k):
                e = int(ids[t, j])
                if e < 0:
                    continue
                h = W1[e] @ xb[t] + b1[e]
                g, u = np.minimum(h[0::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
                y = (g / (1 + np.exp(-1.702 * g)) * (u + 1)).astype(np.float32).astype(BF16)
                ref[t] += wts[t, j] * (W2[e] @ y.astype(np.float64) + b2[e])
        return compare(res, ref, 5e-3, "gpt_oss_moe_mlp", atol=5e-3)

    params = {"x": x, "topk_ids": ids, "topk_weights": wts, "w1": w1.data, "w1_scale": w1.scales, "b1": b1,
              "w2": w2.data, "w2_scale": w2.scales, "b2": b2, "act": act, "out_dtype": "float32"}
    kinds = {"x": "in", "topk_ids": "in", "topk_weights": "in", "w1": "in_bytes", "w1_scale": "in_bytes",
             "b1": "in", "w2": "in_bytes", "w2_scale": "in_bytes", "b2": "in", "act": "choice",
             "alpha": "float", "limit": "float"}
    params.update(alpha=1.702, limit=7.0)
    spec = Spec("gpt_oss_moe_mlp", lambda **p: lb.gpt_oss_moe_mlp(**p), params, kinds, check,
                required=set(params) - {"act", "out_dtype", "alpha", "limit"},
                extra=[("int64 topk_ids (torch.topk's dtype)", {"topk_ids": ids.astype(np.int64)}, "either"),
                       ("ids out of range", {"topk_ids": np.full((T, k), E + 5, np.int32)}, "either")],
                choices={"act": ("bf16", "mxfp8")})
    # int64 topk_ids are accepted on purpose (what torch.topk returns): host values are range-checked
    # and converted to int32 (gpt_oss_moe_mlp's docstring); the result is that of the int32 ids
    spec.dtype_ok = {"topk_ids": (np.dtype(np.int64),)}
    return spec


def gen_format(rng):
    lb = _lb()
    name = pick(rng, list(FORMAT_INFO))
    kw = random_format_kwargs(rng, name)
    if rng.random() < 0.5:
        kw["eps"] = 1e-10
    kinds = {k: ("eps" if k == "eps" else "int" if k == "block" else "choice") for k in kw}  # noqa: E501
    kinds["name"] = "fmt"
    return Spec("Format", lambda name, **k: lb.Format(name, **k), {"name": name, **kw}, kinds, None,
                required={"name"}, choices={"name": tuple(FORMAT_INFO)})


GENERATORS = [  # (weight, generator)
    (14, gen_quantize), (6, gen_quantize_special), (10, gen_dequantize), (3, gen_transcode), (6, gen_cast),
    (5, gen_scale_shape), (6, gen_convert_layout), (1, gen_convert_raw), (4, gen_interleave), (4, gen_nf4k),
    (3, gen_nf4k_dequant), (6, gen_entry), (2, gen_amax), (3, gen_dual_gemm), (1, gen_prepack),
    (4, gen_group_gemm), (2, gen_group_prepack), (2, gen_moe), (2, gen_format),
]
_WEIGHTS = np.array([w for w, _ in GENERATORS], dtype=np.float64)
_WEIGHTS /= _WEIGHTS.sum()


def make_call(seed, i):
    """Call i of the run with this seed (valid with probability 0.4, else mutated)."""
    rng = np.random.default_rng([seed, i])
    gen = GENERATORS[int(rng.choice(len(GENERATORS), p=_WEIGHTS))][1]
    spec = gen(rng)
    if isinstance(spec, Call):
        return spec
    if rng.random() < 0.4 or not spec.kinds or all(k == "fixed" for k in spec.kinds.values()) and not spec.extra:
        return spec.call(check=spec.check)
    return mutate(spec, rng)


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


# ---------------------------------------------------------------------------------------------
# Worker (one process, many calls) and the runner that restarts it after a crash

def worker(seed, start, stop, deadline, out=sys.stdout):
    """Runs calls [start, stop) until the wall-clock deadline; one line per call on `out`:
    "B i" before it, "F {json}" per finding; "DONE n" at the end."""
    import faulthandler

    faulthandler.enable()
    errors = lowbit_errors()
    known = _known_calls()
    i = start
    while i < stop and (i < len(known) or time.time() < deadline):
        out.write(f"B {i}\n")
        out.flush()
        try:
            call = get_call(seed, i, known)
            desc = call.describe()
            findings = run_call(call, errors)
        except Exception as e:  # noqa: BLE001 - a fuzzer bug: report it, go on
            desc = f"call {i}"
            findings = [("harness_error", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)[-300:]}")]
        for cat, msg in findings:
            out.write("F " + json.dumps({"i": i, "cat": cat, "msg": msg, "call": desc}) + "\n")
        i += 1
    out.write(f"DONE {i}\n")
    out.flush()
    return i


class Summary:
    def __init__(self):
        self.calls = 0
        self.findings = []  # dicts: i, cat, msg, call
        self.restarts = 0

    def by_category(self):
        out = {}
        for f in self.findings:
            out.setdefault(f["cat"], []).append(f)
        return out

    def report(self, seed, limit=6):
        lines = [f"{self.calls} calls (seed {seed}), {len(self.findings)} findings, {self.restarts} worker restarts"]
        for cat, fs in sorted(self.by_category().items()):
            lines.append(f"  {cat} ({len(fs)}): {CATEGORIES.get(cat, '')}")
            seen = set()
            shown = 0
            for f in fs:
                key = (f["call"].split("(")[0], f["msg"][:40])
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"    #{f['i']} {f['call'][:200]}")
                lines.append(f"        -> {f['msg'][:300]}")
                shown += 1
                if shown >= limit:
                    break
        return "\n".join(lines)


def _worker_cmd(script, seed, start, stop, deadline):
    return [sys.executable, script, "--worker", "--seed", str(seed), "--start", str(start),
            "--stop", str(stop), "--deadline", repr(deadline)]


def run_api_fuzz(seed=0, seconds=60.0, calls=None, **kw):
    """Runs the API fuzzer in worker processes for `seconds` (or exactly `calls` calls, the known
    repros included); returns a Summary."""
    kw.setdefault("min_items", known_count())
    return run_fuzz(os.path.abspath(__file__), _describe_index, seed, seconds, calls, **kw)


def run_fuzz(script, describe_fn, seed=0, seconds=60.0, calls=None, call_timeout=180.0, env=None,
             max_restarts=500, log=None, min_items=0):
    """Runs `script --worker` processes for `seconds` (or exactly `calls` items); returns a
    Summary. A worker that dies is a finding (crash / sanitizer) and a new worker goes on after
    the item that killed it."""
    _describe_index = describe_fn  # noqa: N806
    summ = Summary()
    deadline = time.time() + (seconds if calls is None else 10 ** 7)
    stop = calls if calls is not None else 1 << 62
    start = 0
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    while start < stop and (start < min_items or time.time() < deadline) and summ.restarts <= max_restarts:
        p = subprocess.Popen(_worker_cmd(script, seed, start, stop, deadline), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env)
        cur, done, stray = None, None, []
        buf = b""
        last = time.time()
        while True:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if r:
                chunk = os.read(p.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                buf += chunk
                last = time.time()
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if line.startswith("B "):
                        cur = int(line[2:])
                        stray = []
                    elif line.startswith("F "):
                        summ.findings.append(json.loads(line[2:]))
                        if log:
                            log(summ.findings[-1])
                    elif line.startswith("DONE "):
                        done = int(line[5:])
                    else:
                        stray.append(line)
                        if SANITIZER_RE.search(line) and cur is not None and not any(
                                f["i"] == cur and f["cat"] == "sanitizer" for f in summ.findings):
                            summ.findings.append({"i": cur, "cat": "sanitizer", "msg": line.strip()[:300],
                                                  "call": _describe_index(seed, cur)})
            elif time.time() - last > call_timeout:
                p.kill()
                summ.findings.append({"i": cur, "cat": "hang", "msg": f"no progress for {call_timeout:.0f} s",
                                      "call": _describe_index(seed, cur)})
                break
        rc = p.wait()
        if done is not None:
            summ.calls += done - start
            start = done
            break_now = True
        else:
            summ.restarts += 1
            if cur is None:
                summ.findings.append({"i": start, "cat": "harness_error", "msg": f"worker exited {rc}: "
                                      + " | ".join(stray[-5:])[:500], "call": "-"})
                break
            text = "\n".join(stray)
            m = SANITIZER_RE.search(text)
            if not any(f["i"] == cur and f["cat"] in ("sanitizer", "hang") for f in summ.findings):
                cat = "sanitizer" if m else "crash"
                how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                key = [s.strip() for s in stray if re.search(r"Fatal Python error|ERROR|runtime error|SUMMARY|Bus error", s)]
                tail = key[:3] or [s for s in stray if s.strip() and not s.lstrip().startswith("#")][-3:]
                summ.findings.append({"i": cur, "cat": cat, "msg": f"worker died ({how}): "
                                      + " | ".join(tail)[:400], "call": _describe_index(seed, cur)})
            summ.calls += cur + 1 - start
            start = cur + 1
            break_now = False
        if break_now:
            break
    return summ


def _describe_index(seed, i):
    try:
        return get_call(seed, i).describe()
    except Exception as e:  # noqa: BLE001
        return f"call {i} ({type(e).__name__})"


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def env_float(name, default):
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=env_int("LOWBIT_FUZZ_SEED", 0))
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=1 << 62)
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--replay", type=int, action="append", default=[])
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", metavar="FILE", help="write the findings as JSON")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.seed, a.start, a.stop, a.deadline or time.time() + 3600)
        return 0
    if a.replay:
        for i in a.replay:
            call = get_call(a.seed, i)
            print(f"#{i} {call.describe()}  (expect {call.expect})")
            fs = run_call(call)
            for cat, msg in fs:
                print(f"  {cat}: {msg}")
            if not fs:
                print("  ok")
        return 0
    s = run_api_fuzz(a.seed, a.seconds, a.calls)
    print(s.report(a.seed, limit=20))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"calls": s.calls, "seed": a.seed, "findings": s.findings}, fh, indent=1)
    return 1 if s.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
