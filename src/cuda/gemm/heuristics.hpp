// src/cuda/gemm/heuristics.hpp: tile, stage and split-K choices of the NVFP4 dual GEMM. Host-only
// pure functions of sizes and the SM count (no CUDA types), unit-tested on the CPU
// (tests/cpp/test_heuristics.cpp).
#pragma once

#include <cstdint>

namespace lowbit::cuda::gemm {

/// K per pipeline stage of the dual GEMM (4 wgmma k16 steps).
constexpr int kDualTileK = 64;

/// Pipeline stages of the dual GEMM for a tile of `tile_n` tokens.
constexpr int dual_stages(int tile_n) { return tile_n == 16 ? 8 : tile_n == 32 ? 6 : tile_n == 64 ? 5 : 4; }

/// Tokens per CTA, split-K and K tiles per split of one dual GEMM (M tokens, N features, L batches).
struct DualConfig {
  int tile_n = 16;
  int splits = 1;
  int kt_per_split = 0;
};

/// Split K when the (feature block, token tile, batch) tiles are fewer than the SMs: about 2 CTAs
/// per SM, at least 4 K tiles per split (no tiles: no split).
constexpr DualConfig dual_config(int64_t M, int64_t N, int64_t K, int64_t L, int sms) {
  DualConfig c;
  c.tile_n = M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : 128;
  const int64_t kTiles = K / kDualTileK;
  const int64_t tiles = (N / 64) * ((M + c.tile_n - 1) / c.tile_n) * L;
  int splits = 1;
  if (tiles < sms && tiles > 0) {
    splits = int((2 * sms + tiles - 1) / tiles);
    const int max_splits = int(kTiles / 4 > 0 ? kTiles / 4 : 1);
    splits = splits < max_splits ? splits : max_splits;
    if (splits < 1) splits = 1;
  }
  const int per = int((kTiles + splits - 1) / splits);
  c.splits = per > 0 ? int((kTiles + per - 1) / per) : splits;
  c.kt_per_split = per;
  return c;
}

}  // namespace lowbit::cuda::gemm
