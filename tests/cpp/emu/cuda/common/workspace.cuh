// host emulation (tests/cpp/emu/cuda_runtime.h): lowbit's memory pool
#pragma once
#include <cuda_runtime.h>
namespace lowbit::cuda_emu {
inline cudaError_t workspace_pool(cudaMemPool_t* p) {
  *p = nullptr;
  return cudaSuccess;
}
}  // namespace lowbit::cuda_emu
