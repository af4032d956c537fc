"""GEMM operations on lowbit formats (C++: include/lowbit/gemm.hpp).

CUDA tensors run the sm_90a kernels on the current torch stream; host arrays run the CPU
reference (fp32 dequantization, fp64 sums). An op whose CUDA kernel is not built raises
NotImplementedError rather than falling back silently.
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._arrays import (INT32_MAX, INT32_MIN, _T_EXPORT, Backend, _torch, as_array, c_export, c_view, check_float,
                      check_int, contiguous, dtype_name, is_contiguous, is_torch, same_backend)
from ._formats import GROUP_PADS as _PADS, LAYOUTS, _choice

# the GEMMs take two of the scale layouts
_KINDS = {k: LAYOUTS[k] for k in ("row_major", "blocked128x4")}


def _bytes(x, op, arg):
    """A uint8 view of a 1-byte array (packed fp4, fp8 scales given as torch / ml_dtypes types)."""
    if x is None:
        return None
    x = as_array(x, op, arg, float_default=False)
    if is_torch(x):
        if x.dtype == _torch().bool:
            raise ValueError(f"{op}: argument '{arg}': expected packed codes or scale bytes (uint8 / fp8 / fp4), "
                             f"got bool")
        if x.element_size() != 1:
            raise ValueError(f"{op}: argument '{arg}': expected 1-byte elements, got {x.dtype}")
        # dtypes of lowbit's tables go to _C as they are (c_export takes a uint8 view where this
        # torch's DLPack lacks the dtype); any other 1-byte dtype as its uint8 bytes
        return x if x.dtype in _T_EXPORT else x.view(_torch().uint8)
    if x.dtype == np.bool_:
        raise ValueError(f"{op}: argument '{arg}': expected packed codes or scale bytes (uint8 / fp8 / fp4), got bool")
    if x.dtype.itemsize != 1:
        raise ValueError(f"{op}: argument '{arg}': expected 1-byte elements, got {x.dtype}")
    return x if x.dtype == np.uint8 else x.view(np.uint8)


def _cb(x, op, arg, shapes=None):
    """_bytes(x) as _C takes it (torch tensors as DLPack capsules); with `shapes`, scales of a
    documented index shape are read by index (_by_index)."""
    x = _bytes(x, op, arg)
    return c_export(_by_index(x, shapes) if shapes else x)


def _permute(x, axes):
    return x.permute(*axes) if is_torch(x) else np.transpose(x, axes)


def _by_index(x, shapes):
    """Scale bytes `x` (from _bytes) read by index when their shape is one of the documented index
    shapes: ``shapes`` maps each such shape to the order of its dimensions in the storage the
    kernels address (outermost first; e.g. (2, 0, 1) for the batch-last [rows, cols, L] view of
    (L, rows, cols) storage). An array of such a shape in another memory order (Fortran-ordered,
    transposed, C-contiguous where the view is batch-last) is copied into that order and passed
    as the same view, so what is read is what its indices say. Scales are small (1/16 or 1/32
    of the operand they scale), so NumPy arrays and torch tensors alike are copied, on their own
    device, as the format ops do for their scales. Other shapes go as they are (the C++ API
    accepts only row-major storage and the documented views, and refuses the rest)."""
    if x is None or not hasattr(x, "shape"):
        return x
    perm = shapes.get(tuple(int(d) for d in x.shape))
    if perm is None:
        return x
    y = _permute(x, perm)
    if is_contiguous(y):
        return x
    inv = tuple(int(i) for i in np.argsort(perm))
    return _permute(contiguous(y), inv)


def _ceil(a, b):
    return -(-a // b) * b


def _group_scale_shapes(G, R, K, blocked):
    """The index shapes of G stored [R, K/32] UE8M0 scale matrices (grouped GEMM operands,
    per-matrix layout "row_major" or "blocked128x4"), all in row-major storage order."""
    if blocked:
        R, C = _ceil(R, 128), _ceil(K // 32, 4)
    else:
        R, C = R, K // 32
    shapes = {(G, R, C): (0, 1, 2)}
    if G == 1:
        shapes[(R, C)] = (0, 1)
    return shapes


def _dual_scale_shapes(R, K, L, ndim, blocked):
    """The documented index shapes of the dual GEMM's E4M3 scales of R x K/16 (L matrices):
    row_major [R, K/16, L] (batch-last view) or [R, K/16] (2-D operands); blocked128x4 the 6-D
    GPU MODE view [32, 4, Rp/128, 4, Cp/4, L]."""
    if blocked:
        Rp, Cp = _ceil(R, 128), _ceil(K // 16, 4)
        return {(32, 4, Rp // 128, 4, Cp // 4, L): (5, 2, 4, 0, 1, 3)}
    if ndim == 3:
        return {(R, K // 16, L): (2, 0, 1)}
    return {(R, K // 16): (0, 1)}


def _writable(out, op, arg="out"):
    """`out` as given, after checking that it may be written (a read-only NumPy array is refused)."""
    if out is not None and not is_torch(out) and not isinstance(out, np.ndarray):
        raise ValueError(f"{op}: argument '{arg}': expected a NumPy array or a torch tensor, got {type(out).__name__}")
    if out is not None and not is_torch(out) and isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{op}: argument '{arg}': is read-only: an output must be a writable array")
    return out


def _index_array(be: Backend, v, op, arg, lo=INT32_MIN, hi=INT32_MAX):
    """An integer index argument (m_indptr, topk_ids) as an array of this backend: arrays as they
    are (their dtype is checked by the C++ API), Python sequences strictly as integers (a float
    such as 3.7 is refused, not truncated)."""
    if isinstance(v, np.ndarray) or is_torch(v):
        return v
    if isinstance(v, (list, tuple)):
        return be.index_values(v, op, arg, "int32", lo, hi)
    raise ValueError(f"{op}: argument '{arg}': expected an integer array or a list of integers, got {type(v).__name__}")


def _ids_int32(be: Backend, ids, op):
    """topk_ids as int32 (the kernels' type): torch.topk's int64 indices are converted. Host
    values outside int32 are refused; device values are clamped into int32 (no host sync), so an
    out-of-range id stays out of range (the kernels skip it) instead of wrapping to a valid one."""
    ids = _index_array(be, ids, op, "topk_ids")
    if is_torch(ids):
        t = _torch()
        if ids.dtype == t.int64:
            if not ids.is_cuda and ids.numel() and (int(ids.min()) < INT32_MIN or int(ids.max()) > INT32_MAX):
                raise ValueError(f"{op}: argument 'topk_ids': expert ids must fit in int32")
            ids = ids.clamp(INT32_MIN, INT32_MAX).to(t.int32)
        return ids
    if ids.dtype == np.int64:
        if ids.size and (int(ids.min()) < INT32_MIN or int(ids.max()) > INT32_MAX):
            raise ValueError(f"{op}: argument 'topk_ids': expert ids must fit in int32")
        ids = ids.astype(np.int32)
    return ids


def _required(x, op, arg):
    if x is None:
        raise ValueError(f"{op}: argument '{arg}': is required")
    return x


def _f32(x, be: Backend, op, arg):
    if x is None:
        return None
    x = be.adopt(x, op, arg, "float32")
    return c_view(x, op, arg)[0]


def nvfp4_dual_gemm_silu(a, b1=None, b2=None, sfa=None, sfb1=None, sfb2=None, *, scale_layout: str = "row_major",
                         amax_a=None, amax_b1=None, amax_b2=None, out=None, out_dtype="float16", packed_b=None,
                         n: int | None = None):
    """NVFP4 dual GEMM with fused SiLU (the SwiGLU of an LLM MLP)::

        C[m, n, l] = silu(G) * U,  G = sum_k A[m,k,l] B1[n,k,l],  U = sum_k A[m,k,l] B2[n,k,l]

    Every operand element is e2m1(code) * e4m3(scale of its 16 K-elements) (x the NVFP4
    per-tensor decode scale 1 / (2688 / amax) when ``amax_*`` is given); sums in fp32, SiLU and
    product in fp32, C rounded to ``out_dtype`` (float16 or bfloat16).

    a: [M, K/2, L] or [M, K/2] packed E2M1 (uint8 / float4_e2m1fn_x2, element 2k in the low
    nibble; the GPU MODE [M, K/2, L] views of (L, M, K/2) storage are taken as they are).
    b1, b2: [N, K/2, L] or [N, K/2]. sfa / sfb1 / sfb2: E4M3 block scales, "row_major" (the
    reference [MN, K/16, L] tensors) or "blocked128x4" (the permuted [32, 4, MN/128, 4, K/64, L]
    tensors); scales of those shapes in another memory order (C-contiguous [MN, K/16, L],
    Fortran-ordered, ...) are copied into the view's order first, on their device, so they are
    read by index. packed_b: weights from nvfp4_dual_gemm_prepack (then b1/b2/sfb1/sfb2 are omitted
    and N is taken from ``out`` or ``n``). Constraints: N % 128 == 0, K % 64 == 0; any M, L.
    Returns C ([M, N, L] view of (L, M, N) storage for 3-D inputs, else [M, N]).
    """
    op = "nvfp4_dual_gemm_silu"
    a = _bytes(_required(a, op, "a"), op, "a")
    _required(sfa, op, "sfa")
    _writable(out, op)
    if a.ndim not in (2, 3):
        raise ValueError(f"{op}: argument 'a': expected [M, K/2, L] or [M, K/2], got shape {tuple(a.shape)}")
    for arg, v in (("b1", b1), ("b2", b2), ("sfa", sfa), ("sfb1", sfb1), ("sfb2", sfb2), ("out", out)):
        same_backend(a, v, op, arg)
    M, L = int(a.shape[0]), int(a.shape[2]) if a.ndim == 3 else 1
    be = Backend(a, op, "a")
    if out is None:
        if packed_b is not None:
            if n is None:
                raise ValueError(f"{op}: argument 'n': give n (or out) with prepacked weights")
            N = check_int(n, op, "n", 0)
        else:
            if b1 is None:
                raise ValueError(f"{op}: argument 'b1': is required without packed_b")
            if not hasattr(b1, "shape"):
                raise ValueError(f"{op}: argument 'b1': expected an array, got {type(b1).__name__}")
            N = int(b1.shape[0])
        oname = dtype_name(out_dtype, op, "out_dtype")
        if a.ndim == 3:
            out = be.empty((L, M, N), oname)
            out = out.permute(1, 2, 0) if be.torch else np.transpose(out, (1, 2, 0))
        else:
            out = be.empty((M, N), oname)
    cv, cdt = c_view(out, op, "out")
    kind = _choice(scale_layout, _KINDS, "scale_layout", op)
    blocked = kind == _KINDS["blocked128x4"]
    K = 2 * int(a.shape[1])
    sa_shapes = _dual_scale_shapes(M, K, L, a.ndim, blocked)
    sb_shapes = None
    if b1 is not None and hasattr(b1, "shape") and len(b1.shape) == a.ndim:
        sb_shapes = _dual_scale_shapes(int(b1.shape[0]), K, L, a.ndim, blocked)
    with be.guard():
        _C.nvfp4_dual_gemm(c_export(a), _cb(b1, op, "b1"), _cb(b2, op, "b2"), _cb(sfa, op, "sfa", sa_shapes),
                           _cb(sfb1, op, "sfb1", sb_shapes), _cb(sfb2, op, "sfb2", sb_shapes),
                           kind, _f32(amax_a, be, op, "amax_a"),
                           _f32(amax_b1, be, op, "amax_b1"), _f32(amax_b2, be, op, "amax_b2"), cv, cdt,
                           _cb(packed_b, op, "packed_b"), be.stream())
    return out


def nvfp4_dual_gemm_prepack(b1, b2, sfb1, sfb2, *, scale_layout: str = "row_major"):
    """Prepares the dual-GEMM weights once (load time): returns a uint8 CUDA tensor of
    ``_C.nvfp4_dual_gemm_packed_bytes(N, K, L)`` bytes in the kernel's layout (gate/up rows
    interleaved by 8, each thread's wgmma fragments contiguous), for
    ``nvfp4_dual_gemm_silu(a, sfa=..., packed_b=packed, n=N)``."""
    op = "nvfp4_dual_gemm_prepack"
    b1 = _bytes(_required(b1, op, "b1"), op, "b1")
    if b1.ndim not in (2, 3):
        raise ValueError(f"{op}: argument 'b1': expected [N, K/2, L] or [N, K/2], got shape {tuple(b1.shape)}")
    N, K = int(b1.shape[0]), 2 * int(b1.shape[1])
    L = int(b1.shape[2]) if b1.ndim == 3 else 1
    be = Backend(b1, op, "b1")
    packed = be.empty((_C.nvfp4_dual_gemm_packed_bytes(N, K, L),), "uint8")
    kind = _choice(scale_layout, _KINDS, "scale_layout", op)
    shapes = _dual_scale_shapes(N, K, L, b1.ndim, kind == _KINDS["blocked128x4"])
    with be.guard():
        _C.nvfp4_dual_gemm_prepack(c_export(b1), _cb(b2, op, "b2"), _cb(sfb1, op, "sfb1", shapes),
                                   _cb(sfb2, op, "sfb2", shapes), kind, c_export(packed), be.stream())
    return packed


def custom_kernel(data):
    """Drop-in for the GPU MODE task: ``data`` is the 10-tuple
    ``(a, b1, b2, sfa, sfb1, sfb2, sfa_permuted, sfb1_permuted, sfb2_permuted, c)``; writes
    ``c = silu(a @ b1^T) * (a @ b2^T)`` (fp16, [M, N, L]) using the permuted scales and returns c."""
    a, b1, b2, _, _, _, sfa_p, sfb1_p, sfb2_p, c = data
    nvfp4_dual_gemm_silu(a, b1, b2, sfa_p, sfb1_p, sfb2_p, scale_layout="blocked128x4", out=c)
    return c


MXFP4_PACK_ROWS, MXFP4_PACK_K = 128, 256  # lowbit/mxfp4_pack.hpp
MXFP4_FP8_PACK_K = 128                     # the FP8 path's K tile (lowbit/mxfp4_pack.hpp)
_PRECISIONS = {"exact": _C.GemmPrecision.exact, "fp8": _C.GemmPrecision.fp8}


def group_gemm_mxfp4_prepack(b, b_scale, *, b_scale_layout: str = "blocked128x4", precision: str = "exact"):
    """Reorders MXFP4 expert weights once (load time) into the layout the sm_90a grouped GEMM
    decodes with the fewest instructions (include/lowbit/mxfp4_pack.hpp). b [G, N, K/2] and
    b_scale (UE8M0, G x N x K/32, "blocked128x4" or "row_major") -> (packed_b uint8 [G, Np, Kp/2],
    packed_scale uint8 [G, Np, Kp/32]) with Np = N rounded up to 128 and Kp = K rounded up to 256,
    on b's device. b_scale of its stored shape ([G, N, K/32] / [G, Np, Cp], or 2-D when G == 1) in
    another memory order (e.g. Fortran-ordered) is copied to row-major order first (NumPy and
    torch alike), so it is read by index; b needs its K bytes contiguous. Pass them with ``b_packed=True`` to group_gemm_mxfp4_nt_groupwise (and
    ``packed=True`` to gpt_oss_moe_mlp); lossless.

    ``precision="fp8"``: the layout of the opt-in FP8 tensor-core path instead
    (group_gemm_mxfp4_nt_groupwise(..., precision="fp8")): packed_b uint8
    [G, Np/128, Kq/128, 128, 64] and packed_scale uint8 [G, Np/128, Kq/128, 128, 4], Kq = K rounded
    up to 128, one 128-row x 128-K tile after the other (C++: group_gemm_mxfp4_prepack_fp8);
    lossless too. Each precision reads only its own layout."""
    op = "group_gemm_mxfp4_prepack"
    _required(b, op, "b")
    _required(b_scale, op, "b_scale")
    fp8 = _choice(precision, _PRECISIONS, "precision", op) == _C.GemmPrecision.fp8
    b = _bytes(b, op, "b")
    if b.ndim != 3:
        raise ValueError(f"{op}: argument 'b': expected [groups, N, K/2], got shape {tuple(b.shape)}")
    G, N, K = (int(b.shape[0]), int(b.shape[1]), 2 * int(b.shape[2]))
    Np = -(-N // MXFP4_PACK_ROWS) * MXFP4_PACK_ROWS
    be = Backend(b, op, "b")
    if fp8:
        Kq = -(-K // MXFP4_FP8_PACK_K) * MXFP4_FP8_PACK_K
        tiles = (G, Np // MXFP4_PACK_ROWS, Kq // MXFP4_FP8_PACK_K, MXFP4_PACK_ROWS)
        pb = be.empty(tiles + (64,), "uint8")
        ps = be.empty(tiles + (4,), "uint8")
    else:
        Kp = -(-K // MXFP4_PACK_K) * MXFP4_PACK_K
        pb = be.empty((G, Np, Kp // 2), "uint8")
        ps = be.empty((G, Np, Kp // 32), "uint8")
    kind = _choice(b_scale_layout, _KINDS, "b_scale_layout", op)
    shapes = _group_scale_shapes(G, N, K, kind == _KINDS["blocked128x4"])
    prepack = _C.group_gemm_mxfp4_prepack_fp8 if fp8 else _C.group_gemm_mxfp4_prepack
    with be.guard():
        prepack(c_export(b), _cb(b_scale, op, "b_scale", shapes), kind, c_export(pb), c_export(ps), be.stream())
    return pb, ps


def group_gemm_mxfp4_nt_groupwise(a, b, a_scale, b_scale, m_indptr=None, out_dtype="bfloat16", *,
                                  a_scale_layout: str = "blocked128x4", b_scale_layout: str = "blocked128x4",
                                  group_pad: str = "flashinfer", out=None, b_packed: bool = False, n=None,
                                  m_counts=None, expected_m: int = 0, precision: str = "exact"):
    """Grouped GEMM for MoE (FlashInfer conventions): ``out[m] = A[m] @ B[g]^T`` for the rows m of
    group g. A is MXFP8 (float8_e4m3fn / float8_e5m2 codes, ``a_scale`` UE8M0 per 32 K-elements:
    "blocked128x4" with per-group 128-row padding (``group_pad``, m_indptr only) or "row_major") or
    bfloat16 (W4A16, ``a_scale`` None). B [G, N, K/2] is MXFP4 (E2M1, element 2k in the low nibble)
    with ``b_scale`` UE8M0 per 32 ("blocked128x4" per expert or "row_major"). Values are
    code * 2^(scale - 127); fp32 sums. K % 32 == 0, N % 8 == 0; empty groups allowed.

    The rows of the groups (docs/moe_ep.md), given by exactly one of:
      ``m_indptr`` [G+1]: A [cum_m, K]; group g is rows m_indptr[g] .. m_indptr[g+1]-1.
      ``m_counts`` [G] with A [M, K] (contiguous layout: tokens sorted by expert, DeepEP's
          normal mode): group g is the m_counts[g] rows after those of groups < g; sum <= M.
      ``m_counts`` [G] with A [G, max_tokens, K] (masked layout: DeepEP's low-latency mode,
          pplx-kernels): group g is rows 0 .. m_counts[g]-1 of batch g; out is [G, max_tokens, N].
    Rows outside the counts are neither read nor written (an allocated ``out`` leaves them
    uninitialised: pass ``out`` to keep them). Host counts are validated (non-negative; contiguous:
    sum <= M; masked: each <= max_tokens); CUDA counts are read on the device without a host
    synchronisation (CUDA-graph safe) and clamped the same way instead. ``expected_m``: the masked
    layout's typical count per group, a tile-size hint (0: max_tokens); it changes only the speed.

    Scales of their stored shape in another memory order (e.g. Fortran-ordered) are copied to
    row-major order first (NumPy and torch alike), so they are read by index; a / b need their K
    elements contiguous (other strides are honoured). ``b_packed=True``: b / b_scale come from
    group_gemm_mxfp4_prepack (b_scale_layout unused) and N is ``out.shape[-1]`` or ``n``.

    ``precision``: "exact" (default: operands decoded exactly onto bf16 tensor cores, fp32 sums,
    within one ulp of the output dtype of the fp64 reference) or "fp8" (opt-in, MXFP8 activations
    only): each K block of 32 is one FP8 wgmma (weights decoded to E4M3 with their row scale folded
    in, activations as stored), its partial sum scaled by the block's two UE8M0 scales and added
    into fp32. Hopper's FP8 accumulation keeps fewer mantissa bits, so results are not bit-exact:
    ``|out - ref| <= 1 ulp(out) + (2^-7 + (K/32) * 2^-24) * sum_k |a_k b_k|`` (the derivation:
    docs/design/moe_grouped_gemm.md, "FP8 tensor-core path"; typical errors are far smaller). It
    takes weights from ``group_gemm_mxfp4_prepack(..., precision="fp8")`` with ``b_packed=True``
    (other weights raise NotImplementedError, bfloat16 ``a`` raises ValueError). CPU arrays compute
    the exact reference for either precision (within that bound by definition)."""
    op = "group_gemm_mxfp4_nt_groupwise"
    for arg, v in (("a", a), ("b", b), ("b_scale", b_scale)):
        _required(v, op, arg)
    if m_indptr is None and m_counts is None:
        raise ValueError(f"{op}: argument 'm_indptr': is required (or m_counts: rows per group)")
    if m_indptr is not None and m_counts is not None:
        raise ValueError(f"{op}: argument 'm_counts': give either m_indptr or m_counts, not both")
    _writable(out, op)
    a = as_array(a, op, "a", float_default=False)
    be = Backend(a, op, "a")
    if a.ndim not in (2, 3):
        raise ValueError(f"{op}: argument 'a': expected [cum_m, K] or (masked layout) [G, max_tokens, K], got shape "
                         f"{tuple(a.shape)}")
    if a.ndim == 3 and m_counts is None:
        raise ValueError(f"{op}: argument 'm_counts': is required with a 3-D a [G, max_tokens, K] (the masked layout)")
    dtype_name(a.dtype, op, "a")
    av, adt = c_view(a, op, "a")
    if m_indptr is not None:
        m_indptr = _index_array(be, m_indptr, op, "m_indptr", 0)
    if m_counts is not None:
        m_counts = _index_array(be, m_counts, op, "m_counts", 0)
    expected_m = check_int(expected_m, op, "expected_m", 0)
    prec = _choice(precision, _PRECISIONS, "precision", op)
    if out is None:
        if b_packed and n is None:
            raise ValueError(f"{op}: argument 'n': is required with b_packed=True when out is not given")
        if not b_packed and (not hasattr(b, "shape") or len(b.shape) != 3):
            raise ValueError(f"{op}: argument 'b': expected [groups, N, K/2], got {getattr(b, 'shape', type(b).__name__)}")
        N = check_int(n, op, "n", 0) if b_packed else int(b.shape[1])
        out = be.empty(tuple(int(d) for d in a.shape[:-1]) + (N,), dtype_name(out_dtype, op, "out_dtype"))
    ov, odt = c_view(out, op, "out")
    pad = _choice(group_pad, _PADS, "group_pad", op)  # checked even when the layout does not use it
    akind = _choice(a_scale_layout, _KINDS, "a_scale_layout", op)
    if akind != _KINDS["blocked128x4"]:
        pad = _C.GroupPad.none
    bkind = _choice(b_scale_layout, _KINDS, "b_scale_layout", op)
    K = int(a.shape[-1])
    # scales of their stored shape are read by index (grouped a_scale must be row-major storage)
    a_shapes = None
    if akind == _KINDS["row_major"]:
        rows = int(np.prod(a.shape[:-1]))
        a_shapes = _group_scale_shapes(1, rows, K, False)
        if a.ndim == 3:  # the masked layout's [G, max_tokens, K/32]
            a_shapes[(int(a.shape[0]), int(a.shape[1]), K // 32)] = (0, 1, 2)
    b_shapes = None
    if not b_packed and hasattr(b, "shape") and len(b.shape) == 3:
        b_shapes = _group_scale_shapes(int(b.shape[0]), int(b.shape[1]), K, bkind == _KINDS["blocked128x4"])
    with be.guard():
        # a_scale is passed whatever a's dtype: bf16 activations with scales are refused, not ignored
        _C.group_gemm_mxfp4(av, adt, None if a_scale is None else _cb(a_scale, op, "a_scale", a_shapes),
                            akind, pad, _cb(b, op, "b"),
                            _cb(b_scale, op, "b_scale", b_shapes), bkind,
                            None if m_indptr is None else c_view(m_indptr, op, "m_indptr")[0], ov, odt,
                            b_packed=bool(b_packed), stream=be.stream(),
                            m_counts=None if m_counts is None else c_view(m_counts, op, "m_counts")[0],
                            expected_m=expected_m, precision=prec)
    return out


def gpt_oss_moe_mlp(x, topk_ids, topk_weights, w1, w1_scale, b1, w2, w2_scale, b2, *, alpha: float = 1.702,
                    limit: float = 7.0, act: str = "bf16", out_dtype=None, out=None, packed: bool = False):
    """The gpt-oss expert MLP in one call. For each token t and routed expert e = topk_ids[t, j]:
    ``h = act(x[t]) @ W1[e]^T + b1[e]`` (gate = h[0::2], up = h[1::2]); ``g = min(gate, limit)``,
    ``u = clamp(up, -limit, limit)``; ``y = g * sigmoid(alpha g) * (u + 1)``;
    ``out[t] += topk_weights[t, j] * (act(y) @ W2[e]^T + b2[e])`` (j in order; id -1 skips).
    W1 [E, 2I, H/2] / W2 [E, H, I/2] MXFP4 codes with UE8M0 scales [E, 2I, H/32] / [E, H, I/32]
    (``lowbit convert-gpt-oss``); act "bf16" (W4A16) or "mxfp8" (activations quantized, RCEIL).
    ``packed=True``: w1 / w1_scale and w2 / w2_scale are group_gemm_mxfp4_prepack outputs
    (of the row-major scales)."""
    op = "gpt_oss_moe_mlp"
    for arg, v in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights), ("w1", w1), ("w1_scale", w1_scale),
                   ("b1", b1), ("w2", w2), ("w2_scale", w2_scale), ("b2", b2)):
        _required(v, op, arg)
    _writable(out, op)
    x = as_array(x, op, "x")
    be = Backend(x, op, "x")
    alpha, limit = check_float(alpha, op, "alpha"), check_float(limit, op, "limit")
    xv, xdt = c_view(x, op, "x")
    b1 = as_array(b1, op, "b1")
    b2 = as_array(b2, op, "b2")
    b1v, b1dt = c_view(b1, op, "b1")
    b2v, b2dt = c_view(b2, op, "b2")
    if out is None:
        out = be.empty(tuple(int(s) for s in x.shape), dtype_name(x.dtype if out_dtype is None else out_dtype, op, "out_dtype"))
    ov, odt = c_view(out, op, "out")
    acts = {"bf16": _C.ActQuant.bf16, "mxfp8": _C.ActQuant.mxfp8}
    with be.guard():
        _C.gpt_oss_moe_mlp(xv, xdt, c_view(_ids_int32(be, topk_ids, op), op, "topk_ids")[0],
                           c_view(be.adopt(topk_weights, op, "topk_weights", "float32"), op, "topk_weights")[0],
                           _cb(w1, op, "w1"), _cb(w1_scale, op, "w1_scale"), b1v, b1dt, _cb(w2, op, "w2"),
                           _cb(w2_scale, op, "w2_scale"), b2v, b2dt, float(alpha), float(limit),
                           _choice(act, acts, "act", op), ov, odt, packed=bool(packed), stream=be.stream())
    return out


def gpt_oss_expert_mlp(x, m_counts, w1, w1_scale, b1, w2, w2_scale, b2, *, x_scale=None, alpha: float = 1.702,
                       limit: float = 7.0, act: str = "bf16", out_dtype=None, out=None, packed: bool = False,
                       expected_m: int = 0):
    """The gpt-oss expert MLP over rows already grouped by expert (expert parallelism: the rows a
    dispatch delivers to the GPU of the experts), without routing or weighting. For every row x_r
    of local expert e: ``h = act(x_r) @ W1[e]^T + b1[e]`` (gate = h[0::2], up = h[1::2]);
    ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``; ``y = g * sigmoid(alpha g) * (u + 1)``;
    ``out_r = act(y) @ W2[e]^T + b2[e]``: bit for bit the term gpt_oss_moe_mlp weights with
    topk_weights for the same row and expert (CPU reference; the CUDA kernels within the fp32
    summation-order rule of the MLP tests). Layouts (docs/moe_ep.md), ``m_counts`` [E] int32/int64:
      x [M, H]: contiguous, expert e's rows are the m_counts[e] rows after those of experts < e
        (sum <= M);
      x [E, max_tokens, H]: masked, expert e's rows are rows 0 .. m_counts[e]-1 of batch e.
    Rows outside the counts are neither read nor written (an allocated ``out`` leaves them
    uninitialised). Host counts are validated, CUDA counts clamped on the device (no host
    synchronisation). x: bfloat16 / float32, or MXFP8 as a quantized dispatch delivers it
    (float8_e4m3fn codes with ``x_scale``: UE8M0 bytes [.., H/32] row-major; act() then rounds the
    decoded values). W1 / W2 and their scales as in gpt_oss_moe_mlp (``packed`` likewise); act
    "bf16" or "mxfp8"; ``expected_m``: the masked layout's tile-size hint. Returns ``out``, x's
    leading shape with H (dtype ``out_dtype``, default x's, bfloat16 for MXFP8 x)."""
    op = "gpt_oss_expert_mlp"
    for arg, v in (("x", x), ("m_counts", m_counts), ("w1", w1), ("w1_scale", w1_scale), ("b1", b1), ("w2", w2),
                   ("w2_scale", w2_scale), ("b2", b2)):
        _required(v, op, arg)
    _writable(out, op)
    x = as_array(x, op, "x")
    be = Backend(x, op, "x")
    alpha, limit = check_float(alpha, op, "alpha"), check_float(limit, op, "limit")
    expected_m = check_int(expected_m, op, "expected_m", 0)
    xv, xdt = c_view(x, op, "x")
    b1 = as_array(b1, op, "b1")
    b2 = as_array(b2, op, "b2")
    b1v, b1dt = c_view(b1, op, "b1")
    b2v, b2dt = c_view(b2, op, "b2")
    m_counts = _index_array(be, m_counts, op, "m_counts", 0)
    if out is None:
        xname = dtype_name(x.dtype, op, "x")
        default = xname if xname in ("bfloat16", "float32") else "bfloat16"
        out = be.empty(tuple(int(s) for s in x.shape),
                       dtype_name(default if out_dtype is None else out_dtype, op, "out_dtype"))
    ov, odt = c_view(out, op, "out")
    acts = {"bf16": _C.ActQuant.bf16, "mxfp8": _C.ActQuant.mxfp8}
    with be.guard():
        _C.gpt_oss_expert_mlp(xv, xdt, None if x_scale is None else _cb(x_scale, op, "x_scale"),
                              c_view(m_counts, op, "m_counts")[0], _cb(w1, op, "w1"), _cb(w1_scale, op, "w1_scale"),
                              b1v, b1dt, _cb(w2, op, "w2"), _cb(w2_scale, op, "w2_scale"), b2v, b2dt, float(alpha),
                              float(limit), _choice(act, acts, "act", op), ov, odt, packed=bool(packed),
                              expected_m=expected_m, stream=be.stream())
    return out
