"""The checkpoint schema: command-line formats and their options, the output tensor names, the
"lowbit" metadata entries (written, read back and validated) and the Format / Quantized of an
entry. See lowbit.checkpoint for the naming scheme."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import lowbit

from .. import safetensors_io as st
from .._arrays import dtype_name, numpy_dtype
from .._formats import (
    _FORMATS,
    _ALIASES,
    CLI_FORMATS,
    CLI_SCALE_DTYPE_NAMES,
    LAYOUTS as _LAYOUT_KINDS,
    Format,
    Quantized,
    is_mx,
    is_packed,
)
from ..ops import scale_shape

METADATA_KEY = "lowbit"
METADATA_VERSION = 1
# what the metadata's "producer" says: the package's version (lowbit.__version__, from _C)
PRODUCER = f"lowbit {lowbit.__version__}"

LAYOUTS = tuple(_LAYOUT_KINDS)
FLOAT_DTYPES = ("F32", "F16", "BF16")
# safetensors float dtype -> lowbit dtype name
FLOAT_DTYPE_NAMES = {sd: dtype_name(st.dtype_to_numpy(sd)) for sd in FLOAT_DTYPES}


class CheckpointError(ValueError):
    """A problem with the input, the options or the output that ends the command."""


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


def _format_spec(cli: str, api: str, description: str) -> FormatSpec:
    elem, block, scale_type, rule, fixed, scale_types = _FORMATS[api]
    return FormatSpec(cli, api, 4 if is_packed(elem) else 8, block if fixed else None, block, mx=is_mx(rule),
                      scale_dtypes=tuple(CLI_SCALE_DTYPE_NAMES[t] for t in scale_types),
                      default_scale_dtype=CLI_SCALE_DTYPE_NAMES[scale_type], description=description)


# command-line name -> FormatSpec, derived from the format table of lowbit._formats
FORMATS: Dict[str, FormatSpec] = {name: _format_spec(name, name, d) for name, d in CLI_FORMATS.items()}
# former command-line spellings and the other accepted aliases -> the one name (docs/cli.md)
FORMAT_ALIASES: Dict[str, str] = {a: n for a, n in _ALIASES.items() if n in FORMATS}


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
        if len(self.spec.scale_dtypes) > 1:  # fp8-group, int4: float32 or ue8m0
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
    fmt = FORMAT_ALIASES.get(fmt, fmt)
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
        raise CheckpointError(f"--rounding applies to the MX formats (mxfp4, mxfp8_e4m3, mxfp8_e5m2), not {fmt}")
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


def output_names(name: str, cfg: QuantConfig) -> Dict[str, Optional[str]]:
    return {
        "qdata": f"{name}.qdata",
        "scale": f"{name}.scale",
        "zero": f"{name}.zero" if cfg.spec.api == "uint4" else None,
        "global_amax": f"{name}.global_amax" if cfg.spec.api == "nvfp4" else None,
    }


def quantized_specs(fmt, layout: str, shape: Sequence[int]) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """{qdata|scale|zero|global_amax: (safetensors dtype, shape)} that lowbit.quantize produces for
    a [M, K] input (zero / global_amax present only for the formats that have them)."""
    m, k = (int(d) for d in shape)
    code = st.numpy_to_dtype(numpy_dtype(fmt.code_dtype))
    sshape = tuple(int(d) for d in scale_shape(fmt, layout, 1, m, k))[1:]
    out = {"qdata": (code, (m, k // 2) if fmt.packed else (m, k)),
           "scale": (st.numpy_to_dtype(numpy_dtype(fmt.scale_dtype)), sshape)}
    if fmt.has_zero_point:
        out["zero"] = ("U8", sshape)
    if fmt.has_global_scale:
        out["global_amax"] = ("F32", (1,))
    return out


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
    fname = e.get("format")
    kwargs = e.get("format_kwargs")
    try:
        if not isinstance(fname, str):
            raise TypeError("format must be a string")
        if isinstance(kwargs, dict):
            return Format(fname, **kwargs), e.get("layout", "row_major")
        kw = {k: e[k] for k in ("block", "rounding", "scale_dtype", "nibble_order", "zero_scale")
              if e.get(k) is not None}
        return Format(fname, **kw), e.get("layout", "row_major")
    except (ValueError, TypeError) as ex:
        who = f"quantized tensor {name!r}: " if name is not None else ""
        raise CheckpointError(f"{who}metadata entry with format {e.get('format')!r}: {ex}") from None


def make_quantized(data, scales, zeros, global_amax, fmt, layout: str, shape):
    return Quantized(data=data, scales=scales, zeros=zeros, global_amax=global_amax, format=fmt,
                        layout=layout, shape=tuple(int(d) for d in shape))
