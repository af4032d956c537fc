// lowbit/codecs.hpp: element codecs, bit-exact, usable on host and device.
//
// Rules (see docs/formats.md for the full table):
//  * float -> E4M3 / E5M2 / E2M1 / FP16 / BF16 is round-to-nearest-even on the exact fp32 value.
//  * Saturate::kFinite ("satfinite", the default: PTX .satfinite, TransformerEngine, FlashInfer)
//    clamps overflow and +-Inf to +-max finite; NaN stays NaN (E4M3/E5M2 canonical 0x7F).
//    Saturate::kNone follows IEEE / ml_dtypes / torch `.to()`: overflow gives Inf (E5M2, FP16)
//    or NaN (E4M3, which has no Inf).
//  * E2M1 has no Inf/NaN codes: overflow and +-Inf saturate to +-6 in both modes; NaN encodes
//    to +6 (0x7).
//  * -0 keeps its sign in every signed format.
//  * UE8M0 decodes byte b to 2^(b-127); 0xFF is NaN. Encoders: RCEIL (round the value up to a
//    power of two, TransformerEngine's float_to_e8m0) and FLOOR (the fp32 exponent field).
//  * NF4 encodes by the bitsandbytes decision tree: the code is the number of midpoints the
//    value exceeds (strictly), so exact ties go to the lower code and NaN to code 0.
#pragma once

#include "lowbit/config.hpp"

#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

namespace lowbit {

enum class Saturate : uint8_t { kFinite, kNone };

// ---------------------------------------------------------------------------------------------
// bit helpers
LOWBIT_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

LOWBIT_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

/// Exactly 2^e as fp32 for e in [-149, 127] (subnormals included); 0 below, +Inf above.
LOWBIT_HOST_DEVICE float exp2i(int e) {
  if (e >= -126) return e > 127 ? bits_float(0x7F800000u) : bits_float(uint32_t(e + 127) << 23);
  if (e < -149) return 0.0f;
  return bits_float(1u << (e + 149));
}

LOWBIT_HOST_DEVICE bool is_finite_bits(uint32_t u) { return (u & 0x7F800000u) != 0x7F800000u; }

// ---------------------------------------------------------------------------------------------
// Generic sign / exponent / mantissa minifloat with round-to-nearest-even.
struct MiniFloat {
  int ebits, mbits, bias;
  uint32_t max_code;  // largest finite magnitude code
  uint32_t inf_code;  // 0 when the format has no Inf
  uint32_t nan_code;  // canonical NaN (E2M1: none, NaN saturates to max_code)
  bool has_inf, has_nan;
};

constexpr MiniFloat kE4M3Spec{4, 3, 7, 0x7E, 0, 0x7F, false, true};
constexpr MiniFloat kE5M2Spec{5, 2, 15, 0x7B, 0x7C, 0x7F, true, true};
constexpr MiniFloat kE2M1Spec{2, 1, 1, 0x7, 0, 0x7, false, false};
constexpr MiniFloat kFP16Spec{5, 10, 15, 0x7BFF, 0x7C00, 0x7E00, true, true};

/// Encodes fp32 into a minifloat of at most 16 bits (targets whose smallest subnormal is far
/// above fp32 subnormals). Returns the code with the sign at bit ebits+mbits.
LOWBIT_HOST_DEVICE uint32_t encode_minifloat(float x, MiniFloat f, Saturate sat) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 31) << (f.ebits + f.mbits);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return f.has_nan ? f.nan_code : f.max_code;  // NaN
  if (a == 0x7F800000u) {                                             // +-Inf
    if (sat == Saturate::kFinite || !f.has_nan) return sign | f.max_code;
    return sign | (f.has_inf ? f.inf_code : f.nan_code);
  }
  const int e = int(a >> 23);
  if (e == 0) return sign;  // fp32 zero / subnormal: below half the target's smallest subnormal
  const int exp = e - 127;
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;  // value = mant * 2^(exp-23)
  const int emin = 1 - f.bias;
  const int eclamp = exp > emin ? exp : emin;
  const int shift = (eclamp - f.mbits) - (exp - 23);  // >= 23 - mbits > 0
  uint32_t r;
  if (shift >= 32) {
    r = 0;
  } else {
    r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
  }
  const uint32_t code = (uint32_t(eclamp - emin) << f.mbits) + r;
  if (code > f.max_code) {
    if (sat == Saturate::kFinite || !f.has_nan) return sign | f.max_code;
    return sign | (f.has_inf ? f.inf_code : f.nan_code);
  }
  return sign | code;
}

LOWBIT_HOST_DEVICE float decode_minifloat(uint32_t c, MiniFloat f) {
  const int nb = f.ebits + f.mbits;
  const bool neg = (c >> nb) & 1u;
  const uint32_t mag = c & ((1u << nb) - 1u);
  const uint32_t e = mag >> f.mbits, m = mag & ((1u << f.mbits) - 1u);
  const uint32_t emax_field = (1u << f.ebits) - 1u;
  float v;
  if (f.has_inf && e == emax_field) {
    v = m == 0 ? bits_float(0x7F800000u) : bits_float(0x7FC00000u);
  } else if (!f.has_inf && f.has_nan && mag == f.nan_code) {
    v = bits_float(0x7FC00000u);
  } else if (e == 0) {
    v = float(m) * exp2i(1 - f.bias - f.mbits);
  } else {
    v = float(m + (1u << f.mbits)) * exp2i(int(e) - f.bias - f.mbits);
  }
  return neg ? -v : v;
}

// ---------------------------------------------------------------------------------------------
// 8-bit floats
LOWBIT_HOST_DEVICE uint8_t encode_e4m3(float x, Saturate s = Saturate::kFinite) {
  return uint8_t(encode_minifloat(x, kE4M3Spec, s));
}
LOWBIT_HOST_DEVICE uint8_t encode_e5m2(float x, Saturate s = Saturate::kFinite) {
  return uint8_t(encode_minifloat(x, kE5M2Spec, s));
}
LOWBIT_HOST_DEVICE float decode_e4m3(uint8_t c) { return decode_minifloat(c, kE4M3Spec); }
LOWBIT_HOST_DEVICE float decode_e5m2(uint8_t c) { return decode_minifloat(c, kE5M2Spec); }

// ---------------------------------------------------------------------------------------------
// E2M1 (4-bit): code in the low 4 bits.
LOWBIT_HOST_DEVICE uint8_t encode_e2m1(float x) { return uint8_t(encode_minifloat(x, kE2M1Spec, Saturate::kFinite)); }

LOWBIT_HOST_DEVICE float decode_e2m1(uint8_t c) {
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6 as (value * 2): 0 1 2 3 4 6 8 12
  const uint32_t twice = (0xC8643210u >> ((c & 7u) * 4u)) & 0xFu;
  const float v = float(twice) * 0.5f;
  return (c & 8u) ? -v : v;
}

// ---------------------------------------------------------------------------------------------
// 16-bit floats
LOWBIT_HOST_DEVICE uint16_t encode_fp16(float x) { return uint16_t(encode_minifloat(x, kFP16Spec, Saturate::kNone)); }
LOWBIT_HOST_DEVICE float decode_fp16(uint16_t h) { return decode_minifloat(h, kFP16Spec); }

LOWBIT_HOST_DEVICE uint16_t encode_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN, sign kept
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
LOWBIT_HOST_DEVICE float decode_bf16(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// ---------------------------------------------------------------------------------------------
// UE8M0 scales
LOWBIT_HOST_DEVICE float decode_ue8m0(uint8_t b) { return b == 0xFF ? bits_float(0x7FC00000u) : exp2i(int(b) - 127); }

/// RCEIL: smallest power of two >= x (TransformerEngine float_to_e8m0, PTX cvt.rp.satfinite.ue8m0x2):
/// NaN -> 0xFF, +Inf and values above 2^127 -> 0xFE, zero/negative values are not expected
/// (the sign bit is ignored).
LOWBIT_HOST_DEVICE uint8_t encode_ue8m0_rceil(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFF;
  if (a == 0x7F800000u) return 0xFE;
  uint32_t exponent = a >> 23;
  const uint32_t mantissa = a & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return uint8_t(exponent);
}

/// FLOOR: the fp32 biased exponent field (largest power of two <= x for normal x; 0 for
/// zero and fp32 subnormals); NaN and Inf -> 0xFF.
LOWBIT_HOST_DEVICE uint8_t encode_ue8m0_floor(float x) { return uint8_t((float_bits(x) >> 23) & 0xFFu); }

// ---------------------------------------------------------------------------------------------
// INT4 / UINT4
LOWBIT_HOST_DEVICE float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  // exact for |x| < 2^23; larger values are already integers
  const float a = x < 0 ? -x : x;
  if (!(a < 8388608.0f)) return x;
  float r = (a + 8388608.0f) - 8388608.0f;  // RNE under the default rounding mode
  return x < 0 ? -r : r;
#endif
}

/// Signed INT4 code (two's complement, low 4 bits) of round-half-even(x) clamped to [-8, 7].
/// NaN encodes to 0.
LOWBIT_HOST_DEVICE uint8_t encode_int4(float x) {
  if (x != x) return 0;
  float r = round_half_even(x);
  r = r < -8.0f ? -8.0f : (r > 7.0f ? 7.0f : r);
  return uint8_t(int(r) & 0xF);
}
LOWBIT_HOST_DEVICE int decode_int4(uint8_t c) { return int((c & 0xFu) ^ 0x8u) - 8; }

/// Unsigned 4-bit code of round-half-even(x) clamped to [0, 15]; NaN encodes to 0.
LOWBIT_HOST_DEVICE uint8_t encode_uint4(float x) {
  if (x != x) return 0;
  float r = round_half_even(x);
  r = r < 0.0f ? 0.0f : (r > 15.0f ? 15.0f : r);
  return uint8_t(int(r));
}

// ---------------------------------------------------------------------------------------------
// NF4 (bitsandbytes get_4bit_type('nf4'))
LOWBIT_HOST_DEVICE float nf4_value(uint8_t c) {
  constexpr float kCode[16] = {-1.0f,
                               -0.6961928009986877f,
                               -0.5250730514526367f,
                               -0.39491748809814453f,
                               -0.28444138169288635f,
                               -0.18477343022823334f,
                               -0.09105003625154495f,
                               0.0f,
                               0.07958029955625534f,
                               0.16093020141124725f,
                               0.24611230194568634f,
                               0.33791524171829224f,
                               0.44070982933044434f,
                               0.5626170039176941f,
                               0.7229568362236023f,
                               1.0f};
  return kCode[c & 0xFu];
}

/// Decision thresholds: midpoints of adjacent codes, as the fp32 literals bitsandbytes uses.
LOWBIT_HOST_DEVICE float nf4_threshold(int i) {
  constexpr float kMid[15] = {-0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f,
                              -0.33967943489551544f, -0.23460740596055984f, -0.13791173323988914f,
                              -0.045525018125772476f, 0.03979014977812767f, 0.1202552504837513f,
                              0.2035212516784668f, 0.2920137718319893f, 0.38931253552436829f,
                              0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f};
  return kMid[i];
}

/// NF4 code of a value already normalised to [-1, 1]: the number of thresholds it exceeds.
LOWBIT_HOST_DEVICE uint8_t encode_nf4(float x) {
  uint8_t c = 0;
LOWBIT_UNROLL
  for (int i = 0; i < 15; ++i) c += (x > nf4_threshold(i)) ? 1 : 0;
  return c;
}

}  // namespace lowbit
