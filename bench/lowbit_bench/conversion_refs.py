"""bench_conversions.py's value tables, its PyTorch formulas (the anchors: what a user would
write without lowbit, with the recipes lowbit reproduces) and the decoders of lowbit's outputs
for the value check. Imports torch."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch


FP8_MAX = 448.0
FLT_MAX = 3.4028234663852886e38
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
NF4_VALUES = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0]
# bitsandbytes' decision thresholds (midpoints of adjacent codes), as fp32 literals
NF4_MIDPOINTS = [-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                 -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                 0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.38931253552436829,
                 0.5016634166240692, 0.6427869200706482, 0.8614784181118011]


_CONST: Dict[Tuple[str, str], torch.Tensor] = {}


def _const(name: str, values: Sequence[float], device) -> torch.Tensor:
    key = (name, str(device))
    if key not in _CONST:
        _CONST[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return _CONST[key]


# =============================================================================================
# PyTorch formulas (the anchors). Each is what a user would write without lowbit; the recipes
# are the ones lowbit reproduces (include/lowbit/block_quant.hpp), so values must agree.
# =============================================================================================

def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    m, k = x.shape
    return x.view(m, k // block, block).float()


def ue8m0_rceil(s: torch.Tensor) -> torch.Tensor:
    """Biased exponent of s (fp32 >= 0) rounded up to a power of two (NVIDIA RCEIL), int32."""
    bits = s.contiguous().view(torch.int32)
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    up = (m > 0) & (e != 0xFE) & ~((e == 0) & (m <= 0x400000))
    return e + up.to(torch.int32)


def exp2i(e: torch.Tensor) -> torch.Tensor:
    """2^e as fp32 for integer e in [-126, 127] (built from the exponent bits)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def ue8m0_value(s: torch.Tensor) -> torch.Tensor:
    """Decoded UE8M0 scales (uint8 or float8_e8m0fnu bytes; fp32 input returned as is)."""
    if s.dtype == torch.float32:
        return s
    return exp2i(s.view(torch.uint8).to(torch.int32) - 127)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of fp32 values: round to nearest even, saturate to 6, sign kept (uint8)."""
    a = v.abs()
    u8 = torch.uint8
    c = ((a > 0.25).to(u8) + (a >= 0.75).to(u8) + (a > 1.25).to(u8) + (a >= 1.75).to(u8)
         + (a > 2.5).to(u8) + (a >= 3.5).to(u8) + (a > 5.0).to(u8))
    return c | (torch.signbit(v).to(u8) << 3)


def pack_nibbles(c: torch.Tensor) -> torch.Tensor:
    """[M, K] 4-bit codes (uint8) -> [M, K/2], element 2i in the low nibble."""
    m, k = c.shape
    c = c.view(m, k // 2, 2)
    return c[..., 0] | (c[..., 1] << 4)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """[M, K/2] bytes -> [M, K] codes, low nibble first."""
    p = p.view(torch.uint8)
    m, kh = p.shape
    return torch.stack([p & 0xF, p >> 4], dim=-1).view(m, 2 * kh)


def to_blocked128x4(s: torch.Tensor) -> torch.Tensor:
    """Row-major [R, C] 1-byte scales -> [Rp, Cp] in the 128x4 blocked layout (zero padded)."""
    r, c = s.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    u = s.view(torch.uint8)
    if rp != r or cp != c:
        u = torch.nn.functional.pad(u, (0, cp - c, 0, rp - r))
    out = u.reshape(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, cp)
    return out.view(s.dtype)


def from_blocked128x4(s: torch.Tensor, r: int, c: int) -> torch.Tensor:
    """Inverse of to_blocked128x4 (accepts any tensor holding the Rp*Cp bytes)."""
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    flat = s.contiguous().view(torch.uint8).reshape(-1)
    if flat.numel() != rp * cp:
        raise ValueError(f"blocked scales hold {flat.numel()} bytes, expected {rp}*{cp}")
    return flat.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, cp)[:r, :c]


# --- quantize --------------------------------------------------------------------------------

def torch_ptgq_fp8(x, group=128, ue8m0=False, col_major=False):
    """Per-token-group FP8 as SGLang / vLLM write it (scale = max(amax, 1e-10) / 448)."""
    m, k = x.shape
    g = _blocks(x, group)
    amax = g.abs().amax(-1, keepdim=True).clamp(min=1e-10)
    s = amax / FP8_MAX
    if ue8m0:
        s = exp2i(ue8m0_rceil(s) - 127)
    q = (g / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, k)
    s = s.view(m, k // group)
    if col_major:
        s = s.t().contiguous().t()
    return q, s


def torch_int4(x, group=128):
    """Symmetric INT4 groups: s = max(amax, eps) / 7, q = rne(x / s) clamped to [-8, 7], packed."""
    m, k = x.shape
    g = _blocks(x, group)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 7.0
    c = torch.round(g / s).clamp(-8, 7).to(torch.int8).view(m, k).view(torch.uint8) & 0xF
    return pack_nibbles(c), s.view(m, k // group)


def torch_uint4(x, group=128):
    """Asymmetric UINT4: s = max((max - min) / 15, eps), zp = clamp(rne(-min / s), 0, 15)."""
    m, k = x.shape
    g = _blocks(x, group)
    mn = g.amin(-1, keepdim=True)
    mx = g.amax(-1, keepdim=True)
    s = ((mx - mn) / 15.0).clamp(min=1e-10)
    z = torch.round(-mn / s).clamp(0, 15)
    c = (torch.round(g / s) + z).clamp(0, 15).to(torch.uint8).view(m, k)
    return pack_nibbles(c), s.view(m, k // group), z.to(torch.uint8).view(m, k // group)


def torch_mxfp8(x, swizzled=False):
    """MXFP8 e4m3, 32-element blocks, RCEIL: e = rceil(amax / 448), q = e4m3(x * 2^(127 - e))."""
    m, k = x.shape
    g = _blocks(x, 32)
    e = ue8m0_rceil(g.abs().amax(-1, keepdim=True) / FP8_MAX)
    q = (g * exp2i(127 - e)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, k)
    s = e.to(torch.uint8).view(m, k // 32)
    return q, (to_blocked128x4(s) if swizzled else s)


def torch_mxfp4(x):
    """MXFP4 (E2M1, 32-element blocks, RCEIL): e = rceil(amax / 6), codes of x * 2^(127 - e)."""
    m, k = x.shape
    g = _blocks(x, 32)
    e = ue8m0_rceil(g.abs().amax(-1, keepdim=True) / 6.0)
    c = e2m1_codes(g * exp2i(127 - e)).view(m, k)
    return pack_nibbles(c), e.to(torch.uint8).view(m, k // 32)


def nvfp4_s_enc(global_amax: torch.Tensor) -> torch.Tensor:
    """TransformerEngine: S_enc = min(448 * 6 / amax, FLT_MAX); 1 where amax or S_enc is 0."""
    a = global_amax.float()
    # NOTE: a true division (scalar / tensor would be reciprocal(a) * 2688, one ulp off)
    s = torch.div(torch.full_like(a, 2688.0), a).clamp(max=FLT_MAX)
    return torch.where((a == 0) | (s == 0), torch.ones_like(s), s)


def torch_nvfp4(x, global_amax=None):
    """NVFP4 (TransformerEngine formula): E4M3 block scale of amax * S_enc / 6 per 16 elements,
    codes of x / (scale * S_dec). global_amax None: computed here (one more pass over x)."""
    m, k = x.shape
    if global_amax is None:
        global_amax = x.abs().amax().float().reshape(1)
    s_enc = nvfp4_s_enc(global_amax)
    g = _blocks(x, 16)
    amax = g.abs().amax(-1, keepdim=True)
    sb = (amax * (s_enc * (1.0 / 6.0))).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    factor = (1.0 / (sb.float() * (1.0 / s_enc))).clamp(max=FLT_MAX)
    c = e2m1_codes(g * factor).view(m, k)
    return pack_nibbles(c), sb.view(m, k // 16), global_amax


def torch_nf4(x, block=64):
    """NF4 (bitsandbytes): absmax per block, code = number of midpoints below x * (1 / absmax)."""
    m, k = x.shape
    g = _blocks(x, block)
    amax = g.abs().amax(-1, keepdim=True)
    v = g * (1.0 / amax)
    c = torch.bucketize(v, _const("nf4_mid", NF4_MIDPOINTS, x.device)).to(torch.uint8).view(m, k)
    return pack_nibbles(c), amax.view(m, k // block)


# --- dequantize (inputs: the tensors of a lowbit.Quantized, row-major scales) ----------------

def _apply_block_scale(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    m, k = v.shape
    c = s.shape[-1]
    return (v.view(m, c, k // c) * s.reshape(m, c, 1)).view(m, k)


def torch_dq_fp8_group(q, s):
    return _apply_block_scale(q.float(), s.float()).to(torch.bfloat16)


def torch_dq_int4(p, s):
    c = unpack_nibbles(p).to(torch.int32)
    return _apply_block_scale(((c ^ 8) - 8).float(), s.float()).to(torch.bfloat16)


def torch_dq_uint4(p, s, z):
    c = unpack_nibbles(p)
    m, k = c.shape
    cols = s.shape[-1]
    v = c.float().view(m, cols, k // cols) - z.reshape(m, cols, 1).float()
    return (v * s.reshape(m, cols, 1).float()).view(m, k).to(torch.bfloat16)


def torch_dq_mxfp8(q, s):
    return _apply_block_scale(q.float(), ue8m0_value(s)).to(torch.bfloat16)


def torch_dq_mxfp4(p, s):
    lut = _const("e2m1", E2M1_VALUES, p.device)
    return _apply_block_scale(lut[unpack_nibbles(p).long()], ue8m0_value(s)).to(torch.bfloat16)


def torch_dq_nvfp4(p, s, global_amax):
    lut = _const("e2m1", E2M1_VALUES, p.device)
    v = _apply_block_scale(lut[unpack_nibbles(p).long()], s.view(torch.float8_e4m3fn).float())
    return (v * (1.0 / nvfp4_s_enc(global_amax))).to(torch.bfloat16)


def torch_dq_nf4(p, s):
    lut = _const("nf4", NF4_VALUES, p.device)
    return _apply_block_scale(lut[unpack_nibbles(p).long()], s.float()).to(torch.bfloat16)


def torch_tc_int4_fp8(p):
    c = unpack_nibbles(p).to(torch.int32)
    return ((c ^ 8) - 8).float().to(torch.float8_e4m3fn)


def torch_tc_mxfp4_mxfp8(p):
    lut = _const("e2m1", E2M1_VALUES, p.device)
    return lut[unpack_nibbles(p).long()].to(torch.float8_e4m3fn)


def torch_cast_bf16(x8):
    return x8.to(torch.bfloat16)


# =============================================================================================
# lowbit side: calls and the decoding of its outputs (for the value check)
# =============================================================================================


def q_fields(out) -> Tuple[Any, Any, Any, Any]:
    """(data, scales, zeros, global_amax) of a lowbit.Quantized or a (q, s) tuple."""
    if hasattr(out, "data") and hasattr(out, "scales"):
        return out.data, out.scales, getattr(out, "zeros", None), getattr(out, "global_amax", None)
    if isinstance(out, (tuple, list)):
        items = list(out) + [None] * (4 - len(out))
        return items[0], items[1], items[2], items[3]
    return out, None, None, None


def as_u8(t):
    """1-byte tensors whose dtype Inductor cannot generate code for (e8m0, fp4 x2) as uint8."""
    if isinstance(t, torch.Tensor) and t.element_size() == 1 and t.dtype not in (
            torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8)
    return t


def tensors_of(obj) -> List[torch.Tensor]:
    """Every tensor in an output: a tensor, a tuple of them, or a Quantized."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if hasattr(obj, "data") and hasattr(obj, "scales"):
        return [t for t in q_fields(obj) if isinstance(t, torch.Tensor)]
    if isinstance(obj, (tuple, list)):
        out: List[torch.Tensor] = []
        for o in obj:
            out.extend(tensors_of(o))
        return out
    return []


def nbytes(*objs) -> int:
    return sum(t.numel() * t.element_size() for o in objs for t in tensors_of(o))


def scales_rm(s: torch.Tensor, m: int, c: int, layout: str = "row_major") -> torch.Tensor:
    """Logical [m, c] view of stored scales in `layout` (row_major, col_major, blocked128x4)."""
    if layout == "blocked128x4":
        return from_blocked128x4(s, m, c)
    if layout == "col_major":
        if tuple(s.shape) == (m, c):
            return s
        return s.reshape(c, -1)[:, :m].t()
    if tuple(s.shape) == (m, c):
        return s
    return s.reshape(m, c)


def dec_fp8_group(q, s, m, k, group, layout):
    s = scales_rm(s, m, k // group, layout)
    sv = s if s.dtype == torch.float32 else ue8m0_value(s)
    return _apply_block_scale(q.view(m, k).view(torch.float8_e4m3fn).float(), sv)


def dec_int4(p, s, m, k):
    c = unpack_nibbles(p.reshape(m, k // 2)).to(torch.int32)
    return _apply_block_scale(((c ^ 8) - 8).float(), scales_rm(s, m, k // 128).float())


def dec_uint4(p, s, z, m, k):
    c = unpack_nibbles(p.reshape(m, k // 2))
    cols = k // 128
    zz = scales_rm(z, m, cols).view(torch.uint8).float().reshape(m, cols, 1)
    v = c.float().view(m, cols, 128) - zz
    return (v * scales_rm(s, m, cols).float().reshape(m, cols, 1)).view(m, k)


def dec_mxfp8(q, s, m, k, layout):
    sv = ue8m0_value(scales_rm(s, m, k // 32, layout))
    return _apply_block_scale(q.reshape(m, k).view(torch.float8_e4m3fn).float(), sv)


def dec_mxfp4(p, s, m, k, layout="row_major"):
    lut = _const("e2m1", E2M1_VALUES, p.device)
    sv = ue8m0_value(scales_rm(s, m, k // 32, layout))
    return _apply_block_scale(lut[unpack_nibbles(p.reshape(m, k // 2)).long()], sv)


def dec_nvfp4(p, s, gamax, m, k, layout="row_major"):
    lut = _const("e2m1", E2M1_VALUES, p.device)
    sv = scales_rm(s, m, k // 16, layout).view(torch.float8_e4m3fn).float()
    v = _apply_block_scale(lut[unpack_nibbles(p.reshape(m, k // 2)).long()], sv)
    return v * (1.0 / nvfp4_s_enc(gamax.reshape(-1)[:1].to(p.device)))


def dec_nf4(p, s, m, k):
    lut = _const("nf4", NF4_VALUES, p.device)
    return _apply_block_scale(lut[unpack_nibbles(p.reshape(m, k // 2)).long()], scales_rm(s, m, k // 64).float())
