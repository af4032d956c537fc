// src/ref/ref_vcache.cpp: CPU reference of the FP8 V cache of the decode attention
// (lowbit/decode_attention.hpp fp8_vcache_quantize / fp8_vcache_append; the element rules of
// lowbit/vcache.hpp). Parallel over (batch, head); tested by tests/cpp/test_vcache_ref.cpp and
// tests/python/test_vcache.py against independent implementations.
#include <algorithm>
#include <cstdint>

#include "core/parallel.hpp"
#include "lowbit/block_quant.hpp"
#include "lowbit/vcache.hpp"
#include "ref/ref_decode_attention.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

namespace {

/// Element (b, t, h, d) of a [B, T, H, D] tensor of the given strides.
inline int64_t at(const int64_t* s, int64_t b, int64_t t, int64_t h, int64_t d) {
  return b * s[0] + t * s[1] + h * s[2] + d * s[3];
}

/// The finite amax over tokens 0 .. T-1 of channel (b, h, d) of the plan's values.
float finite_amax(const VCachePlan& p, int64_t b, int64_t h, int64_t d) {
  uint32_t amax = 0;
  for (int64_t t = 0; t < p.T; ++t) amax = std::max(amax, finite_abs_bits(load_float(p.v, p.v_dtype, at(p.v_s, b, t, h, d))));
  return bits_float(amax);
}

}  // namespace

void fp8_vcache_quantize(const VCachePlan& p) {
  const float fmax = vcache_fp8_max(p.e5m2);
  parallel_for(p.B * p.H, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    for (int64_t d = 0; d < p.D; ++d) {
      const float s = vcache_scale(finite_amax(p, b, h, d), fmax);
      p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]] = s;
      for (int64_t t = 0; t < p.T; ++t)
        p.codes[at(p.c_s, b, t, h, d)] = vcache_code(load_float(p.v, p.v_dtype, at(p.v_s, b, t, h, d)), s, p.e5m2);
    }
  });
}

void fp8_vcache_append(const VCacheAppendPlan& a) {
  const VCachePlan& p = a.cache;  // v = the new values [B, N, H, D], T = N
  const float fmax = vcache_fp8_max(p.e5m2);
  parallel_for(p.B * p.H, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H, len = int64_t(a.lengths[b]);
    for (int64_t d = 0; d < p.D; ++d) {
      float* sp = p.scale + b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2];
      const float amax = finite_amax(p, b, h, d), s_old = *sp;
      float s = s_old;
      if (vcache_outgrows(amax, s_old, fmax)) {  // rescale: re-encode the cached tokens' values
        s = vcache_scale(amax, fmax);
        for (int64_t t = 0; t < len; ++t) {
          uint8_t& code = p.codes[a.pages.offset(p.c_s, b, t) + h * p.c_s[2] + d * p.c_s[3]];
          code = vcache_code(vcache_decode(code, s_old, p.e5m2), s, p.e5m2);
        }
        *sp = s;
      }
      for (int64_t i = 0; i < p.T; ++i)
        p.codes[a.pages.offset(p.c_s, b, len + i) + h * p.c_s[2] + d * p.c_s[3]] =
            vcache_code(load_float(p.v, p.v_dtype, at(p.v_s, b, i, h, d)), s, p.e5m2);
    }
  });
}

}  // namespace lowbit::ref
