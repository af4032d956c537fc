"""Shared pieces of the MXFP8 attention tests (test_attention.py on the CPU, test_attention_gpu.py
on the GPU): the kernel's constants, an independent NumPy reference (ml_dtypes decoding, fp64) and
the input generator."""

import math

import ml_dtypes
import numpy as np

import lowbit

# The precision the kernel rounds P to before the PV product (docs/attention.md, "Kernel"):
# "bf16" or "e4m3".
KERNEL_P_DTYPE = "bf16"
# The kernel's query and key tile sizes: under causal masking a NaN v[t, c] may also reach
# out[i, c] for rows i of a query tile that processes t's key tile without seeing key t.
KERNEL_BLOCK_M, KERNEL_BLOCK_N = 128, 128

E4M3 = ml_dtypes.float8_e4m3fn


# ---------------------------------------------------------------------------------------------
# independent NumPy reference

def np_dequant(codes, scales):
    """fp64 values of E4M3 codes [..., d] with UE8M0 bytes [..., d/32] (255 -> NaN)."""
    vals = np.asarray(codes).view(np.uint8).view(E4M3).astype(np.float64)
    s = np.asarray(scales).view(np.uint8).astype(np.int64)
    sv = np.where(s == 255, np.nan, np.ldexp(1.0, (s - 127).astype(np.int32)))
    return vals * np.repeat(sv, 32, axis=-1)


def np_attention(q, k, v, scale, causal):
    """q [sq, d], k / v [sk, d] fp64 -> (out [sq, d], lse [sq]) by the rules of docs/attention.md."""
    sq, sk, d = q.shape[0], k.shape[0], q.shape[1]
    out = np.zeros((sq, d))
    lse = np.full(sq, -np.inf)
    for i in range(sq):
        n = max(0, min(sk, i + sk - sq + 1)) if causal else sk
        if n == 0:
            continue
        s = (q[i][None, :] * k[:n]).sum(-1) * scale
        if np.isnan(s).any():
            out[i] = np.nan
            lse[i] = np.nan
            continue
        m = s.max()
        p = np.exp(s - m)
        l = p.sum()
        out[i] = (p[:, None] * v[:n]).sum(0) / l
        lse[i] = m + math.log(l)
    return out, lse


def np_reference(q, k, v, qs, ks, vs, scale, causal):
    """Fixed-length: q [b, sq, h, d] codes, qs [b, h, sq, d/32], ... -> out, lse (fp64)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = np.zeros((b, sq, h, d))
    lse = np.zeros((b, h, sq))
    for bb in range(b):
        for hh in range(h):
            kh = hh // (h // hk)
            qd = np_dequant(q[bb, :, hh], qs[bb, hh])
            kd = np_dequant(k[bb, :, kh], ks[bb, kh])
            vd = np_dequant(v[bb, :, kh], vs[bb, kh])
            out[bb, :, hh], lse[bb, hh] = np_attention(qd, kd, vd, scale, causal)
    return out, lse


def bf16_ulp(x):
    x = np.abs(x)
    e = np.where(x >= 2.0 ** -126, np.floor(np.log2(np.maximum(x, 2.0 ** -126))), -126)
    return np.ldexp(1.0, (e - 7).astype(np.int32))


def assert_close(out, lse, ref_out, ref_lse):
    o = np.asarray(out).astype(np.float64)
    nan = np.isnan(ref_out)
    np.testing.assert_array_equal(np.isnan(o), nan)
    err = np.abs(o - ref_out)[~nan]
    assert (err <= bf16_ulp(ref_out[~nan])).all(), float(err.max())
    lse = np.asarray(lse).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_array_equal(lse[~fin & ~np.isnan(ref_lse)], ref_lse[~fin & ~np.isnan(ref_lse)])
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-6, atol=1e-6)


def make_inputs(b, sq, sk, h, hk, d, seed=0, spread=0):
    """Random MXFP8 operands (codes uint8, scale bytes uint8 in the attention layouts): N(0, 1)
    data quantized by lowbit.quantize_mxfp8_attn, then the scale bytes moved: +e_c on Q and -e_c
    on K per 32-channel block (the scores are unchanged), +-2 per Q row, e'_c per block of V;
    |e|, |e'| <= spread (values stay finite)."""
    rng = np.random.default_rng(seed)
    q, qs = lowbit.quantize_mxfp8_attn(rng.standard_normal((b, sq, h, d), dtype=np.float32))
    k, ks = lowbit.quantize_mxfp8_attn(rng.standard_normal((b, sk, hk, d), dtype=np.float32))
    v, vs = lowbit.quantize_mxfp8_attn(rng.standard_normal((b, sk, hk, d), dtype=np.float32))
    qs, ks, vs = (s.view(np.uint8).astype(np.int64) for s in (qs, ks, vs))
    if spread:
        e = rng.integers(-spread, spread + 1, (b, hk, 1, d // 32))
        qs = qs + np.repeat(e, h // hk, axis=1) + rng.integers(-2, 3, (b, h, sq, 1))
        ks = ks - e
        vs = vs + rng.integers(-spread, spread + 1, (b, hk, 1, d // 32)) + rng.integers(-2, 3, (b, hk, sk, 1))
    clip = lambda s: np.clip(s, 0, 254).astype(np.uint8)  # noqa: E731
    return q.view(np.uint8), k.view(np.uint8), v.view(np.uint8), clip(qs), clip(ks), clip(vs)


# ---------------------------------------------------------------------------------------------
# CPU reference

