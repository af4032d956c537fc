"""Array plumbing between NumPy / torch and the lowbit._C module.

Every array handed to ``_C`` is a same-itemsize view of a plain dtype (bf16 as uint16 / int16,
fp8 and packed fp4 as uint8) plus the real dtype as a ``_C.DType``, because NumPy cannot export
the ml_dtypes types through DLPack and torch's fp4 exports are fragile. Outputs are allocated
in the library and on the device of the reference input. torch is never imported here unless
the caller already passed a torch tensor (it is looked up in ``sys.modules``).
"""

from __future__ import annotations

import contextlib
import sys

import ml_dtypes
import numpy as np

from . import _C

D = _C.DType

# lowbit dtype name -> (lowbit DType, NumPy storage dtype, NumPy view dtype handed to _C)
_BY_NAME = {
    "float32": (D.float32, np.dtype(np.float32), None),
    "float16": (D.float16, np.dtype(np.float16), None),
    "bfloat16": (D.bfloat16, np.dtype(ml_dtypes.bfloat16), np.uint16),
    "float64": (D.float64, np.dtype(np.float64), None),
    "float8_e4m3fn": (D.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn), np.uint8),
    "float8_e5m2": (D.float8_e5m2, np.dtype(ml_dtypes.float8_e5m2), np.uint8),
    "float8_e8m0fnu": (D.float8_e8m0fnu, np.dtype(ml_dtypes.float8_e8m0fnu), np.uint8),
    # NumPy has no packed fp4 type: two E2M1 codes per byte are stored as uint8
    "float4_e2m1fn_x2": (D.float4_e2m1fn_x2, np.dtype(np.uint8), None),
    "uint8": (D.uint8, np.dtype(np.uint8), None),
    "int8": (D.int8, np.dtype(np.int8), None),
    "int16": (D.int16, np.dtype(np.int16), None),
    "int32": (D.int32, np.dtype(np.int32), None),
    "int64": (D.int64, np.dtype(np.int64), None),
}
_NP_TO_NAME = {v[1]: k for k, v in _BY_NAME.items() if k != "float4_e2m1fn_x2"}

DTYPE_ALIASES = {
    "fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2", "ue8m0": "float8_e8m0fnu", "e8m0": "float8_e8m0fnu",
}


def _torch():
    return sys.modules.get("torch")


def is_torch(a) -> bool:
    t = _torch()
    return t is not None and isinstance(a, t.Tensor)


def dtype_name(dtype, op: str = "lowbit", arg: str = "dtype") -> str:
    """Canonical lowbit name of a dtype given as a string, NumPy dtype or torch dtype."""
    if isinstance(dtype, str):
        name = DTYPE_ALIASES.get(dtype, dtype)
        if name in _BY_NAME:
            return name
    else:
        t = _torch()
        if t is not None and isinstance(dtype, t.dtype):
            name = str(dtype).replace("torch.", "")
            if name in _BY_NAME:
                return name
        else:
            try:
                npd = np.dtype(dtype)
            except TypeError:
                npd = None
            if npd is not None and npd in _NP_TO_NAME:
                return _NP_TO_NAME[npd]
    raise ValueError(f"{op}: argument '{arg}': unsupported dtype {dtype!r}")


def array_dtype_name(a, op: str, arg: str) -> str:
    if is_torch(a):
        return dtype_name(a.dtype, op, arg)
    return dtype_name(a.dtype, op, arg)


def as_array(a, op: str, arg: str, float_default: bool = True):
    """A NumPy array or torch tensor for `a` (lists and scalars become NumPy float32 arrays)."""
    if is_torch(a) or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "__array__") or isinstance(a, (list, tuple, int, float)):
        arr = np.asarray(a)
        if float_default and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        return arr
    raise ValueError(f"{op}: argument '{arg}': expected a NumPy array or a torch tensor, got {type(a).__name__}")


def c_view(a, op: str, arg: str, dtype: str | None = None):
    """(array for _C, _C.DType): a same-itemsize view of a plain dtype plus the real dtype.

    `dtype` overrides the array's own dtype (e.g. uint8 bytes that hold E2M1 pairs)."""
    name = dtype if dtype is not None else array_dtype_name(a, op, arg)
    cdt, _, npview = _BY_NAME[name]
    if is_torch(a):
        t = _torch()
        a = a.detach()
        if a.dtype == t.bfloat16 or a.dtype == t.float16:
            a = a.view(t.int16)
        elif a.element_size() == 1 and a.dtype not in (t.uint8, t.int8):
            a = a.view(t.uint8)
        return a, cdt
    if not a.dtype.isnative:
        raise ValueError(f"{op}: argument '{arg}': byte-swapped arrays are not supported")
    if npview is not None and a.dtype != np.dtype(npview):
        a = a.view(npview)
    return a, cdt


class Backend:
    """Allocates outputs like a reference array: NumPy on the host, or torch on its device."""

    def __init__(self, like):
        self.torch = is_torch(like)
        self.device = like.device if self.torch else None
        self.cuda = self.torch and like.device.type == "cuda"

    def empty(self, shape, dtype: str):
        shape = tuple(int(s) for s in shape)
        if self.torch:
            t = _torch()
            tdt = t.uint8 if dtype == "float4_e2m1fn_x2" else getattr(t, dtype)
            return t.empty(shape, dtype=tdt, device=self.device)
        return np.empty(shape, dtype=_BY_NAME[dtype][1])

    def zeros(self, shape, dtype: str):
        shape = tuple(int(s) for s in shape)
        if self.torch:
            t = _torch()
            return t.zeros(shape, dtype=getattr(t, dtype), device=self.device)
        return np.zeros(shape, dtype=_BY_NAME[dtype][1])

    def full(self, shape, value, dtype: str):
        out = self.empty(shape, dtype)
        if self.torch:
            out.fill_(value)
        else:
            out.fill(value)
        return out

    def from_values(self, values, dtype: str):
        """A small array of Python numbers (e.g. m_indptr given as a list)."""
        if self.torch:
            t = _torch()
            return t.tensor(list(values), dtype=getattr(t, dtype), device=self.device)
        return np.asarray(values, dtype=_BY_NAME[dtype][1])

    def adopt(self, a, op: str, arg: str, dtype: str):
        """`a` as an array of this backend (scalars and lists are converted)."""
        if is_torch(a) or isinstance(a, np.ndarray):
            return a
        if isinstance(a, (int, float)):
            return self.full((1,), float(a), dtype)
        return self.from_values(a, dtype)

    def stream(self) -> int:
        if not self.cuda:
            return 0
        return int(_torch().cuda.current_stream(self.device).cuda_stream)

    def guard(self):
        if self.cuda:
            return _torch().cuda.device(self.device)
        return contextlib.nullcontext()

    def transpose_last(self, a):
        return a.transpose(-1, -2) if self.torch else np.swapaxes(a, -1, -2)


def same_backend(ref, a, op: str, arg: str):
    """Raise ValueError unless `a` is of the library of `ref` (NumPy vs torch)."""
    if a is None:
        return
    if is_torch(ref) != is_torch(a):
        raise ValueError(
            f"{op}: argument '{arg}': expected a {'torch tensor' if is_torch(ref) else 'NumPy array'} "
            f"like the first argument, got {type(a).__name__}")
