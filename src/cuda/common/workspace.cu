// src/cuda/common/workspace.cu: see workspace.cuh.
#include <cstdint>
#include <mutex>

#include "cuda/common/workspace.cuh"

namespace lowbit::cuda {

cudaError_t workspace_pool(cudaMemPool_t* pool) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static cudaMemPool_t pools[kMaxDevices] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  if (!pools[dev]) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t created = nullptr;
    e = cudaMemPoolCreate(&created, &props);
    if (e != cudaSuccess) return e;
    uint64_t threshold = UINT64_MAX;
    e = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e != cudaSuccess) {  // cache only a fully configured pool
      cudaMemPoolDestroy(created);
      return e;
    }
    pools[dev] = created;
  }
  *pool = pools[dev];
  return cudaSuccess;
}

}  // namespace lowbit::cuda
