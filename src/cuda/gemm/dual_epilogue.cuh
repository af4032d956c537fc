// src/cuda/gemm/dual_epilogue.cuh: epilogue of the NVFP4 dual GEMM: SiLU * up to the output or the
// split-K partials, and the split-K finalize kernel.
#pragma once

#include "cuda/gemm/dual_params.cuh"

namespace lowbit::cuda {
namespace {

template <int kTileN>
__device__ __forceinline__ void epilogue_store(const MainArgs& A, const float (&acc)[kTileN / 2], int64_t l, int64_t bx,
                                               int64_t tok0, int wg, int warp, int lane, int split) {
  const DualGemmPlan& p = A.p;
  const int64_t feature = 64 * bx + 32 * wg + 8 * warp + (lane >> 2);
  const int t = lane & 3;
  float ag = kBiasOut, au = kBiasOut;
  if (A.splits == 1) {
    const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
    ag *= sda * (p.amax_b1 ? nvfp4_global_decode_scale(*p.amax_b1) : 1.0f);
    au *= sda * (p.amax_b2 ? nvfp4_global_decode_scale(*p.amax_b2) : 1.0f);
  }
#pragma unroll
  for (int j = 0; j < kTileN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t tok = tok0 + 8 * j + 2 * t + h;
      if (tok >= p.M) continue;
      const float g = acc[4 * j + h], u = acc[4 * j + 2 + h];
      if (A.splits == 1) {
        const float gs = g * ag, us = u * au;
        store_float(p.c, p.c_dtype, l * p.c_sL + tok * p.c_sM + feature, gs / (1.0f + __expf(-gs)) * us);
      } else {
        float2* w = reinterpret_cast<float2*>(A.ws + (((int64_t(split) * p.L + l) * p.M + tok) * p.N + feature) * 2);
        *w = make_float2(g, u);
      }
    }
  }
}

/// Split-K finalize: sum the partials in split order, then SiLU * up.
__global__ void finalize_kernel(DualGemmPlan p, const float* ws, int splits) {
  const int64_t n = p.L * p.M * p.N;
  const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
  const float ag = kBiasOut * sda * (p.amax_b1 ? nvfp4_global_decode_scale(*p.amax_b1) : 1.0f);
  const float au = kBiasOut * sda * (p.amax_b2 ? nvfp4_global_decode_scale(*p.amax_b2) : 1.0f);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float g = 0.0f, u = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float2 v = reinterpret_cast<const float2*>(ws)[s * n + i];
      g += v.x;
      u += v.y;
    }
    const int64_t f = i % p.N, m = (i / p.N) % p.M, l = i / (p.N * p.M);
    const float gs = g * ag, us = u * au;
    store_float(p.c, p.c_dtype, l * p.c_sL + m * p.c_sM + f, gs / (1.0f + __expf(-gs)) * us);
  }
}

}  // namespace
}  // namespace lowbit::cuda
