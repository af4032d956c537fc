// CPU reference of the gpt-oss expert MLP, checked against a formulation written here from
// dequantize() of the expert weights (interleaved gate/up, clamped SwiGLU, weighted sum).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lowbit/moe.hpp"
#include "moe_test_util.hpp"
#include "ref_formats.hpp"

using namespace lowbit;
using moetest::act_round;

class MoeMlpRef : public ::testing::TestWithParam<bool> {};

TEST_P(MoeMlpRef, MatchesIndependentFormulation) {
  const bool mxfp8 = GetParam();
  const int64_t T = 5, H = 64, I = 96, E = 4, k = 2;
  moetest::Weights w1 = moetest::mxfp4_weights(E, 2 * I, H, 11, 0.3f), w2 = moetest::mxfp4_weights(E, H, I, 12, 0.3f);
  const std::vector<float>& W1 = w1.deq;
  const std::vector<float>& W2 = w2.deq;
  auto b1 = reftest::randn(size_t(E * 2 * I), 13, 0.5f), b2 = reftest::randn(size_t(E * H), 14, 0.5f);
  auto x = reftest::randn(size_t(T * H), 15, 1.0f);
  std::vector<int32_t> ids = {0, 3, 2, 2, 1, -1, 3, 0, 1, 2};
  std::vector<float> wts = {0.6f, 0.4f, 0.5f, 0.5f, 1.0f, 0.0f, 0.3f, 0.7f, 0.9f, 0.1f};
  std::vector<uint16_t> out(size_t(T * H), 0xFFFF);

  MoeMlpArgs a;
  a.x = TensorView(x.data(), DType::kFloat32, {T, H});
  a.topk_ids = TensorView(ids.data(), DType::kInt32, {T, k});
  a.topk_weights = TensorView(wts.data(), DType::kFloat32, {T, k});
  a.w1 = TensorView(w1.q.data(), DType::kUInt8, {E, 2 * I, H / 2});
  a.w1_scale = TensorView(w1.s.data(), DType::kUE8M0, {E, 2 * I, H / 32});
  a.b1 = TensorView(b1.data(), DType::kFloat32, {E, 2 * I});
  a.w2 = TensorView(w2.q.data(), DType::kUInt8, {E, H, I / 2});
  a.w2_scale = TensorView(w2.s.data(), DType::kUE8M0, {E, H, I / 32});
  a.b2 = TensorView(b2.data(), DType::kFloat32, {E, H});
  a.act = mxfp8 ? ActQuant::kMXFP8 : ActQuant::kBF16;
  a.out = TensorView(out.data(), DType::kBFloat16, {T, H});
  gpt_oss_moe_mlp(a);

  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ref(static_cast<size_t>(H), 0.0);
    std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    act_round(xt, mxfp8);
    for (int64_t j = 0; j < k; ++j) {
      const int e = ids[size_t(t * k + j)];
      if (e < 0) continue;
      std::vector<float> y(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double hg = b1[size_t(e * 2 * I + 2 * i)], hu = b1[size_t(e * 2 * I + 2 * i + 1)];
        for (int64_t h = 0; h < H; ++h) {
          hg += double(W1[size_t((e * 2 * I + 2 * i) * H + h)]) * xt[size_t(h)];
          hu += double(W1[size_t((e * 2 * I + 2 * i + 1) * H + h)]) * xt[size_t(h)];
        }
        const double g = std::min(hg, 7.0), u = std::max(-7.0, std::min(hu, 7.0));
        y[size_t(i)] = float(g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0));
      }
      act_round(y, mxfp8);
      for (int64_t h = 0; h < H; ++h) {
        double o = b2[size_t(e * H + h)];
        for (int64_t i = 0; i < I; ++i) o += double(W2[size_t((e * H + h) * I + i)]) * y[size_t(i)];
        ref[size_t(h)] += wts[size_t(t * k + j)] * o;
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const double got = decode_bf16(out[size_t(t * H + h)]);
      // within bf16 rounding (2^-8 relative) plus the fp32-vs-fp64 difference of the steps
      ASSERT_NEAR(got, ref[size_t(h)], 1e-3 + std::abs(ref[size_t(h)]) / 128.0) << "t=" << t << " h=" << h;
    }
  }
  // a bad expert id is refused with the argument named, output untouched
  ids[3] = 4;
  std::vector<uint16_t> out2(size_t(T * H), 0x1234);
  a.out = TensorView(out2.data(), DType::kBFloat16, {T, H});
  try {
    gpt_oss_moe_mlp(a);
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& err) {
    EXPECT_NE(std::string(err.what()).find("argument 'topk_ids'"), std::string::npos) << err.what();
  }
  for (uint16_t v : out2) ASSERT_EQ(v, 0x1234);
}

INSTANTIATE_TEST_SUITE_P(Act, MoeMlpRef, ::testing::Values(false, true));
