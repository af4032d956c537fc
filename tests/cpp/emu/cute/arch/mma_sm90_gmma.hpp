// tests/cpp/emu/cute/arch/mma_sm90_gmma.hpp: host emulation of the few CuTe SM90 GMMA entry points
// that the kernels use (src/cuda/common/sm90_gemm_common.cuh, src/cuda/moe/group_fp8_mainloop.cuh;
// shadows CuTe's header on the emu tests' include path): the warpgroup fence / commit / wait, the
// operand fence, the bf16 RS MMAs MMA_64xNx16_F32BF16BF16_RS (K-major A and B, D += A B) and the
// 8-bit RS MMAs MMA_64xNx32_F32{E4M3,E5M2}{E4M3,E5M2}_RS_TN (D = A B + scale-d D, scale-d the
// optional last argument as in CuTe) for N = 8 .. 256, all forwarded to the wgmma emulation of
// emu_sm90.hpp. Only what the kernels call exists here. Test code only.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

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

/// wgmma.mma_async.sync.aligned.m64nNk32.f32.<A>.<B> with A (E4M3 / E5M2) from registers and B
/// (E4M3 / E5M2, K-major) through a descriptor: fma(a0, a1, a2, a3, desc_b, d0 .. d(N/2 - 1)
/// [, scale_D]), scale_D = ScaleOut::Zero giving D = A B.
template <int N, emu::WgmmaType kType, ScaleIn sA, ScaleIn sB>
struct EmuRsFp8 {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "m64nNk32: N a multiple of 8 in [8, 256]");
  static_assert(sA == ScaleIn::One && sB == ScaleIn::One, "operand negation is not emulated");
  template <typename... T>
  static void fma(uint32_t const& a0, uint32_t const& a1, uint32_t const& a2, uint32_t const& a3,
                  uint64_t const& desc_b, T&&... args) {
    constexpr size_t nf = (size_t(std::is_same_v<std::remove_reference_t<T>, float>) + ...);
    constexpr size_t ns = (size_t(std::is_same_v<std::remove_cvref_t<T>, ScaleOut>) + ...);
    static_assert(nf == N / 2 && nf + ns == sizeof...(T) && ns <= 1,
                  "N / 2 fp32 accumulators (lvalues), then at most a ScaleOut");
    const uint32_t a[4] = {a0, a1, a2, a3};
    float* ptrs[N / 2] = {};
    ScaleOut scale_d = ScaleOut::One;
    size_t i = 0;
    bool after_scale = false;
    auto take = [&](auto&& x) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(x)>, ScaleOut>) {
        scale_d = x;
        after_scale = true;
      } else {
        static_assert(std::is_lvalue_reference_v<decltype(x)>, "fp32 accumulators are lvalues");
        if (after_scale) emu::fail("wgmma: the scale-d operand must come last");
        ptrs[i++] = &x;
      }
    };
    (take(std::forward<T>(args)), ...);
    for (size_t j = 1; j < size_t(N / 2); ++j)
      if (ptrs[j] != ptrs[0] + j) emu::fail("wgmma: accumulators that are not one array are not emulated");
    emu::wgmma_issue(a, desc_b, ptrs[0], unsigned(N / 2), kType, scale_d == ScaleOut::One);
  }
};
#define LOWBIT_EMU_RS8(N, TA, TB)                                                                      \
  template <ScaleIn sA = ScaleIn::One, ScaleIn sB = ScaleIn::One>                                      \
  struct MMA_64x##N##x32_F32##TA##TB##_RS_TN : EmuRsFp8<N, emu::WgmmaType::k##TA##TB, sA, sB> {};
#define LOWBIT_EMU_RS8_TYPES(N)     \
  LOWBIT_EMU_RS8(N, E4M3, E4M3)     \
  LOWBIT_EMU_RS8(N, E4M3, E5M2)     \
  LOWBIT_EMU_RS8(N, E5M2, E4M3)     \
  LOWBIT_EMU_RS8(N, E5M2, E5M2)
LOWBIT_EMU_RS8_TYPES(8)
LOWBIT_EMU_RS8_TYPES(16)
LOWBIT_EMU_RS8_TYPES(24)
LOWBIT_EMU_RS8_TYPES(32)
LOWBIT_EMU_RS8_TYPES(48)
LOWBIT_EMU_RS8_TYPES(64)
LOWBIT_EMU_RS8_TYPES(96)
LOWBIT_EMU_RS8_TYPES(128)
LOWBIT_EMU_RS8_TYPES(192)
LOWBIT_EMU_RS8_TYPES(256)
#undef LOWBIT_EMU_RS8_TYPES
#undef LOWBIT_EMU_RS8
}  // namespace SM90::GMMA
}  // namespace cute
