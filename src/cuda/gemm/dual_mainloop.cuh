// src/cuda/gemm/dual_mainloop.cuh: mainloop kernel of the NVFP4 dual GEMM: weights dequantized in
// registers, activations through a cp.async pipeline, bf16 wgmma.
#pragma once

#include <utility>

#include "cuda/gemm/dual_epilogue.cuh"

namespace lowbit::cuda {
namespace {

// ------------------------------------------------------------------------------------------
// Main kernel

/// bf16x2 of two E4M3 scale bytes, each times 2^64 (exact).
__device__ __forceinline__ uint32_t scale_pair_bf16(uint32_t two_e4m3 /* low 16 bits */) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(uint16_t(two_e4m3)));
  const float f0 = __half2float(__ushort_as_half(uint16_t(h2))) * 1.8446744073709551616e19f;
  const float f1 = __half2float(__ushort_as_half(uint16_t(h2 >> 16))) * 1.8446744073709551616e19f;
  uint32_t b2;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(b2) : "f"(f1), "f"(f0));
  return b2;
}

/// Dequantizes one warpgroup's A fragments of a k tile (4 k16 steps x 4 bf16x2 registers).
__device__ __forceinline__ void dequant_fragments(const uint8_t* chunk, int wtid, int g, uint32_t (&a)[4][4]) {
  const uint4 q = reinterpret_cast<const uint4*>(chunk)[wtid];
  const uint32_t sg = reinterpret_cast<const uint32_t*>(chunk + kChunkData)[g];
  const uint32_t sg8 = reinterpret_cast<const uint32_t*>(chunk + kChunkData)[g + 8];
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    // scales of rows g and g+8 for k16 step s, as bf16 (x 2^64), each broadcast to both halves
    const uint32_t pair = scale_pair_bf16(((sg >> (8 * s)) & 0xFF) | (((sg8 >> (8 * s)) & 0xFF) << 8));
    const uint32_t s_g = __byte_perm(pair, 0, 0x1010), s_g8 = __byte_perm(pair, 0, 0x3232);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t y = qw[s] >> (4 * j);
      const uint32_t v = e2m1x2_to_bf16x2_tiny(y);
      a[s][j] = bmul2(v, (j & 1) ? s_g8 : s_g);
    }
  }
}

/// The mainloop; the epilogue is chosen by the argument type (MainArgs: the dual GEMM's SiLU * up;
/// SingleArgs: the dense NVFP4 linear, see single_epilogue.cuh).
template <int kTileN, int kStages, class Args = MainArgs>
__global__ void __launch_bounds__(256) dual_gemm_kernel(Args E) {
  const MainArgs& A = main_args(E);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kActBytes = kTileN * 128;
  constexpr int kStageBytes = kActBytes + ((2 * kChunkBytes + 1023) / 1024) * 1024;
  // NOTE: offset, not a uintptr_t round trip, so the compiler keeps the shared address space (LDS)
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);

  const DualGemmPlan& p = A.p;
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const DualTileXY tile = dual_tile_coords(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, A.raster_group);
  const int64_t bx = tile.x, tok0 = tile.y * kTileN;
  const int split = int(blockIdx.z % A.splits);
  const int64_t l = blockIdx.z / A.splits;
  const int64_t kTiles = p.K / kTileK;
  const int64_t kt0 = int64_t(split) * A.k_tiles_per_split;
  const int64_t kt1 = kt0 + A.k_tiles_per_split < kTiles ? kt0 + A.k_tiles_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;
  const int64_t rowBlocks = 2 * p.N / kRowsPerWG;
  const uint8_t* wsrc = A.packed + ((l * rowBlocks + 2 * bx) * kTiles) * kChunkBytes;
  const uint16_t* asrc = A.act + (l * p.M) * p.K;

  // Each thread's cp.async pieces of a stage: sources advance by a fixed stride per k tile.
  constexpr int kWPieces = 2 * kChunkBytes / 16;            // weight pieces per stage
  constexpr int kWIters = (kWPieces + 255) / 256;
  constexpr int kAIters = (kTileN * 8 + 255) / 256;               // activation pieces per stage
  const uint8_t* wptr[kWIters];
  uint32_t wdst[kWIters];
  bool wok[kWIters];
#pragma unroll
  for (int j = 0; j < kWIters; ++j) {
    const int i = tid + 256 * j, c = i / (kChunkBytes / 16), off = (i % (kChunkBytes / 16)) * 16;
    wok[j] = i < kWPieces;
    wptr[j] = wsrc + (int64_t(c) * kTiles + kt0) * kChunkBytes + off;
    wdst[j] = uint32_t(kActBytes + c * kChunkBytes + off);
  }
  const uint16_t* aptr[kAIters];
  uint32_t adst[kAIters];
  bool aok[kAIters], aload[kAIters];
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int i = tid + 256 * j, r = i >> 3, c = i & 7;
    const int64_t tok = tok0 + r;
    aload[j] = i < kTileN * 8;
    aok[j] = tok < p.M;
    aptr[j] = aok[j] ? asrc + tok * p.K + kt0 * kTileK + c * 8 : asrc;
    adst[j] = uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
  }
  const uint32_t smem_base = smem_u32(smem);
  auto load_stage = [&](int64_t it) {
    const uint32_t st = smem_base + uint32_t((it % kStages) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      if (wok[j]) cp_async16(st + wdst[j], wptr[j] + it * kChunkBytes, true);
#pragma unroll
    for (int j = 0; j < kAIters; ++j)
      if (aload[j]) cp_async16(st + adst[j], aok[j] ? aptr[j] + it * kTileK : aptr[j], aok[j]);
  };

  float acc[kTileN / 2];
#pragma unroll
  for (int i = 0; i < kTileN / 2; ++i) acc[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) load_stage(s);
    cp_async_commit();
  }
  const int g = 16 * warp + (lane >> 2);
  for (int64_t it = 0; it < nkt; ++it) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    if (it + kStages - 1 < nkt) load_stage(it + kStages - 1);
    cp_async_commit();

    const uint8_t* st = smem + (it % kStages) * kStageBytes;
    uint32_t a[4][4];
    dequant_fragments(st + kActBytes + wg * kChunkBytes, wtid, g, a);
    const uint32_t abase = smem_u32(st);
#pragma unroll
    for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int s = 0; s < 4; ++s)
      wgmma_call<kTileN>(a[s], desc_sw128(abase + s * 32), acc, std::make_index_sequence<kTileN / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cp_async_wait<0>();
  epilogue_store<kTileN>(E, acc, l, bx, tok0, wg, warp, lane, split);
}

}  // namespace
}  // namespace lowbit::cuda
