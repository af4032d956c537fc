"""`lowbit dequantize`: the inverse of quantize_checkpoint and of convert_gpt_oss."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import lowbit

from .. import safetensors_io as st
from .._arrays import numpy_dtype
from .device import Backend
from .io import TensorReport, _check_output, _nonfinite_words
from .schema import (
    FLOAT_DTYPE_NAMES,
    METADATA_KEY,
    CheckpointError,
    check_entries,
    format_from_entry,
    make_quantized,
    read_lowbit_metadata,
)


def dequantize_entry(f: st.SafetensorsFile, name: str, e: Dict[str, Any], out_dtype: str) -> np.ndarray:
    fmt, layout = format_from_entry(e, name)
    if fmt.has_global_scale and e.get("global_amax") is None:
        raise CheckpointError(f"{f.path}: quantized tensor {name!r}: the metadata entry names no global_amax "
                              f"tensor (the global amax {fmt.name} needs)")

    def opt(key):
        n = e.get(key)
        if n is None:
            return None
        if n not in f:
            raise CheckpointError(f"{f.path}: tensor {n!r} ({key} of {name!r}) is missing")
        return np.array(f.get(n), copy=True)

    data, scales, zeros, gamax = opt("qdata"), opt("scale"), opt("zero"), opt("global_amax")
    if data is None or scales is None:
        raise CheckpointError(f"{f.path}: entry {name!r} lacks qdata/scale")
    shape = tuple(e["shape"])
    if len(shape) == 2:
        qt = make_quantized(data, scales, zeros, gamax, fmt, layout, shape)
        return np.asarray(lowbit.dequantize(qt, out_dtype=out_dtype))
    if len(shape) == 3:  # one matrix per leading index (converted gpt-oss experts)
        parts = []
        for i in range(shape[0]):
            qt = make_quantized(data[i], scales[i], None if zeros is None else zeros[i], gamax, fmt,
                                layout, shape[1:])
            parts.append(np.asarray(lowbit.dequantize(qt, out_dtype=out_dtype)))
        return np.stack(parts) if parts else np.zeros(shape, np.float32)
    raise CheckpointError(f"{f.path}: entry {name!r} has an unsupported shape {list(shape)}")


_OUT_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "f16": "float16", "float16": "float16",
               "f32": "float32", "float32": "float32"}


def dequantize_checkpoint(src: str, dst: str, dtype: str = "auto",
                          progress: Optional[Callable[[int, int, int, int, str], None]] = None,
                          overwrite: bool = True, warn: Optional[Callable[[str], None]] = None
                          ) -> Tuple[List[TensorReport], Dict[str, Any]]:
    """Dequantizes every entry of the "lowbit" metadata of `src` into `dst` (copies the rest).
    overwrite=False refuses an existing `dst`; warn(message) is called for every dequantized
    tensor that holds NaN or Inf values."""
    with st.SafetensorsFile(src) as f:
        return _dequantize_checkpoint(f, src, dst, dtype, progress, overwrite, warn)


def _dequantize_checkpoint(f, src, dst, dtype, progress, overwrite, warn):
    _check_output(src, dst, overwrite)
    entries = read_lowbit_metadata(f)
    if dtype != "auto" and dtype not in _OUT_DTYPES:
        raise CheckpointError(f"--dtype {dtype}: choose from auto, bf16, f16, f32")
    owned = {n: base for n, (base, _) in check_entries(f, entries).items()}
    # plan: (output name, source name or None for a dequantized entry, safetensors dtype, shape)
    plan: List[Tuple[str, Optional[str], str, Tuple[int, ...]]] = []
    for n in f.names():
        info = f.info(n)
        if n not in owned:
            plan.append((n, n, info.dtype, info.shape))
            continue
        base = owned[n]
        e = entries[base]
        if n == e["qdata"]:  # emitted where its codes were
            want = e.get("dtype", "F32") if dtype == "auto" else dtype
            out_dtype = _OUT_DTYPES.get(want) or FLOAT_DTYPE_NAMES.get(want, "float32")
            plan.append((base, None, st.numpy_to_dtype(numpy_dtype(out_dtype)),
                         tuple(int(d) for d in e["shape"])))
    meta = {k: v for k, v in f.metadata.items() if k != METADATA_KEY}

    reports: List[TensorReport] = []
    total, done = f.total_bytes(), 0
    t_start = time.perf_counter()
    with st.SafetensorsWriter(dst, [(n, dt, shp) for n, _, dt, shp in plan], meta, overwrite=overwrite) as writer:
        for i, (n, source, sdtype, shape) in enumerate(plan):
            if progress:
                progress(i, len(plan), done, total, n)
            if source is not None:
                info = f.info(source)
                writer.write(n, f.get(source))
                done += info.nbytes
                reports.append(TensorReport(n, info.shape, info.dtype, "copied", reason="not quantized",
                                            bytes_before=info.nbytes, bytes_after=info.nbytes, outputs=[n]))
                continue
            e = entries[n]
            t0 = time.perf_counter()
            try:
                y = dequantize_entry(f, n, e, str(_dtype_name(sdtype)))
            except CheckpointError:
                raise
            except Exception as ex:
                raise CheckpointError(f"tensor {n!r}: {ex}") from ex
            writer.write(n, y)
            n_nan, n_inf = Backend().nonfinite(y)
            if (n_nan or n_inf) and warn is not None:
                warn(f"tensor {n!r} {list(y.shape)} decodes to {_nonfinite_words(n_nan, n_inf)}")
            before = sum(f.info(e[k]).nbytes for k in ("qdata", "scale", "zero", "global_amax") if e.get(k))
            done += before
            reports.append(TensorReport(n, tuple(y.shape), sdtype, "dequantized", fmt=e["format"],
                                        bytes_before=before, bytes_after=y.nbytes, outputs=[n],
                                        seconds=time.perf_counter() - t0,
                                        extra={"nan": n_nan, "inf": n_inf}))
        if progress:
            progress(len(plan), len(plan), total, total, "")
    summary = {"input": src, "output": dst, "tensors": len(reports),
               "dequantized": sum(r.action == "dequantized" for r in reports),
               "bytes_before": sum(r.bytes_before for r in reports),
               "bytes_after": sum(r.bytes_after for r in reports), "file_bytes_out": writer.size,
               "seconds": time.perf_counter() - t_start}
    return reports, summary


def _dtype_name(sdtype: str) -> str:
    return FLOAT_DTYPE_NAMES[sdtype]
