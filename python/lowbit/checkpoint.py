"""Quantizing, dequantizing and converting whole safetensors checkpoints.

Naming scheme of a quantized checkpoint. A quantized tensor `W` of shape [M, K] (or [L, M, K]
for the converted gpt-oss experts) is replaced by:

    W.qdata        codes: uint8 [M, K/2] for the 4-bit formats (two codes per byte, element 2i in
                   the low nibble unless nibble_order is "high"); float8_e4m3fn / float8_e5m2
                   [M, K] for the 8-bit formats
    W.scale        the block scales, stored as the layout stores them (row_major [M, K/block];
                   col_major / blocked128x4 / blocked8x4: the padded matrix of lowbit.scale_shape);
                   float32, float8_e8m0fnu / uint8 (UE8M0) or float8_e4m3fn (NVFP4)
    W.zero         uint4 only: uint8 zero points, same layout and shape as W.scale
    W.global_amax  nvfp4 only: float32 [1], the per-tensor amax (S_dec = global_amax / 2688)

and the safetensors `__metadata__` gets one key, "lowbit", whose value is a JSON object

    {"version": 1, "producer": "lowbit 0.1.0",
     "tensors": {"W": {"format": "nvfp4", "block": 16, "layout": "row_major", "row_align": 1,
                       "nibble_order": "low", "rounding": null, "scale_dtype": "float8_e4m3fn",
                       "zero_scale": "zero", "shape": [M, K], "dtype": "BF16",
                       "qdata": "W.qdata", "scale": "W.scale", "zero": null,
                       "global_amax": "W.global_amax",
                       "format_kwargs": {"block": 16, "nibble_order": "low", "zero_scale": "zero"}}}}

`format` is a lowbit.Format name and `format_kwargs` its keyword arguments
(lowbit.Format(format, **format_kwargs) rebuilds it; the fields before it say the same for a
reader without lowbit); `rounding` is the MX scale rule (null otherwise), `nibble_order` null for
the 8-bit formats; `shape` and `dtype` (safetensors name) are those of the original tensor. The
value decodes as lowbit.dequantize(lowbit.Quantized(qdata, scale, zero, global_amax, format,
layout, shape)). Every other tensor is copied byte for byte, and existing metadata keys are kept.
Converted gpt-oss experts use the same scheme with a 3-D shape [experts, rows, K] (one matrix per
expert; "source": "gpt-oss").
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import safetensors_io as st

METADATA_KEY = "lowbit"
METADATA_VERSION = 1

LAYOUTS = ("row_major", "col_major", "blocked128x4", "blocked8x4")
FLOAT_DTYPES = ("F32", "F16", "BF16")


class CheckpointError(ValueError):
    """A problem with the input, the options or the output that ends the command."""


# ---------------------------------------------------------------------------------------------
# Formats of the command line


@dataclass(frozen=True)
class FormatSpec:
    cli: str                      # command-line name
    api: str                      # lowbit.Format name
    bits: int                     # element bits (4: two codes per byte)
    fixed_block: Optional[int]    # MX / NVFP4: block size fixed by the format
    default_block: int
    mx: bool = False              # --rounding applies
    scale_dtypes: Tuple[str, ...] = ("float32",)
    default_scale_dtype: str = "float32"
    description: str = ""


FORMATS: Dict[str, FormatSpec] = {s.cli: s for s in (
    FormatSpec("nvfp4", "nvfp4", 4, 16, 16, scale_dtypes=("e4m3",), default_scale_dtype="e4m3",
               description="E2M1 codes, E4M3 scale per 16, per-tensor FP32 global amax"),
    FormatSpec("mxfp4", "mxfp4", 4, 32, 32, mx=True, scale_dtypes=("ue8m0",), default_scale_dtype="ue8m0",
               description="E2M1 codes, UE8M0 scale per 32 (OCP MX)"),
    FormatSpec("mxfp8", "mxfp8_e4m3", 8, 32, 32, mx=True, scale_dtypes=("ue8m0",), default_scale_dtype="ue8m0",
               description="E4M3 codes, UE8M0 scale per 32 (OCP MX)"),
    FormatSpec("mxfp8-e5m2", "mxfp8_e5m2", 8, 32, 32, mx=True, scale_dtypes=("ue8m0",),
               default_scale_dtype="ue8m0", description="E5M2 codes, UE8M0 scale per 32 (OCP MX)"),
    FormatSpec("fp8-group", "fp8_e4m3", 8, None, 128, scale_dtypes=("float32", "ue8m0"),
               description="E4M3 codes, scale per group (default 128)"),
    FormatSpec("int4", "int4", 4, None, 128, scale_dtypes=("float32", "ue8m0"),
               description="symmetric INT4, scale per group (default 128)"),
    FormatSpec("uint4", "uint4", 4, None, 128,
               description="asymmetric UINT4, scale + zero point per group (default 128)"),
    FormatSpec("nf4", "nf4", 4, None, 64, description="NF4 codebook, absmax per block (default 64)"),
)}


@dataclass
class QuantConfig:
    spec: FormatSpec
    block: int
    layout: str = "row_major"
    rounding: Optional[str] = None       # MX only
    scale_dtype: str = "float32"
    nibble_order: Optional[str] = None   # 4-bit only

    def format_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of lowbit.Format / lowbit.quantize for this configuration."""
        kw: Dict[str, Any] = {}
        if self.spec.fixed_block is None:
            kw["block"] = self.block
        if self.spec.mx and self.rounding:
            kw["rounding"] = self.rounding
        if self.spec.api in ("fp8_e4m3", "int4"):
            kw["scale_dtype"] = self.scale_dtype
        if self.spec.bits == 4 and self.nibble_order:
            kw["nibble_order"] = self.nibble_order
        return kw

    def describe(self) -> str:
        parts = [self.spec.cli, f"block {self.block}", f"scales {self.scale_dtype} {self.layout}"]
        if self.rounding:
            parts.append(f"rounding {self.rounding}")
        if self.nibble_order:
            parts.append(f"nibbles {self.nibble_order}-first")
        return ", ".join(parts)


def make_config(fmt: str, group_size: Optional[int] = None, rounding: Optional[str] = None,
                layout: str = "row_major", nibble_order: Optional[str] = None,
                scale_dtype: Optional[str] = None) -> QuantConfig:
    """Checks the option combination and fills in the defaults."""
    spec = FORMATS.get(fmt)
    if spec is None:
        raise CheckpointError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if spec.fixed_block is not None:
        if group_size is not None and group_size != spec.fixed_block:
            raise CheckpointError(f"--group-size: {fmt} has a fixed block of {spec.fixed_block} "
                                  f"(got {group_size})")
        block = spec.fixed_block
    else:
        block = spec.default_block if group_size is None else group_size
        if block <= 0 or block % 2:
            raise CheckpointError(f"--group-size must be a positive even number (got {block})")
    if rounding is not None and not spec.mx:
        raise CheckpointError(f"--rounding applies to the MX formats (mxfp4, mxfp8, mxfp8-e5m2), not {fmt}")
    if spec.mx and rounding is None:
        rounding = "rceil"
    if scale_dtype is not None and scale_dtype not in spec.scale_dtypes:
        if spec.scale_dtypes == ("float32",) or len(spec.scale_dtypes) > 1:
            raise CheckpointError(f"--scale-dtype {scale_dtype}: {fmt} stores "
                                  f"{' or '.join(spec.scale_dtypes)} scales")
        raise CheckpointError(f"--scale-dtype: {fmt} always stores {spec.scale_dtypes[0]} scales")
    if nibble_order is not None and spec.bits != 4:
        raise CheckpointError(f"--nibble-order applies to the 4-bit formats, not {fmt}")
    if spec.bits == 4 and nibble_order is None:
        nibble_order = "low"
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown scale layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    return QuantConfig(spec=spec, block=block, layout=layout, rounding=rounding,
                       scale_dtype=scale_dtype or spec.default_scale_dtype, nibble_order=nibble_order)


# ---------------------------------------------------------------------------------------------
# Devices: NumPy on the CPU reference, torch tensors on CUDA


def cuda_status() -> Tuple[bool, str]:
    """(usable, reason): whether quantize can run on a CUDA device through torch."""
    import lowbit

    info = lowbit.build_info()
    if not info.get("cuda_built"):
        return False, "lowbit was built without CUDA kernels"
    if not info.get("device_count"):
        return False, "no CUDA device is usable"
    ops = set(info.get("cuda_ops") or ())
    if ops and not {"quantize", "dequantize"} <= ops:
        return False, "quantize/dequantize do not run on the device in this build"
    try:
        import torch  # noqa: F401
    except ImportError:
        return False, "torch is not installed (CUDA arrays are passed as torch tensors)"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, f"{info.get('device_name', 'CUDA device')} (sm_{info.get('sm', '?')})"


class Backend:
    """Moves NumPy arrays to where the kernels run and back."""

    name = "cpu"

    def put(self, a: np.ndarray):
        # A private, writable, contiguous copy (memory-mapped inputs are read-only).
        return np.array(a, order="C", copy=True)

    def get(self, t) -> Optional[np.ndarray]:
        return None if t is None else np.asarray(t)

    def error_stats(self, x, xh) -> Tuple[float, float, float, float, float]:
        """(SQNR dB, max |x - xh|, max |x|, sum x^2, sum (x - xh)^2), in float64 by chunks of rows."""
        x2 = np.asarray(x).reshape(-1, np.asarray(x).shape[-1]) if np.ndim(x) else np.asarray(x).reshape(1, 1)
        y2 = np.asarray(xh).reshape(x2.shape)
        sig = noise = 0.0
        maxerr = maxabs = 0.0
        rows = max(1, (1 << 22) // max(1, x2.shape[1]))
        for i in range(0, x2.shape[0], rows):
            a = x2[i:i + rows].astype(np.float64)
            d = a - y2[i:i + rows].astype(np.float64)
            sig += float(np.sum(a * a))
            noise += float(np.sum(d * d))
            if d.size:
                maxerr = nanmax(maxerr, float(np.max(np.abs(d))))
                maxabs = nanmax(maxabs, float(np.max(np.abs(a))))
        return _sqnr(sig, noise), maxerr, maxabs, sig, noise

    def nonfinite(self, x) -> Tuple[int, int]:
        """(number of NaN, number of +-Inf) values of x."""
        a = np.asarray(x)
        nan = inf = 0
        flat = a.reshape(-1)
        step = 1 << 24
        for i in range(0, flat.size, step):
            c = flat[i:i + step]
            nan += int(np.count_nonzero(np.isnan(c)))
            inf += int(np.count_nonzero(np.isinf(c)))
        return nan, inf


class TorchCudaBackend(Backend):
    name = "cuda"

    def __init__(self):
        import torch

        self.torch = torch
        import ml_dtypes

        # NumPy dtypes torch.from_numpy cannot take: (bit-view dtype on both sides)
        self._np_views = {
            np.dtype(ml_dtypes.bfloat16): (np.int16, torch.bfloat16),
            np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, torch.float8_e4m3fn),
            np.dtype(ml_dtypes.float8_e5m2): (np.uint8, torch.float8_e5m2),
        }
        self._torch_views = {
            torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
            torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
            torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
        }
        e8m0 = getattr(torch, "float8_e8m0fnu", None)
        if e8m0 is not None and hasattr(ml_dtypes, "float8_e8m0fnu"):
            self._np_views[np.dtype(ml_dtypes.float8_e8m0fnu)] = (np.uint8, e8m0)
            self._torch_views[e8m0] = (torch.uint8, np.dtype(ml_dtypes.float8_e8m0fnu))

    def put(self, a: np.ndarray):
        torch = self.torch
        a = np.ascontiguousarray(a)
        view = self._np_views.get(a.dtype)
        if view is not None:
            t = torch.from_numpy(np.array(a.view(view[0]), copy=True)).view(view[1])
        else:
            t = torch.from_numpy(np.array(a, copy=True))
        return t.to("cuda", non_blocking=False)

    def get(self, t) -> Optional[np.ndarray]:
        if t is None:
            return None
        torch = self.torch
        if not isinstance(t, torch.Tensor):
            return np.asarray(t)
        t = t.detach().contiguous().cpu()
        view = self._torch_views.get(t.dtype)
        if view is not None:
            return t.view(view[0]).numpy().view(view[1])
        return t.numpy()

    def error_stats(self, x, xh) -> Tuple[float, float, float, float, float]:
        torch = self.torch
        a = x.double()
        d = a - xh.double()
        sig = float(torch.sum(a * a))
        noise = float(torch.sum(d * d))
        maxerr = float(d.abs().max()) if d.numel() else 0.0
        maxabs = float(a.abs().max()) if a.numel() else 0.0
        return _sqnr(sig, noise), maxerr, maxabs, sig, noise

    def nonfinite(self, x) -> Tuple[int, int]:
        torch = self.torch
        return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def nanmax(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """max of two floats that is NaN when either is NaN (Python's max(0.0, nan) is 0.0); None is
    ignored."""
    if a is None:
        return b
    if b is None:
        return a
    if math.isnan(a) or math.isnan(b):
        return float("nan")
    return a if a >= b else b


def _sqnr(sig: float, noise: float) -> float:
    if math.isnan(sig) or math.isnan(noise):
        return float("nan")
    if noise == 0.0:
        return float("inf")
    if sig == 0.0:
        return float("-inf")
    return 10.0 * math.log10(sig / noise)


def make_backend(device: str) -> Backend:
    if device == "cpu":
        return Backend()
    usable, why = cuda_status()
    if device == "cuda":
        if not usable:
            raise CheckpointError(f"--device cuda: {why}")
        return TorchCudaBackend()
    if device == "auto":
        return TorchCudaBackend() if usable else Backend()
    raise CheckpointError(f"unknown device {device!r} (auto, cpu or cuda)")


# ---------------------------------------------------------------------------------------------
# Quantize


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


@dataclass
class Selection:
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    min_size: int = 0

    def __post_init__(self):
        try:
            self._inc = [re.compile(p) for p in self.include]
            self._exc = [re.compile(p) for p in self.exclude]
        except re.error as e:
            raise CheckpointError(f"bad regular expression {e.pattern!r}: {e}") from None


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
    return None


_API_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _lowbit():
    import lowbit

    return lowbit


def output_names(name: str, cfg: QuantConfig) -> Dict[str, Optional[str]]:
    return {
        "qdata": f"{name}.qdata",
        "scale": f"{name}.scale",
        "zero": f"{name}.zero" if cfg.spec.api == "uint4" else None,
        "global_amax": f"{name}.global_amax" if cfg.spec.api == "nvfp4" else None,
    }


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
    lb = _lowbit()
    _check_output(src, dst, overwrite)
    if METADATA_KEY in f.metadata:
        raise CheckpointError(f"{src}: already a lowbit-quantized checkpoint (metadata key {METADATA_KEY!r})")
    backend = make_backend(device)
    fmt = lb.Format(cfg.spec.api, **cfg.format_kwargs())

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
    meta[METADATA_KEY] = json.dumps({"version": METADATA_VERSION, "producer": f"lowbit {lb.__version__}",
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
            try:
                qt = lb.quantize(x, fmt, layout=cfg.layout, **kwargs)
                xh = lb.dequantize(qt, out_dtype="float32")
            except Exception as e:
                raise CheckpointError(f"tensor {n!r} {list(info.shape)}: {e}") from e
            sqnr, maxerr, maxabs, sig, noise = backend.error_stats(x.float() if backend.name == "cuda" else x, xh)
            n_nan, n_inf = backend.nonfinite(x)
            if (n_nan or n_inf) and warn is not None:
                warn(f"tensor {n!r} {list(info.shape)} holds {_nonfinite_words(n_nan, n_inf)}")
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
                                        bytes_before=info.nbytes, bytes_after=after, sqnr_db=sqnr,
                                        max_abs_err=maxerr, max_abs=maxabs,
                                        outputs=[o for o in names_out.values() if o],
                                        seconds=time.perf_counter() - t0,
                                        extra={"signal_energy": sig, "noise_energy": noise,
                                               "nan": n_nan, "inf": n_inf}))
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


def _nonfinite_words(n_nan: int, n_inf: int) -> str:
    parts = []
    if n_nan:
        parts.append(f"{n_nan} NaN")
    if n_inf:
        parts.append(f"{n_inf} Inf")
    return " and ".join(parts) + (" value" if n_nan + n_inf == 1 else " values")


def _api_dtype(name: str) -> np.dtype:
    """NumPy dtype of a lowbit dtype name (uint8, float32, float8_e4m3fn, float8_e8m0fnu, ...)."""
    import ml_dtypes

    t = getattr(ml_dtypes, name, None)
    return np.dtype(t if t is not None else name)


def quantized_specs(fmt, layout: str, shape: Sequence[int]) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """{qdata|scale|zero|global_amax: (safetensors dtype, shape)} that lowbit.quantize produces for
    a [M, K] input (zero / global_amax present only for the formats that have them)."""
    lb = _lowbit()
    m, k = (int(d) for d in shape)
    code = st.numpy_to_dtype(_api_dtype(fmt.code_dtype))
    sshape = tuple(int(d) for d in lb.scale_shape(fmt, layout, 1, m, k))[1:]
    out = {"qdata": (code, (m, k // 2) if fmt.packed else (m, k)),
           "scale": (st.numpy_to_dtype(_api_dtype(fmt.scale_dtype)), sshape)}
    if fmt.has_zero_point:
        out["zero"] = ("U8", sshape)
    if fmt.has_global_scale:
        out["global_amax"] = ("F32", (1,))
    return out


def _conform(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`a` as `dtype` when they differ only in name (uint8 vs a 1-byte float type, e.g. UE8M0
    scales from a torch without float8_e8m0fnu); float32 global amax reshaped to [1]."""
    a = np.asarray(a)
    if a.dtype != dtype and a.dtype.itemsize == dtype.itemsize == 1:
        a = a.view(dtype)
    if a.ndim == 0:
        a = a.reshape(1)
    return a


def metadata_entry(fmt, layout: str, shape, dtype: str, names_out: Dict[str, Optional[str]],
                   **extra: Any) -> Dict[str, Any]:
    """The "lowbit" metadata entry of one quantized tensor (fmt: a lowbit.Format)."""
    packed = bool(getattr(fmt, "packed", True))
    e: Dict[str, Any] = {
        "format": fmt.name,
        "block": int(fmt.block),
        "layout": layout,
        "row_align": 1,
        "nibble_order": fmt.nibble_order if packed else None,
        "rounding": getattr(fmt, "rounding", None),
        "scale_dtype": getattr(fmt, "scale_dtype", None),
        "zero_scale": getattr(fmt, "zero_scale", None),
        "shape": [int(d) for d in shape],
        "dtype": dtype,
    }
    e.update(names_out)
    kwargs = getattr(fmt, "kwargs", None)
    e["format_kwargs"] = kwargs() if callable(kwargs) else {}
    e.update(extra)
    return e


def _check_output(src: str, dst: str, overwrite: bool = True) -> None:
    """Refuses an output that is the input, or that could not be replaced by a regular file (see
    safetensors_io.check_output_path)."""
    if st.same_file(src, dst):
        raise CheckpointError(f"{dst}: the output is the input file {src}")
    st.check_output_path(dst, "output", overwrite)


# ---------------------------------------------------------------------------------------------
# Dequantize (the inverse of quantize_checkpoint and of convert_gpt_oss)


def read_lowbit_metadata(f: st.SafetensorsFile) -> Dict[str, Any]:
    raw = f.metadata.get(METADATA_KEY)
    if raw is None:
        raise CheckpointError(f"{f.path}: not a lowbit-quantized checkpoint (no {METADATA_KEY!r} metadata)")
    try:
        meta = json.loads(raw, object_pairs_hook=_unique_keys)
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
        entries = meta["tensors"]
        if not isinstance(entries, dict):
            raise TypeError("tensors is not an object")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{f.path}: malformed {METADATA_KEY!r} metadata ({type(e).__name__}: {e})") from None
    version = meta.get("version", 1)
    if type(version) is not int:
        raise CheckpointError(f"{f.path}: malformed {METADATA_KEY!r} metadata (version {version!r} is not an "
                              f"integer)")
    if version > METADATA_VERSION:
        raise CheckpointError(f"{f.path}: lowbit metadata version {meta.get('version')} is newer than "
                              f"this lowbit understands ({METADATA_VERSION})")
    return entries


def _unique_keys(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key {k!r} appears twice")
            seen.add(k)
    return d


_ENTRY_TENSORS = ("qdata", "scale", "zero", "global_amax")


def check_entries(f: st.SafetensorsFile, entries: Dict[str, Any]) -> Dict[str, Tuple[str, str]]:
    """Validates the "lowbit" metadata entries against the file; returns {tensor name: (entry,
    role)} of the tensors the entries own. Every problem is a CheckpointError naming the entry:
    a tensor owned twice (by two entries, or twice by one), a missing tensor, a format whose
    global amax or zero points the entry does not give (or gives where the format has none), a
    malformed shape, an original dtype other than F32 / F16 / BF16."""
    owned: Dict[str, Tuple[str, str]] = {}
    for base, e in entries.items():
        where = f"{f.path}: quantized tensor {base!r}"
        if not isinstance(e, dict):
            raise CheckpointError(f"{where}: metadata entry is not an object")
        shape = e.get("shape")
        if (not isinstance(shape, list) or len(shape) not in (2, 3)
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of 2 or 3 non-negative integers")
        if base in f:
            raise CheckpointError(f"{where}: the name is both a tensor and a quantized entry")
        if "dtype" in e and e["dtype"] not in FLOAT_DTYPES:  # the original dtype: what dequantize writes
            raise CheckpointError(f"{where}: dtype {e['dtype']!r} is not one of {', '.join(FLOAT_DTYPES)} "
                                  f"(the dtype of the original tensor)")
        fmt, _ = format_from_entry(e, base)
        need = {"qdata": True, "scale": True, "zero": bool(fmt.has_zero_point),
                "global_amax": bool(fmt.has_global_scale)}
        for key in _ENTRY_TENSORS:
            n = e.get(key)
            if n is None:
                if need[key]:
                    why = {"qdata": "its codes", "scale": "its scales",
                           "zero": f"the zero points {fmt.name} needs",
                           "global_amax": f"the global amax {fmt.name} needs (without it the values would "
                                          f"decode at the wrong scale)"}[key]
                    raise CheckpointError(f"{where}: the metadata entry names no {key} tensor ({why})")
                continue
            if not isinstance(n, str):
                raise CheckpointError(f"{where}: {key} must be a tensor name, not {n!r}")
            if not need[key]:
                raise CheckpointError(f"{where}: the metadata entry names a {key} tensor ({n!r}) but {fmt.name} "
                                      f"has none")
            if n not in f:
                raise CheckpointError(f"{where}: the {key} tensor {n!r} is missing")
            if n in owned:
                other, role = owned[n]
                raise CheckpointError(f"{where}: tensor {n!r} is its {key} and also the {role} of "
                                      f"{'the same entry' if other == base else repr(other)}; each quantized "
                                      f"tensor needs tensors of its own")
            owned[n] = (base, key)
        if e.get("global_amax") is not None:
            info = f.info(e["global_amax"])
            if info.dtype not in FLOAT_DTYPES or info.numel != 1:
                raise CheckpointError(f"{where}: the global_amax tensor {e['global_amax']!r} is {info.dtype} "
                                      f"{list(info.shape)}, expected one float value")
    return owned


def format_from_entry(e: Dict[str, Any], name: Optional[str] = None):
    """The lowbit.Format an entry of the "lowbit" metadata describes, and its layout."""
    lb = _lowbit()
    fname = e.get("format")
    kwargs = e.get("format_kwargs")
    try:
        if not isinstance(fname, str):
            raise TypeError("format must be a string")
        if isinstance(kwargs, dict):
            return lb.Format(fname, **kwargs), e.get("layout", "row_major")
        kw = {k: e[k] for k in ("block", "rounding", "scale_dtype", "nibble_order", "zero_scale")
              if e.get(k) is not None}
        return lb.Format(fname, **kw), e.get("layout", "row_major")
    except (ValueError, TypeError) as ex:
        who = f"quantized tensor {name!r}: " if name is not None else ""
        raise CheckpointError(f"{who}metadata entry with format {e.get('format')!r}: {ex}") from None


def make_quantized(data, scales, zeros, global_amax, fmt, layout: str, shape):
    lb = _lowbit()
    return lb.Quantized(data=data, scales=scales, zeros=zeros, global_amax=global_amax, format=fmt,
                        layout=layout, shape=tuple(int(d) for d in shape))


def dequantize_entry(f: st.SafetensorsFile, name: str, e: Dict[str, Any], out_dtype: str) -> np.ndarray:
    lb = _lowbit()
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
        return np.asarray(lb.dequantize(qt, out_dtype=out_dtype))
    if len(shape) == 3:  # one matrix per leading index (converted gpt-oss experts)
        parts = []
        for i in range(shape[0]):
            qt = make_quantized(data[i], scales[i], None if zeros is None else zeros[i], gamax, fmt,
                                layout, shape[1:])
            parts.append(np.asarray(lb.dequantize(qt, out_dtype=out_dtype)))
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
            out_dtype = _OUT_DTYPES.get(want) or _API_DTYPES.get(want, "float32")
            plan.append((base, None, st.numpy_to_dtype(_api_dtype(out_dtype)),
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
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[sdtype]


# ---------------------------------------------------------------------------------------------
# gpt-oss MXFP4 experts -> lowbit layout

# E2M1 code -> value (sign bit 3, then the exponent/mantissa of section 1 of the format notes)
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def decode_gpt_oss(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Independent NumPy decode of gpt-oss MXFP4: blocks uint8 [..., G, 16] (element 2i in the low
    nibble), scales uint8 [..., G] (2^(s-127), 0xFF = NaN) -> float32 [..., G*32]."""
    b = np.asarray(blocks, dtype=np.uint8)
    s = np.asarray(scales, dtype=np.uint8)
    vals = np.empty(b.shape[:-1] + (32,), dtype=np.float32)
    vals[..., 0::2] = _E2M1[b & 0x0F]
    vals[..., 1::2] = _E2M1[b >> 4]
    mult = np.ldexp(np.float32(1.0), np.minimum(s, 254).astype(np.int32) - 127).astype(np.float32)
    mult[s == 0xFF] = np.nan
    with np.errstate(over="ignore"):  # 6 * 2^127 is +-inf in float32, as in any fp32 decode
        vals *= mult[..., None]
    return vals.reshape(b.shape[:-2] + (b.shape[-2] * 32,))


def _same_bits(a: np.ndarray, b: np.ndarray) -> int:
    """Number of elements whose float32 bits differ (NaN equals NaN)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return max(a.size, b.size)
    diff = a.view(np.uint32) != b.view(np.uint32)
    diff &= ~(np.isnan(a) & np.isnan(b))
    return int(np.count_nonzero(diff))


def find_gpt_oss_pairs(f: st.SafetensorsFile) -> Tuple[Dict[str, Tuple[str, str]], Dict[str, str]]:
    """{base: (blocks name, scales name)} of the MXFP4 expert tensors, and {name: why not} of
    `*blocks` tensors that do not form a valid pair."""
    pairs: Dict[str, Tuple[str, str]] = {}
    bad: Dict[str, str] = {}
    for n in f.names():
        for sep in ("_", "."):
            if not n.endswith(sep + "blocks"):
                continue
            base = n[: -len(sep + "blocks")]
            sn = base + sep + "scales"
            if sn not in f:
                bad[n] = f"no matching {sn}"
                break
            bi, si = f.info(n), f.info(sn)
            if bi.dtype != "U8" or si.dtype != "U8":
                bad[n] = f"dtypes {bi.dtype}/{si.dtype}, expected U8/U8"
            elif len(bi.shape) != 4 or bi.shape[-1] != 16:
                bad[n] = f"shape {list(bi.shape)}, expected (experts, rows, K/32, 16)"
            elif tuple(si.shape) != tuple(bi.shape[:3]):
                bad[n] = f"scales shape {list(si.shape)} does not match blocks {list(bi.shape)}"
            else:
                pairs[base] = (n, sn)
            break
    return pairs, bad


def convert_gpt_oss(src: str, dst: str, layout: str = "row_major", verify: bool = True,
                    progress: Optional[Callable[[int, int, int, int, str], None]] = None,
                    overwrite: bool = True) -> Tuple[List[TensorReport], Dict[str, Any]]:
    """Converts the gpt-oss MXFP4 experts of `src` into `dst`; overwrite=False refuses an
    existing `dst`."""
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown scale layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    with st.SafetensorsFile(src) as f:
        return _convert_gpt_oss(f, src, dst, layout, verify, progress, overwrite)


def _convert_gpt_oss(f, src, dst, layout, verify, progress, overwrite):
    lb = _lowbit()
    _check_output(src, dst, overwrite)
    pairs, bad = find_gpt_oss_pairs(f)
    if not pairs:
        why = "; ".join(f"{n}: {r}" for n, r in bad.items())
        raise CheckpointError(f"{src}: no gpt-oss MXFP4 tensors (*_blocks uint8 [E, rows, K/32, 16] with "
                              f"*_scales uint8 [E, rows, K/32]) found" + (f" ({why})" if why else ""))
    fmt = lb.Format("mxfp4")
    by_name = {b: base for base, (b, s) in pairs.items()}
    scale_names = {s for (b, s) in pairs.values()}
    for base in pairs:
        for o in (base + ".qdata", base + ".scale"):
            if o in f:
                raise CheckpointError(f"{src}: output tensor name {o!r} already exists in the input")

    # header first (streamed output): every output's name, dtype and shape
    names = f.names()
    specs: List[Tuple[str, str, Tuple[int, ...]]] = []
    entries: Dict[str, Any] = {}
    for n in names:
        if n in scale_names:
            continue
        info = f.info(n)
        if n not in by_name:
            specs.append((n, info.dtype, info.shape))
            continue
        base = by_name[n]
        E, R, G, _ = info.shape
        K = G * 32
        sshape = (E, R, G) if layout == "row_major" else \
            (E,) + tuple(int(d) for d in lb.scale_shape(fmt, layout, 1, R, K))[1:]
        qn, sn = base + ".qdata", base + ".scale"
        specs += [(qn, "U8", (E, R, K // 2)), (sn, "U8", sshape)]
        entries[base] = metadata_entry(fmt, layout, (E, R, K), "BF16",
                                       {"qdata": qn, "scale": sn, "zero": None, "global_amax": None},
                                       rounding=None, source="gpt-oss", source_tensors=[n, pairs[base][1]])
    meta = dict(f.metadata)
    meta[METADATA_KEY] = json.dumps({"version": METADATA_VERSION, "producer": f"lowbit {lb.__version__}",
                                     "tensors": entries}, separators=(",", ":"))
    with st.SafetensorsWriter(dst, specs, meta, overwrite=overwrite) as writer:
        reports = _convert_gpt_oss_tensors(f, writer, pairs, by_name, scale_names, bad, layout, verify, progress)
    summary = {"input": src, "output": dst, "converted": len(entries), "layout": layout,
               "copied": sum(r.action == "copied" for r in reports),
               "bytes_before": sum(r.bytes_before for r in reports),
               "bytes_after": sum(r.bytes_after for r in reports), "file_bytes_out": writer.size,
               "verified": verify, "seconds": sum(r.seconds for r in reports)}
    return reports, summary


def _convert_gpt_oss_tensors(f, writer, pairs, by_name, scale_names, bad, layout, verify, progress):
    lb = _lowbit()
    fmt = lb.Format("mxfp4")
    reports: List[TensorReport] = []
    names = f.names()
    total, done = f.total_bytes(), 0
    for i, n in enumerate(names):
        if progress:
            progress(i, len(names), done, total, n)
        info = f.info(n)
        done += info.nbytes
        if n in scale_names:
            continue
        if n not in by_name:
            t0 = time.perf_counter()
            writer.write(n, f.get(n))
            reports.append(TensorReport(n, info.shape, info.dtype, "copied",
                                        reason=bad.get(n, "not an MXFP4 expert tensor"),
                                        bytes_before=info.nbytes, bytes_after=info.nbytes, outputs=[n],
                                        seconds=time.perf_counter() - t0))
            continue
        t0 = time.perf_counter()
        base = by_name[n]
        sname = pairs[base][1]
        blocks, scales = f.get(n), f.get(sname)
        E, R, G, _ = blocks.shape
        K = G * 32
        qdata = np.ascontiguousarray(blocks).reshape(E, R, K // 2)  # already low-nibble first
        if layout == "row_major":
            sc = np.array(scales, dtype=np.uint8, copy=True)
        else:
            shp = [int(d) for d in lb.scale_shape(fmt, layout, 1, R, K)][1:]
            sc = np.empty([E] + shp, dtype=np.uint8)
            for e in range(E):
                conv = lb.convert_scale_layout(np.array(scales[e], copy=True), R, G, src="row_major", dst=layout)
                sc[e] = np.asarray(conv).view(np.uint8).reshape(shp)
        mismatched = 0
        nan_blocks = int(np.count_nonzero(scales == 0xFF))
        maxabs = 0.0
        if verify:
            for e in range(E):
                ref = decode_gpt_oss(blocks[e], scales[e])
                qt = make_quantized(np.array(qdata[e], copy=True), np.array(sc[e], copy=True), None, None, fmt,
                                    layout, (R, K))
                got = np.asarray(lb.dequantize(qt, out_dtype="float32"))
                mismatched += _same_bits(ref, got)
                finite = ref[np.isfinite(ref)]
                if finite.size:
                    maxabs = max(maxabs, float(np.max(np.abs(finite))))
            if mismatched:
                raise CheckpointError(f"{n}: {mismatched} of {E * R * K} decoded values differ between the "
                                      f"gpt-oss blocks and the converted tensors; nothing written")
        qn, sn = base + ".qdata", base + ".scale"
        writer.write(qn, qdata)
        writer.write(sn, sc)
        before = info.nbytes + f.info(sname).nbytes
        reports.append(TensorReport(base, (E, R, K), "U8", "converted", fmt="mxfp4", bytes_before=before,
                                    bytes_after=qdata.nbytes + sc.nbytes, max_abs=maxabs if verify else None,
                                    outputs=[qn, sn], seconds=time.perf_counter() - t0,
                                    extra={"experts": E, "rows": R, "K": K, "layout": layout,
                                           "verified": "bit-exact" if verify else "skipped",
                                           "nan_blocks": nan_blocks}))
    if progress:
        progress(len(names), len(names), total, total, "")
    return reports
