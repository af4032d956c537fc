// tests/cpp/attention_util.hpp: MXFP8 attention test data and the naive host attentions the
// attention tests compare with (test_attention_ref.cpp on the CPU, gpu_test_attention.cpp on the
// GPU). Independent of the library's reference: its own E4M3 / UE8M0 decoders, a plain two-pass
// softmax, and the low-precision attention of FlashAttention-3's FP8 test (bf16 operands, bf16
// scores and P (or E4M3 P), fp32-exact sums rounded to bf16).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/codecs.hpp"

namespace attntest {

struct Shape {
  int64_t b = 1, sq = 1, sk = 1, h = 1, hk = 1, d = 64;
  bool causal = false;
};

/// One fixed-length problem in the documented contiguous layouts: q [b, sq, h, d], k and v
/// [b, sk, hk, d] (E4M3 codes), q_scale [b, h, sq, d/32], k_scale / v_scale [b, hk, sk, d/32].
struct Data {
  Shape s;
  std::vector<uint8_t> q, k, v, qs, ks, vs;
  size_t iq(int64_t b, int64_t i, int64_t h, int64_t c) const { return size_t(((b * s.sq + i) * s.h + h) * s.d + c); }
  size_t ik(int64_t b, int64_t j, int64_t h, int64_t c) const { return size_t(((b * s.sk + j) * s.hk + h) * s.d + c); }
  size_t iqs(int64_t b, int64_t h, int64_t i, int64_t c) const {
    return size_t(((b * s.h + h) * s.sq + i) * (s.d / 32) + c / 32);
  }
  size_t iks(int64_t b, int64_t h, int64_t j, int64_t c) const {
    return size_t(((b * s.hk + h) * s.sk + j) * (s.d / 32) + c / 32);
  }
};

/// E4M3 (float8_e4m3fn) code -> value; 0x7F / 0xFF are NaN.
inline double e4m3(uint8_t c) {
  const int sign = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

/// UE8M0 byte -> 2^(b - 127); 255 is NaN.
inline double ue8m0(uint8_t b) { return b == 255 ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, int(b) - 127); }

inline uint8_t clamp_byte(int v) { return uint8_t(std::min(254, std::max(0, v))); }

/// Random problem: Q, K and V rows of N(0, 1) values, MXFP8-quantized per 32 channels (RCEIL;
/// codes of the library's encoders), then their scale bytes moved by exponents that keep every
/// value finite: per block c of the head dimension, +e_c on Q and -e_c on K (the scores stay
/// those of the unshifted data), +-2 per Q row (the softmax temperature), and per block e'_c
/// (+-2 per row) on V, so that each 32-channel block of the output has its own magnitude
/// 2^e'_c. |e|, |e'| <= spread (bytes clamped to [0, 254]).
inline Data make_data(const Shape& s, uint64_t seed, int spread = 0) {
  Data x;
  x.s = s;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ud(-spread, spread), temp(-2, 2);
  const int64_t nb = s.d / 32;
  // one [rows, d] operand: codes (row stride `cstride` over the flat index) and scales
  auto quantize = [&](std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, int64_t rows) {
    codes.assign(size_t(rows * s.d), 0);
    scales.assign(size_t(rows * nb), 0);
    std::vector<float> blk(32);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < nb; ++c) {
        float amax = 0.f;
        for (int t = 0; t < 32; ++t) {
          blk[size_t(t)] = nd(rng);
          amax = std::max(amax, std::fabs(blk[size_t(t)]));
        }
        const uint8_t byte = lowbit::encode_ue8m0_rceil(amax / 448.f);
        scales[size_t(r * nb + c)] = byte;
        for (int t = 0; t < 32; ++t)
          codes[size_t(r * s.d + c * 32 + t)] = lowbit::encode_e4m3(blk[size_t(t)] * lowbit::exp2i(127 - int(byte)));
      }
  };
  // codes are generated in [rows, d] order of the code layout; scales then re-laid out
  std::vector<uint8_t> sq_, sk_, sv_;
  quantize(x.q, sq_, s.b * s.sq * s.h);
  quantize(x.k, sk_, s.b * s.sk * s.hk);
  quantize(x.v, sv_, s.b * s.sk * s.hk);
  x.qs.assign(size_t(s.b * s.h * s.sq * nb), 0);
  x.ks.assign(size_t(s.b * s.hk * s.sk * nb), 0);
  x.vs.assign(x.ks.size(), 0);
  std::vector<int> eblk(size_t(s.b * s.hk * nb));  // per (batch, KV head, block): +e on Q, -e on K
  for (auto& e : eblk) e = ud(rng);
  const int64_t group = s.h / s.hk;
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < s.h; ++h) {
        const int t = spread > 0 ? temp(rng) : 0;
        for (int64_t c = 0; c < nb; ++c)
          x.qs[x.iqs(b, h, i, c * 32)] = clamp_byte(sq_[size_t(((b * s.sq + i) * s.h + h) * nb + c)] +
                                                    eblk[size_t((b * s.hk + h / group) * nb + c)] + t);
      }
  std::vector<int> vblk(eblk.size());  // per (batch, KV head, block) on V
  for (auto& e : vblk) e = ud(rng);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t j = 0; j < s.sk; ++j)
      for (int64_t h = 0; h < s.hk; ++h) {
        const int row = spread > 0 ? temp(rng) : 0;
        for (int64_t c = 0; c < nb; ++c) {
          const size_t src = size_t(((b * s.sk + j) * s.hk + h) * nb + c), blk = size_t((b * s.hk + h) * nb + c);
          x.ks[x.iks(b, h, j, c * 32)] = clamp_byte(sk_[src] - eblk[blk]);
          x.vs[x.iks(b, h, j, c * 32)] = clamp_byte(sv_[src] + vblk[blk] + row);
        }
      }
  return x;
}

/// Attention outputs in double: out [b, sq, h, d], lse [b, h, sq].
struct Result {
  std::vector<double> out, lse;
  /// naive() only: per row [b, h, sq], max over the keys it sees of softmax_scale * sum_c |q_c k_c|
  /// (what an accumulator's rounding of the scores is relative to)
  std::vector<double> score_abs;
};

inline double qval(const Data& x, int64_t b, int64_t i, int64_t h, int64_t c) {
  return e4m3(x.q[x.iq(b, i, h, c)]) * ue8m0(x.qs[x.iqs(b, h, i, c)]);
}
inline double kval(const Data& x, int64_t b, int64_t j, int64_t h, int64_t c) {
  return e4m3(x.k[x.ik(b, j, h, c)]) * ue8m0(x.ks[x.iks(b, h, j, c)]);
}
inline double vval(const Data& x, int64_t b, int64_t j, int64_t h, int64_t c) {
  return e4m3(x.v[x.ik(b, j, h, c)]) * ue8m0(x.vs[x.iks(b, h, j, c)]);
}

/// Number of keys query row i sees (causal: bottom-right aligned).
inline int64_t visible(const Shape& s, int64_t i) {
  return s.causal ? std::max<int64_t>(0, std::min<int64_t>(s.sk, i + s.sk - s.sq + 1)) : s.sk;
}

/// The dequantized operands in the code layouts (fp64, exact).
struct Deq {
  std::vector<double> q, k, v;
  explicit Deq(const Data& x) : q(x.q.size()), k(x.k.size()), v(x.v.size()) {
    const Shape& s = x.s;
    for (int64_t b = 0; b < s.b; ++b) {
      for (int64_t i = 0; i < s.sq; ++i)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t c = 0; c < s.d; ++c) q[x.iq(b, i, h, c)] = qval(x, b, i, h, c);
      for (int64_t j = 0; j < s.sk; ++j)
        for (int64_t h = 0; h < s.hk; ++h)
          for (int64_t c = 0; c < s.d; ++c) {
            k[x.ik(b, j, h, c)] = kval(x, b, j, h, c);
            v[x.ik(b, j, h, c)] = vval(x, b, j, h, c);
          }
    }
  }
};

/// The attention of one (batch, head) with the operands given per row: `score(i, j)` and
/// `value(j, c)`; `prob(p)` rounds each probability (identity in fp64), `store(i, c, o)` and
/// `row(i, n, m, l)` take the results. Rows that see no key are reported with n = 0.
template <typename Score, typename Value, typename Prob, typename Store, typename Row>
void attend(const Shape& s, Score&& score, Value&& value, Prob&& prob, Store&& store, Row&& row) {
  std::vector<double> sc, p;
  for (int64_t i = 0; i < s.sq; ++i) {
    const int64_t n = visible(s, i);
    sc.assign(static_cast<size_t>(n), 0.0);
    bool bad = false;
    for (int64_t j = 0; j < n; ++j) {
      sc[size_t(j)] = score(i, j);
      bad = bad || std::isnan(sc[size_t(j)]);
    }
    if (n == 0 || bad) {
      row(i, n, bad, 0.0, 0.0);
      continue;
    }
    const double m = *std::max_element(sc.begin(), sc.end());
    double l = 0;
    p.assign(static_cast<size_t>(n), 0.0);
    for (int64_t j = 0; j < n; ++j) l += p[size_t(j)] = std::exp(sc[size_t(j)] - m);
    for (int64_t j = 0; j < n; ++j) p[size_t(j)] = prob(p[size_t(j)] / l);
    for (int64_t c = 0; c < s.d; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += p[size_t(j)] * value(j, c);
      store(i, c, acc);
    }
    row(i, n, false, m, l);
  }
}

/// fp64 attention of the dequantized operands (two passes over the scores). A row that sees no
/// key: out 0, lse -inf; a NaN score: the row and its lse NaN.
inline Result naive(const Data& x, double scale) {
  const Shape& s = x.s;
  const Deq dq(x);
  Result r;
  r.out.assign(x.q.size(), 0.0);
  r.lse.assign(size_t(s.b * s.h * s.sq), 0.0);
  r.score_abs.assign(size_t(s.b * s.h * s.sq), 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t hk = h / (s.h / s.hk);
      attend(
          s,
          [&](int64_t i, int64_t j) {
            double dot = 0, dabs = 0;
            const double* qi = &dq.q[x.iq(b, i, h, 0)];
            const double* kj = &dq.k[x.ik(b, j, hk, 0)];
            for (int64_t c = 0; c < s.d; ++c) {
              dot += qi[c] * kj[c];
              dabs += std::fabs(qi[c] * kj[c]);
            }
            double& sa = r.score_abs[size_t((b * s.h + h) * s.sq + i)];
            sa = std::max(sa, dabs * std::fabs(scale));
            return dot * scale;
          },
          [&](int64_t j, int64_t c) { return dq.v[x.ik(b, j, hk, c)]; }, [](double p) { return p; },
          [&](int64_t i, int64_t c, double o) { r.out[x.iq(b, i, h, c)] = o; },
          [&](int64_t i, int64_t n, bool bad, double m, double l) {
            double& lse = r.lse[size_t((b * s.h + h) * s.sq + i)];
            if (bad) {
              for (int64_t c = 0; c < s.d; ++c) r.out[x.iq(b, i, h, c)] = nan;
              lse = nan;
            } else {
              lse = n == 0 ? -std::numeric_limits<double>::infinity() : m + std::log(l);
            }
          });
    }
  return r;
}

inline double bf16(double v) { return double(lowbit::decode_bf16(lowbit::encode_bf16(float(v)))); }

/// The same attention in low precision, as FlashAttention-3's FP8 test computes its O_pt: bf16
/// copies of the dequantized operands, K pre-multiplied by the softmax scale in bf16, scores
/// rounded to bf16, softmax in fp32 with P rounded to bf16 (then to E4M3 when p_e4m3), and the
/// PV product rounded to bf16. Rows that see no key give 0. For finite operands only.
inline Result low_precision(const Data& x, double scale, bool p_e4m3) {
  const Shape& s = x.s;
  const Deq dq(x);
  Result r;
  r.out.assign(x.q.size(), 0.0);
  r.lse.assign(size_t(s.b * s.h * s.sq), 0.0);
  std::vector<double> qb(dq.q.size()), kb(dq.k.size()), vb(dq.v.size());
  for (size_t e = 0; e < qb.size(); ++e) qb[e] = bf16(dq.q[e]);
  for (size_t e = 0; e < kb.size(); ++e) kb[e] = bf16(float(bf16(dq.k[e])) * float(scale));
  for (size_t e = 0; e < vb.size(); ++e) vb[e] = bf16(dq.v[e]);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t hk = h / (s.h / s.hk);
      attend(
          s,
          [&](int64_t i, int64_t j) {
            double dot = 0;
            const double* qi = &qb[x.iq(b, i, h, 0)];
            const double* kj = &kb[x.ik(b, j, hk, 0)];
            for (int64_t c = 0; c < s.d; ++c) dot += qi[c] * kj[c];
            return bf16(float(dot));  // a bf16 matmul: fp32 sums, bf16 result
          },
          [&](int64_t j, int64_t c) { return vb[x.ik(b, j, hk, c)]; },
          [&](double p) {
            const float pb = float(bf16(float(p)));
            return double(p_e4m3 ? lowbit::decode_e4m3(lowbit::encode_e4m3(pb)) : pb);
          },
          [&](int64_t i, int64_t c, double o) { r.out[x.iq(b, i, h, c)] = bf16(float(o)); },
          [](int64_t, int64_t, bool, double, double) {});
    }
  return r;
}

}  // namespace attntest
