// tests/cpp/emu/cute/arch/mma_sm90_gmma.hpp: host emulation of the few CuTe SM90 GMMA entry points
// that src/cuda/common/sm90_gemm_common.cuh uses (shadows CuTe's header on the emu tests' include
// path): the warpgroup fence / commit / wait, the operand fence, and the bf16 RS MMAs
// MMA_64xNx16_F32BF16BF16_RS (K-major A and B, D += A B) for N = 8 .. 256, all forwarded to the
// wgmma emulation of emu_sm90.hpp. Only what the kernels call exists here. Test code only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "emu_sm90.hpp"

namespace cute {

inline void warpgroup_arrive() { emu::wgmma_fence(); }
inline void warpgroup_commit_batch() { emu::wgmma_commit(); }
template <int N>
inline void warpgroup_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  emu::wgmma_wait(N);
}
/// A register fence for the compiler only: nothing to emulate.
inline void warpgroup_fence_operand(float&) {}
inline void warpgroup_fence_operand(uint32_t&) {}

namespace SM90::GMMA {
enum class Major { K = 0, MN = 1 };
enum class ScaleIn { Neg = -1, One = 1 };
enum class ScaleOut { Zero = 0, One = 1 };

/// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16, A from registers, B through a descriptor.
template <int N, Major tA, Major tB, ScaleIn sA, ScaleIn sB>
struct EmuRsBf16 {
  static_assert(tA == Major::K, "register A is K-major");
  static_assert(tB == Major::K, "the emulation reads K-major B only");
  static_assert(sA == ScaleIn::One && sB == ScaleIn::One, "operand negation is not emulated");
  template <typename... D>
  static void fma(uint32_t const& a0, uint32_t const& a1, uint32_t const& a2, uint32_t const& a3,
                  uint64_t const& desc_b, D&... d) {
    static_assert(sizeof...(D) == N / 2, "N / 2 fp32 accumulators per thread (scale-d is not emulated)");
    static_assert((std::is_same_v<D, float> && ...), "fp32 accumulators");
    const uint32_t a[4] = {a0, a1, a2, a3};
    float* const ptrs[] = {&d...};
    for (size_t j = 1; j < sizeof...(D); ++j)
      if (ptrs[j] != ptrs[0] + j) emu::fail("wgmma: accumulators that are not one array are not emulated");
    emu::wgmma_issue(a, desc_b, ptrs[0], unsigned(sizeof...(D)));
  }
};
#define LOWBIT_EMU_RS(N)                                                                               \
  template <Major tA, Major tB, ScaleIn sA = ScaleIn::One, ScaleIn sB = ScaleIn::One>                  \
  struct MMA_64x##N##x16_F32BF16BF16_RS : EmuRsBf16<N, tA, tB, sA, sB> {};
LOWBIT_EMU_RS(8)
LOWBIT_EMU_RS(16)
LOWBIT_EMU_RS(24)
LOWBIT_EMU_RS(32)
LOWBIT_EMU_RS(48)
LOWBIT_EMU_RS(64)
LOWBIT_EMU_RS(96)
LOWBIT_EMU_RS(128)
LOWBIT_EMU_RS(192)
LOWBIT_EMU_RS(256)
#undef LOWBIT_EMU_RS
}  // namespace SM90::GMMA
}  // namespace cute
