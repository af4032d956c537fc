// src/cuda/moe/heuristics.hpp: tile, stage and split-K choices of the MXFP4 grouped GEMM and the
// gpt-oss MLP built on it. Host-only pure functions of sizes and the SM count (no CUDA types), so
// the choices are unit-tested on the CPU (tests/cpp/test_heuristics.cpp).
#pragma once

#include <cstdint>

#include "lowbit/mxfp4_pack.hpp"

namespace lowbit::cuda::moe {

/// Weight rows per CTA (2 warpgroups x 64, wgmma M).
constexpr int kGroupRows = 128;

/// Tokens per CTA (wgmma N) and K per pipeline stage.
struct GroupTile {
  int tile_n = 16;
  int tile_k = 64;
};

/// Tokens per CTA (from the mean rows per non-empty group) and the K tile that goes with it.
constexpr GroupTile pick_tile(int64_t rows_bound, int64_t groups) {
  const int64_t used = rows_bound < groups ? rows_bound : groups;  // non-empty groups at most
  const int64_t avg = used > 0 ? (rows_bound + used - 1) / used : 1;
  GroupTile t;
  t.tile_n = avg <= 16 ? 16 : avg <= 32 ? 32 : avg <= 64 ? 64 : 128;
  t.tile_k = t.tile_n <= 32 ? 256 : t.tile_n == 64 ? 128 : 64;
  return t;
}

/// The rows pick_tile sizes the tile from: all `rows` (boundaries and contiguous counts, where they
/// are the rows of the call or a close bound of them), or for the masked layout (max_tokens > 0)
/// groups x the expected rows per group (expected_m, 0: max_tokens): max_tokens is a capacity,
/// typically far above the counts (a decode step's dispatch).
constexpr int64_t tile_rows(int64_t rows, int64_t groups, int64_t max_tokens, int64_t expected_m) {
  if (max_tokens <= 0) return rows;
  const int64_t per = expected_m > 0 && expected_m < max_tokens ? expected_m : max_tokens;
  return groups * per;
}

/// The tile of a call in one of the row layouts: pick_tile over tile_rows, and for the masked
/// layout (max_tokens > 0) at most 32 tokens per tile, the shapes whose kernels are also built
/// with the loop over work items that a capped grid needs (group_grid_y).
constexpr GroupTile pick_layout_tile(int64_t rows, int64_t groups, int64_t max_tokens, int64_t expected_m) {
  GroupTile t = pick_tile(tile_rows(rows, groups, max_tokens, expected_m), groups);
  if (max_tokens > 0 && t.tile_n > 32) t = pick_tile(32, 1);
  return t;
}

/// Pipeline stages of the cp.async kernel for a tile of `tile_n` tokens (its K tile: pick_tile).
constexpr int group_stages(int tile_n) { return tile_n == 32 ? 3 : 4; }
/// Pipeline stages of the warp-specialized kernel (tile_n 16 or 32, K tile 256).
constexpr int group_ws_stages(int tile_n) { return tile_n == 16 ? 4 : 3; }
/// Batches per stage of the warp-specialized kernel.
constexpr int kGroupWsBatches = 8;

/// Grid and split-K of one grouped GEMM launch.
struct GroupSplit {
  int64_t max_tiles = 0;  ///< grid.y: an upper bound of the (group, token tile) pairs
  int splits = 1;         ///< grid.z
  int kt_per_split = 0;   ///< K tiles per split
};

/// Split K when the tiles do not fill the GPU: every configuration runs 2 CTAs per SM, and a CTA
/// costs about its K tiles plus ~2 tiles of pipeline fill, so pick the split count that minimises
/// waves x (tiles per split + 2) (partial waves cost as much as full ones).
constexpr GroupSplit group_split(int64_t rows_bound, int64_t groups, int64_t N, int64_t K, int tile_n, int tile_k,
                                 int sms) {
  GroupSplit s;
  int64_t max_tiles = (rows_bound + tile_n - 1) / tile_n + groups;  // sum over groups of ceil(rows / NT)
  if (rows_bound < max_tiles) max_tiles = rows_bound;                // and each tile holds a row
  const int64_t tiles_est = max_tiles * ((N + kGroupRows - 1) / kGroupRows);
  const int64_t kTiles = (K + tile_k - 1) / tile_k;
  const int64_t slots = 2 * int64_t(sms);
  int splits = 1;
  if (tiles_est < 2 * slots) {
    int64_t best = -1;
    const int64_t max_splits = kTiles / 2 > 0 ? kTiles / 2 : 1;
    for (int64_t sp = 1; sp <= max_splits; ++sp) {
      const int64_t per_sp = (kTiles + sp - 1) / sp;
      const int64_t cost = ((tiles_est * sp + slots - 1) / slots) * (per_sp + 2);
      if (best < 0 || cost < best) {
        best = cost;
        splits = int(sp);
      }
    }
  }
  const int per = int((kTiles + splits - 1) / splits);
  s.max_tiles = max_tiles;
  s.splits = per > 0 ? int((kTiles + per - 1) / per) : splits;
  s.kt_per_split = per;
  return s;
}

/// group_split with a requested split count (tuning): clamped to [1, K tiles], then to the count
/// that leaves no split empty; max_tiles as group_split computes it.
constexpr GroupSplit group_split_for(int64_t max_tiles, int64_t K, int tile_k, int splits) {
  GroupSplit s;
  const int64_t kTiles = (K + tile_k - 1) / tile_k;
  int64_t sp = splits < 1 ? 1 : splits;
  if (sp > kTiles) sp = kTiles > 0 ? kTiles : 1;
  const int64_t per = kTiles > 0 ? (kTiles + sp - 1) / sp : 0;
  s.max_tiles = max_tiles;
  s.kt_per_split = int(per);
  s.splits = per > 0 ? int((kTiles + per - 1) / per) : 1;
  return s;
}

// ---- one group of contiguous rows (mxfp4_gemm; a one-expert grouped GEMM on m_indptr) ----

/// Rows for which one group runs 64-token tiles with dense_group_splits' split count instead of
/// pick_tile / group_split: 64 < M < 4096, except K > 8192 from M = 384 on (there the 128-token
/// tiles stay ahead). Measured with bench/dev/gemm_config_sweep.cu on an H200 (mxfp4_gemm W4A16 on
/// prepacked weights at the five Llama layers, M = 1..4096, every tile x split count): 11.5 %
/// faster than pick_tile / group_split in geometric mean over the 60 shapes, up to 1.67x (256 x
/// 4096 x 4096: 80.8 -> 48.3 us), no shape slower by more than 3 %.
constexpr bool dense_mid_rows(int64_t M, int64_t K) { return M > 64 && M < 4096 && !(K > 8192 && M >= 384); }

/// Split counts dense_group_splits picks from (the ones the sweep measured).
constexpr int kDenseSplitChoices[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16};

/// The split count of 64-token tiles (K tile 128) for one group of M rows, N outputs: the argmin
/// over kDenseSplitChoices of a launch-time model of the dual GEMM's form (docs/design/
/// nvfp4_dual_gemm.md) fitted to the same sweep: each SM takes ceil(CTAs / SMs) CTAs and runs up to
/// 3 at once, a round of c CTAs costs (K tiles per split) x max(1.168, 0.646 c) + 0.309 us, and
/// split-K adds 0.413 us per MB of fp32 partials (written, then read by the finalize).
constexpr int dense_group_splits(int64_t M, int64_t N, int64_t K, int sms) {
  constexpr int kTile = 64, kTileK = 128, kResident = 3;
  constexpr double kLatency = 1.168, kThroughput = 0.646, kFill = 0.309, kUsPerMB = 0.413;
  const int64_t kTiles = (K + kTileK - 1) / kTileK;
  if (M <= 0 || N <= 0 || kTiles <= 0) return 1;
  int64_t max_tiles = (M + kTile - 1) / kTile + 1;  // group_split's bound for one group
  if (M < max_tiles) max_tiles = M;
  const int64_t cols = (N + kGroupRows - 1) / kGroupRows, s = sms > 0 ? sms : 1;
  int best = 1;
  double best_cost = -1;
  for (const int want : kDenseSplitChoices) {
    const int64_t sp = want < kTiles ? want : kTiles;
    const int64_t per = (kTiles + sp - 1) / sp;
    const int64_t splits = (kTiles + per - 1) / per;
    const int64_t load = (cols * max_tiles * splits + s - 1) / s;
    const int64_t rounds = (load + kResident - 1) / kResident;
    const int64_t last = load - (rounds - 1) * kResident;
    auto round_cost = [&](int64_t c) {
      const double t = double(c) * kThroughput;
      return double(per) * (t > kLatency ? t : kLatency) + kFill;
    };
    double cost = double(rounds - 1) * round_cost(kResident) + round_cost(last);
    if (splits > 1) cost += kUsPerMB * 2.0 * double(splits) * double(M) * double(N) * 4.0 * 1e-6;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = int(splits);
    }
  }
  return best;
}

/// The tile of a call (make_group_params): pick_layout_tile, or for one group of mid-size rows
/// bounded by m_indptr (not masked, no device counts: `one_group`) 64 tokens (dense_mid_rows).
constexpr GroupTile call_tile(int64_t rows, int64_t groups, int64_t K, int64_t max_tokens, int64_t expected_m,
                              bool one_group) {
  if (one_group && groups == 1 && dense_mid_rows(rows, K)) return pick_tile(64, 1);
  return pick_layout_tile(rows, groups, max_tokens, expected_m);
}

/// The split of a call with tile `t` (run_group): group_split, or for the 64-token tile of one group
/// of mid-size rows (call_tile) dense_group_splits' count.
constexpr GroupSplit call_split(int64_t rows_bound, int64_t groups, int64_t N, int64_t K, GroupTile t,
                                bool one_group, int sms) {
  const GroupSplit s = group_split(rows_bound, groups, N, K, t.tile_n, t.tile_k, sms);
  if (one_group && groups == 1 && t.tile_n == 64 && dense_mid_rows(rows_bound, K))
    return group_split_for(s.max_tiles, K, t.tile_k, dense_group_splits(rows_bound, N, K, sms));
  return s;
}

/// CTAs per wave-pair slot that a capped grid launches (group_grid_y).
constexpr int kGroupCapWaves = 2;

/// grid.y of a grouped GEMM launch: the bound max_tiles of the (group, tile) items, or, when
/// `cap` (the masked layout, whose bound counts max_tokens rows per group), at most
/// kGroupCapWaves waves of 2 CTAs per SM over the blocks_x x splits columns of the grid; the CTAs
/// then loop over their items (GroupArgs::max_tiles), so that CTAs without work do not scale with
/// max_tokens.
constexpr int64_t group_grid_y(int64_t max_tiles, int64_t blocks_x, int splits, int sms, bool cap) {
  if (!cap || max_tiles <= 0) return max_tiles;
  const int64_t cols = (blocks_x > 0 ? blocks_x : 1) * (splits > 0 ? splits : 1);
  const int64_t slots = int64_t(kGroupCapWaves) * 2 * int64_t(sms > 0 ? sms : 1);
  const int64_t y = (slots + cols - 1) / cols;
  return y < max_tiles ? y : max_tiles;
}

/// Blocks of the split-K finalize (256 threads each), at most 8 per SM.
constexpr int64_t group_finalize_blocks(int64_t M, int64_t N, int sms) {
  const int64_t items = M * ((N + 15) / 16) * 8;
  return items / 256 + 1 < 8 * int64_t(sms) ? items / 256 + 1 : 8 * int64_t(sms);
}

/// The warp-specialized kernel runs when the packed weights and the activation rows can be read by
/// TMA (16-byte aligned bases, rows addressable with 32-bit coordinates). `b_addr` / `act_addr`:
/// the base addresses of the weights and the activation rows.
constexpr bool ws_eligible(bool packed, int tile_n, int tile_k, uint64_t b_addr, int64_t b_sG, int64_t b_sN,
                           int64_t N, int64_t groups, int64_t M, uint64_t act_addr) {
  return packed && tile_k == 256 && (tile_n == 16 || tile_n == 32) && (b_addr & 15) == 0 &&
         b_sG == mxfp4_packed_rows(N) * b_sN && groups * mxfp4_packed_rows(N) < (int64_t(1) << 31) &&
         M < (int64_t(1) << 31) && (act_addr & 15) == 0;
}

/// Activation pre-pass launch: `strip` 64-wide K blocks per warp item and the grid (8 warps a block).
struct PrepassGrid {
  int strip = 1;
  int64_t blocks = 0;
};

/// Strips of K blocks per warp: 1 while the rows are few (latency), up to 8 for long batches (each
/// warp reads its row's scale bytes once for the shift). Kp: the activation row pitch.
constexpr PrepassGrid prepass_grid(int64_t M, int64_t Kp, int sms) {
  PrepassGrid g;
  const int64_t items = M * (Kp / 64), target = 32 * int64_t(sms);
  g.strip = int(items / target < 1 ? 1 : (items / target > 8 ? 8 : items / target));
  const int64_t blocks = (M * ((Kp / 64 + g.strip - 1) / g.strip) + 7) / 8;
  const int64_t cap = 16 * int64_t(sms);
  g.blocks = blocks < cap ? blocks : cap;
  return g;
}

// ---- the FP8 tensor-core path (GemmPrecision::kFp8TensorCores; group_fp8_mainloop.cuh) ----

/// Tokens per CTA tile (wgmma N) and K per pipeline stage (the FP8-path packed tile) of the FP8
/// path: each consumer thread holds 64 fp32 totals and 64 fp32 partial sums.
constexpr int kFp8TileN = 128;
constexpr int kFp8TileK = 128;
/// Pipeline stages (32 KB each: activations 16 KB, weight codes 8 KB, scales, tables, multipliers).
constexpr int kFp8Stages = 6;

/// Host bound of the (group, token tile) items of the FP8 path: every row in a tile, and with the
/// masked layout (max_tokens > 0) at most ceil(max_tokens / kFp8TileN) tiles per group.
constexpr int64_t fp8_token_tiles(int64_t rows, int64_t groups, int64_t max_tokens) {
  int64_t t = (rows + kFp8TileN - 1) / kFp8TileN + groups;
  if (rows < t) t = rows;
  if (max_tokens > 0) {
    const int64_t per = groups * ((max_tokens + kFp8TileN - 1) / kFp8TileN);
    if (per < t) t = per;
  }
  return t;
}
/// CTAs of the FP8 path's persistent kernel (one per SM, each looping over the
/// row-block x token-tile items blockIdx.x, + gridDim.x, ...).
constexpr int64_t fp8_grid(int64_t items, int sms) { return items < int64_t(sms) ? items : int64_t(sms > 0 ? sms : 1); }

}  // namespace lowbit::cuda::moe
