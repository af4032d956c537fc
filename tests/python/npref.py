"""An independent NumPy implementation of the lowbit recipes (FORMATS.md), for byte-for-byte
comparisons. Element casts go through ml_dtypes (clipping first for saturation); scales follow
the formulas of FORMATS.md sections 3, 4 and 7 with float32 arithmetic.
"""

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
QMAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0, "int4": 7.0}
EMAX = {"e4m3": 8, "e5m2": 15, "e2m1": 2}
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}


def sat_codes(v, elem):
    """Codes (uint8) of float32 values v, RNE with saturation to the finite range."""
    v = np.asarray(v, dtype=F32)
    q = np.clip(v, -QMAX[elem], QMAX[elem]).astype(ML[elem])
    return q.view(np.uint8) & (0x0F if elem == "e2m1" else 0xFF)


def pack_nibbles(codes, high_first=False):
    lo, hi = codes[..., 0::2] & 0xF, codes[..., 1::2] & 0xF
    if high_first:
        lo, hi = hi, lo
    return (lo | (hi << 4)).astype(np.uint8)


def blocks(x, block):
    x = np.asarray(x, dtype=F32)
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))


def block_amax(xb):
    return np.max(np.abs(xb), axis=-1).astype(F32)


def ue8m0_rceil(v):
    """Smallest power of two >= v as a biased exponent byte (TE float_to_e8m0)."""
    b = np.asarray(v, dtype=F32).view(np.uint32) & np.uint32(0x7FFFFFFF)
    e = (b >> 23).astype(np.int64)
    m = (b & 0x7FFFFF).astype(np.int64)
    up = (m > 0) & (e != 0xFE) & ~((e == 0) & (m <= 0x400000))
    e = np.where(up, e + 1, e)
    e = np.where(b == 0x7F800000, 0xFE, e)
    e = np.where(b > 0x7F800000, 0xFF, e)
    return e.astype(np.uint8)


def pow2(e):
    return np.ldexp(F32(1.0), np.asarray(e, dtype=np.int32)).astype(F32)


def mx_quantize(x, elem, rounding="rceil"):
    """(codes [.., K] or packed [.., K/2], scale bytes [.., K/32]) of OCP MX with RCEIL or FLOOR."""
    xb = blocks(x, 32)
    amax = block_amax(xb)
    if rounding == "rceil":
        s = ue8m0_rceil(amax / F32(QMAX[elem]))
        factor = pow2(127 - s.astype(np.int32))
    else:
        e = ((amax.view(np.uint32) >> 23) & 0xFF).astype(np.int32) - 127 - EMAX[elem]
        e = np.clip(e, -127, 127)
        s = (e + 127).astype(np.uint8)
        factor = pow2(-e)
    codes = sat_codes(xb * factor[..., None], elem).reshape(np.shape(x))
    if elem == "e2m1":
        codes = pack_nibbles(codes)
    return codes, s


def nvfp4_quantize(x, global_amax=None):
    """TransformerEngine NVFP4: (packed codes, E4M3 scale bytes), zero-scale rule 'zero'."""
    xb = blocks(x, 16)
    if global_amax is None:
        s_enc = F32(1.0)
    else:
        g = F32(global_amax)
        s_enc = F32(min(F32(F32(448.0 * 6.0) / g), FLT_MAX)) if g != 0 else F32(1.0)
        if s_enc == 0:
            s_enc = F32(1.0)
    amax = block_amax(xb)
    sb = sat_codes(amax * F32(s_enc * (F32(1.0) / F32(6.0))), "e4m3")
    s_dec = F32(F32(1.0) / s_enc)
    sbf = sb.view(ml_dtypes.float8_e4m3fn).astype(F32)
    with np.errstate(divide="ignore"):
        m = (F32(1.0) / (sbf * s_dec)).astype(F32)
    m = np.minimum(m, FLT_MAX).astype(F32)
    codes = sat_codes(xb * m[..., None], "e2m1").reshape(np.shape(x))
    return pack_nibbles(codes), sb


def group_quantize(x, elem, block, ue8m0=False, eps=1e-10):
    """vLLM / SGLang per-token-group: s = max(amax, eps) / qmax, q = sat(x / s)."""
    xb = blocks(x, block)
    amax = block_amax(xb)
    s = (np.maximum(amax, F32(eps)) / F32(QMAX[elem])).astype(F32)
    if ue8m0:
        sc = ue8m0_rceil(s)
        s = pow2(sc.astype(np.int32) - 127)
    v = (xb / s[..., None]).astype(F32)
    if elem == "int4":
        q = np.clip(np.rint(v), -8, 7).astype(np.int8).view(np.uint8) & 0xF
        codes = pack_nibbles(q.reshape(np.shape(x)))
    else:
        codes = sat_codes(v, elem).reshape(np.shape(x))
    return codes, (sc if ue8m0 else s)


def uint4_quantize(x, block, eps=1e-10):
    xb = blocks(x, block)
    mn, mx = np.min(xb, axis=-1).astype(F32), np.max(xb, axis=-1).astype(F32)
    s = np.maximum(((mx - mn) / F32(15.0)).astype(F32), F32(eps)).astype(F32)
    zp = np.clip(np.rint((-mn / s).astype(F32)), 0, 15).astype(F32)
    q = np.clip(np.rint((xb / s[..., None]).astype(F32)) + zp[..., None], 0, 15).astype(np.uint8)
    return pack_nibbles(q.reshape(np.shape(x))), s, zp.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# scale layouts (FORMATS.md section 5): stored matrix from a row-major [R, C] one

def round_up(a, m):
    return (a + m - 1) // m * m


def to_layout(s, layout, row_align=1):
    R, C = s.shape
    if layout == "row_major":
        return s.copy()
    if layout == "col_major":
        out = np.zeros((C, round_up(R, row_align)), dtype=s.dtype)
        out[:, :R] = s.T
        return out
    Rp, Cp = (round_up(R, 128) if layout == "blocked128x4" else round_up(R, 8)), round_up(C, 4)
    flat = np.zeros(Rp * Cp, dtype=s.dtype)
    r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
    if layout == "blocked128x4":
        off = ((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    else:
        off = (r // 8) * (Cp // 4) * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4
    flat[off] = s[r, c]
    return flat.reshape(Rp, Cp)


def grouped_blocked(s, m_indptr, rule="flashinfer"):
    """Grouped 128x4 layout: each group's rows start on a 128-row tile."""
    R, C = s.shape
    G = len(m_indptr) - 1
    Cp = round_up(C, 4)
    if rule == "flashinfer":
        starts = [(m_indptr[g] + g * 127) // 128 * 128 for g in range(G)]
        rows = (R + G * 127) // 128 * 128
    else:
        starts = list(np.cumsum([0] + [round_up(m_indptr[g + 1] - m_indptr[g], 128) for g in range(G - 1)]))
        rows = round_up(R + G * 127, 128)
    big = np.zeros((rows, C), dtype=s.dtype)
    for g in range(G):
        a, b = m_indptr[g], m_indptr[g + 1]
        big[starts[g]:starts[g] + (b - a)] = s[a:b]
    out = to_layout(big, "blocked128x4")
    return out[:rows, :Cp] if out.shape[0] >= rows else out
