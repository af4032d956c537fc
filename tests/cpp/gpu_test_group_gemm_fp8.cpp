// The FP8 tensor-core path of the grouped MXFP4 GEMM (GemmPrecision::kFp8TensorCores) on the GPU,
// through the C++ API, against the CPU reference on the same bytes:
//  - integer data (E2M1 and E4M3 / E5M2 codes of 0, +-1, +-2, +-4, scale bytes in narrow windows):
//    every block's products are small integers times one power of two, the tensor cores add them
//    exactly and the promotion is exact: the FP8 path gives the reference's bits, with folded
//    blocks and with blocks in the slow form (rows spread beyond the fold's window), so a layout
//    bug (a K position, row or token in the wrong place) fails whatever the tolerance;
//  - randn data (FlashInfer's recipe): |out - ref| <= 1 ulp + (2^-7 + (K/32) 2^-24) sum_k |a_k b_k|
//    (docs/design/moe_grouped_gemm.md, "FP8 tensor-core path").
// Outputs are poisoned (NaN) before each call; m_indptr lives on the device. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lowbit/moe.hpp"
#include "lowbit/mxfp4_pack.hpp"

using namespace lowbit;

namespace {

using gputest::Dev;
using gputest::have_gpu;

struct Fp8Case {
  std::vector<int64_t> sizes;
  int64_t N, K;
  bool e5m2, integer, spread_rows;
};

std::string name(const Fp8Case& c) {
  int64_t M = 0;
  for (int64_t s : c.sizes) M += s;
  return "N" + std::to_string(c.N) + " K" + std::to_string(c.K) + " M" + std::to_string(M) + (c.e5m2 ? " e5m2" : " e4m3") +
         (c.integer ? " integer" : " randn") + (c.spread_rows ? " slow-form" : "");
}

class GroupGemmFp8Gpu : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GroupGemmFp8Gpu, MatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Fp8Case& cs = GetParam();
  const int64_t G = int64_t(cs.sizes.size()), N = cs.N, K = cs.K, Kb = K / 32;
  std::vector<int64_t> ind(1, 0);
  for (int64_t s : cs.sizes) ind.push_back(ind.back() + s);
  const int64_t M = ind.back();
  std::mt19937 rng(uint32_t(N + K + M));
  // operands
  std::vector<uint8_t> a(size_t(M * K)), as(size_t(M * Kb)), b(size_t(G * N * K / 2)), bs(size_t(G * N * Kb));
  const uint8_t e2m1_pow2[8] = {0, 2, 4, 6, 8, 10, 12, 14};  // 0, 1, 2, 4 and negatives
  const uint8_t e4m3_pow2[8] = {0x00, 0x38, 0x40, 0x48, 0x80, 0xB8, 0xC0, 0xC8};
  const uint8_t e5m2_pow2[8] = {0x00, 0x3C, 0x40, 0x44, 0x80, 0xBC, 0xC0, 0xC4};
  for (auto& v : b) v = cs.integer ? uint8_t(e2m1_pow2[rng() % 8] | (e2m1_pow2[rng() % 8] << 4)) : uint8_t(rng());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < Kb; ++c)
        bs[size_t((g * N + n) * Kb + c)] =
            uint8_t((cs.integer ? 120 + rng() % 4 : 118 + rng() % 8) - (cs.spread_rows && n % 128 < 64 ? 20 : 0));
  for (auto& v : a) {
    if (cs.integer) {
      v = (cs.e5m2 ? e5m2_pow2 : e4m3_pow2)[rng() % 8];
    } else {
      v = uint8_t(rng());
      if (cs.e5m2 ? (v & 0x7C) == 0x7C : (v & 0x7F) == 0x7F) v &= 0xBB;  // finite codes
    }
  }
  for (auto& v : as) v = uint8_t(cs.integer ? 124 + rng() % 4 : (cs.e5m2 ? 110 : 118) + rng() % 8);
  const DType adt = cs.e5m2 ? DType::kE5M2 : DType::kE4M3;

  // FP8-path packed weights (on the CPU), the reference on the CPU (plain weights, exact path)
  const int64_t Np = mxfp4_packed_rows(N), Kq = mxfp4_fp8_packed_k(K);
  std::vector<uint8_t> pb(size_t(G * Np * Kq / 2)), ps(size_t(G * Np * Kq / 32));
  group_gemm_mxfp4_prepack_fp8(TensorView(b.data(), DType::kUInt8, {G, N, K / 2}),
                               TensorView(bs.data(), DType::kUE8M0, {G, N, Kb}), ScaleLayout::row_major(),
                               TensorView(pb.data(), DType::kUInt8, {G, Np / 128, Kq / 128, 128, 64}),
                               TensorView(ps.data(), DType::kUInt8, {G, Np / 128, Kq / 128, 128, 4}));
  std::vector<uint16_t> ref(size_t(M * N));
  {
    GroupGemmArgs x;
    x.a = TensorView(a.data(), adt, {M, K});
    x.a_scale = TensorView(as.data(), DType::kUE8M0, {M, Kb});
    x.a_scale_layout = ScaleLayout::row_major();
    x.b = TensorView(b.data(), DType::kUInt8, {G, N, K / 2});
    x.b_scale = TensorView(bs.data(), DType::kUE8M0, {G, N, Kb});
    x.b_scale_layout = ScaleLayout::row_major();
    x.m_indptr = TensorView(ind.data(), DType::kInt64, {G + 1});
    x.out = TensorView(ref.data(), DType::kBFloat16, {M, N});
    group_gemm_mxfp4_nt_groupwise(x);
  }

  Dev<uint8_t> da(a), das(as), dpb(pb), dps(ps);
  Dev<int64_t> dind(ind);
  Dev<uint16_t> dout(size_t(M * N));
  cudaMemset(dout.p, 0xFF, dout.n * 2);
  GroupGemmArgs x;
  x.a = TensorView(da.p, adt, {M, K}, Device::kCUDA);
  x.a_scale = TensorView(das.p, DType::kUE8M0, {M, Kb}, Device::kCUDA);
  x.a_scale_layout = ScaleLayout::row_major();
  x.b = TensorView(dpb.p, DType::kUInt8, {G, Np / 128, Kq / 128, 128, 64}, Device::kCUDA);
  x.b_scale = TensorView(dps.p, DType::kUInt8, {G, Np / 128, Kq / 128, 128, 4}, Device::kCUDA);
  x.b_packed = true;
  x.precision = GemmPrecision::kFp8TensorCores;
  x.m_indptr = TensorView(dind.p, DType::kInt64, {G + 1}, Device::kCUDA);
  x.out = TensorView(dout.p, DType::kBFloat16, {M, N}, Device::kCUDA);
  group_gemm_mxfp4_nt_groupwise(x);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name(cs);
  const std::vector<uint16_t> got = dout.get();

  auto a_val = [&](int64_t m, int64_t k) {
    const uint8_t c = a[size_t(m * K + k)];
    return double(cs.e5m2 ? decode_e5m2(c) : decode_e4m3(c)) * double(decode_ue8m0(as[size_t(m * Kb + k / 32)]));
  };
  auto b_val = [&](int64_t g, int64_t n, int64_t k) {
    const uint8_t c = (b[size_t((g * N + n) * (K / 2) + k / 2)] >> ((k & 1) * 4)) & 0xF;
    return double(decode_e2m1(c)) * double(decode_ue8m0(bs[size_t((g * N + n) * Kb + k / 32)]));
  };
  int64_t bad = 0, g = 0;
  for (int64_t m = 0; m < M; ++m) {
    while (ind[size_t(g + 1)] <= m) ++g;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      if (cs.integer) {
        if (got[i] != ref[i] && bad++ < 5)
          ADD_FAILURE() << name(cs) << ": m=" << m << " n=" << n << " got " << decode_bf16(got[i]) << " want "
                        << decode_bf16(ref[i]) << " (integer data must be exact)";
        continue;
      }
      const double r = decode_bf16(ref[i]), v = decode_bf16(got[i]);
      double S = 0;
      for (int64_t k = 0; k < K; ++k) S += std::fabs(a_val(m, k) * b_val(g, n, k));
      const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::max(std::fabs(r), std::fabs(v)) + 1e-300), -126) - 7);
      const double bound = ulp + (std::ldexp(1.0, -7) + double(Kb) * std::ldexp(1.0, -24)) * S;
      if (!(std::fabs(v - r) <= bound) && bad++ < 5)
        ADD_FAILURE() << name(cs) << ": m=" << m << " n=" << n << " got " << v << " want " << r << " bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0) << name(cs);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupGemmFp8Gpu,
    ::testing::Values(Fp8Case{{0, 5, 130, 0, 260}, 264, 2880, false, true, false},
                      Fp8Case{{0, 5, 130, 0, 260}, 264, 2880, false, true, true},
                      Fp8Case{{3, 200}, 136, 512, true, true, false},
                      Fp8Case{{1, 0, 129, 40}, 256, 288, false, false, false},
                      Fp8Case{{70, 0, 2}, 200, 160, true, false, true}));

}  // namespace
