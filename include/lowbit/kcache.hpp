// lowbit/kcache.hpp: the element rules of the NF4 + FP8-residual K cache, host and device.
//
// Per (b, h, channel) the scale s is the finite amax of the channel over all tokens. A token's
// element x is stored as an NF4 code q and an FP8 (E4M3 / E5M2) residual r:
//   q = s == 0 ? 7 (the code of 0) : encode_nf4(x / s)     (IEEE division)
//   r = fp8(x - nf4[q] * s)                                   (no FMA; saturating for finite x)
// and decoded as nf4[q] * s + r. The CPU reference (src/ref/ref_kcache.cpp) and the kernels
// (src/cuda/convert/sm90_kcache.cu) use these functions; the kernels pass their own NF4 encoder
// and, for the decode, multiply / add with the x86 NaN rules of the reference.
#pragma once

#include "lowbit/block_quant.hpp"
#include "lowbit/codecs.hpp"
#include "lowbit/config.hpp"

namespace lowbit {

/// NF4 code of x under scale s; `enc` encodes x / s (encode_nf4 by default).
template <typename Encode>
LOWBIT_HOST_DEVICE auto kcache_code(float x, float s, Encode enc) -> decltype(enc(x)) {
  return s == 0.0f ? decltype(enc(x))(7) : enc(x / s);
}
/// The reference NF4 encoder as a function object.
struct KCacheNF4Encode {
  LOWBIT_HOST_DEVICE uint8_t operator()(float v) const { return encode_nf4(v); }
};
LOWBIT_HOST_DEVICE uint8_t kcache_code(float x, float s) { return kcache_code(x, s, KCacheNF4Encode{}); }

/// The residual of x, given the NF4 value nf4[q] of its code and the scale, before the FP8
/// encode (saturation: kcache_residual_saturate(x)).
LOWBIT_HOST_DEVICE float kcache_residual(float x, float q_value, float s) { return x - q_value * s; }

/// Plain fp32 operations of the decode (the host's).
struct KCacheIeeeOps {
  static LOWBIT_HOST_DEVICE float mul(float a, float b) { return a * b; }
  static LOWBIT_HOST_DEVICE float add(float a, float b) { return a + b; }
};

/// Decoded element without its residual: nf4[q] * s.
template <typename Ops = KCacheIeeeOps>
LOWBIT_HOST_DEVICE float kcache_decode(uint8_t q, float s) {
  return Ops::mul(nf4_value(q), s);
}
/// Adds the decoded residual r to kcache_decode(q, s).
template <typename Ops = KCacheIeeeOps>
LOWBIT_HOST_DEVICE float kcache_add_residual(float v, float r) {
  return Ops::add(v, r);
}
/// Decoded element: nf4[q] * s + r.
template <typename Ops = KCacheIeeeOps>
LOWBIT_HOST_DEVICE float kcache_decode(uint8_t q, float s, float r) {
  return kcache_add_residual<Ops>(kcache_decode<Ops>(q, s), r);
}

}  // namespace lowbit
