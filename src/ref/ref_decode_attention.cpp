// src/ref/ref_decode_attention.cpp: CPU reference of the pruned decode attention over an NF4 +
// FP8-residual K cache (lowbit/decode_attention.hpp). Built from the validated plan
// (src/core/plan_decode.hpp); parallel over (batch, KV head), each task running stage 1 (block
// maxima, threshold, keep decision, per-block m / l / o) and stage 2 (log-sum-exp merge) for the
// query heads of its group. Tested by tests/cpp/test_decode_attention_ref.cpp against a naive
// attention and by tests/python/test_decode_attention.py against NumPy.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "lowbit/kcache.hpp"
#include "ref/ref_attention.hpp"
#include "ref/ref_decode_attention.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Max with NaN propagation (a NaN anywhere gives NaN), the block-max rule of the pruning.
inline double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return a > b ? a : b;
}

/// The decoded keys of tokens 0 .. L-1 of (b, KV head g) as fp64 copies of the fp32 rule.
void decode_keys(const DecodeNf4Plan& p, const DecodeNf4Ptrs& x, int64_t b, int64_t g, int64_t L, double* K) {
  const int64_t D = p.head_dim;
  std::vector<float> sc(size_t(D), 0.0f);
  for (int64_t c = 0; c < D; ++c)
    sc[size_t(c)] = load_float(x.k_scale, p.scale_dtype, b * p.ks_stride[0] + g * p.ks_stride[1] + c);
  for (int64_t t = 0; t < L; ++t) {
    const uint8_t* codes = x.k_nf4 + p.pages.offset(p.kc_stride, b, t) + g * p.kc_stride[2];
    const int64_t r0 = p.pages.offset(p.kr_stride, b, t) + g * p.kr_stride[2];
    for (int64_t c = 0; c < D; ++c) {
      const uint8_t code = unpack_nibble(p.nibbles, codes[c / 2], int(c & 1));
      float val = kcache_decode(code, sc[size_t(c)]);
      if (p.use_residual) val = kcache_add_residual(val, load_float(x.k_residual, p.residual_dtype, r0 + c));
      K[t * D + c] = double(val);
    }
  }
}

}  // namespace

void attn_decode_nf4(const DecodeNf4Plan& p, const DecodeNf4Ptrs& x) {
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.heads / p.heads_kv;
  const double scale = double(p.softmax_scale), delta = double(p.delta);
  parallel_for(p.batch * p.heads_kv, [&](int64_t bg) {
    const int64_t b = bg / p.heads_kv, g = bg % p.heads_kv;
    const int64_t L = p.has_seq_lens ? int64_t(x.seq_lens[b]) : p.seqlen;
    const int64_t n = p.blocks(L), bs = p.block_size, sbs = p.sub_block_size;
    auto sz = [](int64_t v) { return static_cast<size_t>(v); };
    std::vector<double> K(sz(L * D)), V(sz(L * Dv)), q(sz(D)), s(sz(G * L)), M(sz(G * n));
    decode_keys(p, x, b, g, L, K.data());
    // values: bf16, or FP8 codes times the channel's scale (the exact product, in fp64)
    const float* vs = x.v_scale ? x.v_scale + b * p.vs_stride[0] + g * p.vs_stride[1] : nullptr;
    for (int64_t t = 0; t < L; ++t) {
      const int64_t v0 = p.pages.offset(p.v_stride, b, t) + g * p.v_stride[2];
      for (int64_t c = 0; c < Dv; ++c) {
        const double e = double(load_float(x.v, p.v_dtype, v0 + c));
        V[size_t(t * Dv + c)] = vs ? e * double(vs[c]) : e;
      }
    }
    // scores and block maxima (each block's max is the max of its sub-block maxima)
    std::vector<double> thr(sz(G));
    for (int64_t i = 0; i < G; ++i) {
      const int64_t h = g * G + i;
      const uint16_t* qh = x.q + b * p.q_stride[0] + h * p.q_stride[2];
      for (int64_t c = 0; c < D; ++c) q[size_t(c)] = double(decode_bf16(qh[c]));
      double* si = &s[size_t(i * L)];
      for (int64_t t = 0; t < L; ++t) {
        double acc = 0;
        for (int64_t c = 0; c < D; ++c) acc += q[size_t(c)] * K[size_t(t * D + c)];
        si[t] = scale * acc;
      }
      for (int64_t j = 0; j < n; ++j) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t t0 = j * bs; t0 < std::min((j + 1) * bs, L); t0 += sbs) {
          double sub = -std::numeric_limits<double>::infinity();
          for (int64_t t = t0; t < std::min({t0 + sbs, (j + 1) * bs, L}); ++t) sub = nan_max(sub, si[t]);
          m = nan_max(m, sub);
        }
        M[size_t(i * n + j)] = m;
      }
      // threshold: the larger of the first and last blocks' maxima minus delta (NaN stays NaN,
      // and -inf with delta = +inf gives NaN: either way nothing compares below it)
      thr[size_t(i)] = p.has_threshold ? double(x.threshold[b * p.heads + h])
                                       : nan_max(M[size_t(i * n)], M[size_t(i * n + n - 1)]) - delta;
    }
    // keep decision per block, shared by the group: skipped only when every head is below
    std::vector<char> keep(size_t(n), 1);
    int64_t skipped = 0;
    for (int64_t j = 1; j + 1 < n; ++j) {
      bool all_below = true;
      for (int64_t i = 0; i < G && all_below; ++i) all_below = M[size_t(i * n + j)] < thr[size_t(i)];
      if (all_below) {
        keep[size_t(j)] = 0;
        ++skipped;
      }
    }
    if (p.has_skip_ratio)
      x.skip_ratio[b * p.sr_stride[0] + g * p.sr_stride[1]] = float(double(skipped) / double(n));
    // stage 1 per kept block and stage 2 merge, per head
    std::vector<double> o(sz(Dv)), oj(sz(Dv));
    for (int64_t i = 0; i < G; ++i) {
      const int64_t h = g * G + i;
      uint16_t* out = x.out + b * p.o_stride[0] + h * p.o_stride[1];
      const double* si = &s[size_t(i * L)];
      bool finite = true;
      for (int64_t j = 0; j < n && finite; ++j)
        if (keep[size_t(j)])
          for (int64_t t = j * bs; t < std::min((j + 1) * bs, L); ++t) finite = finite && std::isfinite(si[t]);
      if (!finite) {
        for (int64_t c = 0; c < Dv; ++c) out[c] = bf16_from_double(kNaN);
        continue;
      }
      double m_all = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j)
        if (keep[size_t(j)]) m_all = std::max(m_all, M[size_t(i * n + j)]);
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        if (!keep[size_t(j)]) continue;
        const double mj = M[size_t(i * n + j)];
        double lj = 0;  // stage 1: l_j = sum exp(s - m_j), o_j = sum exp(s - m_j) v
        std::fill(oj.begin(), oj.end(), 0.0);
        for (int64_t t = j * bs; t < std::min((j + 1) * bs, L); ++t) {
          const double pt = std::exp(si[t] - mj);
          lj += pt;
          for (int64_t c = 0; c < Dv; ++c) oj[size_t(c)] += pt * V[size_t(t * Dv + c)];
        }
        const double w = std::exp(mj - m_all);  // stage 2: log-sum-exp merge
        l += w * lj;
        for (int64_t c = 0; c < Dv; ++c) o[size_t(c)] += w * oj[size_t(c)];
      }
      for (int64_t c = 0; c < Dv; ++c) out[c] = bf16_from_double(o[size_t(c)] / l);
    }
  });
}

}  // namespace lowbit::ref
