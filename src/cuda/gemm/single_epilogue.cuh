// src/cuda/gemm/single_epilogue.cuh: the dense NVFP4 linear (nvfp4_gemm) on the dual GEMM's
// mainloop. The mainloop sees a DualGemmPlan of N/2 "features", so each CTA covers two 64-row
// blocks of B (128 output columns) without interleaving: accumulator rows g and g + 8 of a
// warpgroup are two output columns, not gate and up. Here: the prepack of B, the parameters, the
// epilogue (global scales, bias, output dtype) and the split-K finalize.
#pragma once

#include "cuda/gemm/dual_epilogue.cuh"
#include "core/plan_linear.hpp"

namespace lowbit::cuda {
namespace {

struct SingleArgs {
  MainArgs m;            ///< m.p: M, N / 2, K, L = 1 for the mainloop
  Nvfp4GemmPlan q;       ///< the linear's plan (out, bias, global amaxes)
};
__host__ __device__ inline const MainArgs& main_args(const SingleArgs& a) { return a.m; }

/// Output column of accumulator row (g or g + 8) of warpgroup wg in CTA bx.
__device__ __forceinline__ int64_t single_col(int64_t bx, int wg, int warp, int lane, int half) {
  return 64 * (2 * bx + wg) + 16 * warp + (lane >> 2) + 8 * half;
}

__device__ __forceinline__ float single_scale(const Nvfp4GemmPlan& q) {
  const float sda = q.amax_a ? nvfp4_global_decode_scale(*q.amax_a) : 1.0f;
  return kBiasOut * sda * (q.amax_b ? nvfp4_global_decode_scale(*q.amax_b) : 1.0f);
}

__device__ __forceinline__ void single_store(const Nvfp4GemmPlan& q, int64_t tok, int64_t col, float v) {
  if (q.bias) v += load_float(q.bias, q.bias_dtype, col);
  store_float(q.out, q.out_dtype, tok * q.o_sM + col, v);
}

template <int kTileN>
__device__ __forceinline__ void epilogue_store(const SingleArgs& E, const float (&acc)[kTileN / 2], int64_t l,
                                               int64_t bx, int64_t tok0, int wg, int warp, int lane, int split) {
  (void)l;
  const Nvfp4GemmPlan& q = E.q;
  const int t = lane & 3;
  const float sc = E.m.splits == 1 ? single_scale(q) : 1.0f;
#pragma unroll
  for (int j = 0; j < kTileN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t tok = tok0 + 8 * j + 2 * t + h;
      if (tok >= q.M) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t col = single_col(bx, wg, warp, lane, half);
        const float v = acc[4 * j + 2 * half + h];
        if (E.m.splits == 1) single_store(q, tok, col, v * sc);
        else E.m.ws[(int64_t(split) * q.M + tok) * q.N + col] = v;
      }
    }
  }
}

/// Split-K finalize: sum the partials in split order, scale, bias, store.
__global__ void single_finalize_kernel(Nvfp4GemmPlan q, const float* ws, int splits) {
  const int64_t n = q.M * q.N;
  const float sc = single_scale(q);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += ws[s * n + i];
    single_store(q, i / q.N, i % q.N, v * sc);
  }
}

/// Prepack of B [N][K/2] with its E4M3 scales into the mainloop's chunks [N/64][K/64][chunk] (the
/// dual GEMM's fragment order, rows not interleaved).
__global__ void single_prepack_kernel(Nvfp4GemmPlan q, uint8_t* out) {
  const int64_t kTiles = q.K / kTileK, rowBlocks = q.N / kRowsPerWG;
  const int64_t chunk = blockIdx.x;  // (rb, kt)
  const int64_t kt = chunk % kTiles, rb = chunk / kTiles;
  (void)rowBlocks;
  const int tid = threadIdx.x;  // 128 threads
  uint8_t* dst = out + chunk * kChunkBytes;
  const int warp = tid >> 5, lane = tid & 31, g = 16 * warp + (lane >> 2), t = lane & 3;
  auto code = [&](int r, int k) -> uint32_t {
    const uint8_t* base = q.b + (rb * kRowsPerWG + r) * q.b_sN;
    const int64_t kk = kt * kTileK + k;
    return (base[kk >> 1] >> ((kk & 1) * 4)) & 0xFu;
  };
  uint32_t words[4];
  for (int s = 0; s < 4; ++s) {
    const int k0 = 16 * s + 2 * t;
    uint32_t e[8] = {code(g, k0), code(g, k0 + 1), code(g + 8, k0), code(g + 8, k0 + 1),
                     code(g, k0 + 8), code(g, k0 + 9), code(g + 8, k0 + 8), code(g + 8, k0 + 9)};
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j) w |= (e[2 * j] << (4 * j)) | (e[2 * j + 1] << (4 * (j + 4)));
    words[s] = w;
  }
  reinterpret_cast<uint4*>(dst)[tid] = make_uint4(words[0], words[1], words[2], words[3]);
  if (tid < kRowsPerWG) {
    const int64_t src = rb * kRowsPerWG + tid;
    uint32_t w = 0;
    for (int s = 0; s < 4; ++s) w |= uint32_t(q.sfb[q.spb.offset(0, src, kt * 4 + s)]) << (8 * s);
    reinterpret_cast<uint32_t*>(dst + kChunkData)[tid] = w;
  }
}

/// Activations to bf16 rows [M][K]: NVFP4 decoded exactly, or bf16 rows copied (strided input).
__global__ void single_act_kernel(Nvfp4GemmPlan q, uint16_t* out) {
  const int64_t blocks = q.M * (q.K / 16);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < blocks; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % (q.K / 16), m = i / (q.K / 16);
    uint32_t w[8];
    if (q.a_bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(q.a) + m * q.a_sM + c * 16;
      for (int j = 0; j < 8; ++j) w[j] = uint32_t(src[2 * j]) | (uint32_t(src[2 * j + 1]) << 16);
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(q.a) + m * q.a_sM + c * 8;
      const float s = decode_e4m3(q.sfa[q.spa.offset(0, m, c)]);
      for (int j = 0; j < 8; ++j) {
        const uint8_t b = src[j];
        const uint16_t lo = encode_bf16(decode_e2m1(b & 0xF) * s), hi = encode_bf16(decode_e2m1(b >> 4) * s);
        w[j] = uint32_t(lo) | (uint32_t(hi) << 16);
      }
    }
    uint4* d = reinterpret_cast<uint4*>(out + m * q.K + c * 16);
    d[0] = make_uint4(w[0], w[1], w[2], w[3]);
    d[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

}  // namespace
}  // namespace lowbit::cuda
