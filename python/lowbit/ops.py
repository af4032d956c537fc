"""The lowbit format operations on NumPy arrays and torch tensors.

Arrays in, arrays out: NumPy in -> NumPy out (bfloat16 / fp8 / e8m0 as ml_dtypes dtypes, packed
4-bit codes as uint8); torch in -> torch out on the same device. CUDA tensors run the device
kernels on the current torch stream; host arrays run the CPU reference. Argument errors raise
ValueError naming the argument; an op that this build cannot run on the given device raises
NotImplementedError.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _C
from ._arrays import (Backend, as_array, array_dtype_name, c_view, check_float, check_int, check_writable, dtype_name,
                      is_contiguous, is_torch, same_backend)
from ._formats import (_NIBBLES, _PAD_NONE, Format, Quantized, _choice, c_layout, check_shape, group_pad_kind,
                       layout_kind)
from ._op_args import _check_block, _check_mat, _index_order, _indptr, _row_align, _scale_storage_shape
# the scale-layout conversions live in scale_layouts.py; lowbit.ops keeps their names
from .scale_layouts import (_PLAIN_FMT, block_scale_deinterleave, block_scale_interleave,  # noqa: F401
                            convert_scale_layout)

__all__ = [
    "build_info", "scale_shape", "quantize", "dequantize", "transcode", "cast", "convert_scale_layout",
    "tensor_amax", "nf4_kcache_quantize", "nf4_kcache_dequantize",
    "mxfp8_quantize", "mxfp4_quantize", "nvfp4_quantize", "per_token_group_quant",
    "block_scale_interleave", "block_scale_deinterleave",
]


def build_info() -> dict:
    """Build and device information.

    Returns a dict with version, cuda_built (kernels compiled in), cuda_runtime_version (0 without
    CUDA), device_count (0 without a driver), device_name and sm (of device 0) and cuda_ops (the
    ops that run on the device) and cpu_only_ops (ops with only the CPU reference so far: their
    CUDA path raises NotImplementedError; empty in this version)."""
    return _C.build_info()


# ---------------------------------------------------------------------------------------------

def scale_shape(fmt, layout: str = "row_major", L: int = 1, M: int = 1, K: int = 0, groups: int = 0, *,
                row_align: int = 1, group_pad: str = "flashinfer", **fmt_kwargs) -> Tuple[int, int, int]:
    """Shape ``(L, rows, cols)`` of the stored scale matrices that quantize writes for an
    [L, M, K] input: rows = M padded (row_major: M; blocked128x4: round_up(M, 128); blocked8x4:
    round_up(M, 8)), cols = K/block (blocked: round_up(K/block, 4)); col_major gives
    ``(L, K/block, round_up(M, row_align))``. ``groups > 0`` selects the grouped (MoE)
    blocked128x4 layout: ``(1, rows to allocate, cols)``."""
    op = "scale_shape"
    f = Format.of(fmt, **fmt_kwargs)
    layout_kind(layout, op)  # checks the name
    L, M, K, groups = (check_int(v, op, a, 0) for v, a in ((L, "L"), (M, "M"), (K, "K"), (groups, "groups")))
    group_pad_kind(group_pad, groups > 0, op)  # checks the name, also where it is not used
    lay = c_layout(layout, _row_align(row_align, op), group_pad if groups > 0 else None)
    return tuple(_C.scale_shape(f.c_format, lay, L, M, K, groups))


def quantize(x, fmt="mxfp8_e4m3", layout: str = "row_major", *, row_align: int = 1, m_indptr=None,
             group_pad: str = "flashinfer", global_amax=None, compute_global_amax: Optional[bool] = None,
             **fmt_kwargs) -> Quantized:
    """Block-quantize the last dimension of ``x`` ([M, K] or [L, M, K], float32 / float16 /
    bfloat16, last dimension contiguous).

    Per block of ``fmt.block`` elements (see lowbit.Format for every recipe):
      MX (mxfp8_e4m3/e5m2, mxfp4): UE8M0 scale s; RCEIL s = ceil_pow2(amax / qmax), FLOOR
        s = 2^(floor(log2 amax) - emax_elem); q = sat_rne(x / s).
      nvfp4: S_enc = 448*6/global_amax (1 when no global_amax), s = e4m3(amax * S_enc/6),
        q = e2m1(x * 1/(s * S_dec)), S_dec = 1/S_enc.
      fp8_* / int4 groups: s = max(amax, eps) / qmax, q = sat_rne(x / s).
      uint4: s = max((max-min)/15, eps), zp = clamp(rne(-min/s), 0, 15), q = clamp(rne(x/s)+zp, 0, 15).
      nf4: s = absmax, q = nearest nf4 code of x / s.

    layout: where the scales go: "row_major" [M, K/block], "col_major" [K/block, round_up(M,
    row_align)], "blocked128x4" (cuBLAS / CUTLASS / FlashInfer 128x4 swizzle, zero padded),
    "blocked8x4". With ``m_indptr`` (int [G+1] row boundaries of MoE groups) the blocked128x4
    scales of each group start on a 128-row tile (``group_pad`` "flashinfer" or "cumsum").

    NVFP4: the per-tensor scale comes from the tensor's amax. By default (``global_amax`` not
    given, ``compute_global_amax`` left at None) amax(|x|) is computed into a new float32 [1]
    array, returned as ``Quantized.global_amax`` (dequantize uses it). ``global_amax`` (a float
    >= 0 or a float32 [1] array) gives it instead; ``compute_global_amax=True`` writes amax(|x|)
    into the given array first; ``compute_global_amax=False`` without ``global_amax`` uses no
    per-tensor scale (S_enc = 1: small tensors, e.g. std 0.002, then lose most of their
    precision to E4M3 block-scale underflow).

    Returns lowbit.Quantized(data, scales, zeros, global_amax, format, layout, shape)."""
    op = "quantize"
    x = as_array(x, op, "x")
    f = Format.of(fmt, **fmt_kwargs)
    if compute_global_amax is None:  # NVFP4 without a given amax: compute it
        compute_global_amax = f.has_global_scale and global_amax is None
    elif not isinstance(compute_global_amax, (bool, np.bool_)):
        raise ValueError(f"{op}: argument 'compute_global_amax': expected a bool, got {compute_global_amax!r}")
    q, scales, zeros, gam, ind = _quantize(x, f, layout, row_align, m_indptr, group_pad, global_amax,
                                           compute_global_amax)
    return Quantized._from_parts(q, scales, zeros, gam, f, layout, tuple(int(s) for s in x.shape),
                                 _row_align(row_align, op), group_pad if ind is not None else None, ind)


def _quantize(x, f: Format, layout: str, row_align=1, m_indptr=None, group_pad="flashinfer", global_amax=None,
              compute_global_amax=False):
    """quantize() after as_array and Format.of: (q, scales, zeros, global_amax, m_indptr)."""
    op = "quantize"
    kind = layout_kind(layout, op)
    be = Backend(x, op, "x")
    L, M, K = _check_mat(x, op, "x")
    _check_block(f, K, op, "x")
    row_align = _row_align(row_align, op)
    if m_indptr is None:
        group_pad_kind(group_pad, False, op)  # checked even when not used
        ind, groups, pad, gpad = None, 0, _PAD_NONE, None
    else:
        ind, groups = _indptr(be, m_indptr, op)
        same_backend(x, ind, op, "m_indptr")
        pad = group_pad_kind(group_pad, True, op)
        gpad = group_pad
    if global_amax is not None:
        if not hasattr(global_amax, "shape"):  # a Python number
            v = check_float(global_amax, op, "global_amax")
            if not v >= 0:
                raise ValueError(f"{op}: argument 'global_amax': the per-tensor amax must be >= 0 and not NaN, "
                                 f"got {global_amax!r}")
        elif compute_global_amax:
            check_writable(global_amax, op, "global_amax")
    batched = len(x.shape) == 3
    q = be.empty((L, M, K // 2 if f.packed else K) if batched else (M, K // 2 if f.packed else K), f.code_dtype)
    sshape = _scale_storage_shape(f, layout, row_align, gpad, L, M, K, groups, batched)
    scales = be.empty(sshape, f.scale_dtype)
    zeros = be.empty(sshape, "uint8") if f.has_zero_point else None
    gam = None
    if global_amax is not None:
        gam = be.adopt(global_amax, op, "global_amax", "float32")
        same_backend(x, gam, op, "global_amax")
    elif compute_global_amax:
        gam = be.zeros((1,), "float32")
    xv, xdt = c_view(x, op, "x")
    qv, qdt = c_view(q, op, "q")
    sv, sdt = c_view(scales, op, "scales")
    with be.guard():
        _C.quantize(xv, xdt, qv, qdt, sv, sdt, f.c_format, c_layout(layout, row_align, gpad),
                    None if zeros is None else c_view(zeros, op, "zeros")[0],
                    None if gam is None else c_view(gam, op, "global_amax")[0],
                    bool(compute_global_amax),
                    None if ind is None else c_view(ind, op, "m_indptr")[0],
                    be.stream())
    return q, scales, zeros, gam, ind


def dequantize(qt: Quantized, out_dtype="float32") -> object:
    """x ~= dequantize(qt): per element, with s the block's stored scale,
    MX: q * 2^(s-127); nvfp4: e2m1(q) * e4m3(s) * S_dec (S_dec = global_amax/(448*6), 1 without);
    fp8_* / int4: q * s; uint4: (q - zp) * s; nf4: nf4[q] * s.
    The fp32 value is rounded to nearest even into ``out_dtype`` (float32, float16, bfloat16,
    float8_e4m3fn or float8_e5m2; 8-bit outputs saturate). Returns an array of ``qt.shape``."""
    op = "dequantize"
    if not isinstance(qt, Quantized):
        raise ValueError(f"{op}: argument 'qt': expected a lowbit.Quantized, got {type(qt).__name__}")
    f = qt.format
    out_name = dtype_name(out_dtype, op, "out_dtype")
    for arg in ("data", "scales"):
        if not (isinstance(getattr(qt, arg), np.ndarray) or is_torch(getattr(qt, arg))):
            raise ValueError(f"{op}: argument '{arg}': expected a NumPy array or a torch tensor, "
                             f"got {type(getattr(qt, arg)).__name__}")
    be = Backend(qt.data, op, "qt")
    for arg in ("scales", "zeros", "global_amax"):
        same_backend(qt.data, getattr(qt, arg), op, arg)
    shape = check_shape(qt.shape, op)
    if len(shape) not in (2, 3):
        raise ValueError(f"{op}: argument 'qt': expected a 2-D or 3-D shape, got {qt.shape}")
    kind = layout_kind(qt.layout, op)
    row_align = _row_align(qt.row_align, op)
    ind, groups = _indptr(be, qt.m_indptr, op)
    same_backend(qt.data, ind, op, "m_indptr")
    pad = group_pad_kind(qt.group_pad, ind is not None, op)
    gam = qt.global_amax
    if gam is not None and not hasattr(gam, "shape"):
        v = check_float(gam, op, "global_amax")
        if v < 0:
            raise ValueError(f"{op}: argument 'global_amax': the per-tensor amax must be >= 0, got {gam!r}")
    # scales / zeros of the stored shape are read by index (a Fortran-ordered copy is reordered)
    scales, zeros = qt.scales, qt.zeros
    if not is_contiguous(scales) or (zeros is not None and hasattr(zeros, "shape") and not is_contiguous(zeros)):
        L, M, K = (1,) + shape if len(shape) == 2 else shape
        stored = None
        if K % f.block == 0:
            try:
                stored = _scale_storage_shape(f, qt.layout, row_align, qt.group_pad if ind is not None else None,
                                              L, M, K, groups, True)
            except ValueError:  # reported by the C++ checks below
                stored = None
        shapes = () if stored is None else (stored, stored[1:]) if stored[0] == 1 else (stored,)
        scales = _index_order(scales, shapes, op, "scales")
        zeros = _index_order(zeros, shapes, op, "zeros")
    out = be.empty(shape, out_name)
    qv, qdt = c_view(qt.data, op, "q")
    sv, sdt = c_view(scales, op, "scales")
    ov, odt = c_view(out, op, "out")
    with be.guard():
        _C.dequantize(qv, qdt, sv, sdt, ov, odt, f.c_format,
                      c_layout(qt.layout, row_align, qt.group_pad if ind is not None else None),
                      None if zeros is None else c_view(zeros, op, "zeros")[0],
                      None if gam is None else c_view(be.adopt(gam, op, "global_amax", "float32"), op, "global_amax")[0],
                      None if ind is None else c_view(ind, op, "m_indptr")[0],
                      be.stream())
    return out


def transcode(qt: Quantized, out_dtype="float8_e4m3fn"):
    """Exact element transcode keeping the scales: INT4 codes q -> fp8(q), UINT4 -> fp8(q - zp)
    (float8_e4m3fn only), E2M1 (mxfp4 / nvfp4) -> fp8(e2m1(q)). Every value is representable,
    so ``transcode(qt) * scale`` decodes exactly like ``qt``: mxfp4 -> mxfp8 and int4 -> fp8 with
    the same scales (``qt.scales``). Returns the [L?, M, K] fp8 codes."""
    op = "transcode"
    if not isinstance(qt, Quantized):
        raise ValueError(f"{op}: argument 'qt': expected a lowbit.Quantized, got {type(qt).__name__}")
    f = qt.format
    out_name = dtype_name(out_dtype, op, "out_dtype")
    _row_align(qt.row_align, op)  # checked even where the layout does not use it
    be = Backend(qt.data, op, "qt")
    out = be.empty(check_shape(qt.shape, op), out_name)
    zeros = qt.zeros
    if zeros is not None and qt.layout == "row_major" and qt.m_indptr is None and len(qt.shape) in (2, 3):
        L, M, K = (1,) + tuple(qt.shape) if len(qt.shape) == 2 else tuple(qt.shape)
        if K % f.block == 0:  # row-major [L?, M, K/block] zero points are read by index
            zeros = _index_order(zeros, ((L, M, K // f.block), (M, K // f.block)) if L == 1 else ((L, M, K // f.block),),
                                  op, "zeros")
    if zeros is not None and (qt.layout != "row_major" or qt.m_indptr is not None):
        # transcode takes the zero points row-major [L, M, K/block]
        L, M, K = _check_mat(out, op, "qt")
        zeros = convert_scale_layout(zeros, M, K // f.block, src=qt.layout, dst="row_major", m_indptr=qt.m_indptr,
                                     src_row_align=qt.row_align,
                                     group_pad="flashinfer" if qt.group_pad is None else qt.group_pad)
    with be.guard():
        _C.transcode(*c_view(qt.data, op, "q"), *c_view(out, op, "out"), f.c_format,
                     zeros=None if zeros is None else c_view(zeros, op, "zeros")[0], stream=be.stream())
    return out


def cast(x, dtype="float8_e4m3fn", saturate: bool = True):
    """Elementwise ``out = dtype(x)`` between float32 / float16 / bfloat16 / float8_e4m3fn /
    float8_e5m2, round-to-nearest-even. ``saturate=True`` (satfinite) clamps overflow and +-Inf
    to +-max finite (448 E4M3, 57344 E5M2), NaN stays NaN; ``saturate=False`` follows IEEE /
    ml_dtypes / torch ``.to()``: overflow gives Inf (E5M2, fp16) or NaN (E4M3). Any shape and
    strides; the output is contiguous."""
    op = "cast"
    x = as_array(x, op, "x")
    out_name = dtype_name(dtype, op, "dtype")
    be = Backend(x, op, "x")
    out = be.empty(x.shape, out_name)
    sat = _C.Saturate.finite if saturate else _C.Saturate.none
    xv, xdt = c_view(x, op, "x")
    ov, odt = c_view(out, op, "out")
    with be.guard():
        _C.cast(xv, xdt, ov, odt, sat, be.stream())
    return out


def tensor_amax(x):
    """``max(|x|)`` over the finite elements of a whole [M, K] or [L, M, K] array as float32 [1]
    (NaN and +-Inf are ignored, 0 if there is none): the NVFP4 global amax."""
    op = "tensor_amax"
    x = as_array(x, op, "x")
    be = Backend(x, op, "x")
    out = be.empty((1,), "float32")
    with be.guard():
        _C.tensor_amax(*c_view(x, op, "x"), c_view(out, op, "out")[0], stream=be.stream())
    return out


def _nibbles(order: str, op: str):
    return _choice(order, _NIBBLES, "nibble_order", op)


def nf4_kcache_quantize(k, residual_dtype="float8_e5m2", nibble_order: str = "low"):
    """NF4 K cache with an FP8 residual, for k [B, T, H, D] (float32 / float16 / bfloat16, D even):
    scale[b, h, d] = max |k| over the T tokens (finite ones only); codes = nf4_encode(k / scale)
    packed two per byte along D (a zero scale gives code 7 = 0.0); residual =
    fp8_satfinite(k - nf4[code] * scale) (NaN / +-Inf tokens: not saturated, so they decode to
    NaN / +-Inf; +-Inf to NaN with float8_e4m3fn). Returns (codes uint8 [B, T, H, D/2], scale float32
    [B, H, D], residual [B, T, H, D] in ``residual_dtype`` (float8_e5m2 or float8_e4m3fn))."""
    op = "nf4_kcache_quantize"
    k = as_array(k, op, "k")
    if k.ndim != 4:
        raise ValueError(f"{op}: argument 'k': expected [B, T, H, D], got shape {tuple(k.shape)}")
    B, T, H, D = (int(s) for s in k.shape)
    if D % 2:
        raise ValueError(f"{op}: argument 'k': head dim D = {D} must be even (two NF4 codes per byte)")
    rname = dtype_name(residual_dtype, op, "residual_dtype")
    be = Backend(k, op, "k")
    codes = be.empty((B, T, H, D // 2), "uint8")
    scale = be.empty((B, H, D), "float32")
    residual = be.empty((B, T, H, D), rname)
    with be.guard():
        _C.nf4_kcache_quantize(*c_view(k, op, "k"), c_view(codes, op, "codes")[0], c_view(scale, op, "scale")[0],
                               *c_view(residual, op, "residual"), _nibbles(nibble_order, op), stream=be.stream())
    return codes, scale, residual


def nf4_kcache_dequantize(codes, scale, residual=None, out_dtype="float32", nibble_order: str = "low"):
    """k ~= nf4[code] * scale[b, h, d] (+ residual when given), as [B, T, H, D] ``out_dtype``
    (float32 / float16 / bfloat16)."""
    op = "nf4_kcache_dequantize"
    codes = as_array(codes, op, "codes", float_default=False)
    scale = as_array(scale, op, "scale")
    if residual is not None:
        residual = as_array(residual, op, "residual", float_default=False)
    same_backend(codes, scale, op, "scale")
    same_backend(codes, residual, op, "residual")
    if codes.ndim != 4:
        raise ValueError(f"{op}: argument 'codes': expected [B, T, H, D/2], got shape {tuple(codes.shape)}")
    B, T, H, D2 = (int(s) for s in codes.shape)
    sname = array_dtype_name(scale, op, "scale")
    if sname != "float32":  # the C++ takes the scale bytes as float32: another 4-byte type would be reinterpreted
        raise ValueError(f"{op}: argument 'scale': expected float32 (the per-channel scales of nf4_kcache_quantize), "
                         f"got {sname}")
    be = Backend(codes, op, "codes")
    out = be.empty((B, T, H, 2 * D2), dtype_name(out_dtype, op, "out_dtype"))
    rv, rdt = (None, _C.DType.float8_e5m2) if residual is None else c_view(residual, op, "residual")
    with be.guard():
        _C.nf4_kcache_dequantize(c_view(codes, op, "codes")[0], c_view(scale, op, "scale")[0], rv, rdt,
                                 *c_view(out, op, "out"), _nibbles(nibble_order, op), stream=be.stream())
    return out


# ---------------------------------------------------------------------------------------------
# Familiar entry points (FlashInfer / SGLang / vLLM names)

def mxfp8_quantize(x, swizzled: bool = False, rounding: str = "rceil", *, dtype="float8_e4m3fn"):
    """MXFP8 (FlashInfer ``mxfp8_quantize``): blocks of 32, UE8M0 scale s = 2^ceil(log2(amax/448))
    (RCEIL; "floor": 2^(floor(log2 amax) - 8)), q = e4m3_satfinite(x / s).
    Returns (q float8_e4m3fn [.., M, K], scales float8_e8m0fnu): row-major [M, K/32], or the
    128x4 swizzled [round_up(M,128), round_up(K/32,4)] when ``swizzled``.
    ``dtype="float8_e5m2"`` gives MXFP8 E5M2 (qmax 57344, emax 15)."""
    name = _MXFP8_NAMES.get(dtype_name(dtype, "mxfp8_quantize"))
    if name is None:
        raise ValueError(f"mxfp8_quantize: argument 'dtype': expected float8_e4m3fn or float8_e5m2, got {dtype!r}")
    x = as_array(x, "quantize", "x")
    f = _entry_format(name, "rounding", rounding)
    q, scales, _, _, _ = _quantize(x, f, "blocked128x4" if swizzled else "row_major")
    return q, scales


_ENTRY_FORMATS: dict = {}


def _entry_format(name: str, kw: str, value) -> Format:
    """Format.of(name, **{kw: value}), looked up by the raw value (only valid ones are stored:
    equal values of other types, e.g. 1 and True, are rejected by Format before)."""
    try:
        return _ENTRY_FORMATS[(name, kw, value)]
    except (KeyError, TypeError):
        pass
    f = Format.of(name, **{kw: value})
    if isinstance(value, str) and len(_ENTRY_FORMATS) < 256:
        _ENTRY_FORMATS[(name, kw, value)] = f
    return f


_MXFP8_NAMES = {"float8_e4m3fn": "mxfp8_e4m3", "float8_e5m2": "mxfp8_e5m2"}
_PTG_NAMES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def mxfp4_quantize(x, swizzled: bool = False, rounding: str = "rceil"):
    """MXFP4: blocks of 32, UE8M0 scale s (RCEIL s = 2^ceil(log2(amax/6)); "floor":
    2^(floor(log2 amax) - 2), the OCP rule), q = e2m1_satfinite(x / s), two codes a byte (element
    2i in the low nibble). Returns (q uint8 [.., M, K/2], scales float8_e8m0fnu row-major
    [M, K/32] or 128x4 swizzled when ``swizzled``)."""
    x = as_array(x, "quantize", "x")
    f = _entry_format("mxfp4", "rounding", rounding)
    q, scales, _, _, _ = _quantize(x, f, "blocked128x4" if swizzled else "row_major")
    return q, scales


def nvfp4_quantize(x, global_amax=None, swizzled: bool = False, *, zero_scale: str = "zero"):
    """NVFP4 (TransformerEngine recipe): blocks of 16, S_enc = 448*6/global_amax (1 without a
    global amax), block scale s = e4m3_satfinite(amax * S_enc / 6),
    q = e2m1_satfinite(x * min(1/(s/S_enc), FLT_MAX)); decode q * s / S_enc.
    ``global_amax`` is the tensor's amax (a float or float32 [1] array), not FlashInfer's
    global_scale (= S_enc). Returns (q uint8 [.., M, K/2], scales float8_e4m3fn row-major
    [M, K/16] or 128x4 swizzled when ``swizzled``)."""
    x = as_array(x, "quantize", "x")
    f = _entry_format("nvfp4", "zero_scale", zero_scale)
    q, scales, _, _, _ = _quantize(x, f, "blocked128x4" if swizzled else "row_major", global_amax=global_amax)
    return q, scales


def per_token_group_quant(x, group_size: int = 128, dtype="float8_e4m3fn", scale_ue8m0: bool = False,
                          column_major_scales: bool = False, tma_aligned: bool = False, eps: float = 1e-10):
    """Per-token-group quantization (vLLM / SGLang ``per_token_group_quant_fp8``): groups of
    ``group_size`` consecutive elements of a row, s = max(amax, eps) / qmax (448 E4M3, 57344 E5M2,
    7 INT4), q = sat_rne(x / s). ``scale_ue8m0``: s rounded up to a power of two and stored as
    float8_e8m0fnu (one byte each; not packed four to an int32).
    ``dtype``: float8_e4m3fn, float8_e5m2 or "int4" (packed uint8 [.., M, K/2]).
    Scales: [.., M, K/G] row-major, or with ``column_major_scales`` a [.., M, K/G] view of
    column-major storage [.., K/G, Mp] (strides (1, Mp); Mp = M, or with ``tma_aligned`` M rounded
    up to 16 bytes: 4 fp32 / 16 UE8M0 scales)."""
    f = ptg_format(dtype, group_size, scale_ue8m0, eps)
    x = as_array(x, "quantize", "x")
    if not column_major_scales:
        q, scales, _, _, _ = _quantize(x, f, "row_major")
        return q, scales
    row_align = (16 // (1 if scale_ue8m0 else 4)) if tma_aligned else 1
    q, scales, _, _, _ = _quantize(x, f, "col_major", row_align)
    M = int(x.shape[-2])
    return q, scales[..., :M].transpose(-1, -2) if is_torch(q) else scales[..., :M].swapaxes(-1, -2)


_PTG_FORMATS: dict = {}


def ptg_format(dtype, group_size, scale_ue8m0, eps) -> Format:
    """The Format of per_token_group_quant (also used by the torch custom op's fake)."""
    op = "per_token_group_quant"
    if isinstance(dtype, str) and dtype == "int4":
        name = "int4"
    else:
        name = _PTG_NAMES.get(dtype_name(dtype, op))
        if name is None:
            raise ValueError(f"{op}: argument 'dtype': expected float8_e4m3fn, float8_e5m2 or 'int4', got {dtype!r}")
    return _ptg_format(name, group_size, scale_ue8m0, eps)


def _ptg_format(name: str, group_size, scale_ue8m0, eps) -> Format:
    """The Format of per_token_group_quant, looked up by (name, int(group_size), bool(scale_ue8m0),
    float(eps)) once Format accepted them."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise ValueError(f"per_token_group_quant: argument 'group_size': expected an integer, got {group_size!r}")
    try:
        key = (name, int(group_size), bool(scale_ue8m0), float(eps))
        return _PTG_FORMATS[key]
    except (KeyError, TypeError, ValueError):
        key = None
    f = Format.of(name, block=int(group_size), scale_dtype="ue8m0" if scale_ue8m0 else "float32", eps=eps)
    if key is not None and len(_PTG_FORMATS) < 256:
        _PTG_FORMATS[key] = f
    return f
