// src/cuda/moe/sm90_mxfp4_gemm.cu: the dense MXFP4 linear (mxfp4_gemm) on sm_90a: the grouped GEMM
// of sm90_mxfp4_group_gemm.cu run with one group. Tested by tests/python/test_linear_gpu.py.
//
// NOTE: where the one group's bounds come from. The grouped kernels read m_indptr from device
// memory and clamp every bound to [0, M] (GroupArgs::bound: a device m_indptr is never trusted),
// so the boundaries {0, INT64_MAX} describe the single group [0, M) for every M. They live in a
// statically initialized __device__ array of this module: each device gets its copy when the
// module is loaded, and nothing writes it at call time — no host copy, no memset, no fill kernel,
// no per-call allocation. A call therefore adds no stream operation to what the grouped GEMM
// launches (it stays free of host syncs and legal inside CUDA graph capture, and a replayed graph
// reads the same constant), and concurrent calls with different M on any streams share it safely
// because it is read-only. The device address is looked up once per device
// (cudaGetSymbolAddress, not a stream operation) and cached.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "cuda/moe/launch_moe.hpp"

namespace lowbit::cuda {
namespace {

__device__ int64_t g_dense_indptr[2] = {0, INT64_MAX};

/// The device address of g_dense_indptr on the current device (cached per device).
cudaError_t dense_indptr(const void** out) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static const void* cached[kMaxDevices] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  if (!cached[dev]) {
    void* p = nullptr;
    e = cudaGetSymbolAddress(&p, g_dense_indptr);
    if (e != cudaSuccess) return e;
    cached[dev] = p;
  }
  *out = cached[dev];
  return cudaSuccess;
}

}  // namespace

int mxfp4_gemm(detail::GroupGemmPlan p, void* stream) {
  const void* indptr = nullptr;
  if (cudaError_t e = dense_indptr(&indptr); e != cudaSuccess) return int(e);
  p.G = 1;
  p.m_indptr = indptr;
  p.indptr64 = true;
  return group_gemm_mxfp4(p, stream);
}

}  // namespace lowbit::cuda
