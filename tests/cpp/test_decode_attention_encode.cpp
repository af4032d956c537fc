// The CPU reference of lowbit::kproj_rope_nf4_encode (projection + rotate-half RoPE against a
// naive fp64 computation; the cache bit for bit equal to nf4_kcache_quantize of the rotated
// keys) and of lowbit::nf4_kcache_append (the rescale policy: untouched channels keep their
// bytes, outgrown channels get the new amax and stay within FP8 precision, tokens past the
// appended ones are not written, appending into an empty cache equals the quantize).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/codecs.hpp"
#include "lowbit/decode_attention.hpp"
#include "lowbit/kcache.hpp"

using namespace lowbit;

namespace {

TEST(KprojRopeEncode, MatchesNaiveAndQuantize) {
  const int64_t B = 2, T = 5, E = 24, H = 2, D = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(B * T * E)), w(size_t(H * D * E));
  for (auto& e : x) e = n(rng);
  for (auto& e : w) e = n(rng) * 0.2f;
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 7, 100, 1000, 4095, 31};
  std::vector<uint8_t> codes(size_t(B * T * H * D / 2)), res(size_t(B * T * H * D));
  std::vector<float> scale(size_t(B * H * D)), k(size_t(B * T * H * D));
  KprojRopeArgs a;
  a.rope_theta = 500000.0;
  kproj_rope_nf4_encode(TensorView(x.data(), DType::kFloat32, {B, T, E}), TensorView(w.data(), DType::kFloat32, {H * D, E}),
                        TensorView(pos.data(), DType::kInt32, {B, T}), D,
                        TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}),
                        TensorView(scale.data(), DType::kFloat32, {B, H, D}),
                        TensorView(res.data(), DType::kE5M2, {B, T, H, D}),
                        TensorView(k.data(), DType::kFloat32, {B, T, H, D}), a);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c) {
          auto proj = [&](int64_t ch) {
            double acc = 0;
            for (int64_t i = 0; i < E; ++i) acc += double(x[size_t((b * T + t) * E + i)]) * w[size_t((h * D + ch) * E + i)];
            return acc;
          };
          const int64_t i = c % (D / 2);
          const double ang = double(pos[size_t(b * T + t)]) * std::pow(500000.0, -2.0 * double(i) / double(D));
          const double want = c < D / 2 ? proj(c) * std::cos(ang) - proj(c + D / 2) * std::sin(ang)
                                        : proj(c) * std::cos(ang) + proj(c - D / 2) * std::sin(ang);
          ASSERT_NEAR(k[size_t(((b * T + t) * H + h) * D + c)], want, 1e-5 * (1.0 + std::fabs(want)))
              << b << " " << t << " " << h << " " << c;
        }
  // the cache is nf4_kcache_quantize of the rotated keys, bit for bit
  std::vector<uint8_t> codes2(codes.size()), res2(res.size());
  std::vector<float> scale2(scale.size());
  nf4_kcache_quantize(TensorView(k.data(), DType::kFloat32, {B, T, H, D}),
                      TensorView(codes2.data(), DType::kUInt8, {B, T, H, D / 2}),
                      TensorView(scale2.data(), DType::kFloat32, {B, H, D}),
                      TensorView(res2.data(), DType::kE5M2, {B, T, H, D}));
  EXPECT_EQ(codes, codes2);
  EXPECT_EQ(res, res2);
  EXPECT_EQ(scale, scale2);
  // without k_out, and with bf16 inputs / int64 positions, the same encode path runs
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = encode_bf16(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wb[i] = encode_bf16(w[i]);
  std::vector<int64_t> pos64(pos.begin(), pos.end());
  std::vector<uint8_t> codes3(codes.size()), res3(res.size());
  kproj_rope_nf4_encode(TensorView(xb.data(), DType::kBFloat16, {B, T, E}),
                        TensorView(wb.data(), DType::kBFloat16, {H * D, E}), TensorView(pos64.data(), DType::kInt64, {B, T}),
                        D, TensorView(codes3.data(), DType::kUInt8, {B, T, H, D / 2}),
                        TensorView(scale2.data(), DType::kFloat32, {B, H, D}),
                        TensorView(res3.data(), DType::kE5M2, {B, T, H, D}), TensorView(), a);
  for (float s : scale2) EXPECT_GT(s, 0.0f);
}

struct Cache {
  int64_t B, T, H, D;
  std::vector<uint8_t> codes, res;
  std::vector<float> scale;
  TensorView cv() { return TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}); }
  TensorView sv() { return TensorView(scale.data(), DType::kFloat32, {B, H, D}); }
  TensorView rv() { return TensorView(res.data(), DType::kE5M2, {B, T, H, D}); }
  float decode(int64_t b, int64_t t, int64_t h, int64_t c) const {
    const size_t i = size_t(((b * T + t) * H + h) * D + c);
    const uint8_t code = (c & 1) ? uint8_t(codes[i / 2] >> 4) : uint8_t(codes[i / 2] & 0xF);
    return kcache_decode(code, scale[size_t((b * H + h) * D + c)], decode_e5m2(res[i]));
  }
};

TEST(KCacheAppend, RescalesOnlyTheOutgrownChannels) {
  const int64_t B = 2, T = 12, H = 2, D = 64, N = 2;
  const std::vector<int32_t> lens = {5, 9};
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> k(size_t(B * T * H * D), 0.0f);  // prefill: tokens < lens[b], zeros after
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < lens[size_t(b)]; ++t)
      for (int64_t i = 0; i < H * D; ++i) k[size_t((b * T + t) * H * D + i)] = n(rng);
  Cache c{B, T, H, D, std::vector<uint8_t>(size_t(B * T * H * D / 2)), std::vector<uint8_t>(size_t(B * T * H * D)),
          std::vector<float>(size_t(B * H * D))};
  nf4_kcache_quantize(TensorView(k.data(), DType::kFloat32, {B, T, H, D}), c.cv(), c.sv(), c.rv());
  // poison the tokens past the appended ones
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = lens[size_t(b)] + N; t < T; ++t)
      for (int64_t i = 0; i < H * D; ++i) {
        c.res[size_t((b * T + t) * H * D + i)] = 0xAB;
        c.codes[size_t((b * T + t) * H * D + i) / 2] = 0xCD;
      }
  const Cache before = c;
  // new tokens: channel d outgrows its scale for odd d (3x the stored scale), stays inside otherwise
  std::vector<float> kn(size_t(B * N * H * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const float s = c.scale[size_t((b * H + h) * D + d)];
          kn[size_t(((b * N + i) * H + h) * D + d)] = (d & 1) ? (i == 0 ? 3.0f : -2.0f) * s : 0.5f * s * (i ? -1.0f : 1.0f);
        }
  nf4_kcache_append(TensorView(kn.data(), DType::kFloat32, {B, N, H, D}), c.cv(), c.sv(), c.rv(),
                    TensorView(const_cast<int32_t*>(lens.data()), DType::kInt32, {B}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const size_t si = size_t((b * H + h) * D + d);
        const float s0 = before.scale[si], s = c.scale[si];
        EXPECT_EQ(s, (d & 1) ? 3.0f * s0 : s0) << b << " " << h << " " << d;
        for (int64_t t = 0; t < lens[size_t(b)]; ++t) {
          const float want = k[size_t(((b * T + t) * H + h) * D + d)];
          if (d & 1)  // rewritten: within two residual roundings of the true key
            EXPECT_LE(std::fabs(c.decode(b, t, h, d) - want), 0.04f * s) << b << " " << t << " " << d;
          else  // untouched
            EXPECT_EQ(c.decode(b, t, h, d), before.decode(b, t, h, d));
        }
        for (int64_t i = 0; i < N; ++i) {  // new tokens: the kcache rule under the (new) scale
          const float xv = kn[size_t(((b * N + i) * H + h) * D + d)];
          const int64_t t = lens[size_t(b)] + i;
          const uint8_t code = kcache_code(xv, s);
          const float r = decode_e5m2(encode_e5m2(kcache_residual(xv, nf4_value(code), s), Saturate::kFinite));
          EXPECT_EQ(c.decode(b, t, h, d), kcache_decode(code, s, r));
          EXPECT_LE(std::fabs(c.decode(b, t, h, d) - xv), 0.02f * s);
        }
      }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = lens[size_t(b)] + N; t < T; ++t)
      for (int64_t i = 0; i < H * D; ++i) {
        ASSERT_EQ(c.res[size_t((b * T + t) * H * D + i)], 0xAB);
        ASSERT_EQ(c.codes[size_t((b * T + t) * H * D + i) / 2], 0xCD);
      }
}

TEST(KCacheAppend, IntoAnEmptyCacheEqualsTheQuantize) {
  const int64_t B = 1, T = 7, H = 3, D = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> k(size_t(B * T * H * D));
  for (auto& e : k) e = n(rng);
  k[5] = std::numeric_limits<float>::quiet_NaN();  // a NaN token stays NaN, the amax ignores it
  Cache q{B, T, H, D, std::vector<uint8_t>(size_t(B * T * H * D / 2)), std::vector<uint8_t>(size_t(B * T * H * D)),
          std::vector<float>(size_t(B * H * D))};
  Cache a = q;  // empty: scale 0, codes 0
  nf4_kcache_quantize(TensorView(k.data(), DType::kFloat32, {B, T, H, D}), q.cv(), q.sv(), q.rv());
  const std::vector<int32_t> zero = {0};
  nf4_kcache_append(TensorView(k.data(), DType::kFloat32, {B, T, H, D}), a.cv(), a.sv(), a.rv(),
                    TensorView(const_cast<int32_t*>(zero.data()), DType::kInt32, {B}));
  EXPECT_EQ(a.scale, q.scale);
  EXPECT_EQ(a.codes, q.codes);
  EXPECT_EQ(a.res, q.res);
  // token by token gives the same scales (each the amax so far)
  Cache s = Cache{B, T, H, D, std::vector<uint8_t>(q.codes.size()), std::vector<uint8_t>(q.res.size()),
                  std::vector<float>(q.scale.size())};
  for (int32_t t = 0; t < T; ++t) {
    const std::vector<int32_t> len = {t};
    nf4_kcache_append(TensorView(k.data() + t * H * D, DType::kFloat32, {B, 1, H, D}), s.cv(), s.sv(), s.rv(),
                      TensorView(const_cast<int32_t*>(len.data()), DType::kInt32, {B}));
  }
  EXPECT_EQ(s.scale, q.scale);
  EXPECT_TRUE(std::isnan(s.decode(0, 0, 0, 5)));
}

}  // namespace
