"""Block-scaled FP8 (MXFP8) flash attention (C++: include/lowbit/attention.hpp; docs/attention.md).

Every element of Q, K and V is an E4M3 code times the UE8M0 scale of its 32 head-dimension
channels::

    q[b, i, h, c] = e4m3(q code) * 2^(q_scale[b, h, i, c // 32] - 127)        (k, v likewise)
    S[i, j] = softmax_scale * sum_c q[i, c] k[j, c]
    out[i]  = sum_j softmax(S[i, :])_j v[j],      lse[i] = log(sum_j exp(S[i, j]))   (natural log)

torch CUDA tensors run the sm_90a kernel on the current stream (no host synchronisation: CUDA
graph safe); NumPy arrays (and CPU tensors) run the CPU reference (exact dequantization, fp64
attention, out rounded to bfloat16). ``precision="fp8"`` (opt-in) selects the FP8 tensor-core
path on CUDA (QK^T and PV on FP8 wgmma, scales folded into re-rounded E4M3 operands, P in E4M3;
within FlashAttention-3's FP8 accuracy rule) and its arithmetic model on the CPU; the default
``"exact"`` keeps both products exact up to P's bf16 rounding (docs/attention.md, "Precision"). ``quantize_mxfp8_attn`` turns float32 / float16 / bfloat16
Q, K or V into these codes and scales (on CUDA with the device quantize kernel).
"""

from __future__ import annotations

import math

import numpy as np

from . import _C
from ._arrays import Backend, as_array, c_view, check_float, check_int, dtype_name, is_torch, same_backend
from .ops import _entry_format, _quantize

__all__ = ["flash_attn_mxfp8_func", "flash_attn_mxfp8_varlen_func", "quantize_mxfp8_attn", "flash_attn_mxfp8_quantized"]

_CODE_DTYPES = ("float8_e4m3fn", "uint8")
_SCALE_DTYPES = ("float8_e8m0fnu", "uint8")
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_LAYOUTS = ("bshd", "bhsd", "thd")
_PRECISIONS = ("exact", "fp8")


def _fail(op, arg, what):
    raise ValueError(f"{op}: argument '{arg}': {what}")


def _operand(a, op: str, arg: str, allowed, ndim: int | None = None):
    """`a` as a NumPy array or torch tensor of one of the `allowed` dtypes (and rank `ndim`)."""
    if a is None:
        _fail(op, arg, "is required")
    a = as_array(a, op, arg, float_default=False)
    name = dtype_name(a.dtype, op, arg)
    if name not in allowed:
        hint = ""
        if name in _FLOAT_DTYPES and allowed is _CODE_DTYPES:
            hint = " (quantize float inputs with lowbit.quantize_mxfp8_attn first)"
        _fail(op, arg, f"expected dtype {' or '.join(allowed)}, got {name}{hint}")
    if ndim is not None and a.ndim != ndim:
        _fail(op, arg, f"expected a {ndim}-D array, got shape {tuple(int(s) for s in a.shape)}")
    return a


def _precision(op, precision):
    """The _C.AttnPrecision of a precision string ("exact" or "fp8")."""
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        _fail(op, "precision", f"expected one of {', '.join(repr(v) for v in _PRECISIONS)}, got {precision!r}")
    return _C.AttnPrecision.fp8 if precision == "fp8" else _C.AttnPrecision.exact


def _common(op, q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, ndim):
    q = _operand(q, op, "q", _CODE_DTYPES, ndim)
    k = _operand(k, op, "k", _CODE_DTYPES)
    v = _operand(v, op, "v", _CODE_DTYPES)
    qs = _operand(q_scale, op, "q_scale", _SCALE_DTYPES)
    ks = _operand(k_scale, op, "k_scale", _SCALE_DTYPES)
    vs = _operand(v_scale, op, "v_scale", _SCALE_DTYPES)
    for arg, a in (("k", k), ("v", v), ("q_scale", qs), ("k_scale", ks), ("v_scale", vs)):
        same_backend(q, a, op, arg)
    if softmax_scale is None:
        scale = math.nan
    else:
        scale = check_float(softmax_scale, op, "softmax_scale")
        if not (math.isfinite(scale) and scale > 0):
            _fail(op, "softmax_scale", f"expected a finite value > 0 (or None for 1/sqrt(d)), got {softmax_scale!r}")
    if not isinstance(causal, (bool, np.bool_)):
        _fail(op, "causal", f"expected a bool, got {causal!r}")
    return q, k, v, qs, ks, vs, scale, bool(causal)


def _views(op, *named):
    out = []
    for arg, a in named:
        out.extend(c_view(a, op, arg))
    return out


def flash_attn_mxfp8_func(q, k, v, q_scale, k_scale, v_scale, softmax_scale=None, causal: bool = False,
                          precision: str = "exact"):
    """MXFP8 flash-attention forward. Returns ``(out, lse)``.

    q: [b, s_q, h, d], k and v: [b, s_k, h_kv, d] E4M3 codes (float8_e4m3fn or uint8; d
    contiguous, other strides free); q_scale: [b, h, s_q, d/32], k_scale and v_scale:
    [b, h_kv, s_k, d/32] UE8M0 bytes (float8_e8m0fnu or uint8; 255 = NaN). d in {64, 128, 256};
    h % h_kv == 0 (query head h reads KV head h // (h // h_kv)); any s_q, s_k >= 1.

    ``out[b, i, h] = sum_j softmax_j(S) v[j]`` with ``S[i, j] = softmax_scale * q[i] . k[j]``
    (softmax_scale None: 1/sqrt(d)); out [b, s_q, h, d] bfloat16, lse [b, h, s_q] float32
    (natural log of sum_j exp(S[i, j])). ``causal``: key j visible to query i when
    j <= i + s_k - s_q (bottom-right aligned); a row that sees no key gets out 0, lse -inf.
    NaN: see docs/attention.md.

    ``precision``: "exact" (default; CUDA: bf16 tensor cores on exactly scaled operands, P in
    bf16; CPU: the fp64 reference) or "fp8" (CUDA: QK^T and PV on FP8 tensor cores, every block
    scale folded into E4M3 operands against the head's largest scale of each 32-channel block,
    P rounded to E4M3 after scaling by 2^8; CPU: the model of that arithmetic). The FP8 path
    meets FlashAttention-3's accuracy rule for its FP8 forward (docs/attention.md)."""
    op = "flash_attn_mxfp8"
    q, k, v, qs, ks, vs, scale, causal = _common(op, q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, 4)
    prec = _precision(op, precision)
    b, s_q, h, d = (int(s) for s in q.shape)
    be = Backend(q, op, "q")
    out = be.empty((b, s_q, h, d), "bfloat16")
    lse = be.empty((b, h, s_q), "float32")
    args = _views(op, ("q", q), ("k", k), ("v", v), ("q_scale", qs), ("k_scale", ks), ("v_scale", vs))
    with be.guard():
        _C.flash_attn_mxfp8(*args, c_view(out, op, "out")[0], c_view(lse, op, "lse")[0], scale, causal, prec,
                            be.stream())
    return out, lse


def _seqlens(be: Backend, a, op: str, arg: str):
    if a is None:
        _fail(op, arg, "is required")
    if isinstance(a, (list, tuple)):
        return be.index_values(a, op, arg, "int32", -(1 << 31), (1 << 31) - 1)
    if not (isinstance(a, np.ndarray) or is_torch(a)):
        _fail(op, arg, f"expected an int32 array or a list of integers, got {type(a).__name__}")
    return a


def flash_attn_mxfp8_varlen_func(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                                 max_seqlen_k: int, softmax_scale=None, causal: bool = False, precision: str = "exact"):
    """Varlen MXFP8 flash-attention forward (FlashAttention's packed convention). Returns
    ``(out, lse)``.

    q: [total_q, h, d], k and v: [total_k, h_kv, d] E4M3 codes; q_scale: [h, total_q, d/32],
    k_scale and v_scale: [h_kv, total_k, d/32] UE8M0; cu_seqlens_q / cu_seqlens_k: int32
    [batch + 1] boundaries (0, non-decreasing, last = total; on the tensors' device; a list is
    converted); sequence b holds rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q.
    max_seqlen_q / max_seqlen_k (>= 1) size the CUDA grid (a longer sequence is still computed in
    full). out [total_q, h, d] bfloat16, lse [h, total_q] float32; the formula, the causal
    rule and ``precision`` of flash_attn_mxfp8_func apply per sequence."""
    op = "flash_attn_mxfp8_varlen"
    q, k, v, qs, ks, vs, scale, causal = _common(op, q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, 3)
    prec = _precision(op, precision)
    total_q, h, d = (int(s) for s in q.shape)
    be = Backend(q, op, "q")
    cq = _seqlens(be, cu_seqlens_q, op, "cu_seqlens_q")
    ck = _seqlens(be, cu_seqlens_k, op, "cu_seqlens_k")
    same_backend(q, cq, op, "cu_seqlens_q")
    same_backend(q, ck, op, "cu_seqlens_k")
    mq = check_int(max_seqlen_q, op, "max_seqlen_q")
    mk = check_int(max_seqlen_k, op, "max_seqlen_k")
    out = be.empty((total_q, h, d), "bfloat16")
    lse = be.empty((h, total_q), "float32")
    args = _views(op, ("q", q), ("k", k), ("v", v), ("q_scale", qs), ("k_scale", ks), ("v_scale", vs))
    with be.guard():
        _C.flash_attn_mxfp8_varlen(*args, c_view(cq, op, "cu_seqlens_q")[0], c_view(ck, op, "cu_seqlens_k")[0], mq, mk,
                                   c_view(out, op, "out")[0], c_view(lse, op, "lse")[0], scale, causal, prec,
                                   be.stream())
    return out, lse


def quantize_mxfp8_attn(x, *, layout: str = "bshd", rounding: str = "rceil"):
    """MXFP8 (E4M3, UE8M0 scale per 32 channels of the last dimension) codes and scales of an
    attention operand, in the layouts flash_attn_mxfp8_func takes. Returns ``(codes, scales)``.

    x: float32 / float16 / bfloat16, d = x.shape[-1] a multiple of 32. ``layout``:
      "bshd": x [b, s, h, d] -> codes [b, s, h, d], scales [b, h, s, d/32];
      "bhsd": x [b, h, s, d] (torch SDPA's layout) -> codes: a [b, s, h, d] view of the
        [b, h, s, d] storage (the attention takes any strides but d's), scales [b, h, s, d/32];
      "thd":  x [total, h, d] (varlen) -> codes [total, h, d], scales [h, total, d/32].
    Per block: s = 2^ceil(log2(amax / 448)) (``rounding="rceil"``, the default) or
    2^(floor(log2 amax) - 8) ("floor"); code = e4m3_satfinite(x / s); a block holding NaN / Inf
    gets scale 255 (NaN). CUDA tensors run the device quantize kernel (the scales are then
    reordered on the device; no host copy)."""
    op = "quantize_mxfp8_attn"
    if x is None:
        _fail(op, "x", "is required")
    x = as_array(x, op, "x")
    if layout not in _LAYOUTS:
        _fail(op, "layout", f"expected one of {', '.join(repr(v) for v in _LAYOUTS)}, got {layout!r}")
    name = dtype_name(x.dtype, op, "x")
    if name not in _FLOAT_DTYPES:
        _fail(op, "x", f"expected dtype float32, float16 or bfloat16, got {name}")
    want = 3 if layout == "thd" else 4
    if x.ndim != want:
        shape = {"bshd": "[b, s, h, d]", "bhsd": "[b, h, s, d]", "thd": "[total, h, d]"}[layout]
        _fail(op, "x", f"expected a {want}-D {shape} array for layout {layout!r}, got shape {tuple(int(s) for s in x.shape)}")
    dims = tuple(int(s) for s in x.shape)
    d = dims[-1]
    if d % 32 or d == 0:
        _fail(op, "x", f"the head dim d = {d} must be a positive multiple of 32")
    f = _entry_format("mxfp8_e4m3", "rounding", rounding)
    rows = 1
    for s in dims[:-1]:
        rows *= s
    x2 = x.reshape(rows, d)  # a view of contiguous inputs, a copy otherwise
    codes, scales, _, _, _ = _quantize(x2, f, "row_major")
    codes = codes.reshape(dims)
    torch_in = is_torch(codes)
    if layout == "bshd":
        b, s, h, _ = dims
        scales = scales.reshape(b, s, h, d // 32)
        scales = scales.permute(0, 2, 1, 3).contiguous() if torch_in else np.ascontiguousarray(scales.transpose(0, 2, 1, 3))
    elif layout == "bhsd":
        b, h, s, _ = dims
        codes = codes.permute(0, 2, 1, 3) if torch_in else codes.transpose(0, 2, 1, 3)
        scales = scales.reshape(b, h, s, d // 32)
    else:
        t, h, _ = dims
        scales = scales.reshape(t, h, d // 32)
        scales = scales.permute(1, 0, 2).contiguous() if torch_in else np.ascontiguousarray(scales.transpose(1, 0, 2))
    return codes, scales


def flash_attn_mxfp8_quantized(q, k, v, softmax_scale=None, causal: bool = False, *, layout: str = "bshd",
                               rounding: str = "rceil", precision: str = "exact"):
    """Attention of float32 / float16 / bfloat16 q, k, v in one call: each quantized with
    quantize_mxfp8_attn (``layout`` "bshd" or "bhsd"; for varlen inputs call quantize_mxfp8_attn
    with layout="thd" and flash_attn_mxfp8_varlen_func), then flash_attn_mxfp8_func (``precision``
    as there). Returns ``(out, lse)`` with out [b, s_q, h, d] bfloat16 (for "bhsd" inputs too) and
    lse [b, h, s_q]."""
    op = "flash_attn_mxfp8_quantized"
    if layout not in ("bshd", "bhsd"):
        _fail(op, "layout", f"expected 'bshd' or 'bhsd', got {layout!r}")
    _precision(op, precision)
    qc, qs = quantize_mxfp8_attn(q, layout=layout, rounding=rounding)
    kc, ks = quantize_mxfp8_attn(k, layout=layout, rounding=rounding)
    vc, vs = quantize_mxfp8_attn(v, layout=layout, rounding=rounding)
    return flash_attn_mxfp8_func(qc, kc, vc, qs, ks, vs, softmax_scale, causal, precision)
