"""`lowbit quantize`: quantizes the eligible tensors of a safetensors checkpoint."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import lowbit

from .. import safetensors_io as st
from .._formats import Format
from .device import make_backend
from .io import TensorReport, _check_output, _conform, _nonfinite_words
from .schema import (
    FLOAT_DTYPES,
    METADATA_KEY,
    METADATA_VERSION,
    PRODUCER,
    CheckpointError,
    QuantConfig,
    metadata_entry,
    output_names,
    quantized_specs,
)


# Tensors never quantized unless --no-default-excludes: (what, pattern searched in the name).
DEFAULT_EXCLUDES = (
    ("embedding", r"(^|\.)(embed_tokens|embeddings?|wte|wpe|word_embeddings|position_embeddings|"
                  r"token_type_embeddings|embed_positions)(\.|$)"),
    ("lm_head", r"(^|\.)(lm_head|output_layer)(\.|$)"),
    ("norm", r"(?i)(norm|(^|\.)ln_\w*)(\.|$)"),
    ("router", r"(^|\.)(router|gate|shared_expert_gate)\.(weight|bias)$"),
    ("bias", r"(\.|_)bias$"),
)


@dataclass
class Selection:
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    min_size: int = 0
    default_excludes: bool = False

    def __post_init__(self):
        try:
            self._inc = [re.compile(p) for p in self.include]
            self._exc = [re.compile(p) for p in self.exclude]
        except re.error as e:
            raise CheckpointError(f"bad regular expression {e.pattern!r}: {e}") from None
        self._dflt = [(w, re.compile(p)) for w, p in DEFAULT_EXCLUDES] if self.default_excludes else []


@dataclass
class Measured:
    """A quantized tensor's error against its input (Backend.error_stats) and the input's NaN / Inf
    counts, as TensorReport fields."""
    sqnr: float
    maxerr: float
    maxabs: float
    sig: float
    noise: float
    n_nan: int
    n_inf: int

    def report_fields(self) -> Dict[str, Any]:
        return {"sqnr_db": self.sqnr, "max_abs_err": self.maxerr, "max_abs": self.maxabs,
                "extra": {"signal_energy": self.sig, "noise_energy": self.noise, "nan": self.n_nan,
                          "inf": self.n_inf}}


def measure(backend, ref, xh, x, n: str, shape, warn: Optional[Callable[[str], None]]) -> Measured:
    """xh (the dequantized tensor n) against ref, and the NaN / Inf of its input x (warned of)."""
    sqnr, maxerr, maxabs, sig, noise = backend.error_stats(ref, xh)
    n_nan, n_inf = backend.nonfinite(x)
    if (n_nan or n_inf) and warn is not None:
        warn(f"tensor {n!r} {list(shape)} holds {_nonfinite_words(n_nan, n_inf)}")
    return Measured(sqnr, maxerr, maxabs, sig, noise, n_nan, n_inf)


def quantize_measured(backend, x, fmt, layout: str, kwargs: Dict[str, Any], n: str, shape,
                      warn: Optional[Callable[[str], None]]):
    """lowbit.quantize of tensor n (x, on the backend), its dequantized values and their Measured
    error: (qt, xh, measured). A failure of the library is a CheckpointError naming the tensor."""
    try:
        qt = lowbit.quantize(x, fmt, layout=layout, **kwargs)
        xh = lowbit.dequantize(qt, out_dtype="float32")
    except Exception as e:
        raise CheckpointError(f"tensor {n!r} {list(shape)}: {e}") from e
    return qt, xh, measure(backend, x.float() if backend.name == "cuda" else x, xh, x, n, shape, warn)


def skip_reason(info: st.TensorInfo, cfg: QuantConfig, sel: Selection) -> Optional[str]:
    """Why a tensor is copied instead of quantized (None: quantize it)."""
    if sel._inc and not any(p.search(info.name) for p in sel._inc):
        return "not matched by --include"
    for p in sel._exc:
        if p.search(info.name):
            return f"excluded (--exclude {p.pattern})"
    if info.dtype not in FLOAT_DTYPES:
        return f"not float ({info.dtype}; quantizes F32/F16/BF16)"
    if len(info.shape) != 2:
        return f"not 2-D ({len(info.shape)}-D)"
    m, k = info.shape
    if m == 0 or k == 0:
        return "empty"
    if k % cfg.block:
        return f"K={k} not a multiple of the block {cfg.block}"
    if m * k < sel.min_size:
        return f"smaller than --min-size {sel.min_size}"
    for what, p in sel._dflt:
        if p.search(info.name):
            return f"{what}: excluded by default (--no-default-excludes)"
    return None


def quantize_checkpoint(src: str, dst: str, cfg: QuantConfig, sel: Selection, device: str = "auto",
                        progress: Optional[Callable[[int, int, int, int, str], None]] = None,
                        overwrite: bool = True,
                        warn: Optional[Callable[[str], None]] = None
                        ) -> Tuple[List[TensorReport], Dict[str, Any]]:
    """Quantizes the eligible tensors of `src` into `dst`. Returns the per-tensor reports and a
    summary. Nothing is written unless every tensor succeeded. overwrite=False refuses an existing
    `dst`; warn(message) is called for every quantized tensor that holds NaN or Inf values (the
    report's "nan" / "inf" counts say the same)."""
    with st.SafetensorsFile(src) as f:
        return _quantize_checkpoint(f, src, dst, cfg, sel, device, progress, overwrite, warn)


def _quantize_checkpoint(f, src, dst, cfg, sel, device, progress, overwrite, warn):
    _check_output(src, dst, overwrite)
    if METADATA_KEY in f.metadata:
        raise CheckpointError(f"{src}: already a lowbit-quantized checkpoint (metadata key {METADATA_KEY!r})")
    backend = make_backend(device)
    fmt = Format(cfg.spec.api, **cfg.format_kwargs())

    names = f.names()
    plan: List[Tuple[str, Optional[str]]] = [(n, skip_reason(f.info(n), cfg, sel)) for n in names]
    taken: Dict[str, str] = {}
    for n, why in plan:
        outs = [n] if why else [o for o in output_names(n, cfg).values() if o]
        for o in outs:
            if o in taken:
                raise CheckpointError(f"output tensor name {o!r} of {n!r} clashes with the one of {taken[o]!r}")
            taken[o] = n

    # The whole header (shapes, dtypes, metadata) is known before anything is quantized, so the
    # output is streamed: memory stays at one tensor.
    specs: List[Tuple[str, str, Tuple[int, ...]]] = []
    entries: Dict[str, Any] = {}
    for n, why in plan:
        info = f.info(n)
        if why is not None:
            specs.append((n, info.dtype, info.shape))
            continue
        names_out = output_names(n, cfg)
        for key, (dtype, shape) in quantized_specs(fmt, cfg.layout, info.shape).items():
            if names_out[key]:
                specs.append((names_out[key], dtype, shape))
        entries[n] = metadata_entry(fmt, cfg.layout, info.shape, info.dtype, names_out)
    meta = dict(f.metadata)
    meta[METADATA_KEY] = json.dumps({"version": METADATA_VERSION, "producer": PRODUCER,
                                     "tensors": entries}, separators=(",", ":"))
    spec_dtype = {name: st.dtype_to_numpy(dtype) for name, dtype, _ in specs}

    reports: List[TensorReport] = []
    total = f.total_bytes()
    done = 0
    t_start = time.perf_counter()
    with st.SafetensorsWriter(dst, specs, meta, overwrite=overwrite) as writer:
        for i, (n, why) in enumerate(plan):
            info = f.info(n)
            if progress:
                progress(i, len(plan), done, total, n)
            if why is not None:
                writer.write(n, f.get(n))
                reports.append(TensorReport(n, info.shape, info.dtype, "copied", reason=why,
                                            bytes_before=info.nbytes, bytes_after=info.nbytes, outputs=[n]))
                done += info.nbytes
                continue
            t0 = time.perf_counter()
            x = backend.put(f.get(n))
            kwargs: Dict[str, Any] = {}
            if cfg.spec.api == "nvfp4":
                kwargs["compute_global_amax"] = True
            qt, xh, ms = quantize_measured(backend, x, fmt, cfg.layout, kwargs, n, info.shape, warn)
            names_out = output_names(n, cfg)
            fields = {"qdata": qt.data, "scale": qt.scales, "zero": qt.zeros, "global_amax": qt.global_amax}
            after = 0
            for key, oname in names_out.items():
                if oname is None:
                    continue
                if fields[key] is None:
                    raise CheckpointError(f"tensor {n!r}: lowbit.quantize returned no {key}")
                a = _conform(backend.get(fields[key]), spec_dtype[oname])
                writer.write(oname, a)
                after += a.nbytes
            reports.append(TensorReport(n, info.shape, info.dtype, "quantized", fmt=cfg.spec.cli,
                                        bytes_before=info.nbytes, bytes_after=after,
                                        outputs=[o for o in names_out.values() if o],
                                        seconds=time.perf_counter() - t0, **ms.report_fields()))
            done += info.nbytes
            del x, qt, xh, fields
        if progress:
            progress(len(plan), len(plan), total, total, "")
    summary = {"input": src, "output": dst, "device": backend.name, "format": cfg.describe(),
               "tensors": len(plan), "quantized": len(entries), "copied": len(plan) - len(entries),
               "bytes_before": sum(r.bytes_before for r in reports),
               "bytes_after": sum(r.bytes_after for r in reports),
               "file_bytes_in": os.path.getsize(src), "file_bytes_out": writer.size,
               "seconds": time.perf_counter() - t_start}
    return reports, summary
