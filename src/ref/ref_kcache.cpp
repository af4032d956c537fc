// src/ref/ref_kcache.cpp: CPU reference of the NF4 + FP8-residual K cache codec.
#include "core/parallel.hpp"
#include "lowbit/kcache.hpp"
#include "ref/ref.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

void kcache_quantize(const KCachePlan& p) {
  parallel_for(p.B * p.H, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    for (int64_t d = 0; d < p.D; d += 2) {
      uint32_t amax[2] = {0, 0};
      for (int64_t t = 0; t < p.T; ++t)
        for (int j = 0; j < 2; ++j) {
          const int64_t ko = b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + (d + j) * p.k_s[3];
          const uint32_t a = finite_abs_bits(load_float(p.k, p.k_dtype, ko));  // NaN / Inf ignored
          amax[j] = a > amax[j] ? a : amax[j];
        }
      float s[2];
      for (int j = 0; j < 2; ++j) {
        s[j] = bits_float(amax[j]);
        p.scale[b * p.s_s[0] + h * p.s_s[1] + (d + j) * p.s_s[2]] = s[j];
      }
      for (int64_t t = 0; t < p.T; ++t) {
        uint8_t code[2];
        for (int j = 0; j < 2; ++j) {
          const int64_t ko = b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + (d + j) * p.k_s[3];
          const float x = load_float(p.k, p.k_dtype, ko);
          code[j] = kcache_code(x, s[j]);
          const float r = kcache_residual(x, nf4_value(code[j]), s[j]);
          store_float(p.residual, p.r_dtype, b * p.r_s[0] + t * p.r_s[1] + h * p.r_s[2] + (d + j) * p.r_s[3], r,
                      kcache_residual_saturate(x));
        }
        p.codes[b * p.c_s[0] + t * p.c_s[1] + h * p.c_s[2] + (d / 2) * p.c_s[3]] =
            pack_nibbles(p.order, code[0], code[1]);
      }
    }
  });
}

void kcache_dequantize(const KCachePlan& p) {
  parallel_for(p.B * p.T, [&](int64_t bt) {
    const int64_t b = bt / p.T, t = bt % p.T;
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t d = 0; d < p.D; ++d) {
        const uint8_t byte = p.codes[b * p.c_s[0] + t * p.c_s[1] + h * p.c_s[2] + (d / 2) * p.c_s[3]];
        const uint8_t code = unpack_nibble(p.order, byte, int(d & 1));
        const float sc = p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]];
        float v = kcache_decode(code, sc);
        if (p.residual)
          v = kcache_add_residual(
              v, load_float(p.residual, p.r_dtype, b * p.r_s[0] + t * p.r_s[1] + h * p.r_s[2] + d * p.r_s[3]));
        store_float(const_cast<void*>(p.k), p.k_dtype, b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3], v);
      }
  });
}

}  // namespace lowbit::ref
