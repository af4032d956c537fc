// lowbit/vcache.hpp: the element rules of the FP8 V cache of the decode attention, host and device.
//
// Per (b, h, channel) one fp32 scale s shared by every token, and one FP8 code (E4M3 or E5M2) per
// element; the value of code q is fp8(q) * s. fp8_vcache_quantize and fp8_vcache_append write
// power-of-two scales:
//   a = the finite amax of the channel over its tokens (NaN / Inf not counted)
//   s = a == 0 ? 0 : the smallest 2^e (e >= -149) with a <= fmax * 2^e
//       (fmax = 448 for E4M3, 57344 for E5M2: the largest finite code)
//   q = fp8(vcache_value(x, s)), round-to-nearest-even without saturation (Saturate::kNone)
// so that x / s is exact (x / 2^e) and the only rounding is the FP8 one; values never overflow
// (|x| <= a <= fmax * s). NaN encodes as NaN; +-Inf as +-Inf in E5M2 and NaN in E4M3; in a
// channel of scale 0 every finite value is a zero of its sign and a non-finite one is NaN.
// The decode attention accepts any scale tensor (not only these), float32 [B, H_kv, Dv].
#pragma once

#include "lowbit/codecs.hpp"
#include "lowbit/config.hpp"

namespace lowbit {

/// The largest finite value of the V-cache code format (E4M3: 448, E5M2: 57344).
LOWBIT_HOST_DEVICE float vcache_fp8_max(bool e5m2) { return e5m2 ? 57344.0f : 448.0f; }

/// floor(log2(a)) of a finite a > 0 (subnormals included).
LOWBIT_HOST_DEVICE int vcache_floor_log2(float a) {
  const uint32_t u = float_bits(a) & 0x7FFFFFFFu;
  if (u >= 0x00800000u) return int(u >> 23) - 127;
  int e = -127;  // subnormal: 2^-149 times the integer u, whose top bit gives the exponent
  for (uint32_t m = u; m > 1; m >>= 1) ++e;
  return e - 22;
}

/// The scale of a channel of finite amax a >= 0: 0 for a == 0, else the smallest power of two
/// 2^e, e >= -149, with a <= fmax * 2^e (each product fmax * 2^e is exact in fp32).
LOWBIT_HOST_DEVICE float vcache_scale(float a, float fmax) {
  if (!(a > 0.0f)) return 0.0f;
  int e = vcache_floor_log2(a) - vcache_floor_log2(fmax);  // fmax * 2^(e - 1) < a <= fmax * 2^(e + 1)
  if (e < -149) e = -149;
  if (a > fmax * exp2i(e)) ++e;
  return exp2i(e);
}

/// The value whose FP8 code stores x under scale s (the FP8 encode follows, Saturate::kNone):
/// x / s (IEEE division); for s == 0, x * 0 (a zero of x's sign, NaN for NaN / Inf).
LOWBIT_HOST_DEVICE float vcache_value(float x, float s) { return s == 0.0f ? x * 0.0f : x / s; }

/// Whether a channel of scale s must be rescaled to hold a new value of magnitude a (finite):
/// a > fmax * s (fp32 product).
LOWBIT_HOST_DEVICE bool vcache_outgrows(float a, float s, float fmax) { return a > fmax * s; }

/// The FP8 code of x under scale s, in the format (E5M2 when e5m2, else E4M3).
LOWBIT_HOST_DEVICE uint8_t vcache_code(float x, float s, bool e5m2) {
  const float v = vcache_value(x, s);
  return e5m2 ? encode_e5m2(v, Saturate::kNone) : encode_e4m3(v, Saturate::kNone);
}

/// The value of code q under scale s: fp8(q) * s (fp32 product; exact for power-of-two scales
/// unless it falls below 2^-126).
LOWBIT_HOST_DEVICE float vcache_decode(uint8_t q, float s, bool e5m2) {
  return (e5m2 ? decode_e5m2(q) : decode_e4m3(q)) * s;
}

}  // namespace lowbit
