"""The fuzzer's core (fuzzlib.py): finding categories, call descriptions, the Call record,
snapshots of array arguments and run_call, which applies the oracles to one call."""

from __future__ import annotations

import os
import re
import sys

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
