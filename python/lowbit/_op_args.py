"""Argument checks and stored-shape helpers shared by the ops (ops.py, scale_layouts.py)."""

from __future__ import annotations

import functools
from typing import Tuple

import numpy as np

from . import _C
from ._arrays import INT32_MAX, INT32_MIN, Backend, check_int, contiguous, is_contiguous, is_torch
from ._formats import Format, c_layout


def _check_mat(x, op: str, arg: str) -> Tuple[int, int, int]:
    """(L, M, K) of a 2-D [M, K] or 3-D [L, M, K] array; ValueError naming `arg` otherwise."""
    shape = x.shape
    nd = len(shape)
    if nd == 2:
        return 1, int(shape[0]), int(shape[1])
    if nd == 3:
        return int(shape[0]), int(shape[1]), int(shape[2])
    raise ValueError(f"{op}: argument '{arg}': expected a 2-D [M, K] or 3-D [L, M, K] array, "
                     f"got shape {tuple(shape)}")


def _check_block(f: Format, K: int, op: str, arg: str):
    if K % f.block:
        raise ValueError(f"{op}: argument '{arg}': the last dimension K = {K} must be a multiple of the block "
                         f"size {f.block} of {f} (lowbit neither pads nor truncates)")


@functools.lru_cache(maxsize=4096)
def _scale_storage_shape_cached(f: Format, layout: str, row_align, group_pad, L: int, M: int, K: int, groups: int,
                                batched: bool):
    s = _C.scale_shape(f.c_format, c_layout(layout, int(row_align), group_pad), L, M, K, groups)
    return tuple(s) if batched else tuple(s[1:])


def _scale_storage_shape(f: Format, layout: str, row_align, group_pad, L: int, M: int, K: int, groups: int,
                         batched: bool):
    """Shape of the stored scales (lowbit::scale_shape, which validates the layout; the shapes
    are cached: errors are not, and raise on every call). group_pad: None when not grouped."""
    try:
        return _scale_storage_shape_cached(f, layout, row_align, group_pad, L, M, K, groups, batched)
    except TypeError:  # unhashable row_align: let int() / the binding report it
        return _scale_storage_shape_cached.__wrapped__(f, layout, row_align, group_pad, L, M, K, groups, batched)


def _row_align(row_align, op: str, arg: str = "row_align") -> int:
    """An integer >= 1, for every layout (also those that ignore it: nothing is silently ignored)."""
    v = check_int(row_align, op, arg, INT32_MIN, INT32_MAX)
    if v < 1:
        raise ValueError(f"{op}: argument '{arg}': {arg} must be an integer >= 1, got {v}")
    return v


def _index_order(a, shapes, op: str | None = None, arg: str | None = None):
    """`a` with its element order equal to its index order when its shape is one of `shapes`
    (the stored shapes whose indices are known: [L, rows, cols] / [rows, cols]): a row-major copy
    of a Fortran-ordered or transposed array. Other shapes are passed as they are (the C++ API
    accepts only the documented views and refuses the rest)."""
    if a is None or not hasattr(a, "shape") or is_contiguous(a):
        return a
    return contiguous(a, op, arg) if tuple(int(d) for d in a.shape) in shapes else a


def _indptr(be: Backend, m_indptr, op: str):
    if m_indptr is None:
        return None, 0
    if is_torch(m_indptr) or hasattr(m_indptr, "dtype"):
        arr = m_indptr
        if not hasattr(arr, "ndim"):  # a NumPy scalar
            arr = np.asarray(arr)
    elif isinstance(m_indptr, (list, tuple)):
        arr = be.index_values(m_indptr, op, "m_indptr", "int64")
    else:
        raise ValueError(f"{op}: argument 'm_indptr': expected an integer array or a list of integers, "
                         f"got {type(m_indptr).__name__}")
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(f"{op}: argument 'm_indptr': expected a 1-D array of G+1 >= 2 boundaries, "
                         f"got shape {tuple(arr.shape)}")
    return arr, int(arr.shape[0]) - 1


def _renamed(e: ValueError, cop: str, op: str, names: dict) -> ValueError:
    """`e` (raised by _C op `cop`) as an error of `op` naming its own arguments (`names`: C++
    argument -> Python argument)."""
    msg = str(e)
    for cname, pname in names.items():
        if msg.startswith(f"{cop}: argument '{cname}'"):
            return ValueError(f"{op}: argument '{pname}'" + msg[len(f"{cop}: argument '{cname}'"):])
    return e
