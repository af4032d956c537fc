// src/cuda/common/cp_async.cuh: 16-byte cp.async from global to shared memory with commit groups
// (sm_80+), for kernels whose loads are not whole TMA tiles (the decode attention's token rows).
// Each wait is followed by a CTA barrier in the kernels, which also orders the compiler.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }


}  // namespace lowbit::cuda
