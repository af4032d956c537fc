// Self-tests of the sm_90 emulation of emu_sm90.hpp, written from the PTX ISA / driver API rules it
// cites, independently of the library's kernels: the wgmma A / D fragments and the K-major
// 128B-swizzled B descriptor against a plain matrix product, a 2-D TMA box with SWIZZLE_128B and
// out-of-bound fill, and the mbarrier phase / arrival / tx-count rules. The library's kernels on
// this emulation: emu_test_group_gemm.cpp, emu_test_dual_gemm.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
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
