// src/cuda/common/tma.cuh: TMA tensor-map descriptors (host side); the device-side bulk tensor
// loads are in sm90_gemm_common.cuh.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace lowbit::cuda {

/// cuTensorMapEncodeTiled from the driver (no link-time dependency on libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
  static std::atomic<void*> fn{nullptr};
  void* f = fn.load(std::memory_order_relaxed);
  if (!f) {
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return nullptr;
    fn.store(f, std::memory_order_relaxed);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}
/// Tensor map of a row-major [rows][cols] tensor (pitch in bytes), read in 128B-swizzled boxes of
/// box_rows x box_cols (box_cols x element size = 128 bytes).
inline cudaError_t make_tmap_2d(CUtensorMap* m, const void* base, CUtensorMapDataType dt, uint64_t cols, uint64_t rows,
                                uint64_t pitch, uint32_t box_cols, uint32_t box_rows) {
  const auto enc = tma_encoder();
  if (!enc) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {pitch};
  const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  const CUresult r = enc(m, dt, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace lowbit::cuda
