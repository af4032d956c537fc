// CPU reference of the grouped GEMM's m_counts layouts (contiguous rows + counts, masked batches)
// and of gpt_oss_expert_mlp: operands made by quantize(), checked against dequantize() and an fp64
// matmul written here; rows outside the counts are neither read (NaN there changes nothing) nor
// written (the poison stays); the host refusals name the argument and touch no output; the expert
// MLP gives bit for bit the term gpt_oss_moe_mlp weights (one slot of weight 1 per row).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lowbit/moe.hpp"
#include "moe_test_util.hpp"
#include "ref_formats.hpp"

using namespace lowbit;
using moetest::act_round;
using moetest::mxfp4_weights;
using moetest::Weights;

namespace {

constexpr uint16_t kPoison = 0x7FC1;  // a bf16 NaN the kernels never write

/// The rule of the reference: the fp64 sum rounded to fp32, then to bf16.
uint16_t expect(const float* a, const float* b, int64_t K) {
  double acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += double(a[k]) * double(b[k]);
  return encode_bf16(float(acc));
}

}  // namespace

TEST(GroupGemmLayouts, ContiguousCountsMatchDequantizeThenMatmul) {
  const int64_t G = 4, N = 24, K = 96;
  const std::vector<int64_t> counts = {3, 0, 9, 1};
  const int64_t used = 13, M = used + 4;  // 4 rows beyond the counts
  const Weights w = mxfp4_weights(G, N, K, 21, 0.2f);
  auto x = reftest::randn(size_t(M * K), 22, 1.0f);
  std::vector<uint16_t> a(size_t(M * K));
  for (size_t i = 0; i < a.size(); ++i) a[i] = encode_bf16(x[i]);
  for (int64_t i = used * K; i < M * K; ++i) a[size_t(i)] = 0x7FC0;  // NaN rows beyond the counts
  std::vector<float> A(a.size());
  for (size_t i = 0; i < a.size(); ++i) A[i] = decode_bf16(a[i]);
  std::vector<uint16_t> out(size_t(M * N), kPoison);
  GroupGemmArgs g;
  g.a = TensorView(a.data(), DType::kBFloat16, {M, K});
  g.b = TensorView(const_cast<uint8_t*>(w.q.data()), DType::kUInt8, {G, N, K / 2});
  g.b_scale = TensorView(const_cast<uint8_t*>(w.s.data()), DType::kUE8M0, {G, N, K / 32});
  g.b_scale_layout = ScaleLayout::row_major();
  g.m_counts = TensorView(const_cast<int64_t*>(counts.data()), DType::kInt64, {G});
  g.out = TensorView(out.data(), DType::kBFloat16, {M, N});
  group_gemm_mxfp4_nt_groupwise(g);
  int64_t r = 0;
  for (int64_t e = 0; e < G; ++e)
    for (int64_t i = 0; i < counts[size_t(e)]; ++i, ++r)
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(out[size_t(r * N + n)], expect(&A[size_t(r * K)], &w.deq[size_t((e * N + n) * K)], K))
            << "group " << e << " row " << r << " n " << n;
  for (int64_t i = used * N; i < M * N; ++i) ASSERT_EQ(out[size_t(i)], kPoison) << "row beyond the counts written";
}

TEST(GroupGemmLayouts, MaskedBatchesMatchDequantizeThenMatmul) {
  const int64_t G = 3, T = 5, N = 16, K = 64;
  const std::vector<int32_t> counts = {0, 5, 2};  // empty, full, partial
  const Weights w = mxfp4_weights(G, N, K, 31, 0.2f);
  auto x = reftest::randn(size_t(G * T * K), 32, 1.0f);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = counts[size_t(g)]; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) x[size_t((g * T + t) * K + k)] = 1e30f;  // never read for results
  std::vector<uint8_t> q(size_t(G * T * K)), s(size_t(G * T * K / 32));
  std::vector<float> A(x.size());
  quantize(TensorView(x.data(), DType::kFloat32, {G * T, K}), BlockFormat::mxfp8(), ScaleLayout::row_major(),
           TensorView(q.data(), DType::kE4M3, {G * T, K}), TensorView(s.data(), DType::kUE8M0, {G * T, K / 32}));
  dequantize(TensorView(q.data(), DType::kE4M3, {G * T, K}), TensorView(s.data(), DType::kUE8M0, {G * T, K / 32}),
             BlockFormat::mxfp8(), ScaleLayout::row_major(), TensorView(A.data(), DType::kFloat32, {G * T, K}));
  std::vector<uint16_t> out(size_t(G * T * N), kPoison);
  GroupGemmArgs g;
  g.a = TensorView(q.data(), DType::kE4M3, {G, T, K});
  g.a_scale = TensorView(s.data(), DType::kUE8M0, {G, T, K / 32});
  g.a_scale_layout = ScaleLayout::row_major();
  g.b = TensorView(const_cast<uint8_t*>(w.q.data()), DType::kUInt8, {G, N, K / 2});
  g.b_scale = TensorView(const_cast<uint8_t*>(w.s.data()), DType::kUE8M0, {G, N, K / 32});
  g.b_scale_layout = ScaleLayout::row_major();
  g.m_counts = TensorView(const_cast<int32_t*>(counts.data()), DType::kInt32, {G});
  g.expected_m = 2;
  g.out = TensorView(out.data(), DType::kBFloat16, {G, T, N});
  group_gemm_mxfp4_nt_groupwise(g);
  for (int64_t e = 0; e < G; ++e)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        const uint16_t v = out[size_t((e * T + t) * N + n)];
        if (t >= counts[size_t(e)]) {
          ASSERT_EQ(v, kPoison) << "group " << e << ": row " << t << " at or beyond the count written";
        } else {
          ASSERT_EQ(v, expect(&A[size_t((e * T + t) * K)], &w.deq[size_t((e * N + n) * K)], K))
              << "group " << e << " row " << t << " n " << n;
        }
      }
}

TEST(GroupGemmLayouts, HostCountsRefusedNamingTheArgument) {
  const int64_t G = 2, T = 4, N = 8, K = 32;
  const Weights w = mxfp4_weights(G, N, K, 41, 0.2f);
  std::vector<uint16_t> a(size_t(G * T * K), encode_bf16(1.0f));
  std::vector<uint16_t> out(size_t(G * T * N), 0x1234);
  std::vector<int32_t> ind = {0, 1, 2};
  auto call = [&](std::vector<int32_t> counts, bool masked, bool with_indptr, const char* arg) {
    GroupGemmArgs g;
    g.a = masked ? TensorView(a.data(), DType::kBFloat16, {G, T, K}) : TensorView(a.data(), DType::kBFloat16, {G * T, K});
    g.b = TensorView(const_cast<uint8_t*>(w.q.data()), DType::kUInt8, {G, N, K / 2});
    g.b_scale = TensorView(const_cast<uint8_t*>(w.s.data()), DType::kUE8M0, {G, N, K / 32});
    g.b_scale_layout = ScaleLayout::row_major();
    if (!counts.empty()) g.m_counts = TensorView(counts.data(), DType::kInt32, {int64_t(counts.size())});
    if (with_indptr) g.m_indptr = TensorView(ind.data(), DType::kInt32, {G + 1});
    g.out = masked ? TensorView(out.data(), DType::kBFloat16, {G, T, N}) : TensorView(out.data(), DType::kBFloat16, {G * T, N});
    try {
      group_gemm_mxfp4_nt_groupwise(g);
      ADD_FAILURE() << "expected ArgumentError naming " << arg;
    } catch (const ArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("argument '") + arg + "'"), std::string::npos) << e.what();
    }
    for (uint16_t v : out) ASSERT_EQ(v, 0x1234);
  };
  call({1, 5}, true, false, "m_counts");        // above max_tokens
  call({-1, 2}, true, false, "m_counts");       // negative
  call({5, 4}, false, false, "m_counts");       // sum above the rows (8)
  call({1, 1}, false, true, "m_counts");        // both layouts
  call({}, true, true, "m_counts");             // masked without counts
  call({1, 1, 1}, false, false, "m_counts");    // not [G]
}

class ExpertMlpRef : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ExpertMlpRef, IndependentFormulationAndRoutedTermBitForBit) {
  const auto [masked, mxfp8] = GetParam();
  const int64_t E = 3, H = 64, I = 32, T = 4;
  const std::vector<int64_t> counts = {2, 0, 4};
  const int64_t rows = masked ? E * T : 6 + 1;  // contiguous: one row beyond the counts
  const Weights w1 = mxfp4_weights(E, 2 * I, H, 51, 0.25f), w2 = mxfp4_weights(E, H, I, 52, 0.2f);
  auto b1 = reftest::randn(size_t(E * 2 * I), 53, 0.5f), b2 = reftest::randn(size_t(E * H), 54, 0.5f);
  auto x = reftest::randn(size_t(rows * H), 55, 1.0f);
  std::vector<int64_t> xrow;  // the x rows of the counts, expert by expert
  std::vector<int32_t> xexp;
  for (int64_t e = 0, r = 0; e < E; ++e)
    for (int64_t i = 0; i < counts[size_t(e)]; ++i, ++r) {
      xrow.push_back(masked ? e * T + i : r);
      xexp.push_back(int32_t(e));
    }
  std::vector<bool> used(size_t(rows), false);
  for (int64_t r : xrow) used[size_t(r)] = true;
  for (int64_t r = 0; r < rows; ++r)
    if (!used[size_t(r)])
      for (int64_t h = 0; h < H; ++h) x[size_t(r * H + h)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(size_t(rows * H), -7.0f);
  ExpertMlpArgs a;
  a.x = masked ? TensorView(x.data(), DType::kFloat32, {E, T, H}) : TensorView(x.data(), DType::kFloat32, {rows, H});
  a.m_counts = TensorView(const_cast<int64_t*>(counts.data()), DType::kInt64, {E});
  a.w1 = TensorView(const_cast<uint8_t*>(w1.q.data()), DType::kUInt8, {E, 2 * I, H / 2});
  a.w1_scale = TensorView(const_cast<uint8_t*>(w1.s.data()), DType::kUE8M0, {E, 2 * I, H / 32});
  a.b1 = TensorView(b1.data(), DType::kFloat32, {E, 2 * I});
  a.w2 = TensorView(const_cast<uint8_t*>(w2.q.data()), DType::kUInt8, {E, H, I / 2});
  a.w2_scale = TensorView(const_cast<uint8_t*>(w2.s.data()), DType::kUE8M0, {E, H, I / 32});
  a.b2 = TensorView(b2.data(), DType::kFloat32, {E, H});
  a.act = mxfp8 ? ActQuant::kMXFP8 : ActQuant::kBF16;
  a.out = masked ? TensorView(out.data(), DType::kFloat32, {E, T, H}) : TensorView(out.data(), DType::kFloat32, {rows, H});
  gpt_oss_expert_mlp(a);
  for (int64_t r = 0; r < rows; ++r)
    if (!used[size_t(r)])
      for (int64_t h = 0; h < H; ++h) ASSERT_EQ(out[size_t(r * H + h)], -7.0f) << "row " << r << " written";

  // independent formulation (fp64 from the dequantized weights), within bf16 rounding
  for (size_t i = 0; i < xrow.size(); ++i) {
    const int64_t e = xexp[i], r = xrow[i];
    std::vector<float> xr(x.begin() + r * H, x.begin() + (r + 1) * H), y(static_cast<size_t>(I));
    act_round(xr, mxfp8);
    for (int64_t f = 0; f < I; ++f) {
      double hg = b1[size_t(e * 2 * I + 2 * f)], hu = b1[size_t(e * 2 * I + 2 * f + 1)];
      for (int64_t h = 0; h < H; ++h) {
        hg += double(w1.deq[size_t((e * 2 * I + 2 * f) * H + h)]) * xr[size_t(h)];
        hu += double(w1.deq[size_t((e * 2 * I + 2 * f + 1) * H + h)]) * xr[size_t(h)];
      }
      const double g = std::min(hg, 7.0), u = std::max(-7.0, std::min(hu, 7.0));
      y[size_t(f)] = float(g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0));
    }
    act_round(y, mxfp8);
    for (int64_t h = 0; h < H; ++h) {
      double o = b2[size_t(e * H + h)];
      for (int64_t f = 0; f < I; ++f) o += double(w2.deq[size_t((e * H + h) * I + f)]) * y[size_t(f)];
      ASSERT_NEAR(out[size_t(r * H + h)], o, 1e-3 + std::abs(o) / 128.0) << "row " << r << " h " << h;
    }
  }

  // gpt_oss_moe_mlp with one slot of weight 1 per row: the same bits
  const int64_t n = int64_t(xrow.size());
  std::vector<float> xs(size_t(n * H)), ones(size_t(n), 1.0f), routed(size_t(n * H));
  for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[size_t(i * H)], &x[size_t(xrow[size_t(i)] * H)], size_t(H) * 4);
  MoeMlpArgs m;
  m.x = TensorView(xs.data(), DType::kFloat32, {n, H});
  m.topk_ids = TensorView(xexp.data(), DType::kInt32, {n, 1});
  m.topk_weights = TensorView(ones.data(), DType::kFloat32, {n, 1});
  m.w1 = a.w1; m.w1_scale = a.w1_scale; m.b1 = a.b1; m.w2 = a.w2; m.w2_scale = a.w2_scale; m.b2 = a.b2;
  m.act = a.act;
  m.out = TensorView(routed.data(), DType::kFloat32, {n, H});
  gpt_oss_moe_mlp(m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(float_bits(out[size_t(xrow[size_t(i)] * H + h)]), float_bits(routed[size_t(i * H + h)]))
          << "row " << xrow[size_t(i)] << " h " << h;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertMlpRef,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));
