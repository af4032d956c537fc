"""The fuzzer's specs (fuzzlib.py): an op, its valid parameters and their kinds, and mutate(),
which turns a valid call into an invalid one."""

from __future__ import annotations

import numpy as np

from fuzzlib_core import BF16, Call, describe, E4M3, E5M2, E8M0
from fuzzlib_checks import huge_view, pick, readonly, readonly_memmap, same_bytes, STORAGE


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
