"""Reports and output files shared by the checkpoint commands."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import safetensors_io as st
from .schema import CheckpointError


@dataclass
class TensorReport:
    name: str
    shape: Tuple[int, ...]
    dtype: str
    action: str                    # "quantized" | "copied" | "converted" | "dequantized"
    reason: str = ""
    fmt: str = ""
    bytes_before: int = 0
    bytes_after: int = 0
    sqnr_db: Optional[float] = None
    max_abs_err: Optional[float] = None
    max_abs: Optional[float] = None
    outputs: List[str] = field(default_factory=list)
    seconds: float = 0.0
    extra: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        d = {k: getattr(self, k) for k in ("name", "dtype", "action", "reason", "fmt", "bytes_before",
                                           "bytes_after", "sqnr_db", "max_abs_err", "max_abs", "outputs",
                                           "seconds")}
        d["shape"] = list(self.shape)
        d.update(self.extra)
        for k in ("sqnr_db", "max_abs_err", "max_abs"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d


def _nonfinite_words(n_nan: int, n_inf: int) -> str:
    parts = []
    if n_nan:
        parts.append(f"{n_nan} NaN")
    if n_inf:
        parts.append(f"{n_inf} Inf")
    return " and ".join(parts) + (" value" if n_nan + n_inf == 1 else " values")


def _conform(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`a` as `dtype` when they differ only in name (uint8 vs a 1-byte float type, e.g. UE8M0
    scales from a torch without float8_e8m0fnu); float32 global amax reshaped to [1]."""
    a = np.asarray(a)
    if a.dtype != dtype and a.dtype.itemsize == dtype.itemsize == 1:
        a = a.view(dtype)
    if a.ndim == 0:
        a = a.reshape(1)
    return a


def _check_output(src: str, dst: str, overwrite: bool = True) -> None:
    """Refuses an output that is the input, or that could not be replaced by a regular file (see
    safetensors_io.check_output_path)."""
    if st.same_file(src, dst):
        raise CheckpointError(f"{dst}: the output is the input file {src}")
    st.check_output_path(dst, "output", overwrite)
