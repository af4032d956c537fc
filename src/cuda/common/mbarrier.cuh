// src/cuda/common/mbarrier.cuh: the pieces of a warp-specialized cp.async pipeline (sm_90) for
// kernels that do not use sm90_gemm_common.cuh (the decode attention's warp-specialized split
// kernel, nf4_decode_ws.cuh): mbarriers of CTA scope addressed by their 32-bit shared addresses,
// 16-byte cp.async whose completion an mbarrier counts, and named barriers over a subset of the
// warps. The barrier operations are CUTLASS's (cutlass/arch/barrier.h: ClusterBarrier,
// fence_barrier_init, cpasync_barrier_arrive_noinc, NamedBarrier); only the 16-byte cp.async to a
// 32-bit shared address is hand-written PTX (CuTe's SM80_CP_ASYNC_CACHEGLOBAL takes a generic
// destination). CUTLASS's asm statements carry no "memory" clobber, so each forwarder brackets the
// call with compiler_fence(), as sm90_gemm_common.cuh does: the consumers read the stages with plain
// shared-memory loads, which must not move across a wait or an arrival. The host emulation of
// tests/cpp/emu/ shadows this header (tests/cpp/emu/cuda/common/mbarrier.cuh).
//
// Semantics relied on (PTX ISA, "mbarrier", "cp.async", "bar.sync"):
//  * mbarrier.arrive has release semantics and mbarrier.try_wait acquire semantics at CTA scope
//    (their defaults): the shared-memory accesses before an arrival are visible to a thread whose
//    wait observed the completed phase.
//  * try_wait.parity(p) succeeds once the phase of parity p has completed: on a fresh barrier (phase
//    0 in progress) a wait for parity 1 succeeds at once, the usual start of a producer's waits on
//    its "empty" barriers.
//  * cp.async.mbarrier.arrive.noinc: an arrive-on the barrier once all the thread's earlier cp.async
//    copies have landed; .noinc: it counts against the barrier's expected arrival count.
//  * bar.sync id, n: the n threads (a multiple of 32) that reach barrier id wait for each other;
//    barrier 0 is __syncthreads's. NamedBarrier::sync(n, id) uses hardware barrier id + 8 (CUTLASS
//    reserves the first 8), so `id` is in 0..7.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace lowbit::cuda {

namespace mbar_detail {
/// Compiler-only ordering point (no instruction): what a "memory" clobber on the asm gives.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }
/// The barrier at shared-window address `bar` as CUTLASS takes it (the conversion folds away).
__device__ __forceinline__ uint64_t* bar_ptr(uint32_t bar) { return static_cast<uint64_t*>(__cvta_shared_to_generic(bar)); }
}  // namespace mbar_detail

/// 32-bit shared-window address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

/// mbarrier.init with `count` expected arrivals per phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  cutlass::arch::ClusterBarrier::init(mbar_detail::bar_ptr(bar), count);
}
/// Makes the initialisations visible (followed by a CTA barrier before any other thread uses them).
__device__ __forceinline__ void mbar_init_fence() {
  mbar_detail::compiler_fence();
  cutlass::arch::fence_barrier_init();
  mbar_detail::compiler_fence();
}
/// One arrival (release, CTA scope).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  mbar_detail::compiler_fence();
  cutlass::arch::ClusterBarrier::arrive(mbar_detail::bar_ptr(bar));
  mbar_detail::compiler_fence();
}
/// Waits (acquire, CTA scope) until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  mbar_detail::compiler_fence();
  cutlass::arch::ClusterBarrier::wait(mbar_detail::bar_ptr(bar), parity);
  mbar_detail::compiler_fence();
}
/// 16 bytes global -> shared (address `dst` in the shared window), not committed to a group:
/// an mbarrier counts it through cp_async_mbar_arrive.
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/// An arrival on `bar` once this thread's earlier cp.async copies have landed (counted in the
/// barrier's expected arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  mbar_detail::compiler_fence();
  cutlass::arch::cpasync_barrier_arrive_noinc(mbar_detail::bar_ptr(bar));
  mbar_detail::compiler_fence();
}
/// Waits for every cp.async this thread issued (before it exits).
__device__ __forceinline__ void cp_async_drain() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}
/// The n threads of the warps that use named barrier `id` (0..7; hardware barrier id + 8) meet.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t n) {
  mbar_detail::compiler_fence();
  cutlass::arch::NamedBarrier::sync(n, id);
  mbar_detail::compiler_fence();
}

}  // namespace lowbit::cuda
