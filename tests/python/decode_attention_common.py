"""Shared pieces of the NF4 K-cache decode attention tests (test_decode_attention.py on the CPU,
test_decode_attention_gpu.py on the GPU): an independent NumPy implementation of
docs/decode_attention.md (its own NF4 table and nibble unpacking, ml_dtypes FP8 decoding, fp64
scores, block maxima, threshold and keep rule, one softmax over the kept tokens) and the input
generator (the cache made by lowbit.nf4_kcache_quantize)."""

import math

import ml_dtypes
import numpy as np

import lowbit

BF16 = ml_dtypes.bfloat16

# bitsandbytes' NF4 code values (code 0 .. 15), as fp32
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)


def np_keys(k_nf4, k_scale, k_residual):
    """fp64 keys [B, T, H_kv, D] of the cache: fp32 nf4 * scale (+ residual), low nibble first."""
    c = np.asarray(k_nf4).view(np.uint8)
    codes = np.stack([c & 0xF, c >> 4], axis=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],))
    s = np.asarray(k_scale).astype(np.float32)[:, None]  # [B, 1, H_kv, D]
    k = NF4[codes] * s
    if k_residual is not None:
        k = (k + np.asarray(k_residual).astype(np.float32)).astype(np.float32)
    return k.astype(np.float64)


def np_decode(q, k_nf4, k_scale, k_residual, v, seq_lens=None, block_size=64, delta=math.inf, threshold=None,
              softmax_scale=None, v_scale=None):
    """(out [B, H_q, Dv] fp64, skip_ratio [B, H_kv]) by the rules of docs/decode_attention.md
    (FP8 v: the codes' values times v_scale [B, H_kv, Dv], in fp64)."""
    q = np.asarray(q).astype(np.float64)[:, 0]  # [B, H_q, D]
    K = np_keys(k_nf4, k_scale, k_residual)
    V = np.asarray(v).astype(np.float64)
    if v_scale is not None:
        V = V * np.asarray(v_scale).astype(np.float64)[:, None]
    B, H, D = q.shape
    T, HK, DV = K.shape[1], K.shape[2], V.shape[3]
    G = H // HK
    scale = 1 / math.sqrt(D) if softmax_scale is None else float(np.float32(softmax_scale))
    out = np.zeros((B, H, DV))
    ratio = np.zeros((B, HK))
    for b in range(B):
        L = T if seq_lens is None else int(seq_lens[b])
        n = -(-L // block_size)
        for g in range(HK):
            s = scale * np.einsum("hd,td->ht", q[b, g * G:(g + 1) * G], K[b, :L, g])  # [G, L]
            M = np.array([[np.nan if np.isnan(s[i, j * block_size:(j + 1) * block_size]).any()
                           else s[i, j * block_size:(j + 1) * block_size].max() for j in range(n)] for i in range(G)])
            if threshold is not None:
                thr = np.asarray(threshold, dtype=np.float64)[b, g * G:(g + 1) * G]
            else:
                with np.errstate(invalid="ignore"):
                    first_last = np.where(np.isnan(M[:, 0]) | np.isnan(M[:, -1]), np.nan, np.maximum(M[:, 0], M[:, -1]))
                    thr = first_last - delta
            with np.errstate(invalid="ignore"):
                below = (M < thr[:, None]).all(axis=0)
            below[0] = below[-1] = False
            ratio[b, g] = below.sum() / n
            keep = np.repeat(~below, block_size)[:L]
            for i in range(G):
                si = s[i, keep]
                if not np.isfinite(si).all():
                    out[b, g * G + i] = np.nan
                    continue
                p = np.exp(si - si.max())
                out[b, g * G + i] = (p[:, None] * V[b, :L, g][keep]).sum(0) / p.sum()
    return out, ratio


def assert_bf16_close(out, ref):
    """out (bfloat16) within one bf16 ulp of the fp64 reference; NaN exactly where ref is NaN."""
    o = np.asarray(out).astype(np.float64)
    assert o.shape == ref.shape
    assert np.array_equal(np.isnan(o), np.isnan(ref))
    fin = np.isfinite(ref)
    ulp = np.ldexp(1.0, (np.floor(np.log2(np.maximum(np.abs(ref[fin]), 2.0 ** -126))) - 7).astype(np.int32))
    bad = np.abs(o[fin] - ref[fin]) > ulp
    assert not bad.any(), f"{bad.sum()} elements beyond one bf16 ulp; max err {np.abs(o[fin] - ref[fin]).max()}"


def make_v8(B, T, HK, DV, seed, dtype="float8_e4m3fn"):
    """An FP8 V cache (NumPy): codes of N(0, 1) values and per-(b, h, channel) float32 scales, a
    third of them not powers of two, the rest 2^-3 .. 2^3."""
    rng = np.random.default_rng(seed)
    codes = rng.standard_normal((B, T, HK, DV)).astype(np.float32).astype(getattr(ml_dtypes, dtype))
    i = np.arange(B * HK * DV).reshape(B, HK, DV)
    scale = np.where(i % 3 == 0, 0.37 + 0.01 * (i % 7), np.ldexp(1.0, i % 7 - 3)).astype(np.float32)
    return codes, scale


def make_cache(B, T, H, HK, D, DV, seed, residual_dtype="float8_e5m2", sinks=False):
    """q [B, 1, H, D] bf16, the cache of N(0, 1) keys, v [B, T, HK, DV] bf16 (NumPy). ``sinks``:
    the keys of every token but the first and the last 8 are scaled by 1/10, so that pruning has
    middle blocks to skip."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, HK, D)).astype(np.float32)
    if sinks:
        k[:, 8:T - 8] *= np.float32(0.1)
    k_nf4, k_scale, k_res = lowbit.nf4_kcache_quantize(k, residual_dtype)
    q = rng.standard_normal((B, 1, H, D)).astype(BF16)
    v = rng.standard_normal((B, T, HK, DV)).astype(BF16)
    return q, k_nf4, k_scale, k_res, v


# The FP8 V cache (lowbit/vcache.hpp), independently: np.frexp for the power-of-two scale,
# ml_dtypes for the FP8 rounding.
FP8 = {"float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0), "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def np_scale(amax, fmax):
    """The smallest 2^e (e >= -149) with amax <= fmax * 2^e; 0 where amax == 0 (float64 math)."""
    a = np.asarray(amax, np.float64)
    _, e = np.frexp(a / fmax)  # a / fmax = m * 2^e, m in [0.5, 1): 2^e >= a / fmax > 2^(e-1)
    e = np.where(np.ldexp(1.0, e - 1) * fmax >= a, e - 1, e)  # a / fmax an exact power of two
    s = np.ldexp(1.0, np.maximum(e, -149))
    return np.where(a > 0, s, 0.0).astype(np.float32)


def np_quantize(v, dtype):
    """(codes, scale) by the rules of lowbit/vcache.hpp, in NumPy."""
    ft, fmax = FP8[dtype]
    x = np.asarray(v).astype(np.float32)
    fin = np.where(np.isfinite(x), np.abs(x), 0)
    scale = np_scale(fin.max(axis=1), fmax)  # [B, H, D]
    s = scale[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        val = np.where(s == 0, x * np.float32(0), x / np.where(s == 0, 1, s)).astype(np.float32)
    return val.astype(ft), scale


def same_codes(a, b):
    """Byte-equal codes, NaN codes compared as NaN (the sign of a NaN code is not specified)."""
    fa, fb = np.asarray(a).astype(np.float32), np.asarray(b).astype(np.float32)
    nan = np.isnan(fa)
    return np.array_equal(nan, np.isnan(fb)) and np.array_equal(np.asarray(a).view(np.uint8)[~nan],
                                                                np.asarray(b).view(np.uint8)[~nan])
