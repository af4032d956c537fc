"""The safetensors dtypes (names <-> NumPy), the reader's limits and SafetensorsError."""

from __future__ import annotations

from typing import Dict

import ml_dtypes
import numpy as np


# safetensors dtype name -> NumPy dtype (little-endian)
DTYPES: Dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    DTYPES["F8_E8M0"] = np.dtype(ml_dtypes.float8_e8m0fnu)

_NUMPY_TO_DTYPE: Dict[str, str] = {}
for _name, _dt in DTYPES.items():
    _NUMPY_TO_DTYPE[_dt.name] = _name

# Limits of what the reader accepts. The header size limit is the reference implementation's
# (100,000,000 bytes); the tensor count keeps the time and memory of reading a header (and of
# processing its tensors) to seconds: 2^18 tensors is far more than any real checkpoint file holds.
# A valid header nests 3 levels deep (header, entry, shape list).
MAX_HEADER_BYTES = 100_000_000
MAX_TENSORS = 1 << 18
MAX_HEADER_DEPTH = 16
_WRITE_CHUNK = 64 * 1024 * 1024
_READ_CHUNK = 64 * 1024 * 1024


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, a path that cannot be read or written as one,
    or a tensor that cannot be stored."""


def dtype_to_numpy(name: str) -> np.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise SafetensorsError(
            f"unsupported dtype {name!r} (supported: {', '.join(DTYPES)})") from None


def numpy_to_dtype(dtype) -> str:
    dt = np.dtype(dtype)
    name = _NUMPY_TO_DTYPE.get(dt.name)
    if name is None:
        raise SafetensorsError(f"NumPy dtype {dt} has no safetensors equivalent")
    return name
