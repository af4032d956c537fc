"""Array plumbing between NumPy / torch and the lowbit._C module.

Every array handed to ``_C`` is a same-itemsize view of a plain dtype (bf16 as uint16 / int16,
fp8 and packed fp4 as uint8) plus the real dtype as a ``_C.DType``, because NumPy cannot export
the ml_dtypes types through DLPack and torch's fp4 exports are fragile. Outputs are allocated
in the library and on the device of the reference input. torch is never imported here unless
the caller already passed a torch tensor (it is looked up in ``sys.modules``).

The functions here run on every call of every op, so the per-call work is kept to dictionary
look-ups: dtype names, torch dtypes and DLPack export views are computed once per dtype and
cached; torch tensors are handed to ``_C`` as DLPack capsules (``torch._C._to_dlpack``), which
skips ``Tensor.__dlpack__``'s Python-level checks and stream handshake (the kernels run on the
stream passed explicitly); the current CUDA stream is read as a raw handle.
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
_CDT = {k: v[0] for k, v in _BY_NAME.items()}          # name -> _C.DType
_NP_STORAGE = {k: v[1] for k, v in _BY_NAME.items()}   # name -> NumPy dtype of the storage
# NumPy dtype -> (lowbit DType, view dtype for _C or None), for the arrays handed to _C
_NP_EXPORT = {v[1]: (v[0], None if v[2] is None else np.dtype(v[2]))
              for k, v in _BY_NAME.items() if k != "float4_e2m1fn_x2"}



def numpy_dtype(name: str) -> np.dtype:
    """NumPy storage dtype of a lowbit dtype name (packed fp4: uint8)."""
    return _NP_STORAGE[name]


def ml_dtypes_storage():
    """(lowbit name, NumPy dtype) of the dtypes NumPy stores as ml_dtypes types (bfloat16, the fp8
    types): the ones handed to _C, or to torch.from_numpy, as a same-itemsize integer view."""
    return [(k, v[1]) for k, v in _BY_NAME.items() if v[2] is not None]


DTYPE_ALIASES = {
    "fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2", "ue8m0": "float8_e8m0fnu", "e8m0": "float8_e8m0fnu",
}

# dtype given by a caller (string, NumPy dtype or type, torch dtype) -> canonical name; filled
# by dtype_name() with every dtype it resolved (a bounded set: only valid dtypes are cached)
_NAME_CACHE: dict = {k: k for k in _BY_NAME}
_NAME_CACHE.update(DTYPE_ALIASES)
_NAME_CACHE.update(_NP_TO_NAME)

_NULL_GUARD = contextlib.nullcontext()

# --- torch, resolved once it has been imported by the caller ---------------------------------
_T = None            # the torch module
_TENSOR = None       # torch.Tensor
_T_DT = {}           # lowbit name -> torch dtype of the storage (packed fp4: uint8)
_T_EXPORT = {}       # torch dtype -> (lowbit DType, view dtype for the DLPack export or None)
_to_dlpack = None    # torch._C._to_dlpack
_raw_stream = None   # torch._C._cuda_getCurrentRawStream(device_index) -> int
_cur_device = None   # torch._C._cuda_getDevice() -> int


def _init_torch():
    """The torch module once it is fully imported (None before); fills the torch tables."""
    global _T, _TENSOR, _to_dlpack, _raw_stream, _cur_device
    t = sys.modules.get("torch")
    if t is None or getattr(t, "Tensor", None) is None or getattr(t, "bfloat16", None) is None:
        return t  # not imported, or in the middle of its own import: look again next time
    if _T is not None:
        return _T
    tc = getattr(t, "_C", None)
    dl = getattr(tc, "_to_dlpack", None)
    exportable = {}

    def can_export(dt):
        if dl is None:
            return False
        if dt not in exportable:
            try:
                dl(t.empty(0, dtype=dt))
                exportable[dt] = True
            except Exception:  # noqa: BLE001 - this torch's DLPack lacks the dtype
                exportable[dt] = False
        return exportable[dt]

    for name, (cdt, _, _) in _BY_NAME.items():
        tdt = t.uint8 if name == "float4_e2m1fn_x2" else getattr(t, name, None)
        if tdt is None:
            continue
        _T_DT[name] = tdt
        if name == "float4_e2m1fn_x2":
            continue
        view = None
        if tdt.itemsize == 1 and tdt not in (t.uint8, t.int8) and not can_export(tdt):
            view = t.uint8
        _T_EXPORT[tdt] = (cdt, view)
    # torch's packed fp4 type: exported as its uint8 bytes
    fp4 = getattr(t, "float4_e2m1fn_x2", None)
    if fp4 is not None:
        _T_EXPORT[fp4] = (D.float4_e2m1fn_x2, t.uint8)
    _to_dlpack = dl
    _raw_stream = getattr(tc, "_cuda_getCurrentRawStream", None)
    _cur_device = getattr(tc, "_cuda_getDevice", None)
    _TENSOR = t.Tensor
    _T = t
    return t


def _torch():
    return _T if _T is not None else _init_torch()


def is_torch(a) -> bool:
    T = _TENSOR
    if T is None:
        _init_torch()
        T = _TENSOR
        if T is None:
            return False
    return isinstance(a, T)


def dtype_name(dtype, op: str = "lowbit", arg: str = "dtype") -> str:
    """Canonical lowbit name of a dtype given as a string, NumPy dtype or torch dtype."""
    try:
        name = _NAME_CACHE.get(dtype)
    except TypeError:  # unhashable
        name = None
    if name is not None:
        return name
    name = _dtype_name_slow(dtype)
    if name is None:
        raise ValueError(f"{op}: argument '{arg}': unsupported dtype {dtype!r}")
    try:
        _NAME_CACHE[dtype] = name
    except TypeError:
        pass
    return name


def _dtype_name_slow(dtype):
    if isinstance(dtype, str):
        name = DTYPE_ALIASES.get(dtype, dtype)
        return name if name in _BY_NAME else None
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        name = str(dtype).replace("torch.", "")
        return name if name in _BY_NAME else None
    try:
        npd = np.dtype(dtype)
    except TypeError:
        return None
    return _NP_TO_NAME.get(npd)


def array_dtype_name(a, op: str, arg: str) -> str:
    return dtype_name(a.dtype, op, arg)


def as_array(a, op: str, arg: str, float_default: bool = True):
    """A NumPy array or torch tensor for `a` (lists and scalars become NumPy float32 arrays)."""
    if isinstance(a, np.ndarray) or is_torch(a):
        return a
    if hasattr(a, "__array__") or isinstance(a, (list, tuple, int, float)):
        arr = np.asarray(a)
        if float_default and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        return arr
    raise ValueError(f"{op}: argument '{arg}': expected a NumPy array or a torch tensor, got {type(a).__name__}")


def _export_torch(a):
    """What _C receives for the tensor `a`: a DLPack capsule of `a` (or of its same-itemsize
    uint8 view where this torch cannot export the dtype)."""
    view = _T_EXPORT.get(a.dtype)
    if view is not None and view[1] is not None:
        a = a.view(view[1])
    if _to_dlpack is not None:
        try:
            return _to_dlpack(a)
        except Exception:  # noqa: BLE001 - not exportable as is: let _C's conversion report it
            pass
    return a.detach()


def c_export(a):
    """`a` as _C takes it when its dtype is declared separately or known to _C from DLPack:
    torch tensors as DLPack capsules, NumPy arrays as they are; None stays None."""
    T = _TENSOR
    if T is not None and isinstance(a, T):
        return _export_torch(a)
    return a


def c_view(a, op: str, arg: str, dtype: str | None = None):
    """(array for _C, _C.DType): a same-itemsize view of a plain dtype plus the real dtype.

    `dtype` overrides the array's own dtype (e.g. uint8 bytes that hold E2M1 pairs)."""
    T = _TENSOR
    if T is None and _init_torch() is not None:
        T = _TENSOR
    if T is not None and isinstance(a, T):
        e = _T_EXPORT.get(a.dtype)
        if e is None:  # not a lowbit dtype: raises unless the dtype is declared by `dtype`
            e = (_CDT[dtype if dtype is not None else dtype_name(a.dtype, op, arg)], None)
        if dtype is not None:
            e = (_CDT[dtype], e[1])
        if e[1] is not None:
            a = a.view(e[1])
        if _to_dlpack is not None:
            try:
                return _to_dlpack(a), e[0]
            except Exception:  # noqa: BLE001 - not exportable as is: let _C's conversion report it
                pass
        return a.detach(), e[0]
    if dtype is None:
        e = _NP_EXPORT.get(a.dtype)
        if e is None:  # raises unless an equivalent dtype object of a lowbit dtype
            e = _NP_EXPORT[_NP_STORAGE[dtype_name(a.dtype, op, arg)]]
        cdt, npview = e
    else:
        cdt, _, npview = _BY_NAME[dtype]
    if not a.dtype.isnative:
        raise ValueError(f"{op}: argument '{arg}': byte-swapped arrays are not supported")
    if npview is not None and a.dtype != npview:
        a = a.view(npview)
    return a, cdt


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def check_int(value, op: str, arg: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """`value` as a Python int: an integer (Python or NumPy; not bool, not float) in [lo, hi],
    else ValueError naming the argument (never silently truncated or wrapped)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{op}: argument '{arg}': expected an integer, got {value!r}")
    v = int(value)
    if v < lo or v > hi:
        raise ValueError(f"{op}: argument '{arg}': expected an integer in [{lo}, {hi}], got {v}")
    return v


def check_float(value, op: str, arg: str) -> float:
    """`value` as a Python float (a real number, not bool), else ValueError naming the argument."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{op}: argument '{arg}': expected a number, got {value!r}")
    return float(value)


def int_values(values, op: str, arg: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> np.ndarray:
    """A Python sequence of integers (e.g. m_indptr given as a list) as an int64 NumPy array;
    floats (3.7), bools and values out of [lo, hi] are refused, not truncated."""
    try:
        arr = np.asarray(values)
        objs = np.asarray(values, dtype=object)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{op}: argument '{arg}': expected a sequence of integers, got {values!r}") from e
    if any(isinstance(v, (bool, np.bool_)) for v in objs.reshape(-1)):
        raise ValueError(f"{op}: argument '{arg}': expected integers, got a bool in {values!r}")
    if arr.dtype == object:  # Python ints beyond int64, or mixed objects
        for v in arr.reshape(-1):
            check_int(v, op, arg, lo, hi)
        raise ValueError(f"{op}: argument '{arg}': expected a sequence of integers, got {values!r}")
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        raise ValueError(f"{op}: argument '{arg}': expected integers, got {arr.dtype} values {values!r}")
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise ValueError(f"{op}: argument '{arg}': values must lie in [{lo}, {hi}], got {values!r}")
    return arr.astype(np.int64)


def is_contiguous(a) -> bool:
    if is_torch(a):
        return a.is_contiguous()
    return a.flags.c_contiguous


def contiguous(a, op: str | None = None, arg: str | None = None):
    """`a` in row-major (C) order: `a` itself when it already is, else a copy.

    With `op` / `arg`, a host copy larger than the host's physical memory (e.g. of a huge
    stride-0 view) is refused with ValueError naming the argument before anything is allocated."""
    if is_contiguous(a):
        return a
    if op is not None:
        check_host_copy(a, op, arg)
    if is_torch(a):
        return a.contiguous()
    return np.ascontiguousarray(a)


def check_writable(a, op: str, arg: str):
    """Refuses an array that lowbit would write but may not (a read-only NumPy array or memmap)."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{op}: argument '{arg}': is read-only: an output must be a writable array")
    return a


_HOST_MEMORY = []


def _host_memory_bytes() -> int:
    """Physical memory of this host (cached; unbounded where the platform does not say)."""
    if not _HOST_MEMORY:
        try:
            import os
            _HOST_MEMORY.append(int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE")))
        except (ValueError, OSError, AttributeError):
            _HOST_MEMORY.append(1 << 62)
    return _HOST_MEMORY[0]


def check_host_copy(a, op: str, arg: str):
    """Refuses (ValueError naming `arg`) a host array whose contiguous copy would not fit in the
    host's physical memory (a huge stride-0 view has no memory behind it, its copy would)."""
    if is_torch(a) and a.is_cuda:
        return
    n = int(a.dtype.itemsize) if hasattr(a.dtype, "itemsize") else int(a.element_size())
    for d in a.shape:
        n *= int(d)
    if n > _host_memory_bytes():
        raise ValueError(f"{op}: argument '{arg}': a contiguous copy of shape {tuple(int(d) for d in a.shape)} "
                         f"({n} bytes) exceeds the host's physical memory")


class Backend:
    """Allocates outputs like a reference array: NumPy on the host, or torch on its device.

    `op` / `arg` name the call and the argument whose size decides the outputs: an output that
    cannot be allocated (e.g. for a huge stride-0 view) raises ValueError naming them."""

    __slots__ = ("torch", "cuda", "like", "op", "arg")

    def __init__(self, like, op: str = "lowbit", arg: str = "x"):
        self.like = like
        self.torch = is_torch(like)
        self.cuda = self.torch and like.is_cuda
        self.op = op
        self.arg = arg

    def _no_memory(self, shape, dtype, e):
        n = 1
        for d in shape:
            n *= int(d)
        raise ValueError(f"{self.op}: argument '{self.arg}': an output of shape {tuple(int(d) for d in shape)} "
                         f"({dtype}, {n} elements) cannot be allocated: {e}") from None

    @property
    def device(self):
        return self.like.device if self.torch else None

    def empty(self, shape, dtype: str):
        if not self.cuda:  # NOTE: with memory overcommit a huge host allocation "succeeds" and the
            # first writes exhaust memory: an output above the physical memory is refused up front
            n = _NP_STORAGE[dtype].itemsize
            for d in shape:
                n *= int(d)
            if n > _host_memory_bytes():
                self._no_memory(shape, dtype, f"{n} bytes exceed the host's physical memory")
        try:
            if self.torch:
                like = self.like
                if type(like) is _TENSOR:  # plain tensor: new_empty skips the device argument parsing
                    return like.new_empty(shape, dtype=_T_DT[dtype])
                return _T.empty(tuple(int(s) for s in shape), dtype=_T_DT[dtype], device=like.device)
            return np.empty(shape, dtype=_NP_STORAGE[dtype])
        except (MemoryError, ValueError) as e:  # NumPy: "Unable to allocate", "array is too big"
            self._no_memory(shape, dtype, e)
        except RuntimeError as e:  # torch: allocation failures (CPU and CUDA out of memory)
            if "alloc" not in str(e) and "out of memory" not in str(e):
                raise
            self._no_memory(shape, dtype, e)

    def zeros(self, shape, dtype: str):
        shape = tuple(int(s) for s in shape)
        if self.torch:
            return _T.zeros(shape, dtype=getattr(_T, dtype), device=self.like.device)
        return np.zeros(shape, dtype=_BY_NAME[dtype][1])

    def full(self, shape, value, dtype: str):
        out = self.empty(tuple(int(s) for s in shape), dtype)
        if self.torch:
            out.fill_(value)
        else:
            out.fill(value)
        return out

    def from_values(self, values, dtype: str):
        """A small array of Python numbers (e.g. topk_weights given as a list)."""
        if self.torch:
            return _T.tensor(list(values), dtype=getattr(_T, dtype), device=self.like.device)
        return np.asarray(values, dtype=_BY_NAME[dtype][1])

    def index_values(self, values, op: str, arg: str, dtype: str = "int64", lo: int = INT64_MIN,
                     hi: int = INT64_MAX):
        """A small integer array of this backend from a Python sequence (m_indptr, topk_ids given
        as lists): integers only, range-checked (int_values)."""
        arr = int_values(values, op, arg, lo, hi).astype(_BY_NAME[dtype][1])
        if self.torch:
            return _T.from_numpy(arr).to(self.like.device)
        return arr

    def adopt(self, a, op: str, arg: str, dtype: str):
        """`a` as an array of this backend (scalars and lists are converted)."""
        if isinstance(a, np.ndarray) or is_torch(a):
            return a
        if isinstance(a, (bool, np.bool_)):
            raise ValueError(f"{op}: argument '{arg}': expected a number or an array, got {a!r}")
        if isinstance(a, (int, float)):
            return self.full((1,), float(a), dtype)
        if not isinstance(a, (list, tuple)) and not hasattr(a, "__array__"):
            raise ValueError(f"{op}: argument '{arg}': expected a number, a list or an array, got {type(a).__name__}")
        try:
            return self.from_values(a, dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"{op}: argument '{arg}': expected {dtype} values, got {a!r}") from e

    def stream(self) -> int:
        """The current CUDA stream of the reference tensor's device (0 on the host)."""
        if not self.cuda:
            return 0
        if _raw_stream is not None:
            return _raw_stream(self.like.get_device())
        return int(_T.cuda.current_stream(self.like.device).cuda_stream)

    def guard(self):
        """Makes the reference tensor's device current, where it is not already."""
        if self.cuda:
            if _cur_device is None or _cur_device() != self.like.get_device():
                return _T.cuda.device(self.like.device)
        return _NULL_GUARD


def same_backend(ref, a, op: str, arg: str):
    """Raise ValueError unless `a` is of the library of `ref` (NumPy vs torch)."""
    if a is None:
        return
    if is_torch(ref) != is_torch(a):
        raise ValueError(
            f"{op}: argument '{arg}': expected a {'torch tensor' if is_torch(ref) else 'NumPy array'} "
            f"like the first argument, got {type(a).__name__}")
