// CPU reference of the MXFP4 x MXFP8 grouped GEMM: operands made by quantize() (grouped 128x4
// activation scales from m_indptr), checked against dequantize() + an fp64 matmul written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lowbit/moe.hpp"
#include "ref_formats.hpp"

using namespace lowbit;

class GroupGemmRef : public ::testing::TestWithParam<std::tuple<std::vector<int>, int, int, bool, bool>> {};

TEST_P(GroupGemmRef, MatchesDequantizeThenMatmul) {
  const auto& [sizes, N, K, blocked, bf16_a] = GetParam();
  const int64_t G = int64_t(sizes.size());
  std::vector<int32_t> ind(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) ind[size_t(g + 1)] = ind[size_t(g)] + sizes[size_t(g)];
  const int64_t M = ind[size_t(G)];
  const uint64_t seed = 7u + uint64_t(M) + uint64_t(N) + uint64_t(K);
  const auto xa = reftest::randn(size_t(M * K), seed, 1.0f);
  const auto xb = reftest::randn(size_t(G * N * K), seed + 1, 1.0f / std::sqrt(float(K)));
  const TensorView indv(ind.data(), DType::kInt32, {G + 1});

  // B: MXFP4 (FLOOR, as FlashInfer's test), per-expert scales
  const ScaleLayout lb = blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  const auto sb_shape = scale_shape(BlockFormat::mxfp4(true), lb, G, N, K);
  std::vector<uint8_t> bq(size_t(G * N * K / 2)), bs(size_t(sb_shape[0] * sb_shape[1] * sb_shape[2]));
  quantize(TensorView(const_cast<float*>(xb.data()), DType::kFloat32, {G, N, K}), BlockFormat::mxfp4(true), lb,
           TensorView(bq.data(), DType::kUInt8, {G, N, K / 2}), TensorView(bs.data(), DType::kUE8M0, {int64_t(bs.size())}));
  std::vector<float> B(size_t(G * N * K));
  dequantize(TensorView(bq.data(), DType::kUInt8, {G, N, K / 2}), TensorView(bs.data(), DType::kUE8M0, {int64_t(bs.size())}),
             BlockFormat::mxfp4(true), lb, TensorView(B.data(), DType::kFloat32, {G, N, K}));

  // A: MXFP8 E4M3 with grouped 128x4 scales (or row-major), or bf16
  GroupGemmArgs args;
  std::vector<uint8_t> aq(size_t(M * K)), as;
  std::vector<uint16_t> abf(size_t(M * K));
  std::vector<float> A(size_t(M * K));
  if (bf16_a) {
    for (size_t i = 0; i < abf.size(); ++i) {
      abf[i] = encode_bf16(xa[i]);
      A[i] = decode_bf16(abf[i]);
    }
    args.a = TensorView(abf.data(), DType::kBFloat16, {M, K});
  } else {
    const ScaleLayout la = blocked ? ScaleLayout::blocked128x4(GroupPad::kFlashInfer) : ScaleLayout::row_major();
    const auto sa_shape = scale_shape(BlockFormat::mxfp8(), la, 1, M, K, G);
    as.assign(size_t(sa_shape[0] * sa_shape[1] * sa_shape[2]), 0xEE);
    QuantArgs qa;
    if (blocked) qa.m_indptr = indv;
    quantize(TensorView(const_cast<float*>(xa.data()), DType::kFloat32, {M, K}), BlockFormat::mxfp8(), la,
             TensorView(aq.data(), DType::kE4M3, {M, K}), TensorView(as.data(), DType::kUE8M0, {int64_t(as.size())}), qa);
    dequantize(TensorView(aq.data(), DType::kE4M3, {M, K}), TensorView(as.data(), DType::kUE8M0, {int64_t(as.size())}),
               BlockFormat::mxfp8(), la, TensorView(A.data(), DType::kFloat32, {M, K}), qa);
    args.a = TensorView(aq.data(), DType::kE4M3, {M, K});
    args.a_scale = TensorView(as.data(), DType::kUE8M0, {int64_t(as.size())});
    args.a_scale_layout = la;
  }
  args.b = TensorView(bq.data(), DType::kUInt8, {G, N, K / 2});
  args.b_scale = TensorView(bs.data(), DType::kUE8M0, {int64_t(bs.size())});
  args.b_scale_layout = lb;
  args.m_indptr = indv;
  std::vector<uint16_t> out(size_t(M * N), 0xFFFF);
  args.out = TensorView(out.data(), DType::kBFloat16, {M, N});
  group_gemm_mxfp4_nt_groupwise(args);

  for (int64_t g = 0; g < G; ++g)
    for (int64_t m = ind[size_t(g)]; m < ind[size_t(g + 1)]; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(A[size_t(m * K + k)]) * B[size_t((g * N + n) * K + k)];
        const float got = decode_bf16(out[size_t(m * N + n)]);
        // one bf16 ulp of the exact result (the fp64 sum rounded once)
        ASSERT_EQ(got, decode_bf16(encode_bf16(float(acc)))) << "g=" << g << " m=" << m << " n=" << n;
      }
}

INSTANTIATE_TEST_SUITE_P(
    Groups, GroupGemmRef,
    ::testing::Values(std::make_tuple(std::vector<int>{5, 0, 3}, 128, 64, true, false),
                      std::make_tuple(std::vector<int>{127, 127}, 16, 96, true, false),
                      std::make_tuple(std::vector<int>{1, 50, 0, 4}, 24, 128, false, false),
                      std::make_tuple(std::vector<int>{3, 9}, 8, 64, true, true)));
