// host emulation (tests/cpp/emu/cuda_runtime.h): programmatic dependent launch is a plain launch
// (the CTAs of a grid run one after the other, so a grid waits for the previous one anyway)
#pragma once
#include <atomic>
#include <cuda_runtime.h>
namespace lowbit::cuda_emu {
inline void griddep_wait() {}
inline void griddep_launch_dependents() {}
template <typename K, typename... Args>
cudaError_t launch_pdl(K kern, dim3 grid, dim3 block, size_t smem, cudaStream_t, Args&&... args) {
  return emu::launch(kern, grid, block, smem)(args...);
}
template <typename K>
cudaError_t opt_in_smem(K, int, int, std::atomic<uint64_t>&) {
  return cudaSuccess;
}
}  // namespace lowbit::cuda_emu
