// Self-tests of the sm_90 emulation of emu_sm90.hpp, written from the PTX ISA / driver API rules it
// cites, independently of the library's kernels: the wgmma A / D fragments and the K-major
// 128B-swizzled B descriptor against a plain matrix product (bf16 k16 and the 8-bit k32 forms, with
// E4M3 / E5M2 NaN, Inf and zero codes and scale-d 0 / 1), a 2-D TMA box with SWIZZLE_128B and
// out-of-bound fill, a bulk copy, and the mbarrier phase / arrival / tx-count rules. The library's
// kernels on this emulation: emu_test_group_gemm.cpp, emu_test_group_gemm_fp8.cpp,
// emu_test_dual_gemm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "emu_sm90.hpp"
#include "lowbit/codecs.hpp"

using namespace lowbit;

namespace {

/// The first 1024-byte aligned address of the dynamic shared memory.
uint32_t aligned_base() {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(emu::dyn_smem));
  return (a + 1023u) & ~1023u;
}

template <int N>
void wgmma_case(emu::WgmmaMode mode) {
  // A 64 x 16, B (K-major) N x 16, C 64 x N: small integers times powers of two, exact in fp32
  std::mt19937 rng(N);
  std::vector<uint16_t> A(64 * 16), B(static_cast<size_t>(N) * 16);
  std::vector<float> C(static_cast<size_t>(64 * N)), D(static_cast<size_t>(64 * N));
  auto val = [&] { return encode_bf16(std::ldexp(float(int(rng() % 15) - 7), int(rng() % 5) - 2)); };
  for (auto& v : A) v = val();
  for (auto& v : B) v = val();
  for (auto& v : C) v = float(int(rng() % 9) - 4);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < N; ++c) {
      float s = C[size_t(r * N + c)];
      for (int k = 0; k < 16; ++k) s += decode_bf16(A[size_t(r * 16 + k)]) * decode_bf16(B[size_t(c * 16 + k)]);
      D[size_t(r * N + c)] = s;
    }
  const int kStep = 2;  // the k16 slice at bytes 32 * kStep of each 128-byte row (a start-address advance)
  std::vector<float> got(static_cast<size_t>(64 * N), -1.0f);
  emu::wgmma_mode = mode;
  emu::launch([&] {
    const uint32_t base = aligned_base();
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    // B into shared memory: row n at (n / 8) * 1024 + (n % 8) * 128, 16-byte chunk c at c ^ (n % 8)
    for (unsigned n = tid; n < unsigned(N); n += 128)
      for (int k = 0; k < 16; ++k) {
        const uint32_t logical = (n / 8) * 1024 + (n % 8) * 128 + 32 * kStep + 2 * k;
        const uint32_t phys = logical ^ (((logical >> 7) & 7u) << 4);
        std::memcpy(emu::cta->window + base + phys, &B[size_t(n * 16 + k)], 2);
      }
    __syncthreads();
    // A fragment (mma.m16n8k16's, warp w holding rows 16w .. 16w + 15)
    auto pair = [&](unsigned r, unsigned k) {
      return uint32_t(A[size_t(r * 16 + k)]) | (uint32_t(A[size_t(r * 16 + k + 1)]) << 16);
    };
    const unsigned r0 = 16 * w + g;
    const uint32_t a[4] = {pair(r0, 2 * t), pair(r0 + 8, 2 * t), pair(r0, 2 * t + 8), pair(r0 + 8, 2 * t + 8)};
    float acc[N / 2];
    for (int j = 0; j < N / 2; ++j)  // D register j: row 16w + g + 8 ((j >> 1) & 1), column 8 (j >> 2) + 2t + (j & 1)
      acc[j] = C[size_t((r0 + 8 * ((j >> 1) & 1)) * N + 8 * (j >> 2) + 2 * t + (j & 1))];
    const uint64_t desc = uint64_t(((base + 32 * kStep) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) |
                          (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
    cute::warpgroup_arrive();
    [&]<size_t... I>(std::index_sequence<I...>) {
      cute::SM90::GMMA::EmuRsBf16<N, cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K, cute::SM90::GMMA::ScaleIn::One,
                                  cute::SM90::GMMA::ScaleIn::One>::fma(a[0], a[1], a[2], a[3], desc, acc[I]...);
    }(std::make_index_sequence<N / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    for (int j = 0; j < N / 2; ++j)
      got[size_t((r0 + 8 * ((j >> 1) & 1)) * N + 8 * (j >> 2) + 2 * t + (j & 1))] = acc[j];
  }, dim3(1), dim3(128), size_t(N) * 128 + 2048)();
  emu::wgmma_mode = emu::WgmmaMode::kAtWait;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], D[i]) << "N " << N << ", row " << i / N << ", column " << i % N;
}

TEST(EmuSm90, WgmmaFragmentsAndSwizzledDescriptor) {
  for (const emu::WgmmaMode m : {emu::WgmmaMode::kAtWait, emu::WgmmaMode::kAtIssue}) {
    wgmma_case<16>(m);
    wgmma_case<32>(m);
    wgmma_case<64>(m);
    wgmma_case<128>(m);
  }
}

/// The 8-bit wgmma m64nNk32 of operand types (A, B) = (a5 ? E5M2 : E4M3, b5 ? E5M2 : E4M3):
/// A 64 x 32 codes in registers, B N x 32 codes (K-major) at the k32 slice kStep (bytes 32 kStep
/// of each 128-byte row) of a 128B-swizzled tile, against the product of the decoded codes in fp64
/// rounded once to fp32. The codes: random finite ones (E5M2 exponent fields up to 20, so that the
/// fp64 sums are exact), row 3 of A and column 5 of B all zero codes (+-0), a NaN code in A row 9
/// and in B column 17 % N, and (E5M2 B) an Inf code in column 2 (Inf * 0 = NaN where A row 3
/// meets it). scale_d: D = A B + C, else D = A B whatever D held.
template <int N, emu::WgmmaType kType>
void wgmma_fp8_case(emu::WgmmaMode mode, bool scale_d, int kStep) {
  using namespace cute::SM90::GMMA;
  const bool a5 = kType == emu::WgmmaType::kE5M2E4M3 || kType == emu::WgmmaType::kE5M2E5M2;
  const bool b5 = kType == emu::WgmmaType::kE4M3E5M2 || kType == emu::WgmmaType::kE5M2E5M2;
  std::mt19937 rng(uint32_t(N * 131 + a5 * 7 + b5 * 3 + scale_d + kStep * 11));
  auto code = [&](bool e5) {
    for (;;) {
      const uint8_t c = uint8_t(rng());
      const uint32_t e = e5 ? (c >> 2) & 31u : (c >> 3) & 15u;
      if (e5 ? e <= 20 : (c & 0x7F) != 0x7F) return c;
    }
  };
  auto dec = [](uint8_t c, bool e5) { return double(e5 ? decode_e5m2(c) : decode_e4m3(c)); };
  std::vector<uint8_t> A(64 * 32), B(static_cast<size_t>(N) * 32);
  for (auto& v : A) v = code(a5);
  for (auto& v : B) v = code(b5);
  for (int k = 0; k < 32; ++k) {
    A[size_t(3 * 32 + k)] = k % 2 ? 0x80 : 0x00;
    B[size_t(5 % N * 32 + k)] = k % 3 ? 0x00 : 0x80;
  }
  A[size_t(9 * 32 + 21)] = a5 ? 0x7E : 0x7F;      // NaN
  B[size_t(17 % N * 32 + 30)] = b5 ? 0xFD : 0xFF;  // NaN
  if (b5) B[size_t(2 * 32 + 6)] = 0xFC;            // -Inf
  std::vector<float> C(static_cast<size_t>(64 * N)), D(static_cast<size_t>(64 * N));
  for (auto& v : C) v = float(int(rng() % 9) - 4) * 0.375f;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < N; ++c) {
      double s = 0.0;
      for (int k = 0; k < 32; ++k) s += dec(A[size_t(r * 32 + k)], a5) * dec(B[size_t(c * 32 + k)], b5);
      D[size_t(r * N + c)] = float(scale_d ? s + double(C[size_t(r * N + c)]) : s);
    }
  std::vector<float> got(static_cast<size_t>(64 * N), -1.0f);
  emu::wgmma_mode = mode;
  emu::launch([&] {
    const uint32_t base = aligned_base();
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    // B into shared memory: row n at (n / 8) * 1024 + (n % 8) * 128, 16-byte chunk c at c ^ (n % 8)
    for (unsigned n = tid; n < unsigned(N); n += 128)
      for (int k = 0; k < 32; ++k) {
        const uint32_t logical = (n / 8) * 1024 + (n % 8) * 128 + 32 * kStep + k;
        emu::cta->window[base + (logical ^ (((logical >> 7) & 7u) << 4))] = B[size_t(n * 32 + k)];
      }
    __syncthreads();
    // A fragment (PTX ISA, m64nNk32 8-bit A): warp w rows 16w .. 16w + 15; registers 0..3 hold
    // rows g, g + 8, g, g + 8 at K 4t .. 4t + 3, 4t .. 4t + 3, 16 + 4t .., 16 + 4t .., low K first
    auto quad = [&](unsigned r, unsigned k) {
      uint32_t v = 0;
      for (unsigned i = 0; i < 4; ++i) v |= uint32_t(A[size_t(r * 32 + k + i)]) << (8 * i);
      return v;
    };
    const unsigned r0 = 16 * w + g;
    const uint32_t a[4] = {quad(r0, 4 * t), quad(r0 + 8, 4 * t), quad(r0, 16 + 4 * t), quad(r0 + 8, 16 + 4 * t)};
    float acc[N / 2];
    for (int j = 0; j < N / 2; ++j) {  // D register j: row 16w + g + 8 ((j >> 1) & 1), column 8 (j >> 2) + 2t + (j & 1)
      const size_t at = size_t((r0 + 8 * ((j >> 1) & 1)) * N + 8 * (j >> 2) + 2 * t + (j & 1));
      acc[j] = scale_d ? C[at] : std::nanf("");  // scale-d 0 must not read D
    }
    const uint64_t desc = uint64_t(((base + 32 * kStep) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) |
                          (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
    const ScaleOut sd = scale_d ? ScaleOut::One : ScaleOut::Zero;
    cute::warpgroup_arrive();
    [&]<size_t... I>(std::index_sequence<I...>) {
      EmuRsFp8<N, kType, ScaleIn::One, ScaleIn::One>::fma(a[0], a[1], a[2], a[3], desc, acc[I]..., sd);
    }(std::make_index_sequence<N / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    for (int j = 0; j < N / 2; ++j)
      got[size_t((r0 + 8 * ((j >> 1) & 1)) * N + 8 * (j >> 2) + 2 * t + (j & 1))] = acc[j];
  }, dim3(1), dim3(128), size_t(N) * 128 + 2048)();
  emu::wgmma_mode = emu::WgmmaMode::kAtWait;
  const std::string what = "N " + std::to_string(N) + (a5 ? " e5m2" : " e4m3") + (b5 ? ".e5m2" : ".e4m3") +
                           (scale_d ? " scale-d 1" : " scale-d 0") + " slice " + std::to_string(kStep);
  int nan_rows = 0, nan_cols = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t r = i / N, c = i % N;
    if (std::isnan(D[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << ", row " << r << ", column " << c << ": " << got[i];
      nan_rows += r == 9;
      nan_cols += c == size_t(17 % N);
      continue;
    }
    uint32_t gb, db;
    std::memcpy(&gb, &got[i], 4);
    std::memcpy(&db, &D[i], 4);
    ASSERT_EQ(gb, db) << what << ", row " << r << ", column " << c << ": " << got[i] << " want " << D[i];
  }
  EXPECT_EQ(nan_rows, N) << what << ": A's NaN code reaches its whole row";
  EXPECT_EQ(nan_cols, 64) << what << ": B's NaN code reaches its whole column";
  if (b5) EXPECT_TRUE(std::isinf(D[size_t(0 * N + 2)]) || std::isnan(D[size_t(0 * N + 2)])) << what;
}

template <emu::WgmmaType kType>
void wgmma_fp8_cases(emu::WgmmaMode m) {
  wgmma_fp8_case<128, kType>(m, false, 1);
  wgmma_fp8_case<128, kType>(m, true, 3);
  wgmma_fp8_case<8, kType>(m, true, 0);
  wgmma_fp8_case<24, kType>(m, false, 2);
  wgmma_fp8_case<256, kType>(m, false, 0);
}

TEST(EmuSm90, WgmmaFp8FragmentsAndSwizzledDescriptor) {
  for (const emu::WgmmaMode m : {emu::WgmmaMode::kAtWait, emu::WgmmaMode::kAtIssue}) {
    wgmma_fp8_cases<emu::WgmmaType::kE4M3E4M3>(m);
    wgmma_fp8_cases<emu::WgmmaType::kE4M3E5M2>(m);
    wgmma_fp8_cases<emu::WgmmaType::kE5M2E4M3>(m);
    wgmma_fp8_cases<emu::WgmmaType::kE5M2E5M2>(m);
  }
}

/// The k32 sum is exact and rounded once: A (E4M3) row r holds 16 (0x58) at K 0 and the smallest
/// subnormal 2^-9 (0x01) elsewhere; B (E5M2) 16 (0x4C) at K 0, 2^-16 (0x01) elsewhere, so a row
/// sums to 256 + 31 * 2^-25. Through MMA_64x128x32_F32E4M3E5M2_RS_TN with its default scale-d (1)
/// and D = 2^-16: 256 + 2^-16 + 31 * 2^-25 lies just above the midpoint of 256 and 256 + 2^-15
/// (fp32's neighbours), so it rounds up to 256 + 2^-15, where an fp32 sum in K order (256 + 2^-16, a
/// tie, to even: 256; the tiny terms then vanish one by one) gives 256. With scale-d 0 (D poisoned)
/// and B = 2^-7 (0x20) at K 1 instead: 256 + 2^-16 + 30 * 2^-25, the same rounding.
TEST(EmuSm90, WgmmaFp8RoundsTheExactSumOnce) {
  using namespace cute::SM90::GMMA;
  for (const bool scale_d : {true, false}) {
    std::vector<float> got(64 * 128);
    emu::launch([&] {
      const uint32_t base = aligned_base();
      const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
      for (unsigned k = 0; k < 32; ++k) {
        const uint32_t logical = (tid / 8) * 1024 + (tid % 8) * 128 + k;  // row n = tid
        emu::cta->window[base + (logical ^ (((logical >> 7) & 7u) << 4))] =
            k == 0 ? 0x4C : (k == 1 && !scale_d ? 0x20 : 0x01);
      }
      __syncthreads();
      const uint32_t a0 = t == 0 ? 0x01010158u : 0x01010101u;  // K 0 of rows g and g + 8: 16
      const uint32_t a[4] = {a0, a0, 0x01010101u, 0x01010101u};
      float acc[64];
      for (int j = 0; j < 64; ++j) acc[j] = scale_d ? std::ldexp(1.0f, -16) : std::nanf("");
      const uint64_t desc = uint64_t((base & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
                            (uint64_t(1) << 62);
      cute::warpgroup_arrive();
      [&]<size_t... I>(std::index_sequence<I...>) {
        if (scale_d)
          MMA_64x128x32_F32E4M3E5M2_RS_TN<>::fma(a[0], a[1], a[2], a[3], desc, acc[I]...);
        else
          MMA_64x128x32_F32E4M3E5M2_RS_TN<>::fma(a[0], a[1], a[2], a[3], desc, acc[I]..., ScaleOut::Zero);
      }(std::make_index_sequence<64>{});
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      for (int j = 0; j < 64; ++j)
        got[size_t((16 * w + g + 8 * ((j >> 1) & 1)) * 128 + 8 * (j >> 2) + 2 * t + (j & 1))] = acc[j];
    }, dim3(1), dim3(128), 128 * 128 + 2048)();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], 256.0f + std::ldexp(1.0f, -15)) << "scale-d " << scale_d << ", element " << i;
  }
}

/// A bulk copy (cp.async.bulk ... complete_tx) lands its bytes as they are and completes its
/// transaction bytes on the barrier, in both landing orders.
TEST(EmuSm90, BulkCopyCompletesItsBytes) {
  alignas(16) static uint8_t src[96];
  for (int i = 0; i < 96; ++i) src[i] = uint8_t(3 * i + 1);
  for (const emu::CpAsyncMode mode : {emu::CpAsyncMode::kImmediate, emu::CpAsyncMode::kDeferred}) {
    emu::cp_async_mode = mode;
    std::vector<uint8_t> img(96);
    int early = -1;
    emu::launch([&] {
      using B = cutlass::arch::ClusterTransactionBarrier;
      const uint32_t base = aligned_base();
      auto* bar = static_cast<uint64_t*>(__cvta_shared_to_generic(base + 1024));
      if (threadIdx.x != 0) return;
      B::init(bar, 1);
      B::arrive_and_expect_tx(bar, 96 + 32);
      cute::SM90_BULK_COPY_G2S::copy(src, bar, __cvta_shared_to_generic(base + 16), 96);
      early = B::try_wait(bar, 0);  // 32 bytes still expected
      cute::SM90_BULK_COPY_G2S::copy(src + 32, bar, __cvta_shared_to_generic(base + 256), 32);
      B::wait(bar, 0);
      std::memcpy(img.data(), emu::cta->window + base + 16, 96);
      early = early * 2 + (emu::cta->window[base + 256] == src[32]);
    }, dim3(1), dim3(32), 4096)();
    EXPECT_EQ(early, 1);
    EXPECT_EQ(img, std::vector<uint8_t>(src, src + 96));
  }
  emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
}

TEST(EmuSm90, TmaBoxSwizzle128AndOutOfBoundFill) {
  // a [20][100] bf16 tensor (row pitch 208 bytes), box 64 x 16 at (x 40, y 8): columns 100..103 and
  // rows 20..23 are outside and read as zeros
  const int rows = 20, cols = 100, pitch = 104;
  std::vector<uint16_t> t(size_t(rows * pitch));
  for (size_t i = 0; i < t.size(); ++i) t[i] = uint16_t(i * 7 + 1);
  alignas(64) CUtensorMap m;
  const cuuint64_t dims[2] = {uint64_t(cols), uint64_t(rows)}, strides[1] = {uint64_t(pitch * 2)};
  const cuuint32_t box[2] = {64, 16}, estr[2] = {1, 1};
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q), cudaSuccess);
  auto enc = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  ASSERT_EQ(enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, t.data(), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            CUDA_SUCCESS);
  // documented requirements are enforced: a 256-byte box row exceeds the 128-byte swizzle span
  const cuuint32_t wide[2] = {128, 16};
  alignas(64) CUtensorMap bad;
  EXPECT_NE(enc(&bad, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, t.data(), dims, strides, wide, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            CUDA_SUCCESS);
  for (const emu::CpAsyncMode mode : {emu::CpAsyncMode::kImmediate, emu::CpAsyncMode::kDeferred}) {
    emu::cp_async_mode = mode;
    std::vector<uint8_t> img(2048);
    emu::launch([&] {
      const uint32_t base = aligned_base();
      auto* bar = static_cast<uint64_t*>(__cvta_shared_to_generic(base + 2048));
      if (threadIdx.x == 0) {
        cutlass::arch::ClusterBarrier::init(bar, 1);
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, 64 * 16 * 2);
        cute::SM90_TMA_LOAD_2D::copy(&m, bar, 0, __cvta_shared_to_generic(base), 40, 8);
        cutlass::arch::ClusterBarrier::wait(bar, 0);
        std::memcpy(img.data(), emu::cta->window + base, img.size());
      }
    }, dim3(1), dim3(32), 4096)();
    for (int r = 0; r < 16; ++r)
      for (int e = 0; e < 64; ++e) {
        const int y = 8 + r, x = 40 + e;
        const uint16_t want = (y < rows && x < cols) ? t[size_t(y * pitch + x)] : 0;
        const int c = (2 * e) / 16, off = r * 128 + ((c ^ (r % 8)) * 16) + (2 * e) % 16;  // chunk c ^ (r % 8)
        uint16_t got;
        std::memcpy(&got, img.data() + off, 2);
        ASSERT_EQ(got, want) << "box row " << r << ", element " << e;
      }
  }
  emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
}

TEST(EmuSm90, MbarrierPhasesArrivalsAndTransactions) {
  // a 16-byte TMA box (one row of 8 bf16, no swizzle) completes a 16-byte transaction
  alignas(16) static const uint16_t row[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  alignas(64) CUtensorMap m;
  const cuuint64_t dims[2] = {8, 1}, strides[1] = {16};
  const cuuint32_t box[2] = {8, 1}, estr[2] = {1, 1};
  ASSERT_EQ(emu::tensor_map_encode_tiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(row), dims,
                                         strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            CUDA_SUCCESS);
  alignas(16) static const uint8_t src[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  for (const emu::CpAsyncMode mode : {emu::CpAsyncMode::kImmediate, emu::CpAsyncMode::kDeferred}) {
    emu::cp_async_mode = mode;
    std::vector<int> seen;
    emu::launch([&] {
      using B = cutlass::arch::ClusterTransactionBarrier;
      const uint32_t base = aligned_base();
      auto* bar = static_cast<uint64_t*>(__cvta_shared_to_generic(base + 1024));
      auto* bar2 = static_cast<uint64_t*>(__cvta_shared_to_generic(base + 1032));
      if (threadIdx.x != 0) return;
      B::init(bar, 2);  // phase 0 (parity 0) is the current one; "parity 1" names the preceding phase
      seen.push_back(B::try_wait(bar, 0));  // 0
      seen.push_back(B::try_wait(bar, 1));  // 1
      B::arrive(bar);
      seen.push_back(B::try_wait(bar, 0));  // 0: one arrival pending
      B::arrive_and_expect_tx(bar, 16);
      seen.push_back(B::try_wait(bar, 0));  // 0: 16 bytes pending
      cute::SM90_TMA_LOAD_2D::copy(&m, bar, 0, __cvta_shared_to_generic(base), 0, 0);
      B::wait(bar, 0);
      seen.push_back(B::try_wait(bar, 0));  // 1: phase 0 complete
      seen.push_back(B::try_wait(bar, 1));  // 0: phase 1 is the current one
      seen.push_back(emu::cta->window[base + 14]);  // 8: the box landed before the phase completed
      // one cp.async with its noinc arrival completes a barrier of count 1
      B::init(bar2, 1);
      emu::cp_async_shared(base + 64, src, 16, 16);
      cutlass::arch::cpasync_barrier_arrive_noinc(bar2);
      B::wait(bar2, 0);
      seen.push_back(emu::cta->window[base + 64 + 15]);  // 16
    }, dim3(1), dim3(32), 4096)();
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 0, 0, 1, 0, 8, 16}));
  }
  emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
}

}  // namespace
