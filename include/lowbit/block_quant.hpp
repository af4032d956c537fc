// lowbit/block_quant.hpp: the per-block quantization recipes, shared bit for bit by the CPU
// reference and the CUDA kernels.
//
// A quantizer (1) reduces a block to BlockStats, (2) turns the stats into a BlockScale (stored
// scale code, zero point and the exact fp32 operation applied to each element), (3) encodes
// every element with encode_element(). Dequantization is decode_element().
//
// NaN / Inf policy (docs/formats.md, "NaN, Inf and overflow"):
//  * a block holding NaN or +-Inf gets a NaN scale (F32 NaN, UE8M0 0xFF, E4M3 0x7F), zero point 0
//    and the codes of 0.0 (NF4: code 7), so it decodes to NaN; no other block depends on it;
//  * per-tensor amaxes (NVFP4 global amax, NF4 K cache channel scales) are taken over the finite
//    elements only (finite_abs_bits), so NaN / Inf elsewhere leave every finite block as it is;
//  * a per-tensor NVFP4 amax that is not a positive finite number means no per-tensor scale
//    (S_enc = S_dec = 1);
//  * no recipe overflows to Inf from finite input: UINT4 takes max/15 - min/15 where
//    max - min overflows, and keeps its codes where (q - zp) * s is finite.
// All arithmetic is plain IEEE fp32 (no FMA contraction, no flush-to-zero): the CUDA build
// compiles with -fmad=false.
#pragma once

#include "lowbit/codecs.hpp"
#include "lowbit/format.hpp"

namespace lowbit {

constexpr float kFltMax = 3.40282346638528859812e+38f;

/// Reduction of one block. amax_bits is max(bits(|x|)): for non-negative floats the integer
/// order is the float order, and NaN (bits > 0x7F800000) propagates.
struct BlockStats {
  uint32_t amax_bits = 0;
  float min = 0.0f;  // kMinMax only
  float max = 0.0f;  // kMinMax only

  LOWBIT_HOST_DEVICE void add(float x) {
    const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
    amax_bits = a > amax_bits ? a : amax_bits;
    min = x < min ? x : min;
    max = x > max ? x : max;
  }
  LOWBIT_HOST_DEVICE void merge(const BlockStats& o) {
    amax_bits = o.amax_bits > amax_bits ? o.amax_bits : amax_bits;
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
  }
  LOWBIT_HOST_DEVICE float amax() const { return bits_float(amax_bits); }
  LOWBIT_HOST_DEVICE bool finite() const { return amax_bits < 0x7F800000u; }
};

/// The bits of |x| for finite x, 0 for NaN and +-Inf: max over a tensor of these is the finite
/// amax that the per-tensor scales use (NVFP4 global amax, NF4 K cache channel scales).
LOWBIT_HOST_DEVICE uint32_t finite_abs_bits(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  return a < 0x7F800000u ? a : 0u;
}

/// kMinMax needs min/max initialised from the first element, not 0.
LOWBIT_HOST_DEVICE BlockStats block_stats_init(float first) {
  BlockStats s;
  s.amax_bits = float_bits(first) & 0x7FFFFFFFu;
  s.min = first;
  s.max = first;
  return s;
}

// ---------------------------------------------------------------------------------------------
// NVFP4 per-tensor scales (TransformerEngine compute_global_encode_scaling_factor_FP4)

/// S_enc = 448 * 6 / global_amax, capped at FLT_MAX; 1.0 when amax is 0 or S_enc is 0.
/// A global amax that is NaN, +-Inf or negative also gives 1.0 (no per-tensor scale), so a
/// non-finite amax can never turn the finite blocks into zeros or near-zeros.
LOWBIT_HOST_DEVICE float nvfp4_global_encode_scale(float global_amax) {
  if (!(global_amax >= 0.0f && global_amax <= kFltMax)) return 1.0f;
  float s = (448.0f * 6.0f) / global_amax;
  s = s < kFltMax ? s : kFltMax;  // as fminf: Inf and NaN become FLT_MAX
  if (global_amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}
/// S_dec = 1 / S_enc (the per-tensor factor of the decode formula).
LOWBIT_HOST_DEVICE float nvfp4_global_decode_scale(float global_amax) {
  return 1.0f / nvfp4_global_encode_scale(global_amax);
}

// ---------------------------------------------------------------------------------------------

/// What to do with the elements of one block.
struct BlockScale {
  uint32_t code = 0;   ///< stored scale: fp32 bits (kF32), UE8M0 byte or E4M3 byte
  uint8_t zero = 0;    ///< zero point (kMinMax)
  bool divide = false; ///< element value is x / factor (group recipes) instead of x * factor
  bool nonfinite = false;
  float factor = 1.0f;
  uint8_t qlo = 0, qhi = 15; ///< kMinMax: the codes used (those whose (q - zp) * s is finite)
};

/// Context shared by all blocks of one call: the NVFP4 per-tensor encode scale (1 if none).
struct QuantContext {
  float s_enc = 1.0f;
};

LOWBIT_HOST_DEVICE BlockScale compute_block_scale(const BlockFormat& f, const BlockStats& st, const QuantContext& ctx) {
  BlockScale b;
  if (!st.finite()) {
    b.nonfinite = true;
    b.code = f.scale_type == ScaleType::kF32 ? 0x7FC00000u : (f.scale_type == ScaleType::kUE8M0 ? 0xFFu : 0x7Fu);
    b.factor = 0.0f;
    return b;
  }
  const float amax = st.amax();
  switch (f.rule) {
    case ScaleRule::kAmax: {
      float s = (amax > f.eps ? amax : f.eps) / elem_max(f.elem);
      if (f.scale_type == ScaleType::kUE8M0) {
        const uint8_t e = encode_ue8m0_rceil(s);
        b.code = e;
        s = decode_ue8m0(e);
      } else {
        b.code = float_bits(s);
      }
      b.divide = true;
      b.factor = s;
      return b;
    }
    case ScaleRule::kMinMax: {
      // (max - min) / 15; where max - min overflows fp32 (a finite block wider than FLT_MAX),
      // max / 15 - min / 15, which cannot
      const float range = st.max - st.min;
      float s = is_finite_bits(float_bits(range)) ? range / 15.0f : st.max / 15.0f - st.min / 15.0f;
      s = s > f.eps ? s : f.eps;
      float z = round_half_even(-st.min / s);
      z = z < 0.0f ? 0.0f : (z > 15.0f ? 15.0f : z);
      b.code = float_bits(s);
      b.zero = uint8_t(int(z));
      b.divide = true;
      b.factor = s;
      // codes q with |q - zp| <= n, n the largest step count whose n * s is finite (15 unless
      // s > FLT_MAX / 15): the dequantized value (q - zp) * s never overflows
      // NOTE: finiteness is read from the product's bits: a compiler's floating-point range
      // reasoning cannot fold the overflow test (a GCC 13.3 build computed n = 0 from the
      // comparison `n * s <= FLT_MAX`)
      int n = 15;
      while (n > 0 && !is_finite_bits(float_bits(float(n) * s))) --n;
      const int zi = int(b.zero);
      b.qlo = uint8_t(zi - n > 0 ? zi - n : 0);
      b.qhi = uint8_t(zi + n < 15 ? zi + n : 15);
      return b;
    }
    case ScaleRule::kMxFloor: {
      int e = int((float_bits(amax) >> 23) & 0xFFu) - 127 - elem_emax(f.elem);
      e = e < -127 ? -127 : (e > 127 ? 127 : e);
      b.code = uint32_t(e + 127);
      b.factor = exp2i(-e);
      return b;
    }
    case ScaleRule::kMxRceil: {
      const uint8_t e = encode_ue8m0_rceil(amax / elem_max(f.elem));
      b.code = e;
      b.factor = exp2i(127 - int(e));
      return b;
    }
    case ScaleRule::kNvfp4: {
      uint8_t sb = encode_e4m3(amax * (ctx.s_enc * (1.0f / 6.0f)));
      if (sb == 0) sb = f.zero_scale == ZeroScale::kMinSubnormal ? 0x01 : (f.zero_scale == ZeroScale::kOne ? 0x38 : 0x00);
      b.code = sb;
      const float s_dec = 1.0f / ctx.s_enc;
      float m = 1.0f / (decode_e4m3(sb) * s_dec);
      b.factor = m < kFltMax ? m : kFltMax;
      return b;
    }
    case ScaleRule::kAbsmax: {
      b.code = float_bits(amax);
      b.factor = 1.0f / amax;
      // 1 / amax overflows for amax < 2^-128: divide by amax instead (a zero block keeps
      // bitsandbytes' 0 * (1/0))
      if (!is_finite_bits(float_bits(b.factor)) && amax > 0.0f) {
        b.divide = true;
        b.factor = amax;
      }
      return b;
    }
  }
  return b;
}

/// UINT4 code of a scaled value v (x / s) with zero point b.zero: rne(v) + zp clamped to
/// [b.qlo, b.qhi]; NaN gives the zero point.
LOWBIT_HOST_DEVICE uint8_t encode_uint4_zp(float v, const BlockScale& b) {
  if (v != v) return b.zero;
  const float r = round_half_even(v) + float(b.zero);
  const float lo = float(b.qlo), hi = float(b.qhi);
  return uint8_t(int(r < lo ? lo : (r > hi ? hi : r)));
}

/// Code (low bits) of one element x of a block with scale b.
LOWBIT_HOST_DEVICE uint8_t encode_element(const BlockFormat& f, const BlockScale& b, float x) {
  if (b.nonfinite) return f.elem == Elem::kNF4 ? 7 : 0;
  const float v = b.divide ? x / b.factor : x * b.factor;
  switch (f.elem) {
    case Elem::kE4M3: return encode_e4m3(v);
    case Elem::kE5M2: return encode_e5m2(v);
    case Elem::kE2M1: return encode_e2m1(v);
    case Elem::kInt4: return encode_int4(v);
    case Elem::kUInt4: return encode_uint4_zp(v, b);
    case Elem::kNF4: return encode_nf4(v);
  }
  return 0;
}

/// The decoded scale of a stored scale code (F32 bits / UE8M0 / E4M3), as fp32.
LOWBIT_HOST_DEVICE float decode_scale(ScaleType t, uint32_t code) {
  switch (t) {
    case ScaleType::kF32: return bits_float(code);
    case ScaleType::kUE8M0: return decode_ue8m0(uint8_t(code));
    case ScaleType::kE4M3: return decode_e4m3(uint8_t(code));
  }
  return 0.0f;
}

/// The unscaled value of an element code (UINT4: the raw code, zero point not subtracted).
LOWBIT_HOST_DEVICE float decode_code(Elem e, uint8_t c) {
  switch (e) {
    case Elem::kE4M3: return decode_e4m3(c);
    case Elem::kE5M2: return decode_e5m2(c);
    case Elem::kE2M1: return decode_e2m1(c);
    case Elem::kInt4: return float(decode_int4(c));
    case Elem::kUInt4: return float(c & 0xF);
    case Elem::kNF4: return nf4_value(c);
  }
  return 0.0f;
}

/// Dequantized fp32 value of code c with stored scale `scale_code`, zero point `zero` and, for
/// NVFP4, the per-tensor decode scale s_dec:
///   UINT4: (q - zp) * s       NVFP4: (e2m1(q) * e4m3(s)) * s_dec       others: value(q) * s
LOWBIT_HOST_DEVICE float decode_element(const BlockFormat& f, uint8_t c, uint32_t scale_code, uint8_t zero,
                                        float s_dec = 1.0f) {
  const float s = decode_scale(f.scale_type, scale_code);
  if (f.elem == Elem::kUInt4) return (float(c & 0xF) - float(zero)) * s;
  const float v = decode_code(f.elem, c) * s;
  return f.rule == ScaleRule::kNvfp4 ? v * s_dec : v;
}

// ---------------------------------------------------------------------------------------------
// NF4 K cache: scale = finite amax of the channel over all tokens (finite_abs_bits), code =
// nf4(x / scale), residual = fp8(x - nf4[code] * scale). The residual of a finite token
// saturates (satfinite); that of a NaN / +-Inf token (itself NaN / +-Inf) is stored without
// saturation, so the token decodes to NaN / +-Inf (E4M3 residual, which has no Inf: NaN).
LOWBIT_HOST_DEVICE Saturate kcache_residual_saturate(float x) {
  return is_finite_bits(float_bits(x)) ? Saturate::kFinite : Saturate::kNone;
}

/// Packs two 4-bit codes: element 2i (`even`) and 2i+1 (`odd`).
LOWBIT_HOST_DEVICE uint8_t pack_nibbles(NibbleOrder o, uint8_t even, uint8_t odd) {
  return o == NibbleOrder::kLowFirst ? uint8_t((even & 0xF) | (odd << 4)) : uint8_t((odd & 0xF) | (even << 4));
}
LOWBIT_HOST_DEVICE uint8_t unpack_nibble(NibbleOrder o, uint8_t byte, int which /*0 = element 2i*/) {
  const int shift = (o == NibbleOrder::kLowFirst) == (which == 0) ? 0 : 4;
  return uint8_t((byte >> shift) & 0xF);
}

}  // namespace lowbit
