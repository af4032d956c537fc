// src/cuda/gemm/dual_params.cuh: constants and kernel parameters (MainArgs, make_dual_params) of the
// NVFP4 dual GEMM.
// The design and the exactness argument: sm90_nvfp4_dual_gemm.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/sm90_gemm_common.cuh"
#include "cuda/gemm/heuristics.hpp"
#include "cuda/gemm/launch_gemm.hpp"
#include "lowbit/block_quant.hpp"
#include "lowbit/gemm.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;
using namespace lowbit::cuda::gemm;

namespace {

constexpr int kTileK = kDualTileK;         // K per pipeline stage (4 wgmma k16 steps)
constexpr int kRowsPerWG = 64;             // weight rows per warpgroup
constexpr int kChunkData = 128 * 16;       // fragment bytes per (64-row block, k tile)
constexpr int kChunkBytes = kChunkData + 64 * 4;  // + 64 rows x 4 E4M3 scales (see nvfp4_dual_gemm_packed_bytes)
constexpr float kBiasOut = 4.611686018427387904e18f;  // 2^62: undoes e2m1 * 2^-126 * (s * 2^64)

struct MainArgs {
  DualGemmPlan p;
  const uint8_t* packed;
  const uint16_t* act;  // [L][M][K] bf16
  float* ws;            // split-K partials [splits][L][M][2N] (null when splits == 1)
  int splits;
  int k_tiles_per_split;
  int raster_group;  // dual_tile_coords
};

__host__ __device__ inline const MainArgs& main_args(const MainArgs& a) { return a; }

/// The mainloop kernel's parameters of a validated plan: the prepacked weights, the activation
/// pre-pass's bf16 rows, the split-K workspace (null when cfg.splits == 1) and the split.
inline MainArgs make_dual_params(const DualGemmPlan& p, const uint8_t* packed, const uint16_t* act, float* ws,
                                 const DualConfig& cfg) {
  return MainArgs{p, packed, act, ws, cfg.splits, cfg.kt_per_split, cfg.raster_group};
}

}  // namespace
}  // namespace lowbit::cuda
