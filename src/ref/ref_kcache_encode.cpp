// src/ref/ref_kcache_encode.cpp: CPU reference of the ops that fill an NF4 + FP8-residual K
// cache (lowbit/decode_attention.hpp): the fused K projection + RoPE + encode of a prefill and
// the append of decode tokens with per-channel rescaling. Element rules: lowbit/kcache.hpp.
// Tested by tests/cpp/test_decode_attention_encode.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "lowbit/kcache.hpp"
#include "ref/ref.hpp"
#include "ref/ref_decode_attention.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

void kproj_rope_nf4_encode(const KprojRopePlan& p) {
  const int64_t B = p.batch, T = p.seqlen, H = p.heads_kv, D = p.head_dim, E = p.hidden, half = D / 2;
  // pass 0: the rotated keys, fp32, into k_out or an owned [B, T, H, D] buffer
  std::vector<float> own;
  float* k = p.k_out;
  int64_t ks[3] = {p.ko_stride[0], p.ko_stride[1], p.ko_stride[2]};
  if (k == nullptr) {
    own.resize(size_t(B * T * H * D));
    k = own.data();
    ks[0] = T * H * D;
    ks[1] = H * D;
    ks[2] = D;
  }
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t c = 0; c < half; ++c) inv_freq[size_t(c)] = std::pow(p.rope_theta, -double(2 * c) / double(D));
  parallel_for(B * T, [&](int64_t bt) {
    const int64_t b = bt / T, t = bt % T;
    std::vector<double> xr(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i)
      xr[size_t(i)] = double(load_float(p.x, p.x_dtype, b * p.x_stride[0] + t * p.x_stride[1] + i * p.x_stride[2]));
    const int64_t po = b * p.p_stride[0] + t * p.p_stride[1];
    const double pos = p.positions64 ? double(static_cast<const int64_t*>(p.positions)[po])
                                     : double(static_cast<const int32_t*>(p.positions)[po]);
    std::vector<float> proj(static_cast<size_t>(D));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < D; ++c) {
        const int64_t row = h * D + c;
        double acc = 0;
        for (int64_t i = 0; i < E; ++i)
          acc += xr[size_t(i)] * double(load_float(p.w, p.w_dtype, row * p.w_stride[0] + i * p.w_stride[1]));
        proj[size_t(c)] = float(acc);
      }
      float* kh = k + b * ks[0] + t * ks[1] + h * ks[2];
      for (int64_t c = 0; c < half; ++c) {  // rotate-half (neox / llama) RoPE
        const double a = pos * inv_freq[size_t(c)], cs = std::cos(a), sn = std::sin(a);
        const double x0 = double(proj[size_t(c)]), x1 = double(proj[size_t(c + half)]);
        kh[c] = float(x0 * cs - x1 * sn);
        kh[c + half] = float(x1 * cs + x0 * sn);
      }
    }
  });
  // passes 1 and 2: per-channel finite amax over T, then the encode (the kcache.hpp rule)
  KCachePlan c = p.cache;
  c.k = k;
  c.k_dtype = DType::kFloat32;
  c.k_s[0] = ks[0];
  c.k_s[1] = ks[1];
  c.k_s[2] = ks[2];
  c.k_s[3] = 1;
  kcache_quantize(c);
}

namespace {

inline uint8_t set_nibble(NibbleOrder o, uint8_t byte, int which, uint8_t code) {
  const int shift = (o == NibbleOrder::kLowFirst) == (which == 0) ? 0 : 4;
  return uint8_t((byte & ~(0xF << shift)) | ((code & 0xF) << shift));
}

}  // namespace

void nf4_kcache_append(const KCacheAppendPlan& a) {
  const KCachePlan& p = a.cache;  // k = k_new [B, N, H, D], T = N
  parallel_for(p.B * p.H, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H, len = int64_t(a.lengths[b]);
    for (int64_t d = 0; d < p.D; ++d) {
      float* sp = p.scale + b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2];
      uint32_t amax = 0;
      for (int64_t i = 0; i < p.T; ++i)
        amax = std::max(amax, finite_abs_bits(load_float(p.k, p.k_dtype, b * p.k_s[0] + i * p.k_s[1] + h * p.k_s[2] +
                                                                           d * p.k_s[3])));
      const float s_old = *sp, s_new = bits_float(amax);
      // encodes x as token t of this channel under scale s
      auto put = [&](int64_t t, float x, float s) {
        uint8_t* byte = p.codes + a.pages.offset(p.c_s, b, t) + h * p.c_s[2] + (d / 2) * p.c_s[3];
        const uint8_t code = kcache_code(x, s);
        *byte = set_nibble(p.order, *byte, int(d & 1), code);
        store_float(p.residual, p.r_dtype, a.pages.offset(p.r_s, b, t) + h * p.r_s[2] + d * p.r_s[3],
                    kcache_residual(x, nf4_value(code), s), kcache_residual_saturate(x));
      };
      float s = s_old;
      if (s_new > s_old) {  // rescale: re-encode the cached tokens from their decoded values
        for (int64_t t = 0; t < len; ++t) {
          const uint8_t byte = p.codes[a.pages.offset(p.c_s, b, t) + h * p.c_s[2] + (d / 2) * p.c_s[3]];
          const float r = load_float(p.residual, p.r_dtype, a.pages.offset(p.r_s, b, t) + h * p.r_s[2] + d * p.r_s[3]);
          put(t, kcache_decode(unpack_nibble(p.order, byte, int(d & 1)), s_old, r), s_new);
        }
        s = s_new;
        *sp = s;
      }
      for (int64_t i = 0; i < p.T; ++i)
        put(len + i, load_float(p.k, p.k_dtype, b * p.k_s[0] + i * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3]), s);
    }
  });
}

}  // namespace lowbit::ref
