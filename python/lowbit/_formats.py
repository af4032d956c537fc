"""Block-format descriptors (lowbit::BlockFormat) and the quantized-tensor container.

Formats (K is quantized in blocks of `block` consecutive elements, one scale per block):

==============  =====  =====  ========  ==================================  =====================
name            elem   block  scale     scale rule                          decode
==============  =====  =====  ========  ==================================  =====================
mxfp8_e4m3      E4M3   32     UE8M0     MX, rounding="rceil" (default):     q * 2^(s-127)
mxfp8_e5m2      E5M2                    2^ceil(log2(amax / qmax)),
mxfp4           E2M1                    qmax = 448 / 57344 / 6;
                                        rounding="floor" (OCP):
                                        2^(floor(log2 amax) - emax_elem)
nvfp4           E2M1   16     E4M3      TransformerEngine two-level:        q * s * S_dec
                                        S_enc = 448*6/global_amax,
                                        s = e4m3(amax * S_enc / 6)
fp8_e4m3/e5m2   E4M3/  G=128  float32   s = max(amax, eps) / 448 (57344)    q * s
                E5M2          or UE8M0  (UE8M0: s rounded up to 2^n)
int4            INT4   G=128  float32   s = max(amax, eps) / 7              q * s
                              or UE8M0
uint4           UINT4  G=128  float32   s = max((max-min)/15, eps),         (q - zp) * s
                                        zp = clamp(rne(-min/s), 0, 15)
nf4             NF4    B=64   float32   s = absmax (bitsandbytes)           nf4[q] * s
==============  =====  =====  ========  ==================================  =====================

Elements are encoded round-to-nearest-even with saturation to the finite range. 4-bit codes are
packed two per byte, element 2i in the low nibble (``nibble_order="low"``; "high" reproduces
bitsandbytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import _C

E, ST, R = _C.Elem, _C.ScaleType, _C.ScaleRule

_F32_OR_UE8M0 = (ST.f32, ST.ue8m0)

# The one table of block formats.
# name -> (elem, default block, default scale type, default rule, fixed block?, scale types it stores)
_FORMATS = {
    "mxfp8_e4m3": (E.e4m3, 32, ST.ue8m0, R.mx_rceil, True, (ST.ue8m0,)),
    "mxfp8_e5m2": (E.e5m2, 32, ST.ue8m0, R.mx_rceil, True, (ST.ue8m0,)),
    "mxfp4": (E.e2m1, 32, ST.ue8m0, R.mx_rceil, True, (ST.ue8m0,)),
    "nvfp4": (E.e2m1, 16, ST.e4m3, R.nvfp4, True, (ST.e4m3,)),
    "fp8_e4m3": (E.e4m3, 128, ST.f32, R.amax, False, _F32_OR_UE8M0),
    "fp8_e5m2": (E.e5m2, 128, ST.f32, R.amax, False, _F32_OR_UE8M0),
    "int4": (E.int4, 128, ST.f32, R.amax, False, _F32_OR_UE8M0),
    "uint4": (E.uint4, 128, ST.f32, R.minmax, False, (ST.f32,)),
    "nf4": (E.nf4, 64, ST.f32, R.absmax, False, (ST.f32,)),
}
FORMAT_NAMES = tuple(_FORMATS)
# Other spellings accepted for a format name, by lowbit.Format and by `lowbit quantize --format`
# alike (the hyphenated ones are the command line's former names; docs/cli.md).
_ALIASES = {"mxfp8": "mxfp8_e4m3", "fp8": "fp8_e4m3", "fp8_group": "fp8_e4m3", "int4_group": "int4",
            "fp8-group": "fp8_e4m3", "mxfp8-e5m2": "mxfp8_e5m2", "mxfp8-e4m3": "mxfp8_e4m3",
            "fp8-e4m3": "fp8_e4m3", "fp8-e5m2": "fp8_e5m2"}

# The formats a checkpoint can be quantized to (`lowbit quantize --format`), by their one name
# (the lowbit.Format name): name -> description. The CLI derives everything else from _FORMATS.
CLI_FORMATS = {
    "nvfp4": "E2M1 codes, E4M3 scale per 16, per-tensor FP32 global amax",
    "mxfp4": "E2M1 codes, UE8M0 scale per 32 (OCP MX)",
    "mxfp8_e4m3": "E4M3 codes, UE8M0 scale per 32 (OCP MX)",
    "mxfp8_e5m2": "E5M2 codes, UE8M0 scale per 32 (OCP MX)",
    "fp8_e4m3": "E4M3 codes, scale per group (default 128)",
    "fp8_e5m2": "E5M2 codes, scale per group (default 128)",
    "int4": "symmetric INT4, scale per group (default 128)",
    "uint4": "asymmetric UINT4, scale + zero point per group (default 128)",
    "nf4": "NF4 codebook, absmax per block (default 64)",
}


def canonical_format_name(name: str) -> str:
    """The one name of a format given by any accepted spelling (unknown names come back as given)."""
    return _ALIASES.get(name, name)


_SCALE_DTYPE_NAMES = {ST.f32: "float32", ST.ue8m0: "float8_e8m0fnu", ST.e4m3: "float8_e4m3fn"}
# the short scale dtype names the command line uses (all accepted by Format's scale_dtype)
CLI_SCALE_DTYPE_NAMES = {ST.f32: "float32", ST.ue8m0: "ue8m0", ST.e4m3: "e4m3"}
_SCALE_DTYPE_PARSE = {
    "float32": ST.f32, "fp32": ST.f32, "f32": ST.f32,
    "ue8m0": ST.ue8m0, "e8m0": ST.ue8m0, "float8_e8m0fnu": ST.ue8m0,
    "e4m3": ST.e4m3, "float8_e4m3fn": ST.e4m3,
}
_ZERO_SCALE = {"zero": _C.ZeroScale.zero, "min": _C.ZeroScale.min, "one": _C.ZeroScale.one}
_NIBBLES = {"low": _C.NibbleOrder.low, "high": _C.NibbleOrder.high}

LAYOUTS = {
    "row_major": _C.ScaleLayoutKind.row_major,
    "col_major": _C.ScaleLayoutKind.col_major,
    "blocked128x4": _C.ScaleLayoutKind.blocked128x4,
    "blocked8x4": _C.ScaleLayoutKind.blocked8x4,
}
GROUP_PADS = {"flashinfer": _C.GroupPad.flashinfer, "cumsum": _C.GroupPad.cumsum}
_PAD_NONE = _C.GroupPad.none
_CODE_DTYPES = {E.e4m3: "float8_e4m3fn", E.e5m2: "float8_e5m2"}
_INT32_MAX = (1 << 31) - 1


def is_packed(elem) -> bool:
    """Whether codes of `elem` are 4-bit, stored two per byte (else one 8-bit code per byte)."""
    return elem not in _CODE_DTYPES


def is_mx(rule) -> bool:
    """Whether `rule` is an MX scale rule (the formats that take `rounding`)."""
    return rule in (R.mx_rceil, R.mx_floor)


def _fail(arg: str, what: str, op: str = "Format"):
    raise ValueError(f"{op}: argument '{arg}': {what}")


def _choice(value, table, arg, op):
    try:
        return table[value]
    except (KeyError, TypeError):  # TypeError: unhashable (a list)
        _fail(arg, f"expected one of {', '.join(repr(k) for k in table)}, got {value!r}", op)


def layout_kind(layout: str, op: str = "lowbit", arg: str = "layout"):
    try:
        return LAYOUTS[layout]
    except (KeyError, TypeError):
        return _choice(layout, LAYOUTS, arg, op)


_C_LAYOUTS: dict = {}


def c_layout(layout: str, row_align: int, group_pad: Optional[str]):
    """The _C.ScaleLayout of a (checked) layout name, row_align and GROUP_PADS name (None: not
    grouped); shared, the values are immutable. Keyed by the names: str hashes are cheaper than
    those of the enum members."""
    key = (layout, row_align, group_pad)
    lay = _C_LAYOUTS.get(key)
    if lay is None:
        lay = _C.ScaleLayout(LAYOUTS[layout], row_align, _PAD_NONE if group_pad is None else GROUP_PADS[group_pad])
        if len(_C_LAYOUTS) < 1024:
            _C_LAYOUTS[key] = lay
    return lay


def group_pad_kind(group_pad: Optional[str], grouped: bool, op: str = "lowbit"):
    """The _C.GroupPad of `group_pad` when the layout is grouped, else none. The name is checked
    either way (a bad value is refused even where it would not be used)."""
    try:
        kind = GROUP_PADS[group_pad]
    except (KeyError, TypeError):
        if group_pad is None and not grouped:
            return _PAD_NONE
        kind = _choice(group_pad, GROUP_PADS, "group_pad", op)
    return kind if grouped else _PAD_NONE


class Format:
    """A block format (lowbit::BlockFormat).

    ``Format(name, *, block=None, rounding=None, scale_dtype=None, nibble_order="low",
    zero_scale=None, eps=1e-10)``

    name: mxfp8_e4m3 mxfp8_e5m2 mxfp4 nvfp4 fp8_e4m3 fp8_e5m2 int4 uint4 nf4.
    block: group size (fp8_*/int4/uint4 default 128, nf4 default 64; fixed 32 for MX, 16 for NVFP4).
    rounding: MX scale rule, "rceil" (default; NVIDIA: amax/emax_value rounded up to a power of
    two) or "floor" (OCP: 2^(floor(log2 amax) - emax_elem)).
    scale_dtype: "float32" (default) or "ue8m0" (power-of-two scales, rounded up) for fp8_*/int4.
    nibble_order: "low" (element 2i in bits 0-3) or "high" (bitsandbytes).
    zero_scale (NVFP4): block scale stored when it rounds to 0: "zero" (TransformerEngine,
    FlashInfer), "min" (2^-9, torchao) or "one" (ModelOpt).
    eps: floor of the block amax of the fp8/int4 group recipes (uint4: floor of the scale).
    """

    __slots__ = ("name", "elem", "block", "scale_type", "rule", "nibbles", "zero_scale_kind", "eps",
                 "_c_args", "c_format", "_hash", "packed", "code_dtype", "scale_dtype", "has_zero_point")

    def __init__(self, name: str, *, block: Optional[int] = None, rounding: Optional[str] = None,
                 scale_dtype: Optional[str] = None, nibble_order: str = "low", zero_scale: Optional[str] = None,
                 eps: float = 1e-10):
        if isinstance(name, Format):
            name = name.name
        if not isinstance(name, str):
            _fail("name", f"expected a format name, got {type(name).__name__}")
        name = _ALIASES.get(name, name)
        if name not in _FORMATS:
            _fail("name", f"unknown format {name!r}; expected one of {', '.join(FORMAT_NAMES)}")
        elem, dblock, dst, rule, fixed, allowed = _FORMATS[name]
        if block is None:
            block = dblock
        if not isinstance(block, int) or isinstance(block, bool) or block <= 0 or block > _INT32_MAX:
            _fail("block", f"expected a positive integer, got {block!r}")
        if fixed and block != dblock:
            _fail("block", f"{name} has a fixed block size of {dblock}, got {block}")
        if is_mx(rule):
            rule = _choice("rceil" if rounding is None else rounding, {"rceil": R.mx_rceil, "floor": R.mx_floor},
                           "rounding", "Format")
        elif rounding is not None:
            _fail("rounding", f"only the MX formats take a rounding rule, not {name}")
        st = dst
        if scale_dtype is not None:
            st = _choice(scale_dtype, _SCALE_DTYPE_PARSE, "scale_dtype", "Format")
            if st not in allowed:
                _fail("scale_dtype", f"{name} stores {' or '.join(_SCALE_DTYPE_NAMES[a] for a in allowed)} scales, "
                                     f"got {scale_dtype!r}")
        nib = _choice(nibble_order, _NIBBLES, "nibble_order", "Format")
        if zero_scale is not None and rule != R.nvfp4:
            _fail("zero_scale", f"only nvfp4 takes zero_scale, not {name}")
        zs = _choice("zero" if zero_scale is None else zero_scale, _ZERO_SCALE, "zero_scale", "Format")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) and not hasattr(eps, "__float__"):
            _fail("eps", f"expected a number, got {eps!r}")
        try:
            eps = float(eps)
        except (TypeError, ValueError):
            _fail("eps", f"expected a number, got {eps!r}")
        if not (math.isfinite(eps) and eps > 0):  # also checked by lowbit::validate_format
            _fail("eps", f"must be finite and > 0, got {eps!r}")
        c_format = _C.BlockFormat(elem, block, st, rule, nib, zs, eps)
        _C.validate_format(c_format)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "elem", elem)
        object.__setattr__(self, "block", int(block))
        object.__setattr__(self, "scale_type", st)
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "nibbles", nib)
        object.__setattr__(self, "zero_scale_kind", zs)
        object.__setattr__(self, "eps", eps)
        # derived fields, computed once (the ops read them on every call)
        c_args = (elem, int(block), st, rule, nib, zs, eps)
        object.__setattr__(self, "_c_args", c_args)
        object.__setattr__(self, "c_format", c_format)  # the _C.BlockFormat the ops take
        object.__setattr__(self, "_hash", hash((name,) + c_args))
        object.__setattr__(self, "packed", is_packed(elem))
        object.__setattr__(self, "code_dtype", _CODE_DTYPES.get(elem, "uint8"))
        object.__setattr__(self, "scale_dtype", _SCALE_DTYPE_NAMES[st])
        object.__setattr__(self, "has_zero_point", rule == R.minmax)

    def __setattr__(self, key, value):
        raise AttributeError("Format is immutable; use Format.replace(...)")

    @classmethod
    def of(cls, fmt, **kwargs) -> "Format":
        """`fmt` (a Format or a name) with the keyword overrides applied.

        Formats are immutable, so the result is shared between calls with the same arguments
        (a name or Format and keyword values of the same types)."""
        if not kwargs and isinstance(fmt, Format):
            return fmt
        try:
            key = (fmt, tuple(kwargs.items()), tuple(map(type, kwargs.values())))
            f = _FORMAT_CACHE.get(key)
        except TypeError:  # unhashable argument: no caching, Format() reports it
            key, f = None, None
        if f is None:
            f = fmt.replace(**kwargs) if isinstance(fmt, Format) else cls(fmt, **kwargs)
            if key is not None and type(f) is Format and len(_FORMAT_CACHE) < _FORMAT_CACHE_MAX:
                _FORMAT_CACHE[key] = f
        return f

    # --- readable fields ----------------------------------------------------------------------
    @property
    def rounding(self) -> Optional[str]:
        return {R.mx_rceil: "rceil", R.mx_floor: "floor"}.get(self.rule)

    @property
    def nibble_order(self) -> str:
        return "high" if self.nibbles == _C.NibbleOrder.high else "low"

    @property
    def zero_scale(self) -> Optional[str]:
        if self.rule != R.nvfp4:
            return None
        return {v: k for k, v in _ZERO_SCALE.items()}[self.zero_scale_kind]

    @property
    def bits(self) -> int:
        return 4 if self.packed else 8

    @property
    def has_global_scale(self) -> bool:
        return self.rule == R.nvfp4

    def kwargs(self) -> dict:
        kw: dict[str, Any] = {"block": self.block, "nibble_order": self.nibble_order}
        if self.rounding is not None:
            kw["rounding"] = self.rounding
        else:
            kw["scale_dtype"] = self.scale_dtype
        if self.zero_scale is not None:
            kw["zero_scale"] = self.zero_scale
        if self.rule in (R.amax, R.minmax):
            kw["eps"] = self.eps
        if self.rule == R.nvfp4:
            kw.pop("scale_dtype", None)
        return kw

    def replace(self, **kwargs) -> "Format":
        kw = self.kwargs()
        kw.update(kwargs)
        return Format(self.name, **kw)

    def c_args(self) -> tuple:
        """The lowbit::BlockFormat fields in the order of _C.BlockFormat (and of the _C functions
        that take them one by one)."""
        return self._c_args

    def _key(self):
        return (self.name,) + self.c_args()

    def __eq__(self, other):
        if other is self:
            return True
        if isinstance(other, str):
            try:
                other = Format(other)
            except ValueError:
                return False
        return isinstance(other, Format) and self._key() == other._key()

    def __hash__(self):
        return self._hash

    def __repr__(self):
        kw = ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items())
        return f"Format({self.name!r}, {kw})"

    def __str__(self):
        return _C.format_name(self.c_format)


_FORMAT_CACHE: dict = {}
_FORMAT_CACHE_MAX = 4096


@dataclass(frozen=True, eq=False)
class Quantized:
    """A quantized tensor: codes, scales and what is needed to decode them.

    data         codes [L?, M, K] (fp8) or [L?, M, K/2] uint8 (4-bit, two codes a byte)
    scales       the stored scale matrices in `layout` (float32 / float8_e8m0fnu / float8_e4m3fn)
    zeros        uint8 zero points (uint4), same layout as scales; else None
    global_amax  NVFP4 per-tensor amax, float32 [1] (decode factor S_dec = global_amax / (448*6)); or None
    format       the Format
    layout       "row_major" | "col_major" | "blocked128x4" | "blocked8x4"
    shape        the shape of the original (unquantized) tensor
    row_align    col_major: stored rows padded to a multiple of this
    group_pad    grouped blocked128x4 layouts: "flashinfer" | "cumsum"; None when not grouped
    m_indptr     grouped layouts: int32/int64 [G+1] row boundaries; else None
    """

    data: Any
    scales: Any
    zeros: Any = None
    global_amax: Any = None
    format: Any = "mxfp8_e4m3"
    layout: str = "row_major"
    shape: Optional[Tuple[int, ...]] = None
    row_align: int = 1
    group_pad: Optional[str] = None
    m_indptr: Any = None

    def __post_init__(self):
        op = "Quantized"
        if type(self.format) is not Format:
            object.__setattr__(self, "format", Format.of(self.format))
        layout_kind(self.layout, op)
        for arg in ("data", "scales"):
            if not hasattr(getattr(self, arg), "shape") or not hasattr(getattr(self, arg), "dtype"):
                _fail(arg, f"expected a NumPy array or a torch tensor, got {type(getattr(self, arg)).__name__}", op)
        if self.zeros is not None and (not hasattr(self.zeros, "shape") or not hasattr(self.zeros, "dtype")):
            _fail("zeros", f"expected an array (or None), got {type(self.zeros).__name__}", op)
        if self.m_indptr is not None and not hasattr(self.m_indptr, "shape") and not isinstance(self.m_indptr, (list, tuple)):
            _fail("m_indptr", f"expected an integer array or list (or None), got {type(self.m_indptr).__name__}", op)
        if self.shape is None:
            s = tuple(int(d) for d in self.data.shape)
            if self.format.packed and s:
                s = s[:-1] + (s[-1] * 2,)
            object.__setattr__(self, "shape", s)
        else:
            object.__setattr__(self, "shape", check_shape(self.shape, op))
        if isinstance(self.row_align, bool) or not isinstance(self.row_align, int) and not hasattr(self.row_align, "__index__"):
            _fail("row_align", f"expected an integer, got {self.row_align!r}", op)
        if self.m_indptr is not None and self.group_pad is None:
            object.__setattr__(self, "group_pad", "flashinfer")
        if self.group_pad is not None:
            group_pad_kind(self.group_pad, True, op)

    @classmethod
    def _from_parts(cls, data, scales, zeros, global_amax, format, layout, shape, row_align, group_pad, m_indptr):
        """A Quantized from fields already in their checked form (format a Format, layout a valid
        name, shape a tuple of ints, group_pad set when m_indptr is): what quantize() builds,
        without __post_init__'s conversions."""
        self = object.__new__(cls)
        self.__dict__.update(data=data, scales=scales, zeros=zeros, global_amax=global_amax, format=format,
                             layout=layout, shape=shape, row_align=row_align, group_pad=group_pad,
                             m_indptr=m_indptr)
        return self

    def __iter__(self):
        """``q, s = qt`` unpacks codes and scales."""
        return iter((self.data, self.scales))

    def __repr__(self):
        return (f"Quantized(format={self.format!r}, layout={self.layout!r}, shape={self.shape}, "
                f"data={getattr(self.data, 'dtype', '?')}{list(self.data.shape)}, "
                f"scales={getattr(self.scales, 'dtype', '?')}{list(self.scales.shape)})")


def check_shape(shape, op: str, arg: str = "shape") -> Tuple[int, ...]:
    """A tensor shape as a tuple of non-negative Python ints (each below 2^63), else ValueError."""
    try:
        dims = tuple(shape)
    except TypeError:
        _fail(arg, f"expected a tuple of sizes, got {shape!r}", op)
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            _fail(arg, f"expected integer sizes, got {shape!r}", op)
        try:
            v = int(d.__index__())
        except TypeError:  # e.g. an array that is not an integer scalar
            _fail(arg, f"expected integer sizes, got {shape!r}", op)
        if v < 0 or v >= (1 << 63):
            _fail(arg, f"sizes must lie in [0, 2^63), got {shape!r}", op)
        out.append(v)
    return tuple(out)


def stored_scale_shape(layout: str, M, C, row_align: int = 1):
    """(rows, cols) of one stored scale matrix for M rows and C = K/block scale columns (no
    groups); the arithmetic of lowbit::scale_shape, written so that it also works on symbolic
    sizes (torch.compile fake tensors)."""
    if layout == "row_major":
        return (M, C)
    if layout == "col_major":
        return (C, (M + row_align - 1) // row_align * row_align)
    if layout == "blocked128x4":
        return ((M + 127) // 128 * 128, (C + 3) // 4 * 4)
    if layout == "blocked8x4":
        return ((M + 7) // 8 * 8, (C + 3) // 4 * 4)
    layout_kind(layout)
    raise AssertionError(layout)
