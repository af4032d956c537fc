// src/ref/ref_attention.cpp: CPU reference of the MXFP8 flash-attention forward
// (lowbit/attention.hpp). Built from the validated plan (src/core/plan_attention.hpp); parallel
// over (sequence, query head). Tested by tests/cpp/test_attention_ref.cpp against a naive
// implementation and by tests/python/test_attention.py against NumPy.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "lowbit/codecs.hpp"
#include "ref/ref_attention.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

uint16_t bf16_from_double(double x) {
  // NOTE: round to odd into fp32 (24 bits), then to nearest even into bf16 (8 bits): exact,
  // since fp32 keeps more than two extra bits (a plain fp32 cast would round twice).
  float f = float(x);
  if (!std::isnan(x) && double(f) != x) {
    if (std::fabs(double(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // truncate (Inf -> FLT_MAX)
    f = bits_float(float_bits(f) | 1u);
  }
  return encode_bf16(f);
}

namespace {

/// e4m3(code) * 2^(scale - 127) in fp64: exact (the fp32 product could overflow).
inline double mx_value(uint8_t code, uint8_t scale) { return double(decode_e4m3(code)) * double(decode_ue8m0(scale)); }

/// Sequence b: rows q0 .. q0 + sq of q (and out, lse, q_scale), k0 .. k0 + sk of k and v.
struct SeqRows {
  int64_t q0 = 0, k0 = 0, sq = 0, sk = 0;
};

SeqRows seq_rows(const AttnMxfp8Plan& p, int64_t b) {
  SeqRows r{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.varlen) {
    r.q0 = p.cu_seqlens_q[b];
    r.k0 = p.cu_seqlens_k[b];
    r.sq = p.cu_seqlens_q[b + 1] - r.q0;
    r.sk = p.cu_seqlens_k[b + 1] - r.k0;
  }
  return r;
}

/// Keys 0 .. n-1 are visible to row i of the sequence (causal: bottom-right aligned, j <= i + sk - sq).
int64_t visible_keys(const AttnMxfp8Plan& p, const SeqRows& r, int64_t i) {
  return p.causal ? std::max<int64_t>(0, std::min<int64_t>(r.sk, i + r.sk - r.sq + 1)) : r.sk;
}

/// One query row's outputs: out [d] (bf16 bits) and lse.
struct RowOut {
  uint16_t* out;
  float* lse;
  RowOut(const AttnMxfp8Plan& p, const AttnMxfp8Ptrs& x, int64_t b, int64_t h, int64_t row)
      : out(x.out + b * p.o_stride[0] + row * p.o_stride[1] + h * p.o_stride[2]),
        lse(x.lse + b * p.lse_stride[0] + h * p.lse_stride[1] + row * p.lse_stride[2]) {}
  /// A row that sees no key.
  void empty(int64_t d) const {
    for (int64_t c = 0; c < d; ++c) out[c] = 0;  // +0.0
    *lse = -std::numeric_limits<float>::infinity();
  }
  /// A row with a NaN score.
  void nan(int64_t d) const {
    for (int64_t c = 0; c < d; ++c) out[c] = bf16_from_double(std::numeric_limits<double>::quiet_NaN());
    *lse = std::numeric_limits<float>::quiet_NaN();
  }
};

/// f(i, n, row outputs) for the rows i of sequence b, head h that see n >= 1 keys; a row that
/// sees none is written here (out +0, lse -inf).
template <typename F>
void for_each_seen_row(const AttnMxfp8Plan& p, const AttnMxfp8Ptrs& x, int64_t b, int64_t h, const SeqRows& r, F&& f) {
  for (int64_t i = 0; i < r.sq; ++i) {
    const RowOut ro(p, x, b, h, r.q0 + i);
    const int64_t n = visible_keys(p, r, i);
    if (n == 0) {
      ro.empty(p.head_dim);
      continue;
    }
    f(i, n, ro);
  }
}

/// s[j] = f * (q . K[j]) for the n visible keys (K [n, d]); returns their maximum, *has_nan when a
/// score is NaN.
double row_scores(const double* q, const double* K, int64_t n, int64_t d, double f, double* s, bool* has_nan) {
  double m = -std::numeric_limits<double>::infinity();
  *has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    const double* kj = K + j * d;
    for (int64_t c = 0; c < d; ++c) acc += q[c] * kj[c];
    s[j] = f * acc;
    *has_nan = *has_nan || std::isnan(s[j]);
    m = std::max(m, s[j]);
  }
  return m;
}

/// Rows [r0, r0 + n) of one head of an MXFP8 operand, dequantized into dst [n, d].
void load_rows(const uint8_t* codes, const int64_t* cs, const uint8_t* scales, const int64_t* ss, int64_t b,
               int64_t head, int64_t r0, int64_t n, int64_t d, double* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* c = codes + b * cs[0] + (r0 + r) * cs[1] + head * cs[2];
    const uint8_t* s = scales + b * ss[0] + head * ss[1] + (r0 + r) * ss[2];
    for (int64_t i = 0; i < d; ++i) dst[r * d + i] = mx_value(c[i], s[i / 32]);
  }
}

}  // namespace

void flash_attn_mxfp8(const AttnMxfp8Plan& p, const AttnMxfp8Ptrs& x) {
  const int64_t d = p.head_dim, group = p.heads / p.heads_kv;
  const double scale = double(p.softmax_scale);
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / group;
    const SeqRows r = seq_rows(p, b);
    const size_t nk = size_t(r.sk), nd = size_t(d);
    std::vector<double> K(nk * nd), V(nk * nd), q(nd), s(nk), o(nd);
    load_rows(x.k, p.k_stride, x.k_scale, p.ks_stride, b, hk, r.k0, r.sk, d, K.data());
    load_rows(x.v, p.v_stride, x.v_scale, p.vs_stride, b, hk, r.k0, r.sk, d, V.data());
    for_each_seen_row(p, x, b, h, r, [&](int64_t i, int64_t n, const RowOut& ro) {
      load_rows(x.q, p.q_stride, x.q_scale, p.qs_stride, b, h, r.q0 + i, 1, d, q.data());
      // finite unless NaN: |q k| <= d * (448 * 2^127)^2 fits fp64
      bool has_nan = false;
      const double m = row_scores(q.data(), K.data(), n, d, scale, s.data(), &has_nan);
      if (has_nan) {
        ro.nan(d);
        return;
      }
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double pj = std::exp(s[size_t(j)] - m);
        l += pj;
        const double* vj = &V[size_t(j * d)];
        for (int64_t c = 0; c < d; ++c) o[size_t(c)] += pj * vj[c];  // a NaN v[j, c] stays NaN (0 * NaN too)
      }
      for (int64_t c = 0; c < d; ++c) ro.out[c] = bf16_from_double(o[size_t(c)] / l);
      *ro.lse = float(m + std::log(l));
    });
  });
}

double round_e4m3(double x) {
  if (std::isnan(x) || x == 0) return x;
  int e = 0;
  (void)std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const double q = std::ldexp(1.0, std::max(e, -5) - 4);  // 3 mantissa bits; subnormal step 2^-9
  return std::nearbyint(x / q) * q;  // x / q exact (power of two); nearbyint: nearest even
}

namespace {

constexpr int kNoScale = -1;  // a block with no finite scale

/// The largest finite scale byte of every 32-channel block over rows r0 .. r0 + n of one head
/// (127 where a block has none).
std::vector<int> block_maxima(const uint8_t* scales, const int64_t* ss, int64_t b, int64_t head, int64_t r0, int64_t n,
                              int64_t blocks) {
  std::vector<int> m(size_t(blocks), kNoScale);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* s = scales + b * ss[0] + head * ss[1] + (r0 + r) * ss[2];
    for (int64_t i = 0; i < blocks; ++i)
      if (s[i] != 255) m[size_t(i)] = std::max(m[size_t(i)], int(s[i]));
  }
  for (int& v : m) v = v == kNoScale ? 127 : v;
  return m;
}

/// E4M3 operand rows re-rounded against per-block references: dst[r, c] = e4m3(code *
/// 2^(scale[r, c/32] + add[c/32] - ref_r)), ref_r = ref(r) (NaN for scale 255 or a NaN code).
template <class Ref>
void load_rows_fp8(const uint8_t* codes, const int64_t* cs, const uint8_t* scales, const int64_t* ss, int64_t b,
                   int64_t head, int64_t r0, int64_t n, int64_t d, const std::vector<int>& add, Ref ref, double* dst) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* c = codes + b * cs[0] + (r0 + r) * cs[1] + head * cs[2];
    const uint8_t* s = scales + b * ss[0] + head * ss[1] + (r0 + r) * ss[2];
    const int rr = ref(s);
    for (int64_t i = 0; i < d; ++i) {
      const int sc = s[i / 32];
      dst[r * d + i] = sc == 255 ? nan
                                 : round_e4m3(double(decode_e4m3(c[i])) * std::ldexp(1.0, sc + add[size_t(i / 32)] - rr));
    }
  }
}

}  // namespace

void flash_attn_mxfp8_fp8(const AttnMxfp8Plan& p, const AttnMxfp8Ptrs& x) {
  const int64_t d = p.head_dim, group = p.heads / p.heads_kv, blocks = d / 32;
  const double scale_log2 = double(p.softmax_scale) * 1.4426950408889634;
  parallel_for(p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads, hk = h / group;
    const SeqRows r = seq_rows(p, b);
    const size_t nk = size_t(r.sk), nd = size_t(d);
    const std::vector<int> ak = block_maxima(x.k_scale, p.ks_stride, b, hk, r.k0, r.sk, blocks);
    const std::vector<int> av = block_maxima(x.v_scale, p.vs_stride, b, hk, r.k0, r.sk, blocks);
    std::vector<double> K(nk * nd), V(nk * nd), q(nd), s(nk), o(nd);
    // K' = e4m3(k code * 2^(k_scale - Ak)), V' likewise: per-block references, no per-row one
    std::vector<int> neg_ak(ak.size()), neg_av(av.size());
    for (size_t i = 0; i < ak.size(); ++i) neg_ak[i] = -ak[i];
    for (size_t i = 0; i < av.size(); ++i) neg_av[i] = -av[i];
    auto no_row_ref = [](const uint8_t*) { return 0; };
    load_rows_fp8(x.k, p.k_stride, x.k_scale, p.ks_stride, b, hk, r.k0, r.sk, d, neg_ak, no_row_ref, K.data());
    load_rows_fp8(x.v, p.v_stride, x.v_scale, p.vs_stride, b, hk, r.k0, r.sk, d, neg_av, no_row_ref, V.data());
    // R_i = max over finite blocks of q_scale + Ak (254 where the row has none)
    auto q_ref = [&](const uint8_t* sc) {
      int rr = kNoScale;
      for (int64_t i = 0; i < blocks; ++i)
        if (sc[i] != 255) rr = std::max(rr, int(sc[i]) + ak[size_t(i)]);
      return rr == kNoScale ? 254 : rr;
    };
    for_each_seen_row(p, x, b, h, r, [&](int64_t i, int64_t n, const RowOut& ro) {
      load_rows_fp8(x.q, p.q_stride, x.q_scale, p.qs_stride, b, h, r.q0 + i, 1, d, ak, q_ref, q.data());
      const uint8_t* qsc = x.q_scale + b * p.qs_stride[0] + h * p.qs_stride[1] + (r.q0 + i) * p.qs_stride[2];
      const double rf = scale_log2 * std::ldexp(1.0, q_ref(qsc) - 254);
      bool has_nan = false;
      const double m = row_scores(q.data(), K.data(), n, d, rf, s.data(), &has_nan);  // base 2
      if (has_nan) {
        ro.nan(d);
        return;
      }
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double pj = std::exp2(8.0 + s[size_t(j)] - m);  // <= 256
        l += pj;
        const double p8 = round_e4m3(pj);
        const double* vj = &V[size_t(j * d)];
        for (int64_t c = 0; c < d; ++c) o[size_t(c)] += p8 * vj[c];  // a NaN v'[j, c] stays NaN (0 * NaN too)
      }
      for (int64_t c = 0; c < d; ++c)
        ro.out[c] = bf16_from_double(o[size_t(c)] * std::ldexp(1.0, av[size_t(c / 32)] - 127) / l);
      *ro.lse = float((m + std::log2(l) - 8.0) * 0.69314718055994531);
    });
  });
}

}  // namespace lowbit::ref
