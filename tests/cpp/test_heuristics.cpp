// Tile, stage and split-K choices of the grouped GEMM (cuda/moe/heuristics.hpp), the dual GEMM
// (cuda/gemm/heuristics.hpp) and the fused decode attention's K buffers
// (cuda/attention/decode_heuristics.hpp): known shapes -> the choices the launchers make, and edge cases.
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "cuda/attention/decode_heuristics.hpp"
#include "cuda/gemm/heuristics.hpp"
#include "cuda/moe/heuristics.hpp"

namespace {

using lowbit::cuda::gemm::dual_config;
using lowbit::cuda::gemm::dual_stages;
using lowbit::cuda::moe::group_finalize_blocks;
using lowbit::cuda::moe::group_grid_y;
using lowbit::cuda::moe::pick_layout_tile;
using lowbit::cuda::moe::tile_rows;
using lowbit::cuda::moe::group_split;
using lowbit::cuda::moe::group_stages;
using lowbit::cuda::moe::group_ws_stages;
using lowbit::cuda::moe::pick_tile;
using lowbit::cuda::moe::prepass_grid;
using lowbit::cuda::moe::ws_eligible;

constexpr int kH100Sms = 132;

std::tuple<int, int> tile(int64_t rows, int64_t groups) {
  const auto t = pick_tile(rows, groups);
  return {t.tile_n, t.tile_k};
}

TEST(GroupHeuristics, PickTileFromMeanRowsPerGroup) {
  EXPECT_EQ(tile(0, 8), std::make_tuple(16, 256));  // no rows
  EXPECT_EQ(tile(1, 1), std::make_tuple(16, 256));
  EXPECT_EQ(tile(1, 128), std::make_tuple(16, 256));  // one row, many groups
  EXPECT_EQ(tile(16, 1), std::make_tuple(16, 256));
  EXPECT_EQ(tile(17, 1), std::make_tuple(32, 256));
  EXPECT_EQ(tile(32, 1), std::make_tuple(32, 256));
  EXPECT_EQ(tile(33, 1), std::make_tuple(64, 128));
  EXPECT_EQ(tile(64, 1), std::make_tuple(64, 128));
  EXPECT_EQ(tile(65, 1), std::make_tuple(128, 64));
  EXPECT_EQ(tile(128, 128), std::make_tuple(16, 256));
  EXPECT_EQ(tile(129, 128), std::make_tuple(16, 256));  // mean rounded up: 2
  EXPECT_EQ(tile(4096, 128), std::make_tuple(32, 256));
  EXPECT_EQ(tile(2048, 32), std::make_tuple(64, 128));
  EXPECT_EQ(tile(100000, 4), std::make_tuple(128, 64));
}

TEST(GroupHeuristics, LayoutTiles) {
  // boundaries / contiguous counts: the rows of the call
  EXPECT_EQ(tile_rows(4096, 32, 0, 0), 4096);
  EXPECT_EQ(tile_rows(4096, 32, 0, 7), 4096);
  // masked: groups x the expected rows (0 or above max_tokens: max_tokens)
  EXPECT_EQ(tile_rows(16 * 1024, 16, 1024, 0), 16 * 1024);
  EXPECT_EQ(tile_rows(16 * 1024, 16, 1024, 24), 16 * 24);
  EXPECT_EQ(tile_rows(16 * 1024, 16, 1024, 5000), 16 * 1024);
  // masked tiles hold at most 32 tokens (the shapes built with the work-item loop)
  const auto t1 = pick_layout_tile(16 * 1024, 16, 1024, 0);
  EXPECT_EQ(std::make_tuple(t1.tile_n, t1.tile_k), std::make_tuple(32, 256));
  const auto t2 = pick_layout_tile(16 * 1024, 16, 1024, 8);
  EXPECT_EQ(std::make_tuple(t2.tile_n, t2.tile_k), std::make_tuple(16, 256));
  const auto t3 = pick_layout_tile(16 * 1024, 16, 0, 0);  // contiguous: as pick_tile
  EXPECT_EQ(std::make_tuple(t3.tile_n, t3.tile_k), std::make_tuple(128, 64));
}

TEST(GroupHeuristics, GridY) {
  EXPECT_EQ(group_grid_y(5000, 45, 1, kH100Sms, false), 5000);  // not capped: every item
  EXPECT_EQ(group_grid_y(0, 45, 1, kH100Sms, true), 0);
  // capped: 2 waves of 2 CTAs per SM over the columns of the grid
  EXPECT_EQ(group_grid_y(5000, 45, 1, kH100Sms, true), (4 * kH100Sms + 44) / 45);
  EXPECT_EQ(group_grid_y(5000, 2, 2, kH100Sms, true), kH100Sms);
  EXPECT_EQ(group_grid_y(7, 2, 1, kH100Sms, true), 7);  // fewer items than the cap
}

TEST(GroupHeuristics, Stages) {
  EXPECT_EQ(group_stages(16), 4);
  EXPECT_EQ(group_stages(32), 3);
  EXPECT_EQ(group_stages(64), 4);
  EXPECT_EQ(group_stages(128), 4);
  EXPECT_EQ(group_ws_stages(16), 4);
  EXPECT_EQ(group_ws_stages(32), 3);
}

std::tuple<int64_t, int, int> split(int64_t rows, int64_t groups, int64_t N, int64_t K, int sms = kH100Sms) {
  const auto t = pick_tile(rows, groups);
  const auto s = group_split(rows, groups, N, K, t.tile_n, t.tile_k, sms);
  EXPECT_GE(s.splits, 1);
  EXPECT_GE(int64_t(s.splits) * s.kt_per_split, (K + t.tile_k - 1) / t.tile_k);  // every K tile covered
  EXPECT_LT(int64_t(s.splits - 1) * s.kt_per_split, (K + t.tile_k - 1) / t.tile_k);  // no empty split
  return {s.max_tiles, s.splits, s.kt_per_split};
}

TEST(GroupHeuristics, SplitK) {
  // (max_tiles, splits, K tiles per split)
  EXPECT_EQ(split(1, 128, 2880, 2880), std::make_tuple(int64_t(1), 6, 2));  // one token: split K
  EXPECT_EQ(split(16, 1, 4096, 4096), std::make_tuple(int64_t(2), 4, 4));
  EXPECT_EQ(split(3, 4, 256, 4096), std::make_tuple(int64_t(3), 8, 2));
  EXPECT_EQ(split(512, 128, 5760, 2880), std::make_tuple(int64_t(160), 1, 12));  // GPU full: no split
  EXPECT_EQ(split(4096, 32, 5760, 2880), std::make_tuple(int64_t(64), 1, 45));
  EXPECT_EQ(split(32768, 128, 5760, 2880), std::make_tuple(int64_t(384), 1, 45));
  EXPECT_EQ(split(5, 1000, 128, 512), std::make_tuple(int64_t(5), 1, 2));  // many groups, few rows
  // tiny K: one K tile, no split
  EXPECT_EQ(split(1, 1, 128, 1), std::make_tuple(int64_t(1), 1, 1));
  EXPECT_EQ(split(1, 1, 128, 64), std::make_tuple(int64_t(1), 1, 1));
  EXPECT_EQ(split(1, 1, 128, 256), std::make_tuple(int64_t(1), 1, 1));
  // no rows: no tiles (the launcher returns before launching)
  const auto z = group_split(0, 8, 128, 256, 16, 256, kH100Sms);
  EXPECT_EQ(z.max_tiles, 0);
}

TEST(GroupHeuristics, FinalizeBlocks) {
  EXPECT_EQ(group_finalize_blocks(1, 2880, kH100Sms), 6);  // 180 * 8 items / 256 + 1
  EXPECT_EQ(group_finalize_blocks(0, 2880, kH100Sms), 1);
  EXPECT_EQ(group_finalize_blocks(4096, 5760, kH100Sms), 8 * kH100Sms);  // capped
}

TEST(GroupHeuristics, WarpSpecializedEligible) {
  const int64_t N = 2880, Np = lowbit::mxfp4_packed_rows(N), sN = 1440;
  EXPECT_TRUE(ws_eligible(true, 16, 256, 0x1000, Np * sN, sN, N, 32, 64, 0x2000));
  EXPECT_TRUE(ws_eligible(true, 32, 256, 0x1000, Np * sN, sN, N, 32, 64, 0x2000));
  EXPECT_FALSE(ws_eligible(false, 16, 256, 0x1000, Np * sN, sN, N, 32, 64, 0x2000));  // plain weights
  EXPECT_FALSE(ws_eligible(true, 64, 128, 0x1000, Np * sN, sN, N, 32, 64, 0x2000));   // tile
  EXPECT_FALSE(ws_eligible(true, 16, 256, 0x1008, Np * sN, sN, N, 32, 64, 0x2000));   // weights misaligned
  EXPECT_FALSE(ws_eligible(true, 16, 256, 0x1000, Np * sN, sN, N, 32, 64, 0x2004));   // act misaligned
  EXPECT_FALSE(ws_eligible(true, 16, 256, 0x1000, Np * sN + 16, sN, N, 32, 64, 0x2000));  // group pitch
  EXPECT_FALSE(ws_eligible(true, 16, 256, 0x1000, Np * sN, sN, N, int64_t(1) << 20, 64, 0x2000));  // 2^31 rows
  EXPECT_FALSE(ws_eligible(true, 16, 256, 0x1000, Np * sN, sN, N, 32, int64_t(1) << 31, 0x2000));
}

TEST(GroupHeuristics, PrepassGrid) {
  auto pg = [](int64_t M, int64_t Kp) {
    const auto g = prepass_grid(M, Kp, kH100Sms);
    return std::make_tuple(g.strip, g.blocks);
  };
  EXPECT_EQ(pg(0, 1024), std::make_tuple(1, int64_t(0)));
  EXPECT_EQ(pg(1, 64), std::make_tuple(1, int64_t(1)));
  EXPECT_EQ(pg(1, 256), std::make_tuple(1, int64_t(1)));
  EXPECT_EQ(pg(1, 3072), std::make_tuple(1, int64_t(6)));
  EXPECT_EQ(pg(8, 8192), std::make_tuple(1, int64_t(128)));
  EXPECT_EQ(pg(64, 4096), std::make_tuple(1, int64_t(512)));
  EXPECT_EQ(pg(4096, 4096), std::make_tuple(8, int64_t(16 * kH100Sms)));    // long batch: 8 blocks a warp, capped
  EXPECT_EQ(pg(100000, 4096), std::make_tuple(8, int64_t(16 * kH100Sms)));
}

std::tuple<int, int, int> dual(int64_t M, int64_t N, int64_t K, int64_t L, int sms = kH100Sms) {
  const auto c = dual_config(M, N, K, L, sms);
  return {c.tile_n, c.splits, c.kt_per_split};
}

TEST(DualHeuristics, TileAndSplitK) {
  // (tokens per CTA, splits, K tiles per split): the argmin of dual_launch_cost
  EXPECT_EQ(dual(1, 4096, 4096, 1), std::make_tuple(16, 4, 16));
  EXPECT_EQ(dual(16, 4096, 4096, 1), std::make_tuple(16, 4, 16));
  EXPECT_EQ(dual(17, 4096, 4096, 1), std::make_tuple(32, 4, 16));
  EXPECT_EQ(dual(64, 4096, 4096, 1), std::make_tuple(64, 4, 16));
  EXPECT_EQ(dual(33, 128, 1024, 2), std::make_tuple(16, 4, 4));
  EXPECT_EQ(dual(1, 8192, 8192, 1), std::make_tuple(16, 2, 64));
  EXPECT_EQ(dual(256, 2048, 4096, 1), std::make_tuple(128, 4, 16));  // the linear 256 x 4096 x 4096
  EXPECT_EQ(dual(256, 4096, 7168, 1), std::make_tuple(128, 2, 56));  // fewer splits than 2 CTAs per SM
  EXPECT_EQ(dual(128, 4096, 4096, 4), std::make_tuple(128, 1, 64));  // enough tiles: no split
  EXPECT_EQ(dual(4096, 4096, 4096, 1), std::make_tuple(128, 1, 64));
  // tiny K: at least 4 K tiles per split
  EXPECT_EQ(dual(1, 64, 64, 1), std::make_tuple(16, 1, 1));
  EXPECT_EQ(dual(1, 64, 256, 1), std::make_tuple(16, 1, 4));
  // no tokens: no tiles, no split
  EXPECT_EQ(std::get<1>(dual(0, 4096, 4096, 1)), 1);
}

TEST(DualHeuristics, EveryChoiceCoversKOnce) {
  for (int64_t M : {1, 7, 16, 33, 100, 256, 1000, 5000})
    for (int64_t N : {64, 1536, 4096, 14336})
      for (int64_t K : {64, 256, 4096, 14336})
        for (int64_t L : {1, 3}) {
          const auto c = dual_config(M, N, K, L, kH100Sms);
          const int64_t kTiles = K / 64;
          ASSERT_TRUE(c.tile_n == 16 || c.tile_n == 32 || c.tile_n == 64 || c.tile_n == 128);
          ASSERT_TRUE(c.tile_n == 16 || c.tile_n / 2 < M) << M;
          ASSERT_GE(int64_t(c.splits) * c.kt_per_split, kTiles);     // every K tile in a split
          ASSERT_LT(int64_t(c.splits - 1) * c.kt_per_split, kTiles);  // no empty split
          ASSERT_TRUE(c.splits == 1 || c.kt_per_split >= 4);
        }
}

TEST(DualHeuristics, RasterOrderIsABijection) {
  using lowbit::cuda::gemm::dual_tile_coords;
  for (int group : {0, 1, 8, 32})
    for (int64_t gx : {1, 5, 32, 33, 64, 100, 224})
      for (int64_t gy : {1, 3, 32}) {
        std::vector<int> seen(size_t(gx * gy), 0);
        for (int64_t by = 0; by < gy; ++by)
          for (int64_t bx = 0; bx < gx; ++bx) {
            const auto t = dual_tile_coords(bx, by, gx, gy, group);
            ASSERT_TRUE(t.x >= 0 && t.x < gx && t.y >= 0 && t.y < gy) << gx << " " << gy << " " << group;
            ++seen[size_t(t.y * gx + t.x)];
            if (group <= 0 || gx <= group) ASSERT_TRUE(t.x == bx && t.y == by);  // the plain order
          }
        for (int v : seen) ASSERT_EQ(v, 1);
      }
  // 224 blocks, groups of 32: the first 32 x gy CTAs in launch order are the first 32 blocks
  const auto a = dual_tile_coords(31, 0, 224, 4, 32), b = dual_tile_coords(32, 0, 224, 4, 32);
  EXPECT_EQ(std::make_tuple(a.x, a.y, b.x, b.y), std::make_tuple(int64_t(31), int64_t(0), int64_t(0), int64_t(1)));
  const auto last = dual_tile_coords(223, 3, 224, 4, 32);
  EXPECT_EQ(std::make_tuple(last.x, last.y), std::make_tuple(int64_t(223), int64_t(3)));
}

TEST(DualHeuristics, TuningConfigIsMadeValid) {
  using lowbit::cuda::gemm::dual_config_for;
  const auto a = dual_config_for(100, 0, 4096);  // tile rounded up, splits at least 1
  EXPECT_EQ(std::make_tuple(a.tile_n, a.splits, a.kt_per_split), std::make_tuple(128, 1, 64));
  const auto b = dual_config_for(16, 28, 4096);  // 64 K tiles in 28 splits: 3 per split, 22 splits
  EXPECT_EQ(std::make_tuple(b.tile_n, b.splits, b.kt_per_split), std::make_tuple(16, 22, 3));
  const auto c = dual_config_for(32, 1000, 128);  // more splits than K tiles
  EXPECT_EQ(std::make_tuple(c.tile_n, c.splits, c.kt_per_split), std::make_tuple(32, 2, 1));
}

TEST(GroupHeuristics, DenseMidRows) {
  using lowbit::cuda::moe::dense_group_splits;
  using lowbit::cuda::moe::dense_mid_rows;
  EXPECT_FALSE(dense_mid_rows(64, 4096));  // decode sizes: pick_tile / group_split
  EXPECT_TRUE(dense_mid_rows(65, 4096));
  EXPECT_TRUE(dense_mid_rows(4095, 4096));
  EXPECT_FALSE(dense_mid_rows(4096, 4096));  // prefill: 128-token tiles
  EXPECT_TRUE(dense_mid_rows(383, 14336));
  EXPECT_FALSE(dense_mid_rows(384, 14336));  // long K: 128-token tiles from 384 rows on
  // the measured choices (bench/dev/gemm_config_sweep.cu): fewer splits than group_split's
  EXPECT_EQ(dense_group_splits(128, 4096, 4096, kH100Sms), 4);
  EXPECT_EQ(dense_group_splits(256, 4096, 4096, kH100Sms), 2);
  EXPECT_EQ(dense_group_splits(512, 4096, 4096, kH100Sms), 1);
  EXPECT_EQ(dense_group_splits(128, 4096, 14336, kH100Sms), 4);
  EXPECT_EQ(dense_group_splits(1000, 28672, 4096, kH100Sms), 1);
  for (int64_t M : {65, 100, 300, 1000, 4000})
    for (int64_t K : {32, 128, 4096, 8192})
      for (int sms : {1, 2, 132}) {
        const int s = dense_group_splits(M, 4096, K, sms);
        ASSERT_GE(s, 1);
        ASSERT_LE(s, (K + 127) / 128);  // never more splits than K tiles
      }
}

TEST(DualHeuristics, Stages) {
  EXPECT_EQ(dual_stages(16), 8);
  EXPECT_EQ(dual_stages(32), 6);
  EXPECT_EQ(dual_stages(64), 5);
  EXPECT_EQ(dual_stages(128), 4);
}

TEST(DecodeHeuristics, KBuffersWithoutLosingOccupancy) {
  using lowbit::heuristics::decode::ctas_per_sm;
  using lowbit::heuristics::decode::pick_k_stages;
  // the split kernel's bytes at D = 128, 4 query heads scored (Smem<128, res>::bytes in
  // nf4_decode_tile.cuh): one K buffer (codes 10240 + residuals 20480) and two V buffers
  const size_t extras = 2048 + 1024 + 4096 + 4096 + 3520;
  const size_t k = 10240 + 20480, v16 = 2 * 32768, v8 = 2 * 16384;
  EXPECT_EQ(ctas_per_sm(k + v16 + extras), 2);
  EXPECT_EQ(ctas_per_sm(2 * k + v16 + extras), 1);
  EXPECT_EQ(pick_k_stages(k + v16 + extras, 2 * k + v16 + extras), 1);  // bf16 V: two CTAs per SM kept
  EXPECT_EQ(pick_k_stages(k + v8 + extras, 2 * k + v8 + extras), 2);    // FP8 V: two K buffers, still two CTAs
  EXPECT_EQ(pick_k_stages(10240 + v16 + extras, 20480 + v16 + extras), 2);  // no residual
  // already one CTA per SM (8 query heads scored): a second K buffer costs nothing
  const size_t e8 = 4096 + 1024 + 8192 + 4096 + 3520;
  EXPECT_EQ(ctas_per_sm(k + v16 + e8), 1);
  EXPECT_EQ(pick_k_stages(k + v16 + e8, 2 * k + v16 + e8), 2);
  // forced counts (development A/B) when they fit, else the rule; nothing fits: 0
  EXPECT_EQ(pick_k_stages(k + v16 + extras, 2 * k + v16 + extras, 2), 2);
  EXPECT_EQ(pick_k_stages(k + v8 + extras, 2 * k + v8 + extras, 1), 1);
  EXPECT_EQ(pick_k_stages(200 * 1024, 240 * 1024, 2), 1);
  EXPECT_EQ(pick_k_stages(230 * 1024, 240 * 1024), 0);
  EXPECT_EQ(ctas_per_sm(227 * 1024), 1);
  EXPECT_EQ(ctas_per_sm(227 * 1024 + 1), 0);
}

}  // namespace
