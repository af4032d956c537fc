// src/cuda/moe/mxfp4_prepack.cuh: the weight prepack kernel of the MXFP4 grouped GEMM
// (lowbit/mxfp4_pack.hpp).
#pragma once

#include "cuda/moe/group_params.cuh"

namespace lowbit::cuda {
namespace {

/// group_gemm_mxfp4_prepack: one thread per packed 32-bit word (and per packed scale byte).
__global__ void mxfp4_prepack_kernel(Mxfp4PackPlan p, int64_t Np, int64_t Kp) {
  const int64_t words = p.G * Np * (Kp / 8), scales = p.G * Np * (Kp / 32);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words + scales;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (i < words) {
      const int64_t gn = i / (Kp / 8);
      reinterpret_cast<uint32_t*>(p.packed_b)[i] = p.word(gn / Np, gn % Np, i % (Kp / 8));
    } else {
      const int64_t j = i - words, gn = j / (Kp / 32);
      p.packed_scale[j] = p.scale(gn / Np, gn % Np, j % (Kp / 32));
    }
  }
}

}  // namespace
}  // namespace lowbit::cuda
