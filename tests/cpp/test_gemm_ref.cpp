// CPU reference of the NVFP4 dual GEMM: checked against dequantize() + an fp64 matmul written
// here, over the GPU MODE layouts (L-outermost storage, reference and permuted scales).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lowbit/gemm.hpp"

using namespace lowbit;

namespace {

struct Problem {
  int64_t M, N, K, L;
  std::vector<uint8_t> a, b1, b2;        // (L, rows, K/2) storage
  std::vector<uint8_t> sfa, sfb1, sfb2;  // (L, rows, K/16) storage, reference layout
};

Problem make(int64_t M, int64_t N, int64_t K, int64_t L, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{M, N, K, L, {}, {}, {}, {}, {}, {}};
  auto bytes = [&](int64_t n, bool gpumode_mask) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& b : v) b = uint8_t(rng() & (gpumode_mask ? 0xBB : 0xFF));
    return v;
  };
  p.a = bytes(L * M * K / 2, false);
  p.b1 = bytes(L * N * K / 2, true);
  p.b2 = bytes(L * N * K / 2, false);
  auto scales = [&](int64_t n) {  // E4M3 of U(0,1) like GPU MODE, plus some zeros / subnormals
    std::vector<uint8_t> v(static_cast<size_t>(n));
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (auto& s : v) s = encode_e4m3(u(rng));
    v[0] = 0x00;
    if (n > 1) v[1] = 0x03;  // subnormal
    return v;
  };
  p.sfa = scales(L * M * K / 16);
  p.sfb1 = scales(L * N * K / 16);
  p.sfb2 = scales(L * N * K / 16);
  return p;
}

/// Dequantizes one [rows, K] NVFP4 matrix of batch l through the public API.
std::vector<float> dq(std::vector<uint8_t>& data, std::vector<uint8_t>& sf, int64_t rows, int64_t K, int64_t l) {
  std::vector<float> out(size_t(rows * K));
  dequantize(TensorView(data.data() + l * rows * K / 2, DType::kUInt8, {rows, K / 2}),
             TensorView(sf.data() + l * rows * K / 16, DType::kE4M3, {rows, K / 16}), BlockFormat::nvfp4(),
             ScaleLayout::row_major(), TensorView(out.data(), DType::kFloat32, {rows, K}));
  return out;
}

float half_to_float(uint16_t h) { return decode_fp16(h); }

}  // namespace

class DualGemmRef : public ::testing::TestWithParam<std::tuple<int, int, int, int, bool>> {};

TEST_P(DualGemmRef, MatchesDequantizeThenMatmul) {
  const auto [M, N, K, L, permuted] = GetParam();
  Problem p = make(M, N, K, L, 1234u + M + N + K + L);
  std::vector<uint16_t> c(size_t(L * M * N), 0xFFFF);  // poison (NaN)
  // GPU MODE views: [rows, K/2, L] of (L, rows, K/2) storage
  DualGemmArgs args;
  args.a = TensorView(p.a.data(), DType::kUInt8, {M, K / 2, L}, {K / 2, 1, M * K / 2});
  args.b1 = TensorView(p.b1.data(), DType::kUInt8, {N, K / 2, L}, {K / 2, 1, N * K / 2});
  args.b2 = TensorView(p.b2.data(), DType::kUInt8, {N, K / 2, L}, {K / 2, 1, N * K / 2});
  std::vector<uint8_t> pa, pb1, pb2;  // permuted scales when asked
  auto permute = [&](std::vector<uint8_t>& ref, int64_t R, std::vector<uint8_t>& dst) {
    const int64_t per = ((R + 127) / 128 * 128) * (K / 16);
    dst.assign(size_t(L * per), 0xCD);
    convert_scale_layout(TensorView(ref.data(), DType::kUInt8, {L, R, K / 16}), ScaleLayout::row_major(),
                         TensorView(dst.data(), DType::kUInt8, {L * per}), ScaleLayout::blocked128x4(), R, K / 16);
  };
  if (permuted) {
    permute(p.sfa, M, pa);
    permute(p.sfb1, N, pb1);
    permute(p.sfb2, N, pb2);
    args.sfa = TensorView(pa.data(), DType::kE4M3, {int64_t(pa.size())});
    args.sfb1 = TensorView(pb1.data(), DType::kE4M3, {int64_t(pb1.size())});
    args.sfb2 = TensorView(pb2.data(), DType::kE4M3, {int64_t(pb2.size())});
    args.sf_layout = ScaleLayout::blocked128x4();
  } else {
    args.sfa = TensorView(p.sfa.data(), DType::kE4M3, {M, K / 16, L}, {K / 16, 1, M * K / 16});
    args.sfb1 = TensorView(p.sfb1.data(), DType::kE4M3, {N, K / 16, L}, {K / 16, 1, N * K / 16});
    args.sfb2 = TensorView(p.sfb2.data(), DType::kE4M3, {N, K / 16, L}, {K / 16, 1, N * K / 16});
  }
  args.c = TensorView(c.data(), DType::kFloat16, {M, N, L}, {N, 1, M * N});
  nvfp4_dual_gemm_silu(args);

  for (int64_t l = 0; l < L; ++l) {
    const auto A = dq(p.a, p.sfa, M, K, l), B1 = dq(p.b1, p.sfb1, N, K, l), B2 = dq(p.b2, p.sfb2, N, K, l);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < K; ++k) {
          g += double(A[m * K + k]) * B1[n * K + k];
          u += double(A[m * K + k]) * B2[n * K + k];
        }
        const double ref = g / (1.0 + std::exp(-g)) * u;
        const float got = half_to_float(c[size_t(l * M * N + m * N + n)]);
        ASSERT_LE(std::abs(double(got) - ref), 1e-3 + 1e-3 * std::abs(ref)) << "l=" << l << " m=" << m << " n=" << n;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DualGemmRef,
                         ::testing::Values(std::make_tuple(1, 128, 64, 1, false), std::make_tuple(3, 128, 128, 2, false),
                                           std::make_tuple(130, 128, 64, 1, true), std::make_tuple(17, 256, 192, 3, true)));

TEST(DualGemmArgsCheck, RefusesBadShapes) {
  std::vector<uint8_t> a(64 * 48), b(128 * 48), s(128 * 6);
  std::vector<uint16_t> c(64 * 128, 0x1234);
  DualGemmArgs args;
  args.a = TensorView(a.data(), DType::kUInt8, {64, 48});  // K = 96: not a multiple of 64
  args.b1 = args.b2 = TensorView(b.data(), DType::kUInt8, {128, 48});
  args.sfa = TensorView(s.data(), DType::kE4M3, {64, 6});
  args.sfb1 = args.sfb2 = TensorView(s.data(), DType::kE4M3, {128, 6});
  args.c = TensorView(c.data(), DType::kFloat16, {64, 128});
  try {
    nvfp4_dual_gemm_silu(args);
    FAIL() << "expected an ArgumentError";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'a'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 64"), std::string::npos) << e.what();
  }
  for (uint16_t v : c) ASSERT_EQ(v, 0x1234);  // output untouched
}
