// src/cuda/common/launch_utils.cuh: launch helpers of the sm_90a kernels: programmatic
// dependent launch (device side and host side) and the dynamic shared-memory opt-in.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace lowbit::cuda {

/// Programmatic dependent launch: wait for the grids this one depends on (no-op without PDL).
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
/// Lets the next PDL-launched grid start its prologue while this one runs.
__device__ __forceinline__ void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

/// Launches `kern` so that it may start before the previous kernel in the stream has finished
/// (programmatic stream serialization); the kernel calls griddep_wait() before it reads that
/// kernel's results.
template <typename... P, typename... Args>
cudaError_t launch_pdl(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

/// Opts `kern` into `smem` bytes of dynamic shared memory (nothing to do up to the default
/// 48 KiB). For launchers whose shared memory varies from call to call.
template <typename Kernel>
cudaError_t opt_in_smem(Kernel kern, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
}

/// Opts a kernel into `smem` bytes of dynamic shared memory on `device`, once per (kernel, device):
/// each instantiation of the template owns its flag word.
template <typename Kernel>
cudaError_t opt_in_smem(Kernel kern, int smem, int device, std::atomic<uint64_t>& opted) {
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (opted.load(std::memory_order_relaxed) & bit) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) opted.fetch_or(bit, std::memory_order_relaxed);
  return e;
}

}  // namespace lowbit::cuda
