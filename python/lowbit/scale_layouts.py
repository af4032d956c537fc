"""Scale-layout conversions: lowbit.convert_scale_layout and the FlashInfer-named
block_scale_interleave / block_scale_deinterleave."""

from __future__ import annotations

import functools

from . import _C
from ._arrays import Backend, array_dtype_name, as_array, c_view, check_int, same_backend
from ._formats import _PAD_NONE, Format, c_layout, group_pad_kind, layout_kind
from ._op_args import _index_order, _indptr, _renamed, _row_align

__all__ = ["convert_scale_layout", "block_scale_interleave", "block_scale_deinterleave"]


_PLAIN_FMT = Format("fp8_e4m3", block=1)  # block 1: scale_shape of an R x C matrix is that of K = C


@functools.lru_cache(maxsize=1024)
def _layout_storage_cached(kind_name, row_align, pad_name, L, R, C, groups):
    return tuple(_C.scale_shape(_PLAIN_FMT.c_format, c_layout(kind_name, int(row_align), pad_name), L, R, C, groups))


def _layout_storage(layout: str, row_align, group_pad, L, R, C, groups):
    """Stored shape (L, rows, cols) of L R x C matrices in `layout` (validated by the caller);
    group_pad: a GROUP_PADS name, or None when not grouped. Cached like _scale_storage_shape."""
    try:
        return _layout_storage_cached(layout, row_align, group_pad, L, R, C, groups)
    except TypeError:  # unhashable row_align: let int() / the binding report it
        return _layout_storage_cached.__wrapped__(layout, row_align, group_pad, L, R, C, groups)


def convert_scale_layout(scales, rows: int, cols: int, src: str = "row_major", dst: str = "blocked128x4",
                         m_indptr=None, *, src_row_align: int = 1, dst_row_align: int = 1,
                         group_pad: str = "flashinfer"):
    """Copies the stored R x C scale matrices (R = rows, C = cols = K/block; L of them, one after
    the other) from layout ``src`` to ``dst``; padding of the output is zero. Offsets of (r, c):
    row_major r*C + c; col_major c*Rp + r; blocked128x4
    ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4 (Cp = round_up(C, 4));
    blocked8x4 (r/8)*(Cp/4)*32 + (c/4)*32 + (r%8)*4 + c%4. With ``m_indptr`` the blocked128x4
    side is grouped (each group starts on a 128-row tile, ``group_pad`` rule). 1- or 4-byte
    elements; the output has the input's dtype and the stored shape of ``dst``."""
    op = "convert_scale_layout"
    scales = as_array(scales, op, "scales", float_default=False)
    be = Backend(scales, op, "scales")
    R, C = check_int(rows, op, "rows"), check_int(cols, op, "cols")
    if R <= 0 or C <= 0:
        raise ValueError(f"{op}: argument '{'rows' if R <= 0 else 'cols'}': rows and cols must be positive, "
                         f"got {R} x {C}")
    src_row_align = _row_align(src_row_align, op, "src_row_align")
    dst_row_align = _row_align(dst_row_align, op, "dst_row_align")
    ind, groups = _indptr(be, m_indptr, op)
    same_backend(scales, ind, op, "m_indptr")
    group_pad_kind(group_pad, False, op)  # checked even when not used
    sk, dk = layout_kind(src, op, "src"), layout_kind(dst, op, "dst")
    spad = dpad = _PAD_NONE
    spn = dpn = None  # GROUP_PADS names of spad / dpad
    if ind is not None:  # the blocked128x4 side is the grouped one
        if dk == _C.ScaleLayoutKind.blocked128x4:
            dpad, dpn = group_pad_kind(group_pad, True, op), group_pad
        elif sk == _C.ScaleLayoutKind.blocked128x4:
            spad, spn = group_pad_kind(group_pad, True, op), group_pad
        else:
            raise ValueError(f"{op}: argument 'm_indptr': grouped padding needs src or dst 'blocked128x4'")
    name = array_dtype_name(scales, op, "scales")
    numel = 1
    for d in scales.shape:
        numel *= int(d)
    try:
        per = _layout_storage(src, src_row_align, spn, 1, R, C, groups)
        _layout_storage(dst, dst_row_align, dpn, 1, R, C, groups)
    except ValueError as e:  # sizes that overflow: name this function's arguments
        raise _renamed(e, "scale_shape", op, {"M": "rows", "K": "cols", "groups": "m_indptr"}) from None
    if spn is None:
        size = per[1] * per[2]
        # the stored [rows, cols] matrices are read by index (a Fortran-ordered copy is reordered)
        if numel % size == 0:
            scales = _index_order(scales, ((numel // size,) + per[1:], per[1:]) if numel == size
                                  else ((numel // size,) + per[1:],), op, "scales")
        if numel % size:
            raise ValueError(f"{op}: argument 'scales': {numel} elements are not a whole number of {R} x {C} "
                             f"matrices in layout {src}")
        L = numel // size
    else:
        L = 1
        # grouped [rows, Cp] storage (any number of whole rows) is read by index too
        if scales.ndim == 2 and int(scales.shape[1]) == per[2]:
            scales = _index_order(scales, (tuple(int(d) for d in scales.shape),), op, "scales")
    batched = scales.ndim == 3 or L > 1
    try:
        oshape = _layout_storage(dst, dst_row_align, dpn, L, R, C, groups)
    except ValueError as e:
        raise _renamed(e, "scale_shape", op, {"L": "scales", "M": "rows", "K": "cols"}) from None
    out = be.empty(oshape if batched else oshape[1:], name)
    iv = c_view(scales, op, "scales")[0]
    ov, odt = c_view(out, op, "out")
    try:
        with be.guard():
            _C.convert_scale_layout(iv, ov, odt, sk, src_row_align, spad, dk, dst_row_align, dpad, R, C,
                                    None if ind is None else c_view(ind, op, "m_indptr")[0], be.stream())
    except ValueError as e:  # the C++ names (in, R, C) as this function's arguments
        raise _renamed(e, op, op, {"in": "scales", "R": "rows", "C": "cols"}) from None
    return out


def block_scale_interleave(scales):
    """Row-major scales [R, C] (or [L, R, C]) -> the 128x4 blocked layout
    [round_up(R,128), round_up(C,4)] (FlashInfer ``block_scale_interleave``, torchao
    ``to_blocked``): offset(r, c) = ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4,
    padding zero."""
    scales = as_array(scales, "block_scale_interleave", "scales", float_default=False)
    if scales.ndim not in (2, 3):
        raise ValueError(f"block_scale_interleave: argument 'scales': expected [R, C] or [L, R, C], "
                         f"got shape {tuple(scales.shape)}")
    R, C = int(scales.shape[-2]), int(scales.shape[-1])
    try:
        return convert_scale_layout(scales, R, C, "row_major", "blocked128x4")
    except ValueError as e:  # named as this function's error
        raise _renamed(e, "convert_scale_layout", "block_scale_interleave", {"scales": "scales"}) from None


def block_scale_deinterleave(scales, rows: int, cols: int):
    """Inverse of block_scale_interleave: 128x4 blocked scales -> row-major [rows, cols]
    ([L, rows, cols] for L matrices)."""
    try:
        return convert_scale_layout(scales, rows, cols, "blocked128x4", "row_major")
    except ValueError as e:  # named as this function's error
        raise _renamed(e, "convert_scale_layout", "block_scale_deinterleave",
                       {"scales": "scales", "rows": "rows", "cols": "cols"}) from None
