// tests/cpp/decode_attention_util.hpp: test data of the NF4 K-cache decode attention and the
// naive fp64 attention the tests compare with (test_decode_attention_ref.cpp). The naive
// attention decodes the cache itself (nf4 table * scale + residual in fp32, as lowbit/kcache.hpp
// states the rule) and runs one plain softmax over the tokens a mask keeps: no blocks, no
// stages.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/codecs.hpp"
#include "lowbit/decode_attention.hpp"

namespace dectest {

using lowbit::DType;
using lowbit::TensorView;

struct Shape {
  int64_t b = 1, t = 1, h = 1, hk = 1, d = 64, dv = 64;
};

/// One problem in the documented contiguous layouts: q [b, 1, h, d] bf16, the cache
/// (k_nf4 [b, t, hk, d/2], k_scale [b, hk, d] fp32, k_res [b, t, hk, d] E5M2) made by
/// lowbit::nf4_kcache_quantize from float keys `k`, v [b, t, hk, dv] bf16.
struct Data {
  Shape s;
  std::vector<uint16_t> q, v;
  std::vector<float> k, k_scale;
  std::vector<uint8_t> k_nf4, k_res;
  size_t ik(int64_t b, int64_t t, int64_t g, int64_t c) const { return size_t(((b * s.t + t) * s.hk + g) * s.d + c); }
  size_t iv(int64_t b, int64_t t, int64_t g, int64_t c) const { return size_t(((b * s.t + t) * s.hk + g) * s.dv + c); }
  size_t iq(int64_t b, int64_t h, int64_t c) const { return size_t((b * s.h + h) * s.d + c); }

  TensorView qv() { return TensorView(q.data(), DType::kBFloat16, {s.b, 1, s.h, s.d}); }
  TensorView codes_v() { return TensorView(k_nf4.data(), DType::kUInt8, {s.b, s.t, s.hk, s.d / 2}); }
  TensorView scale_v() { return TensorView(k_scale.data(), DType::kFloat32, {s.b, s.hk, s.d}); }
  TensorView res_v() { return TensorView(k_res.data(), DType::kE5M2, {s.b, s.t, s.hk, s.d}); }
  TensorView vv() { return TensorView(v.data(), DType::kBFloat16, {s.b, s.t, s.hk, s.dv}); }

  /// Quantizes `k` into the cache (call after editing k).
  void encode() {
    TensorView kv(k.data(), DType::kFloat32, {s.b, s.t, s.hk, s.d});
    lowbit::nf4_kcache_quantize(kv, codes_v(), scale_v(), res_v());
  }
};

inline uint16_t bf16(float x) { return lowbit::encode_bf16(x); }

inline Data make_data(const Shape& s, uint64_t seed) {
  Data x;
  x.s = s;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  x.q.resize(size_t(s.b * s.h * s.d));
  for (auto& e : x.q) e = bf16(n(rng));
  x.k.resize(size_t(s.b * s.t * s.hk * s.d));
  for (auto& e : x.k) e = n(rng);
  x.v.resize(size_t(s.b * s.t * s.hk * s.dv));
  for (auto& e : x.v) e = bf16(n(rng));
  x.k_scale.resize(size_t(s.b * s.hk * s.d));
  x.k_nf4.resize(size_t(s.b * s.t * s.hk * s.d / 2));
  x.k_res.resize(size_t(s.b * s.t * s.hk * s.d));
  x.encode();
  return x;
}

/// Decoded key element: nf4[code] * scale (+ the E5M2 residual), fp32 operations.
inline double key(const Data& x, int64_t b, int64_t t, int64_t g, int64_t c, bool residual) {
  const uint8_t byte = x.k_nf4[x.ik(b, t, g, c) / 2];
  const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);  // element 2i in the low nibble
  const float sc = x.k_scale[size_t((b * x.s.hk + g) * x.s.d + c)];
  float val = lowbit::nf4_value(code) * sc;
  if (residual) val = val + lowbit::decode_e5m2(x.k_res[x.ik(b, t, g, c)]);
  return double(val);
}

/// fp64 softmax attention of query head h of sequence b over the tokens t < L with keep(t).
template <typename Keep>
std::vector<double> naive(const Data& x, int64_t b, int64_t h, int64_t L, double scale, bool residual, Keep keep) {
  const int64_t g = h / (x.s.h / x.s.hk);
  std::vector<double> s(size_t(L), -std::numeric_limits<double>::infinity()), o(size_t(x.s.dv), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < L; ++t) {
    if (!keep(t)) continue;
    double acc = 0;
    for (int64_t c = 0; c < x.s.d; ++c)
      acc += double(lowbit::decode_bf16(x.q[x.iq(b, h, c)])) * key(x, b, t, g, c, residual);
    s[size_t(t)] = scale * acc;
    m = std::max(m, s[size_t(t)]);
  }
  double l = 0;
  for (int64_t t = 0; t < L; ++t) {
    if (!keep(t)) continue;
    const double p = std::exp(s[size_t(t)] - m);
    l += p;
    for (int64_t c = 0; c < x.s.dv; ++c) o[size_t(c)] += p * double(lowbit::decode_bf16(x.v[x.iv(b, t, g, c)]));
  }
  for (auto& e : o) e /= l;
  return o;
}

/// |got - want| within one bfloat16 ulp of want (the reference rounds its fp64 result once).
inline bool bf16_close(uint16_t got, double want) {
  const double g = double(lowbit::decode_bf16(got));
  const double ulp = want == 0 ? 1e-38 : std::ldexp(1.0, std::ilogb(want) - 7);
  return std::fabs(g - want) <= ulp;
}

}  // namespace dectest
