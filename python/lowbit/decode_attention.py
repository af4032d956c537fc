"""Decode attention over an NF4 + FP8-residual K cache, with threshold block pruning
(C++: include/lowbit/decode_attention.hpp; docs/decode_attention.md).

The cache (the layout of lowbit.nf4_kcache_quantize)::

    k_nf4      [B, T, H_kv, D/2] uint8   two NF4 codes per byte along D (element 2i in the low nibble)
    k_scale    [B, H_kv, D]      float32 one scale per channel, shared by every token
    k_residual [B, T, H_kv, D]   float8_e5m2 / float8_e4m3fn
    key        k[b, t, h, c] = nf4[code] * k_scale[b, h, c] + k_residual[b, t, h, c]   (fp32)

NumPy arrays (and CPU tensors) run the CPU reference (fp64 scores and softmax, out rounded once to
bfloat16). torch CUDA tensors run the sm_90a kernels (a build without them raises
NotImplementedError; no silent fallback to the host).
"""

from __future__ import annotations

import math

import numpy as np

from . import _C
from ._arrays import Backend, as_array, c_view, check_float, check_int, dtype_name, is_torch, same_backend
from .ops import _nibbles

__all__ = ["attn_forward_decode_nf4", "kproj_rope_nf4_encode", "nf4_kcache_append", "fp8_vcache_quantize",
           "fp8_vcache_append"]

_RESIDUAL_DTYPES = ("float8_e5m2", "float8_e4m3fn")
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _fail(op, arg, what):
    raise ValueError(f"{op}: argument '{arg}': {what}")


def _arr(a, op, arg, allowed=None, ndim=None, float_default=False):
    if a is None:
        _fail(op, arg, "is required")
    a = as_array(a, op, arg, float_default=float_default)
    if allowed is not None:
        name = dtype_name(a.dtype, op, arg)
        if name not in allowed:
            _fail(op, arg, f"expected dtype {' or '.join(allowed)}, got {name}")
    if ndim is not None and a.ndim != ndim:
        _fail(op, arg, f"expected a {ndim}-D array, got shape {tuple(int(s) for s in a.shape)}")
    return a


def _lengths(be: Backend, a, op: str, arg: str):
    if isinstance(a, (list, tuple)):
        return be.index_values(a, op, arg, "int32", -(1 << 31), (1 << 31) - 1)
    if not (isinstance(a, np.ndarray) or is_torch(a)):
        _fail(op, arg, f"expected an int32 array or a list of integers, got {type(a).__name__}")
    return a


def _table(ref, block_table, op):
    """A paged cache's block table: int32 [B, max_pages] of ref's library (None: a dense cache)."""
    if block_table is None:
        return None
    t = _arr(block_table, op, "block_table", ("int32",), 2)
    same_backend(ref, t, op, "block_table")
    return t


def _bool(v, op, arg):
    if not isinstance(v, (bool, np.bool_)):
        _fail(op, arg, f"expected a bool, got {v!r}")
    return bool(v)


def attn_forward_decode_nf4(q, k_nf4, k_scale, k_residual, v, *, v_scale=None, seq_lens=None, block_table=None,
                            block_size: int = 64,
                            sub_block_size: int = 16, delta: float = 8.0, precomputed_threshold=None,
                            use_fp8_residual: bool = True, return_skip_ratio: bool = False, softmax_scale=None,
                            nibble_order: str = "low", out=None):
    """Decode attention (one query token per sequence) over the NF4 K cache, with block pruning.

    q [B, 1, H_q, D] bfloat16; k_nf4 / k_scale (float32 or bfloat16) / k_residual as in the module
    docstring (k_residual may be None when ``use_fp8_residual`` is False); v [B, T, H_kv, Dv]
    bfloat16, or an FP8 V cache: float8_e4m3fn / float8_e5m2 codes with ``v_scale`` float32
    [B, H_kv, Dv], v[t, c] = fp8(code) * v_scale[b, h, c] (``fp8_vcache_quantize`` /
    ``fp8_vcache_append`` write it); D, Dv in {64, 128, 256}; H_q % H_kv == 0 (query head h reads KV head
    h // (H_q // H_kv)). ``seq_lens``: int32 [B] (or a list), each in 1..T (default T).
    ``block_table``: a paged cache (vLLM / FlashAttention-3 block tables), int32 [B, max_pages]:
    k_nf4, k_residual and v are then [pages, page_size, H_kv, ...] (page_size a power of two),
    token t of sequence b is row t % page_size of page block_table[b, t // page_size], T =
    max_pages * page_size, and seq_lens is required (docs/decode_attention.md).

    With s[h, t] = softmax_scale * q[h] . k[t] (natural log units; softmax_scale None: 1/sqrt(D))
    and blocks of ``block_size`` tokens (the last one of a sequence possibly shorter):
    M[h, j] = max of s over block j (taken over sub-blocks of ``sub_block_size``);
    thr[h] = max(M[h, 0], M[h, last]) - delta, or ``precomputed_threshold[b, h]`` (float32
    [B, H_q]); a block other than the first and the last is skipped when M[h, j] < thr[h] for
    every query head h of its KV group. out[b, h] = softmax attention over the kept blocks'
    tokens (per-block m, l, o merged by log-sum-exp), [B, H_q, Dv] bfloat16. ``delta`` >= 0;
    math.inf turns pruning off. With ``return_skip_ratio`` returns ``(out, skip_ratio)``,
    skip_ratio [B, H_kv] float32 = skipped blocks / blocks of that sequence and KV head. ``out``: a preallocated
    [B, H_q, Dv] bfloat16 array of the inputs' library and device to write (returned)."""
    op = "attn_forward_decode_nf4"
    q = _arr(q, op, "q", ("bfloat16",), 4)
    k_nf4 = _arr(k_nf4, op, "k_nf4", ("uint8",), 4)
    k_scale = _arr(k_scale, op, "k_scale", ("float32", "bfloat16"), 3, float_default=True)
    use_res = _bool(use_fp8_residual, op, "use_fp8_residual")
    if k_residual is not None or use_res:
        k_residual = _arr(k_residual, op, "k_residual", _RESIDUAL_DTYPES, 4)
    v = _arr(v, op, "v", ("bfloat16",) + _RESIDUAL_DTYPES, 4)
    if dtype_name(v.dtype, op, "v") == "bfloat16":
        if v_scale is not None:
            _fail(op, "v_scale", "is only taken with FP8 v (float8_e4m3fn / float8_e5m2); v is bfloat16")
    else:
        v_scale = _arr(v_scale, op, "v_scale", ("float32",), 3, float_default=True)
    for arg, a in (("k_nf4", k_nf4), ("k_scale", k_scale), ("k_residual", k_residual), ("v", v), ("v_scale", v_scale)):
        same_backend(q, a, op, arg)
    be = Backend(q, op, "q")
    if seq_lens is not None:
        seq_lens = _lengths(be, seq_lens, op, "seq_lens")
        same_backend(q, seq_lens, op, "seq_lens")
    block_table = _table(q, block_table, op)
    if precomputed_threshold is not None:
        precomputed_threshold = _arr(precomputed_threshold, op, "precomputed_threshold", ("float32",), 2,
                                     float_default=True)
        same_backend(q, precomputed_threshold, op, "precomputed_threshold")
    bs = check_int(block_size, op, "block_size", 1)
    sbs = check_int(sub_block_size, op, "sub_block_size", 1)
    d = check_float(delta, op, "delta")
    if math.isnan(d) or d < 0:
        _fail(op, "delta", f"expected a value >= 0 (math.inf: no pruning), got {delta!r}")
    if softmax_scale is None:
        scale = math.nan
    else:
        scale = check_float(softmax_scale, op, "softmax_scale")
        if not (math.isfinite(scale) and scale > 0):
            _fail(op, "softmax_scale", f"expected a finite value > 0 (or None for 1/sqrt(D)), got {softmax_scale!r}")
    want_ratio = _bool(return_skip_ratio, op, "return_skip_ratio")
    b, h = int(q.shape[0]), int(q.shape[2])
    hk, dv = int(k_nf4.shape[2]), int(v.shape[3])
    if out is None:
        out = be.empty((b, h, dv), "bfloat16")
    else:
        out = _arr(out, op, "out", ("bfloat16",), 3)
        same_backend(q, out, op, "out")
    ratio = be.empty((b, hk), "float32") if want_ratio else None
    sv, sdt = c_view(k_scale, op, "k_scale")
    rv, rdt = (None, _C.DType.float8_e5m2) if k_residual is None else c_view(k_residual, op, "k_residual")
    vv, vdt = c_view(v, op, "v")
    with be.guard():
        _C.attn_forward_decode_nf4(
            c_view(q, op, "q")[0], c_view(k_nf4, op, "k_nf4")[0], sv, sdt, rv, rdt, vv, vdt,
            None if v_scale is None else c_view(v_scale, op, "v_scale")[0],
            None if seq_lens is None else c_view(seq_lens, op, "seq_lens")[0],
            None if block_table is None else c_view(block_table, op, "block_table")[0],
            None if precomputed_threshold is None else c_view(precomputed_threshold, op, "precomputed_threshold")[0],
            c_view(out, op, "out")[0], None if ratio is None else c_view(ratio, op, "skip_ratio")[0], bs, sbs, d,
            use_res, scale, _nibbles(nibble_order, op), be.stream())
    return (out, ratio) if want_ratio else out


def kproj_rope_nf4_encode(x, w_k, positions, *, head_dim: int, rope_theta: float = 10000.0,
                          residual_dtype="float8_e5m2", nibble_order: str = "low", return_k: bool = False):
    """Fused K projection + rotate-half (neox / llama) RoPE + NF4 / FP8-residual encode of a
    prefill. Returns ``(k_nf4, k_scale, k_residual)`` (and the rotated fp32 keys ``k`` [B, T,
    H_kv, D] last with ``return_k``).

    x [B, T, hidden] and w_k [H_kv * head_dim, hidden] (torch Linear weight layout) float32 /
    float16 / bfloat16; positions int32 / int64 [B, T] or [T] (shared by the batch), or a list.
    p = x @ w_k.T (fp64 sums rounded to fp32), per head; for c < D/2, f_c = rope_theta^(-2c/D),
    a = position * f_c: k[c] = p[c] cos a - p[c + D/2] sin a, k[c + D/2] = p[c + D/2] cos a +
    p[c] sin a (fp64, rounded to fp32). Then exactly lowbit.nf4_kcache_quantize(k): scale = finite
    amax over T per channel, codes two per byte along D, residual in ``residual_dtype``."""
    op = "kproj_rope_nf4_encode"
    x = _arr(x, op, "x", _FLOAT_DTYPES, 3, float_default=True)
    w_k = _arr(w_k, op, "w_k", _FLOAT_DTYPES, 2, float_default=True)
    same_backend(x, w_k, op, "w_k")
    hd = check_int(head_dim, op, "head_dim", 2)
    theta = check_float(rope_theta, op, "rope_theta")
    rname = dtype_name(residual_dtype, op, "residual_dtype")
    if rname not in _RESIDUAL_DTYPES:
        _fail(op, "residual_dtype", f"expected float8_e5m2 or float8_e4m3fn, got {rname}")
    want_k = _bool(return_k, op, "return_k")
    be = Backend(x, op, "x")
    b, t = int(x.shape[0]), int(x.shape[1])
    if isinstance(positions, (list, tuple)):
        positions = be.index_values(positions, op, "positions", "int64")
    elif not (isinstance(positions, np.ndarray) or is_torch(positions)):
        _fail(op, "positions", f"expected an int32 / int64 array or a list, got {type(positions).__name__}")
    same_backend(x, positions, op, "positions")
    if positions.ndim == 1:  # [T]: shared by every sequence (a broadcast view, stride 0)
        positions = positions.unsqueeze(0).expand(b, -1) if is_torch(positions) else np.broadcast_to(
            positions, (b,) + positions.shape)
    if hd % 2 or int(w_k.shape[0]) % hd:
        _fail(op, "head_dim", f"expected an even divisor of w_k's {int(w_k.shape[0])} rows, got {hd}")
    hk = int(w_k.shape[0]) // hd
    k_nf4 = be.empty((b, t, hk, hd // 2), "uint8")
    k_scale = be.empty((b, hk, hd), "float32")
    k_res = be.empty((b, t, hk, hd), rname)
    k = be.empty((b, t, hk, hd), "float32") if want_k else None
    xv, xdt = c_view(x, op, "x")
    wv, wdt = c_view(w_k, op, "w_k")
    rv, rdt = c_view(k_res, op, "k_residual")
    with be.guard():
        _C.kproj_rope_nf4_encode(xv, xdt, wv, wdt, c_view(positions, op, "positions")[0], hd,
                                 c_view(k_nf4, op, "k_nf4")[0], c_view(k_scale, op, "k_scale")[0], rv, rdt,
                                 None if k is None else c_view(k, op, "k_out")[0], theta, _nibbles(nibble_order, op),
                                 be.stream())
    return (k_nf4, k_scale, k_res, k) if want_k else (k_nf4, k_scale, k_res)


def nf4_kcache_append(k_new, k_nf4, k_scale, k_residual, lengths, *, block_table=None, nibble_order: str = "low") -> None:
    """Appends N new (already rotated) keys per sequence to the cache, in place.

    k_new [B, N, H_kv, D] float32 / float16 / bfloat16 becomes tokens lengths[b] .. lengths[b] + N
    - 1 (lengths: int32 [B] or a list, each in 0..T-N; the caller advances them afterwards).
    Per channel, a = finite amax of the new tokens: a <= k_scale keeps the scale and encodes the
    new tokens with it; a > k_scale rescales the channel: k_scale = a and every cached token
    t < lengths[b] is decoded (nf4 * scale + residual) and re-encoded with the new scale. The
    scale thus stays the finite amax of every token written (docs/decode_attention.md).
    ``block_table``: a paged cache (as attn_forward_decode_nf4's), its table holding the pages of
    the new tokens too."""
    op = "nf4_kcache_append"
    k_new = _arr(k_new, op, "k_new", _FLOAT_DTYPES, 4, float_default=True)
    k_nf4 = _arr(k_nf4, op, "k_nf4", ("uint8",), 4)
    k_scale = _arr(k_scale, op, "k_scale", ("float32",), 3)
    k_residual = _arr(k_residual, op, "k_residual", _RESIDUAL_DTYPES, 4)
    be = Backend(k_new, op, "k_new")
    lengths = _lengths(be, lengths, op, "lengths")
    for arg, a in (("k_nf4", k_nf4), ("k_scale", k_scale), ("k_residual", k_residual), ("lengths", lengths)):
        same_backend(k_new, a, op, arg)
    block_table = _table(k_new, block_table, op)
    kv, kdt = c_view(k_new, op, "k_new")
    rv, rdt = c_view(k_residual, op, "k_residual")
    with be.guard():
        _C.nf4_kcache_append(kv, kdt, c_view(k_nf4, op, "k_nf4")[0], c_view(k_scale, op, "k_scale")[0], rv, rdt,
                             c_view(lengths, op, "lengths")[0],
                             None if block_table is None else c_view(block_table, op, "block_table")[0],
                             _nibbles(nibble_order, op), be.stream())


def fp8_vcache_quantize(v, dtype="float8_e4m3fn"):
    """The FP8 V cache of ``v`` [B, T, H_kv, Dv] (float32 / float16 / bfloat16), as
    attn_forward_decode_nf4 reads it with ``v_scale``: returns ``(codes, scale)``, codes [B, T,
    H_kv, Dv] of ``dtype`` (float8_e4m3fn or float8_e5m2), scale [B, H_kv, Dv] float32. Per
    channel the scale is the smallest power of two 2^e with amax <= fmax * 2^e (0 for an all-zero
    channel; amax the finite amax over T, fmax 448 / 57344), and each code is fp8(v / scale),
    round to nearest even (values never overflow; NaN -> NaN; Inf -> Inf in E5M2, NaN in E4M3).
    torch CUDA tensors run the sm_90a kernels, bit for bit the CPU result."""
    op = "fp8_vcache_quantize"
    v = _arr(v, op, "v", _FLOAT_DTYPES, 4, float_default=True)
    name = dtype_name(dtype, op, "dtype")
    if name not in _RESIDUAL_DTYPES:
        _fail(op, "dtype", f"expected float8_e4m3fn or float8_e5m2, got {name}")
    be = Backend(v, op, "v")
    b, t, h, d = (int(x) for x in v.shape)
    codes = be.empty((b, t, h, d), name)
    scale = be.empty((b, h, d), "float32")
    vv, vdt = c_view(v, op, "v")
    cv, cdt = c_view(codes, op, "codes")
    with be.guard():
        _C.fp8_vcache_quantize(vv, vdt, cv, cdt, c_view(scale, op, "scale")[0], be.stream())
    return codes, scale


def fp8_vcache_append(v_new, codes, scale, lengths, *, block_table=None) -> None:
    """Appends N new values per sequence to the FP8 V cache (codes [B, T, H_kv, Dv], scale [B,
    H_kv, Dv] float32), in place: v_new [B, N, H_kv, Dv] (float32 / float16 / bfloat16) becomes
    tokens lengths[b] .. lengths[b] + N - 1 (lengths: int32 [B] or a list, each in 0..T-N).
    Per channel, a = finite amax of the new values: a <= fmax * scale keeps the scale; otherwise
    the scale becomes the power-of-two scale of a (as fp8_vcache_quantize) and every cached token
    t < lengths[b] is re-encoded from its value fp8(code) * old scale. A cache of zero scales
    and lengths becomes fp8_vcache_quantize of what is appended (docs/decode_attention.md).
    ``block_table``: a paged cache, codes [pages, page_size, H_kv, Dv] (as
    attn_forward_decode_nf4's)."""
    op = "fp8_vcache_append"
    v_new = _arr(v_new, op, "v_new", _FLOAT_DTYPES, 4, float_default=True)
    codes = _arr(codes, op, "codes", _RESIDUAL_DTYPES, 4)
    scale = _arr(scale, op, "scale", ("float32",), 3)
    be = Backend(v_new, op, "v_new")
    lengths = _lengths(be, lengths, op, "lengths")
    for arg, a in (("codes", codes), ("scale", scale), ("lengths", lengths)):
        same_backend(v_new, a, op, arg)
    block_table = _table(v_new, block_table, op)
    vv, vdt = c_view(v_new, op, "v_new")
    cv, cdt = c_view(codes, op, "codes")
    with be.guard():
        _C.fp8_vcache_append(vv, vdt, cv, cdt, c_view(scale, op, "scale")[0], c_view(lengths, op, "lengths")[0],
                             None if block_table is None else c_view(block_table, op, "block_table")[0], be.stream())
