// src/cuda/gemm/dual_prepack.cuh: weight prepack and activation pre-pass kernels of the NVFP4 dual
// GEMM.
#pragma once

#include "cuda/gemm/dual_params.cuh"

namespace lowbit::cuda {
namespace {

// ------------------------------------------------------------------------------------------
// Prepack: B1, B2 -> [L][2N/64][K/64][chunk]

/// Interleaved row R (0..2N) -> (matrix 0 = B1 / 1 = B2, source row).
__device__ __forceinline__ void interleaved_source(int64_t R, int* mat, int64_t* row) {
  const int64_t blk = R >> 4, within = R & 15;
  *mat = within >= 8 ? 1 : 0;
  *row = blk * 8 + (within & 7);
}

__global__ void prepack_kernel(DualGemmPlan p, uint8_t* out) {
  const int64_t kTiles = p.K / kTileK, rowBlocks = 2 * p.N / kRowsPerWG;
  const int64_t chunk = blockIdx.x;  // (l, rb, kt)
  const int64_t kt = chunk % kTiles, rb = (chunk / kTiles) % rowBlocks, l = chunk / (kTiles * rowBlocks);
  const int tid = threadIdx.x;  // 128 threads
  uint8_t* dst = out + chunk * kChunkBytes;
  const int warp = tid >> 5, lane = tid & 31, g = 16 * warp + (lane >> 2), t = lane & 3;
  auto code = [&](int r, int k) -> uint32_t {  // FP4 code of (row r of the block, k of the tile)
    int mat;
    int64_t src;
    interleaved_source(rb * kRowsPerWG + r, &mat, &src);
    const uint8_t* base = mat ? p.b2 + l * p.b2_sL + src * p.b2_sN : p.b1 + l * p.b1_sL + src * p.b1_sN;
    const int64_t kk = kt * kTileK + k;
    return (base[kk >> 1] >> ((kk & 1) * 4)) & 0xFu;
  };
  uint32_t words[4];
  for (int s = 0; s < 4; ++s) {
    const int k0 = 16 * s + 2 * t;
    // fragment element i: e0,e1 (g, k0..k0+1) e2,e3 (g+8, ...) e4,e5 (g, k0+8..) e6,e7 (g+8, k0+8..)
    uint32_t e[8] = {code(g, k0), code(g, k0 + 1), code(g + 8, k0), code(g + 8, k0 + 1),
                     code(g, k0 + 8), code(g, k0 + 9), code(g + 8, k0 + 8), code(g + 8, k0 + 9)};
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j) w |= (e[2 * j] << (4 * j)) | (e[2 * j + 1] << (4 * (j + 4)));
    words[s] = w;
  }
  reinterpret_cast<uint4*>(dst)[tid] = make_uint4(words[0], words[1], words[2], words[3]);
  if (tid < kRowsPerWG) {
    int mat;
    int64_t src;
    interleaved_source(rb * kRowsPerWG + tid, &mat, &src);
    const uint8_t* sf = mat ? p.sfb2 : p.sfb1;
    uint32_t w = 0;
    for (int s = 0; s < 4; ++s) w |= uint32_t(sf[p.spb.offset(l, src, kt * 4 + s)]) << (8 * s);
    reinterpret_cast<uint32_t*>(dst + kChunkData)[tid] = w;
  }
}

// ------------------------------------------------------------------------------------------
// Activations: NVFP4 -> bf16 [L][M][K], exact.

__global__ void dequant_act_kernel(DualGemmPlan p, uint16_t* out) {
  const int64_t blocks = p.L * p.M * (p.K / 16);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < blocks; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % (p.K / 16), m = (i / (p.K / 16)) % p.M, l = i / ((p.K / 16) * p.M);
    const uint8_t* src = p.a + l * p.a_sL + m * p.a_sM + c * 8;
    const float s = decode_e4m3(p.sfa[p.spa.offset(l, m, c)]);
    uint32_t w[8];
    for (int j = 0; j < 8; ++j) {
      const uint8_t b = src[j];
      const uint16_t lo = encode_bf16(decode_e2m1(b & 0xF) * s), hi = encode_bf16(decode_e2m1(b >> 4) * s);
      w[j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    uint4* d = reinterpret_cast<uint4*>(out + (l * p.M + m) * p.K + c * 16);
    d[0] = make_uint4(w[0], w[1], w[2], w[3]);
    d[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

}  // namespace
}  // namespace lowbit::cuda
