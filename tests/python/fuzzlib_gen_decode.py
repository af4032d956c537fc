"""Generators of valid NF4 K-cache decode calls (fuzzlib.py): attn_forward_decode_nf4 on small
random caches (pruned or not, ragged lengths, GQA, a few NaN values), checked against the NumPy
implementation of decode_attention_common.py, kproj_rope_nf4_encode, checked against the
quantize of its own rotated keys and a NumPy projection + RoPE, and fp8_vcache_quantize, checked
bit for bit against the NumPy V-cache rule of decode_attention_common.py."""

from __future__ import annotations

import math

import numpy as np

from fuzzlib_checks import pick
from fuzzlib_core import BF16
from fuzzlib_gen_formats import _lb
from fuzzlib_specs import Spec
from decode_attention_common import make_v8, np_decode, np_quantize, same_codes


def _bf16_mismatch(out, ref):
    o = np.asarray(out).astype(np.float64)
    if o.shape != ref.shape:
        return f"shape {o.shape}, expected {ref.shape}"
    if not np.array_equal(np.isnan(o), np.isnan(ref)):
        return "NaN positions differ"
    fin = np.isfinite(ref)
    ulp = np.ldexp(1.0, (np.floor(np.log2(np.maximum(np.abs(ref[fin]), 2.0 ** -126))) - 7).astype(np.int32))
    return "out beyond one bf16 ulp of the reference" if (np.abs(o[fin] - ref[fin]) > ulp).any() else None


def gen_decode_attention(rng):
    """attn_forward_decode_nf4 with small random shapes and options."""
    lb = _lb()
    D, DV = int(pick(rng, [64, 128])), int(pick(rng, [64, 128]))
    HK = int(rng.integers(1, 3))
    H = HK * int(pick(rng, [1, 2, 4]))
    B, T = int(rng.integers(1, 3)), int(rng.integers(1, 70))
    bs = int(pick(rng, [4, 8, 16, 64]))
    sbs = int(pick(rng, [d for d in (1, 2, 4, 8, 16) if bs % d == 0]))
    delta = float(pick(rng, [math.inf, 0.0, 1.0, 3.0]))
    k = rng.standard_normal((B, T, HK, D)).astype(np.float32)
    k[:, 4:max(4, T - 4)] *= np.float32(0.1)  # prunable middle blocks
    rdt = pick(rng, ["float8_e5m2", "float8_e4m3fn"])
    c, s, r = lb.nf4_kcache_quantize(k, rdt)
    q = rng.standard_normal((B, 1, H, D)).astype(BF16)
    v = rng.standard_normal((B, T, HK, DV)).astype(BF16)
    if rng.random() < 0.15:
        v[int(rng.integers(B)), int(rng.integers(T)), int(rng.integers(HK)), int(rng.integers(DV))] = np.nan
    vs = None
    if rng.random() < 0.3:  # an FP8 V cache with per-channel scales
        v, vs = make_v8(B, T, HK, DV, int(rng.integers(1 << 30)), pick(rng, ["float8_e4m3fn", "float8_e5m2"]))
    lens = rng.integers(1, T + 1, B).astype(np.int32) if rng.random() < 0.5 else None
    use_res = bool(rng.random() < 0.8)
    ref, ratio = np_decode(q, c, s, r if use_res else None, v, lens, bs, delta, v_scale=vs)

    def check(res):
        out, sr = res
        bad = _bf16_mismatch(out, ref)
        if bad:
            return f"attn_forward_decode_nf4: {bad}"
        if not np.array_equal(np.asarray(sr), ratio.astype(np.float32)):
            return "attn_forward_decode_nf4: skip ratio differs from the reference"
        return None

    params = {"q": q, "k_nf4": c, "k_scale": s, "k_residual": r, "v": v, "seq_lens": lens, "block_size": bs,
              "sub_block_size": sbs, "delta": delta, "use_fp8_residual": use_res}
    kinds = {"q": "in_bytes", "k_nf4": "in_bytes", "k_scale": "in", "k_residual": "in_bytes", "v": "in_bytes",
             "seq_lens": "in", "block_size": "fixed", "sub_block_size": "fixed", "delta": "fixed",
             "use_fp8_residual": "fixed"}
    if vs is not None:
        params["v_scale"], kinds["v_scale"] = vs, "in"
    extra = [("delta NaN", {"delta": float("nan")}, "refuse"), ("delta -1", {"delta": -1.0}, "refuse"),
             ("block_size 0", {"block_size": 0}, "refuse"), ("sub_block_size 3 of 64", {"block_size": 64,
                                                                                        "sub_block_size": 3}, "refuse"),
             ("seq_lens past T", {"seq_lens": np.full(B, T + 1, np.int32)}, "refuse"),
             ("seq_lens 0", {"seq_lens": np.zeros(B, np.int32)}, "refuse"),
             ("q as float32", {"q": q.astype(np.float32)}, "refuse")]
    if vs is not None:
        extra += [("v_scale as float16", {"v_scale": vs.astype(np.float16)}, "refuse"),
                  ("v_scale of half the channels", {"v_scale": np.ascontiguousarray(vs[..., : DV // 2])}, "refuse")]
    else:
        extra += [("v_scale with bfloat16 v", {"v_scale": np.ones((B, HK, DV), np.float32)}, "refuse")]
    return Spec("attn_forward_decode_nf4",
                lambda **p: lb.attn_forward_decode_nf4(**p, return_skip_ratio=True), params, kinds, check,
                required={"q", "k_nf4", "k_scale", "v"} | ({"k_residual"} if use_res else set()) |
                ({"v_scale"} if vs is not None else set()), extra=extra)


def gen_kproj_encode(rng):
    """kproj_rope_nf4_encode with small random shapes: the cache equals nf4_kcache_quantize of the
    returned rotated keys, which are within fp32 rounding of a NumPy projection + RoPE."""
    lb = _lb()
    B, T, E, HK = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 40)), int(rng.integers(1, 3))
    D = 2 * int(rng.integers(1, 33))
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    w = (rng.standard_normal((HK * D, E)) * 0.2).astype(np.float32)
    pos = rng.integers(0, 5000, (B, T)).astype(pick(rng, [np.int32, np.int64]))
    theta = float(pick(rng, [10000.0, 500000.0]))

    def check(res):
        c, s, r, k = res
        f = theta ** (-2.0 * np.arange(D // 2) / D)
        p = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32).astype(np.float64).reshape(B, T, HK, D)
        a = pos.astype(np.float64)[:, :, None, None] * f
        x0, x1 = p[..., : D // 2], p[..., D // 2:]
        want = np.concatenate([x0 * np.cos(a) - x1 * np.sin(a), x1 * np.cos(a) + x0 * np.sin(a)], axis=-1)
        if np.abs(np.asarray(k, np.float64) - want).max() > 1e-5 * (1 + np.abs(want).max()):
            return "kproj_rope_nf4_encode: rotated keys differ from the NumPy projection + RoPE"
        c2, s2, r2 = lb.nf4_kcache_quantize(np.asarray(k))
        if not (np.array_equal(c, c2) and np.array_equal(s, s2) and
                np.array_equal(np.asarray(r).view(np.uint8), np.asarray(r2).view(np.uint8))):
            return "kproj_rope_nf4_encode: the cache is not nf4_kcache_quantize of the rotated keys"
        return None

    params = {"x": x, "w_k": w, "positions": pos, "head_dim": D, "rope_theta": theta}
    kinds = {"x": "in", "w_k": "in", "positions": "in", "head_dim": "fixed", "rope_theta": "fixed"}
    extra = [("head_dim odd", {"head_dim": 3}, "refuse"), ("rope_theta 0", {"rope_theta": 0.0}, "refuse"),
             ("rope_theta NaN", {"rope_theta": float("nan")}, "refuse"),
             ("positions as float", {"positions": pos.astype(np.float32)}, "refuse")]
    spec = Spec("kproj_rope_nf4_encode", lambda **p: lb.kproj_rope_nf4_encode(**p, return_k=True), params, kinds,
                check, required={"x", "w_k", "positions"}, extra=extra)
    spec.dtype_ok = {"positions": (np.dtype(np.int32), np.dtype(np.int64))}
    return spec


def gen_vcache_quantize(rng):
    """fp8_vcache_quantize of small random values (channel magnitudes over 2^-30 .. 2^30, sometimes
    NaN / Inf / a zero channel): codes and scales bit for bit as the NumPy rule."""
    lb = _lb()
    B, T, H, D = int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 70))
    dt = pick(rng, ["float32", "float16", "bfloat16"])
    v = (rng.standard_normal((B, T, H, D)) * np.exp2(rng.integers(-30, 30, (1, 1, H, D)))).astype(np.float32)
    if rng.random() < 0.3:
        v[0, int(rng.integers(T)), 0, int(rng.integers(D))] = pick(rng, [np.nan, np.inf, -np.inf])
        v[..., int(rng.integers(D))] = 0.0
    with np.errstate(over="ignore"):  # float16 inputs: magnitudes past 65504 become +-Inf
        v = v.astype(BF16) if dt == "bfloat16" else v.astype(dt)
    code_dt = pick(rng, ["float8_e4m3fn", "float8_e5m2"])
    want_c, want_s = np_quantize(v, code_dt)

    def check(res):
        codes, scale = res
        if not np.array_equal(np.asarray(scale), want_s):
            return "fp8_vcache_quantize: scales differ from the power-of-two rule"
        if not same_codes(codes, want_c):
            return "fp8_vcache_quantize: codes differ from fp8(v / scale)"
        return None

    extra = [("dtype uint8", {"dtype": "uint8"}, "refuse"), ("v as int32", {"v": np.zeros((B, T, H, D), np.int32)},
                                                            "refuse")]
    return Spec("fp8_vcache_quantize", lambda **p: lb.fp8_vcache_quantize(**p), {"v": v, "dtype": code_dt},
                {"v": "in", "dtype": "fixed"}, check, required={"v"}, extra=extra)
