// src/ref/ref_formats.cpp: CPU reference of quantize / dequantize / transcode / cast / layouts.
#include <cstring>

#include "core/parallel.hpp"
#include "ref/ref.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

uint32_t amax_bits(const void* x, DType t, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM) {
  uint32_t a = 0;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t b = finite_abs_bits(load_float(x, t, l * sL + m * sM + k));  // NaN / Inf ignored
        a = b > a ? b : a;
      }
  return a;
}

static void zero_scale_storage(const ScalePlan& sp, void* scales, int64_t L, int elem_bytes) {
  std::memset(scales, 0, size_t(L * sp.batch_stride * elem_bytes));
}

void quantize(const QuantPlan& p) {
  const BlockFormat& f = p.f;
  QuantContext ctx;
  if (f.rule == ScaleRule::kNvfp4 && p.global_amax) {
    if (p.compute_global_amax) *p.global_amax = bits_float(amax_bits(p.x, p.x_dtype, p.L, p.M, p.K, p.x_sL, p.x_sM));
    ctx.s_enc = nvfp4_global_encode_scale(*p.global_amax);
  }
  zero_scale_storage(p.sp, p.scales, p.L, f.scale_bytes());
  if (p.zeros) std::memset(p.zeros, 0, size_t(p.L * p.sp.batch_stride));
  const int64_t C = p.K / f.block;
  parallel_for(
      p.L * p.M,
      [&](int64_t lm) {
        const int64_t l = lm / p.M, m = lm % p.M;
        const int64_t xrow = l * p.x_sL + m * p.x_sM;
        uint8_t* qrow = p.q + l * p.q_sL + m * p.q_sM;
        uint8_t codes[2];
        for (int64_t c = 0; c < C; ++c) {
          const int64_t k0 = c * f.block;
          BlockStats st = block_stats_init(load_float(p.x, p.x_dtype, xrow + k0));
          for (int64_t k = 1; k < f.block; ++k) st.add(load_float(p.x, p.x_dtype, xrow + k0 + k));
          const BlockScale b = compute_block_scale(f, st, ctx);
          const int64_t so = p.sp.offset(l, m, c);
          store_scale_code(p.scales, f.scale_type, so, b.code);
          if (p.zeros) p.zeros[so] = b.zero;
          for (int64_t k = 0; k < f.block; ++k) {
            const uint8_t code = encode_element(f, b, load_float(p.x, p.x_dtype, xrow + k0 + k));
            if (!f.packed()) {
              qrow[k0 + k] = code;
            } else {
              codes[k & 1] = code;
              if (k & 1) qrow[(k0 + k) / 2] = pack_nibbles(f.nibbles, codes[0], codes[1]);
            }
          }
        }
      },
      16);
}

void dequantize(const DequantPlan& p) {
  const BlockFormat& f = p.f;
  const float s_dec =
      (f.rule == ScaleRule::kNvfp4 && p.global_amax) ? nvfp4_global_decode_scale(*p.global_amax) : 1.0f;
  parallel_for(
      p.L * p.M,
      [&](int64_t lm) {
        const int64_t l = lm / p.M, m = lm % p.M;
        const uint8_t* qrow = p.q + l * p.q_sL + m * p.q_sM;
        const int64_t orow = l * p.o_sL + m * p.o_sM;
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t so = p.sp.offset(l, m, k / f.block);
          const uint32_t sc = load_scale_code(p.scales, f.scale_type, so);
          const uint8_t zp = p.zeros ? p.zeros[so] : 0;
          const uint8_t code = f.packed() ? unpack_nibble(f.nibbles, qrow[k / 2], int(k & 1)) : qrow[k];
          store_float(p.out, p.out_dtype, orow + k, decode_element(f, code, sc, zp, s_dec));
        }
      },
      16);
}

void transcode(const TranscodePlan& p) {
  const BlockFormat& f = p.f;
  const MiniFloat& spec = p.out_dtype == DType::kE5M2 ? kE5M2Spec : kE4M3Spec;
  parallel_for(p.L * p.M, [&](int64_t lm) {
    const int64_t l = lm / p.M, m = lm % p.M;
    const uint8_t* qrow = p.q + l * p.q_sL + m * p.q_sM;
    uint8_t* orow = p.out + l * p.o_sL + m * p.o_sM;
    for (int64_t k = 0; k < p.K; ++k) {
      const uint8_t code = unpack_nibble(f.nibbles, qrow[k / 2], int(k & 1));
      float v = decode_code(f.elem, code);
      if (f.elem == Elem::kUInt4) v -= float(p.zeros[p.sp.offset(l, m, k / f.block)]);
      orow[k] = uint8_t(encode_minifloat(v, spec, Saturate::kFinite));
    }
  });
}

void cast(const CastPlan& p) {
  int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d) n *= p.shape[d];
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, xo = 0, oo = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % p.shape[d];
      rem /= p.shape[d];
      xo += idx * p.xs[d];
      oo += idx * p.os[d];
    }
    store_float(p.out, p.out_dtype, oo, load_float(p.x, p.x_dtype, xo), p.sat);
  }
}

void convert_layout(const LayoutPlan& p) {
  std::memset(p.out, 0, size_t(p.L * p.to.batch_stride * p.elem_bytes));
  for (int64_t l = 0; l < p.L; ++l)
    for (int64_t r = 0; r < p.from.rows; ++r)
      for (int64_t c = 0; c < p.from.cols; ++c) {
        const auto* src = static_cast<const uint8_t*>(p.in) + p.from.offset(l, r, c) * p.elem_bytes;
        auto* dst = static_cast<uint8_t*>(p.out) + p.to.offset(l, r, c) * p.elem_bytes;
        std::memcpy(dst, src, size_t(p.elem_bytes));
      }
}

}  // namespace lowbit::ref
