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
/// CTA columns (64 features each) per group of the launch order (dual_tile_coords).
constexpr int kDualRasterGroup = 32;

struct DualConfig {
  int tile_n = 16;
  int splits = 1;
  int kt_per_split = 0;
  int raster_group = kDualRasterGroup;  ///< dual_tile_coords' group width (0: the plain grid order)
};

/// A CTA's (feature block, token tile) from its place in the grid (bx, by of gx x gy). The
/// hardware starts CTAs in x-then-y order, so with gx feature blocks wider than the group a wave
/// of CTAs would read every block's weights for one or two token tiles (28672 outputs: 58 MB of
/// weights per wave, more than L2 holds); here the CTAs walk all token tiles of `group` blocks
/// before the next group starts, and a wave of 2 x 132 CTAs reads 32 blocks and ~8 token tiles.
/// A bijection of the grid; the plain order when gx <= group or group <= 0.
struct DualTileXY {
  int64_t x, y;
};
constexpr DualTileXY dual_tile_coords(int64_t bx, int64_t by, int64_t gx, int64_t gy, int group) {
  if (group <= 0 || gx <= group) return {bx, by};
  const int64_t i = bx + gx * by, span = int64_t(group) * gy;
  const int64_t g = i / span, local = i - g * span, first = g * group;
  const int64_t w = gx - first < group ? gx - first : group;
  return {first + local % w, local / w};
}

/// The launch-time model the choice minimises (us; only its argmin matters). Fitted by least
/// squares of log time to 2,200 graph-replayed launches of bench/dev/gemm_config_sweep.cu on an H200
/// (132 SMs; the dual GEMM at N x K = 4096 x 7168, 3072 x 4096, 3072 x 7168 and the linear at the
/// five Llama shapes, M = 1..4096, every tile x split count): each SM takes ceil(CTAs / SMs) CTAs and
/// runs up to `resident` of them at once; a round of c CTAs costs per-split K tiles x max(latency,
/// c x throughput) plus a fill, and split-K adds its fp32 partials' traffic (written and read).
/// Root-mean-square error of the fit: 7 %; the choice it makes was within 1.7 % of the fastest
/// measured one (geometric mean over the 96 shapes, at most 19 % off), where dual_config's first
/// form (about 2 CTAs per SM by splitting) was 14 % off.
struct DualTileCost {
  int resident;      ///< CTAs per SM the fit found (not the occupancy limit itself)
  double latency;    ///< us per K tile of a CTA alone on its SM
  double throughput; ///< us per K tile per resident CTA when several share the SM
  double fill;       ///< us per CTA round: pipeline fill and epilogue
};
constexpr DualTileCost dual_tile_cost(int tile_n) {
  return tile_n == 16   ? DualTileCost{3, 0.383, 0.306, 0.995}
         : tile_n == 32 ? DualTileCost{2, 0.441, 0.335, 0.992}
         : tile_n == 64 ? DualTileCost{3, 0.532, 0.406, 2.959}
                        : DualTileCost{2, 0.963, 0.596, 5.871};
}
/// us per MB of split-K partials (written, then read by the finalize).
constexpr double kDualSplitUsPerMB = 0.1485;

/// Modelled time of one launch: `blocks` CTA columns (64 features each), M tokens in tiles of
/// tile_n, `splits` of kt_per_split K tiles, L batches; `partial_bytes_per_split`: bytes of one
/// split's fp32 partials.
constexpr double dual_launch_cost(int64_t blocks, int64_t M, int64_t L, int tile_n, int splits, int kt_per_split,
                                  double partial_bytes_per_split, int sms) {
  const DualTileCost c = dual_tile_cost(tile_n);
  const int64_t ctas = blocks * ((M + tile_n - 1) / tile_n) * splits * L;
  const int64_t load = (ctas + sms - 1) / sms;
  const int64_t rounds = (load + c.resident - 1) / c.resident;
  const int64_t last = load - (rounds - 1) * c.resident;
  auto round_cost = [&](int64_t k) {
    const double t = double(k) * c.throughput;
    return double(kt_per_split) * (t > c.latency ? t : c.latency) + c.fill;
  };
  double cost = rounds > 0 ? double(rounds - 1) * round_cost(c.resident) + round_cost(last) : 0.0;
  if (splits > 1) cost += kDualSplitUsPerMB * 2.0 * double(splits) * double(L) * partial_bytes_per_split * 1e-6;
  return cost;
}

/// Split counts the choice picks from (the ones the sweep measured).
constexpr int kDualSplitChoices[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};

/// Tokens per CTA and split-K of one dual-GEMM-mainloop launch: M tokens, N features (64 per CTA
/// column; the linear passes N / 2), L batches. The argmin of dual_launch_cost over tiles of 16 or
/// of fewer than twice M tokens and over kDualSplitChoices with at least 4 K tiles per split (the
/// fit saw no shorter split win; small K is not split) (no tokens: one 16-token tile, no split).
constexpr DualConfig dual_config(int64_t M, int64_t N, int64_t K, int64_t L, int sms) {
  DualConfig best;
  const int64_t kTiles = K / kDualTileK;
  best.kt_per_split = int(kTiles);
  if (M <= 0 || N <= 0 || L <= 0 || kTiles <= 0) return best;
  double best_cost = -1;
  const int tiles[] = {16, 32, 64, 128};
  for (const int t : tiles) {
    if (t > 16 && t / 2 >= M) continue;
    for (const int want : kDualSplitChoices) {
      const int64_t sp = want < kTiles ? want : kTiles;
      const int64_t per = (kTiles + sp - 1) / sp;
      const int splits = int((kTiles + per - 1) / per);
      if (splits > 1 && per < 4) continue;
      const double c = dual_launch_cost(N / 64, M, L, t, splits, int(per), double(M) * double(2 * N) * 4.0,
                                        sms > 0 ? sms : 1);
      if (best_cost < 0 || c < best_cost) {
        best_cost = c;
        best.tile_n = t;
        best.splits = splits;
        best.kt_per_split = int(per);
      }
    }
  }
  return best;
}

/// A requested tile / split count made valid for K: tile_n rounded up to 16 / 32 / 64 / 128, the
/// splits clamped to [1, K tiles] and then to the count that leaves no split empty.
constexpr DualConfig dual_config_for(int tile_n, int splits, int64_t K, int raster_group = kDualRasterGroup) {
  DualConfig c;
  c.raster_group = raster_group;
  c.tile_n = tile_n <= 16 ? 16 : tile_n <= 32 ? 32 : tile_n <= 64 ? 64 : 128;
  const int64_t kTiles = K / kDualTileK;
  int64_t sp = splits < 1 ? 1 : splits;
  if (sp > kTiles) sp = kTiles > 0 ? kTiles : 1;
  const int64_t per = kTiles > 0 ? (kTiles + sp - 1) / sp : 0;
  c.kt_per_split = int(per);
  c.splits = per > 0 ? int((kTiles + per - 1) / per) : 1;
  return c;
}

}  // namespace lowbit::cuda::gemm
