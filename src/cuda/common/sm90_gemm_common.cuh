// src/cuda/common/sm90_gemm_common.cuh: building blocks shared by the sm_90a GEMM kernels:
// cp.async, the bf16 RS wgmma of 64 weight rows x NT tokens x 16, 128B-swizzled K-major
// descriptors, mbarriers (forwarding to CUTLASS's), the two policies of the TMA load and the
// mbarrier wait (LocalPrims, CutlassPrims) and the async-proxy fence. The launch helpers (PDL,
// shared-memory opt-in, SM count) and the TMA descriptors are in launch_utils.cuh,
// device_info.cuh and tma.cuh, included here for the kernels that use them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/device_info.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/tma.cuh"

namespace lowbit::cuda::gemm {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
/// 16-byte global -> shared copy; `valid` false zero-fills the destination.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
/// 8-byte global -> shared copy.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
/// 4-byte global -> shared copy; `valid` false zero-fills the destination.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

/// bf16x2 of the E2M1 codes in bits 0..3 (low half) and 16..19 (high half) of y, times 2^-126
/// (exact: sign -> bit 15, e1 e0 m -> bits 8..6).
__device__ __forceinline__ uint32_t e2m1x2_to_bf16x2_tiny(uint32_t y) {
  return ((y << 6) & 0x01C001C0u) | ((y << 12) & 0x80008000u);
}

template <int NT>
struct Wgmma;
#define LOWBIT_WGMMA(NT_)                                                                               \
  template <>                                                                                           \
  struct Wgmma<NT_> {                                                                                   \
    using Op = cute::SM90::GMMA::MMA_64x##NT_##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,           \
                                                                 cute::SM90::GMMA::Major::K>;          \
  };
LOWBIT_WGMMA(16)
LOWBIT_WGMMA(32)
LOWBIT_WGMMA(64)
LOWBIT_WGMMA(128)
#undef LOWBIT_WGMMA

template <int NT, size_t... I>
__device__ __forceinline__ void wgmma_call(const uint32_t (&a)[4], uint64_t desc, float* d, std::index_sequence<I...>) {
  Wgmma<NT>::Op::fma(a[0], a[1], a[2], a[3], desc, d[I]...);
}

/// Descriptor of a K-major bf16 operand in 128B-swizzled shared memory (rows of 128 bytes).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);  // start address
  d |= uint64_t(1) << 16;                       // leading byte offset (unused for swizzled K-major)
  d |= uint64_t(1024 >> 4) << 32;               // stride byte offset: 8 rows x 128 B
  d |= uint64_t(1) << 62;                       // SWIZZLE_128B
  return d;
}

// ---- mbarriers and bulk tensor copies (TMA), CTA scope ----
// The mbarrier operations are CUTLASS's (cutlass/arch/barrier.h), behind lowbit's names and
// 32-bit shared-window addresses. CUTLASS's asm statements carry no "memory" clobber, so each
// forwarder whose hand-written form had one brackets the call with compiler_fence(): plain
// shared-memory loads and stores are not moved across the barrier operation (the consumers read
// the stages with ordinary loads, not only with wgmma).
using Barrier = cutlass::arch::ClusterTransactionBarrier;

/// Compiler-only ordering point (no instruction): what a "memory" clobber on the asm gives.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }
/// The barrier at shared-window address `bar` as CUTLASS takes it (the conversion folds away).
// NOTE: the kernels keep 32-bit barrier addresses: pointer arithmetic on the barrier array gave
// different address code in the warp-specialized kernel's SASS.
__device__ __forceinline__ uint64_t* bar_ptr(uint32_t bar) {
  return static_cast<uint64_t*>(__cvta_shared_to_generic(bar));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) { Barrier::init(bar_ptr(bar), count); }
/// Makes the barrier initialisations visible to the async proxy (TMA) and the other threads
/// (followed by a CTA barrier).
__device__ __forceinline__ void mbar_init_fence() {
  compiler_fence();
  cutlass::arch::fence_barrier_init();
  compiler_fence();
}
/// One arrival that also announces `bytes` of transactions (TMA completions) for the phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  compiler_fence();
  Barrier::arrive_and_expect_tx(bar_ptr(bar), bytes);
  compiler_fence();
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  compiler_fence();
  Barrier::arrive(bar_ptr(bar));
  compiler_fence();
}
/// An arrival made when the calling thread's earlier cp.async copies have landed (counted in the
/// barrier's initial arrival count).
__device__ __forceinline__ void mbar_cp_async_arrive(uint32_t bar) {
  compiler_fence();
  cutlass::arch::cpasync_barrier_arrive_noinc(bar_ptr(bar));
  compiler_fence();
}
// ---- Primitive policies: the TMA load and the mbarrier wait ----
// The kernels that use them (the MXFP4 grouped GEMM's warp-specialized mainloop,
// group_mainloop_ws.cuh) take the policy as a template parameter `Prims`, defaulted to DefaultPrims.
// Both policies have the same static functions and signatures:
//   tma_load_2d(dst, tmap, x, y, bar): 2D tile of a tensor map (coordinates: x innermost, in
//     elements) into shared memory at `dst`; completion is counted in bytes on `bar`.
//   mbar_wait(bar, parity): blocks until the barrier's phase of parity `parity` has completed.
// The project rule is CUTLASS's primitives unless a same-process A/B shows them slower: the A/B is
// bench/dev/gemm_prims_ab.cu (both policies in one binary, bit-identical outputs checked, timed
// interleaved). Measured on an H100 80GB HBM3 (gpt-oss-20b gate_up, median of 30, cutlass / local):
// T = 1: 0.963, T = 64: 1.010, T = 4096 warp-specialized: 1.013; outputs identical. CUTLASS's is
// not slower beyond 1.3 % anywhere and 3.7 % faster at decode: DefaultPrims is CutlassPrims.
// LocalPrims stays only as the A/B's other arm. On an H200 (bench/dev/ab_kernels.py, two builds
// timed in alternating processes) LocalPrims measured 0.4-1.1 % faster at T = 16 and 256: at
// the edge of the run-to-run spread (up to 1 %), and T = 1 was not in that run: the default stays.
// NOTE: the dual GEMM (dual_mainloop.cuh) and the grouped GEMM's cp.async mainloop
// (group_mainloop.cuh) use neither primitive (cp.async pipelines with CTA barriers): no policy.

/// The hand-written primitives.
struct LocalPrims {
  // NOTE: hand-written: cute::SM90_TMA_LOAD_2D always adds an .L2::cache_hint operand; this load has none.
  __device__ static __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int32_t x, int32_t y,
                                                     uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(tmap), "r"(x), "r"(y), "r"(bar)
        : "memory");
  }
  // NOTE: a C++ loop around try_wait, not Barrier::wait: that one spins inside one asm block with a
  // suspend-time hint, which is a different wait loop in SASS.
  __device__ static __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    compiler_fence();
    while (!Barrier::try_wait(bar_ptr(bar), parity)) {
    }
    compiler_fence();
  }
};

/// CUTLASS's primitives: cute::SM90_TMA_LOAD_2D (always with an L2 cache hint: EVICT_NORMAL, the
/// default policy, as the hand-written load has no hint) and ClusterBarrier::wait (try_wait with a
/// suspend-time hint, looped inside one asm block).
struct CutlassPrims {
  __device__ static __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int32_t x, int32_t y,
                                                     uint32_t bar) {
    cute::SM90_TMA_LOAD_2D::copy(tmap, bar_ptr(bar), static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                 __cvta_shared_to_generic(dst), x, y);
  }
  // NOTE: bracketed by compiler_fence() as LocalPrims's: the wait's asm has no "memory" clobber, and
  // the consumers read the stage with plain loads after it.
  __device__ static __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    compiler_fence();
    Barrier::wait(bar_ptr(bar), parity);
    compiler_fence();
  }
};

/// The policy of the library's kernels (the A/B above).
using DefaultPrims = CutlassPrims;

/// Orders this thread's generic-proxy shared-memory writes (cp.async results) before the async
/// proxy's reads (wgmma operands from shared memory); followed by a CTA barrier.
__device__ __forceinline__ void fence_proxy_async_smem() {
  compiler_fence();
  cutlass::arch::fence_view_async_shared();
  compiler_fence();
}

}  // namespace lowbit::cuda::gemm
