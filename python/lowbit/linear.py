"""Dense low-precision linears (C++: include/lowbit/linear.hpp; docs/linear.md).

``C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N])`` with MXFP4 weights (mxfp4_gemm: the grouped MXFP4
GEMM's sm_90a kernel with one group on CUDA tensors) or NVFP4 weights (nvfp4_gemm: the NVFP4 dual
GEMM's mainloop on CUDA tensors, N % 128 == 0 and K % 64 == 0). Both take weights prepacked once at
load time (mxfp4_gemm_prepack, nvfp4_gemm_prepack). Host arrays run the CPU reference (exact
dequantization, fp64 sums); CUDA tensors run on the current torch stream.
"""

from __future__ import annotations

from . import _C
from ._arrays import Backend, as_array, c_export, c_view, check_int, dtype_name, same_backend
from ._formats import _choice
from .gemm import (MXFP4_PACK_K, MXFP4_PACK_ROWS, _KINDS, _bytes, _cb, _f32, _group_scale_shapes, _required,
                   _writable, group_gemm_mxfp4_prepack)


def _ceil(a, b):
    return -(-a // b) * b


def _dense_scale_shapes(R, cols, blocked):
    """The index shapes of one stored R x cols scale matrix: [R, cols] (row_major) or the padded
    [Rp, Cp] (blocked128x4), each also with a leading batch of 1."""
    if blocked:
        R, cols = _ceil(R, 128), _ceil(cols, 4)
    return {(R, cols): (0, 1), (1, R, cols): (0, 1, 2)}


def _bias(bias, be: Backend, op):
    """(array view, dtype) of the optional bias for _C (float32 when absent)."""
    if bias is None:
        return None, _C.DType.float32
    bias = as_array(bias, op, "bias")
    return c_view(bias, op, "bias")


def _out(out, be: Backend, M, b, b_packed, n, out_dtype, op):
    """The output [M, N] (allocated when `out` is None): N from b [N, K/2], or `n` with b_packed."""
    if out is not None:
        return out
    if b_packed:
        if n is None:
            raise ValueError(f"{op}: argument 'n': is required with b_packed=True when out is not given")
        N = check_int(n, op, "n", 0)
    else:
        if not hasattr(b, "shape") or len(b.shape) != 2:
            raise ValueError(f"{op}: argument 'b': expected [N, K/2], got {getattr(b, 'shape', type(b).__name__)}")
        N = int(b.shape[0])
        if n is not None and check_int(n, op, "n", 0) != N:
            raise ValueError(f"{op}: argument 'n': n = {n} does not match b's N = {N}")
    return be.empty((M, N), dtype_name(out_dtype, op, "out_dtype"))


def _weight_codes(b, b_scale, op):
    """b [N, K/2] as bytes, b_scale present: the argument checks of the two prepack calls."""
    _required(b, op, "b")
    _required(b_scale, op, "b_scale")
    b = _bytes(b, op, "b")
    if b.ndim != 2:
        raise ValueError(f"{op}: argument 'b': expected [N, K/2], got shape {tuple(b.shape)}")
    return b


def mxfp4_gemm_prepack(b, b_scale, *, b_scale_layout: str = "row_major"):
    """Prepares dense MXFP4 weights once (load time) for ``mxfp4_gemm(..., b_packed=True)``:
    b [N, K/2] and b_scale (UE8M0 N x K/32, "row_major" or "blocked128x4") -> (packed_b uint8
    [Np, Kp/2], packed_scale uint8 [Np, Kp/32]) with Np = N rounded up to 128 and Kp = K rounded
    up to 256 (group_gemm_mxfp4_prepack of one group; lossless), on b's device."""
    op = "mxfp4_gemm_prepack"
    b = _weight_codes(b, b_scale, op)
    pb, ps = group_gemm_mxfp4_prepack(b[None], b_scale, b_scale_layout=b_scale_layout)
    return pb[0], ps[0]


def mxfp4_gemm(a, b, b_scale, *, a_scale=None, bias=None, a_scale_layout: str = "row_major",
               b_scale_layout: str = "row_major", b_packed: bool = False, n: int | None = None, out=None,
               out_dtype="bfloat16"):
    """Dense MXFP4 linear::

        C[m, n] = sum_k A[m, k] * B[n, k]  (+ bias[n])

    B [N, K/2] is MXFP4 (E2M1 codes, element 2k in the low nibble; uint8 / float4_e2m1fn_x2) with
    ``b_scale`` UE8M0 per 32 K-elements (N x K/32, "row_major" or "blocked128x4"); decoded
    code * 2^(scale - 127). A [M, K] is bfloat16 (W4A16, no ``a_scale``) or MXFP8 (W4A8:
    float8_e4m3fn / float8_e5m2 codes with ``a_scale`` UE8M0 M x K/32 in ``a_scale_layout``).
    Sums in fp32 (the CPU reference: fp64, rounded once to fp32), + bias (float32 / bfloat16 /
    float16 [N]) in fp32, C rounded to ``out_dtype`` (bfloat16 or float16). K % 32 == 0,
    N % 8 == 0, any M. ``b_packed=True``: b / b_scale come from mxfp4_gemm_prepack (or
    group_gemm_mxfp4_prepack of one group) and N is ``out.shape[1]`` or ``n``. Scales of their
    stored shape in another memory order are copied to row-major order first. CUDA tensors run
    the grouped MXFP4 GEMM's sm_90a kernel with one group (no host synchronisation; CUDA-graph
    safe). Returns C [M, N]."""
    op = "mxfp4_gemm"
    for arg, v in (("a", a), ("b", b), ("b_scale", b_scale)):
        _required(v, op, arg)
    _writable(out, op)
    a = as_array(a, op, "a", float_default=False)
    be = Backend(a, op, "a")
    if a.ndim != 2:
        raise ValueError(f"{op}: argument 'a': expected [M, K], got shape {tuple(a.shape)}")
    for arg, v in (("b", b), ("b_scale", b_scale), ("a_scale", a_scale), ("bias", bias), ("out", out)):
        same_backend(a, v, op, arg)
    av, adt = c_view(a, op, "a")
    M, K = int(a.shape[0]), int(a.shape[1])
    out = _out(out, be, M, b, b_packed, n, out_dtype, op)
    ov, odt = c_view(out, op, "out")
    akind = _choice(a_scale_layout, _KINDS, "a_scale_layout", op)
    bkind = _choice(b_scale_layout, _KINDS, "b_scale_layout", op)
    a_shapes = _group_scale_shapes(1, M, K, akind == _KINDS["blocked128x4"]) if K % 32 == 0 else None
    b_shapes = None
    if not b_packed and hasattr(b, "shape") and len(b.shape) == 2 and K % 32 == 0:
        b_shapes = _group_scale_shapes(1, int(b.shape[0]), K, bkind == _KINDS["blocked128x4"])
    bv, bdt = _bias(bias, be, op)
    with be.guard():
        # a_scale is passed whatever a's dtype: bf16 activations with scales are refused, not ignored
        _C.mxfp4_gemm(av, adt, None if a_scale is None else _cb(a_scale, op, "a_scale", a_shapes), akind,
                      _cb(b, op, "b"), _cb(b_scale, op, "b_scale", b_shapes), bkind, bv, bdt, ov, odt,
                      b_packed=bool(b_packed), stream=be.stream())
    return out


def nvfp4_gemm_prepack(b, b_scale, *, b_scale_layout: str = "row_major"):
    """Prepares dense NVFP4 weights once (load time) for ``nvfp4_gemm(..., b_packed=True)``:
    b [N, K/2] (E2M1 codes) and b_scale (E4M3 N x K/16, "row_major" or "blocked128x4") -> packed
    uint8 [nvfp4_gemm_packed_bytes(N, K)] on b's device: 64 x 64 chunks of the CUDA kernel's
    fragments and scales (N % 128 == 0, K % 64 == 0). CPU and CUDA give the same bytes; lossless
    (a call with them gives the bits of the call without)."""
    op = "nvfp4_gemm_prepack"
    b = _weight_codes(b, b_scale, op)
    be = Backend(b, op, "b")
    same_backend(b, b_scale, op, "b_scale")
    N, K = int(b.shape[0]), 2 * int(b.shape[1])
    kind = _choice(b_scale_layout, _KINDS, "b_scale_layout", op)
    shapes = _dense_scale_shapes(N, K // 16, kind == _KINDS["blocked128x4"]) if K % 16 == 0 else None
    if N < 1 or N % 128 or K < 1 or K % 64:  # as the C++ check, before the packed size is asked for
        raise ValueError(f"{op}: argument 'b': prepacked NVFP4 weights need N a positive multiple of 128 and K of 64 "
                         f"(the CUDA kernel's tiles), got N = {N}, K = {K}")
    packed = be.empty((_C.nvfp4_gemm_packed_bytes(N, K),), "uint8")
    with be.guard():
        _C.nvfp4_gemm_prepack(c_export(b), _cb(b_scale, op, "b_scale", shapes), kind, c_view(packed, op, "packed")[0],
                              stream=be.stream())
    return packed


def nvfp4_gemm(a, b, b_scale, *, a_scale=None, amax_a=None, amax_b=None, bias=None,
               a_scale_layout: str = "row_major", b_scale_layout: str = "row_major", b_packed: bool = False,
               n: int | None = None, out=None, out_dtype="bfloat16"):
    """Dense NVFP4 linear::

        C[m, n] = (sum_k A[m, k] * B[n, k]) * sa * sb  (+ bias[n])

    B [N, K/2] is NVFP4 (E2M1 codes, element 2k in the low nibble) with ``b_scale`` E4M3 per 16
    K-elements (N x K/16, "row_major" or "blocked128x4"); sb = 1 / (448 * 6 / amax_b) when the
    per-tensor ``amax_b`` (float32 [1], as quantize(compute_global_amax=True) writes it) is given,
    else 1. A is bfloat16 [M, K] (W4A16, sa = 1) or NVFP4 codes [M, K/2] with ``a_scale`` E4M3
    M x K/16 and optional ``amax_a`` (sa likewise). Dot products in fp64 rounded once to fp32,
    times sa * sb, + bias in fp32, C rounded to ``out_dtype`` (bfloat16 or float16).
    K % 16 == 0, N >= 1, any M. ``b_packed=True``: b is nvfp4_gemm_prepack's output, ``b_scale``
    None, N is ``out.shape[1]`` or ``n``. CUDA tensors run the sm_90a kernel (N % 128 == 0,
    K % 64 == 0; other shapes raise NotImplementedError naming the constraint; no host
    synchronisation, CUDA-graph safe). Returns C [M, N]."""
    op = "nvfp4_gemm"
    for arg, v in (("a", a), ("b", b)) + ((("b_scale", b_scale),) if not b_packed else ()):
        _required(v, op, arg)
    if b_packed and b_scale is not None:
        raise ValueError(f"{op}: argument 'b_scale': must be None with b_packed=True (the packed weights hold the scales)")
    _writable(out, op)
    a = as_array(a, op, "a", float_default=False)
    be = Backend(a, op, "a")
    if a.ndim != 2:
        raise ValueError(f"{op}: argument 'a': expected [M, K] (bfloat16) or [M, K/2] (NVFP4 codes), "
                         f"got shape {tuple(a.shape)}")
    for arg, v in (("b", b), ("b_scale", b_scale), ("a_scale", a_scale), ("amax_a", amax_a), ("amax_b", amax_b),
                   ("bias", bias), ("out", out)):
        same_backend(a, v, op, arg)
    bf16 = dtype_name(a.dtype, op, "a") == "bfloat16"
    if bf16:
        av, adt = c_view(a, op, "a")
    else:
        if a.dtype.itemsize != 1:
            raise ValueError(f"{op}: argument 'a': expected bfloat16 activations or packed NVFP4 codes "
                             f"(uint8 / float4_e2m1fn_x2), got {a.dtype}")
        av, adt = c_export(_bytes(a, op, "a")), _C.DType.uint8
    M = int(a.shape[0])
    K = int(a.shape[1]) if bf16 else 2 * int(a.shape[1])
    out = _out(out, be, M, b, b_packed, n, out_dtype, op)
    ov, odt = c_view(out, op, "out")
    akind = _choice(a_scale_layout, _KINDS, "a_scale_layout", op)
    bkind = _choice(b_scale_layout, _KINDS, "b_scale_layout", op)
    a_shapes = _dense_scale_shapes(M, K // 16, akind == _KINDS["blocked128x4"]) if K % 16 == 0 else None
    b_shapes = None
    if not b_packed and hasattr(b, "shape") and len(b.shape) == 2 and K % 16 == 0:
        b_shapes = _dense_scale_shapes(int(b.shape[0]), K // 16, bkind == _KINDS["blocked128x4"])
    bv, bdt = _bias(bias, be, op)
    with be.guard():
        _C.nvfp4_gemm(av, adt, None if a_scale is None else _cb(a_scale, op, "a_scale", a_shapes), akind,
                      _f32(amax_a, be, op, "amax_a"), _cb(b, op, "b"),
                      None if b_scale is None else _cb(b_scale, op, "b_scale", b_shapes), bkind,
                      _f32(amax_b, be, op, "amax_b"), bv, bdt, ov, odt, b_packed=bool(b_packed), stream=be.stream())
    return out


__all__ = ["mxfp4_gemm", "mxfp4_gemm_prepack", "nvfp4_gemm", "nvfp4_gemm_prepack", "MXFP4_PACK_ROWS", "MXFP4_PACK_K"]
