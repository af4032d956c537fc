// src/cuda/moe/group_run.cuh: runs one grouped GEMM: the choice of kernel and split-K
// (cuda/moe/heuristics.hpp), the warp-specialized kernel's launch and the split-K finalize.
#pragma once

#include <atomic>

#include "cuda/common/workspace.cuh"
#include "cuda/moe/group_launch.cuh"
#include "cuda/moe/group_mainloop_ws.cuh"
#include "cuda/moe/group_prepass.cuh"

namespace lowbit::cuda {
namespace {

/// Split-K: sums the partials in split order and runs the epilogue (rows of m_indptr[G].. skipped).
__global__ void group_finalize_kernel(GroupArgs A) {
  griddep_wait();
  const int64_t M = A.bound(A.G);
  const int64_t n16 = (A.N + 15) / 16;
  const int64_t items = M * n16 * 8;  // (m, 16-row block, row pair r / r + 8)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / (n16 * 8), R = (i % (n16 * 8)) / 8 * 16 + (i & 7);
    if (R >= A.N) continue;
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < A.splits; ++s) {
      const float* w = A.ws + (int64_t(s) * A.M + m) * A.N;
      v0 += w[R];
      if (R + 8 < A.N) v1 += w[R + 8];
    }
    const int64_t grp = A.group_of(m);
    store_pair(A, grp, m + A.o_offset(grp), R, v0, v1);
  }
}

/// The warp-specialized kernel (packed weights, kTileK = 256) with the primitive policy Prims;
/// max_tiles: grid.y (kItems: fewer CTAs than work items, each looping over its items).
template <int kTileN, int kStages, int kBatches, class Prims = DefaultPrims, bool kItems = false>
cudaError_t launch_group_ws(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  constexpr int kStageBytes = (kTileN * 256 * 2 + StageShape<256>::kWBytes + kRows * 8 + 1023) / 1024 * 1024;
  constexpr int smem = kStages * kStageBytes + 1024;
  CUtensorMap tw, ta;
  const int64_t Np = mxfp4_packed_rows(a.N);
  if (cudaError_t e = make_tmap_2d(&tw, a.b, CU_TENSOR_MAP_DATA_TYPE_UINT8, uint64_t(a.b_sN), uint64_t(a.G * Np),
                                   uint64_t(a.b_sN), 128, kRows);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = make_tmap_2d(&ta, a.act, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint64_t(a.Kp), uint64_t(a.M),
                                   uint64_t(a.Kp * 2), 64, kTileN);
      e != cudaSuccess)
    return e;
  auto kern = group_gemm_ws_kernel<kTileN, kStages, kBatches, kItems, Prims>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  dim3 grid(unsigned((a.N + kRows - 1) / kRows), unsigned(max_tiles), unsigned(a.splits));
  return launch_pdl(kern, grid, dim3(288), size_t(smem), st, tw, ta, a);
}
/// The packed weights and the activation rows can be read by TMA (moe::ws_eligible).
bool ws_eligible(const GroupArgs& a) {
  return moe::ws_eligible(a.packed, a.NT, a.KT, uint64_t(reinterpret_cast<uintptr_t>(a.b)), a.b_sG, a.b_sN, a.N, a.G,
                          a.M, uint64_t(reinterpret_cast<uintptr_t>(a.act)));
}

/// Tokens per CTA and the K tile that goes with it (moe::pick_tile).
void pick_tile(int64_t rows_bound, int64_t G, int* NT, int* KT) {
  const moe::GroupTile t = moe::pick_tile(rows_bound, G);
  *NT = t.tile_n;
  *KT = t.tile_k;
}

/// Runs the grouped GEMM of `a` (act already in place, a.NT / a.KT from pick_tile; rows_bound: an
/// upper bound of the compact rows, a.M): split-K, the grid (moe::group_grid_y) and the finalize.
/// Prims: the warp-specialized kernel's primitive policy (the library runs the default;
/// bench/dev/gemm_prims_ab.cu runs both).
template <class Prims = DefaultPrims>
cudaError_t run_group(GroupArgs a, int64_t rows_bound, cudaMemPool_t pool, cudaStream_t st) {
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  const int NT = a.NT;
  // split K when the tiles do not fill the GPU (moe::call_split)
  moe::GroupSplit sp =
      moe::call_split(rows_bound, a.G, a.N, a.K, {a.NT, a.KT}, !a.cap_grid && !a.group_rows_only, sms);
  if (const int want = group_splits_for_tuning(); want > 0) sp = moe::group_split_for(sp.max_tiles, a.K, a.KT, want);
  const int splits = sp.splits;
  a.splits = splits;
  a.kt_per_split = sp.kt_per_split;
  a.max_tiles = sp.max_tiles;
  // grid.y: every work item, or (masked layout) a few waves of CTAs that loop over them (the item
  // loop is built for the tiles of at most 32 tokens: moe::pick_layout_tile)
  const int64_t max_tiles =
      moe::group_grid_y(sp.max_tiles, (a.N + kRows - 1) / kRows, splits, sms, a.cap_grid && NT <= 32);
  if (max_tiles <= 0 || a.M == 0) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  if (splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a.ws), size_t(splits) * a.M * a.N * sizeof(float), pool, st);
  const bool items = max_tiles < a.max_tiles;  // a capped grid: CTAs loop over their work items
  if (e == cudaSuccess) {
    if (items) {  // the masked layout's tiles have at most 32 tokens (moe::pick_layout_tile)
      constexpr int kB = moe::kGroupWsBatches;
      if (ws_eligible(a))
        e = NT == 16 ? launch_group_ws<16, moe::group_ws_stages(16), kB, Prims, true>(a, max_tiles, dev, st)
                     : launch_group_ws<32, moe::group_ws_stages(32), kB, Prims, true>(a, max_tiles, dev, st);
      else
        e = NT == 16 ? launch_group<16, moe::group_stages(16), moe::pick_tile(16, 1).tile_k, true>(a, max_tiles, dev, st)
                     : launch_group<32, moe::group_stages(32), moe::pick_tile(32, 1).tile_k, true>(a, max_tiles, dev, st);
    } else if (ws_eligible(a)) {
      e = NT == 16 ? launch_group_ws<16, moe::group_ws_stages(16), moe::kGroupWsBatches, Prims>(a, max_tiles, dev, st)
                   : launch_group_ws<32, moe::group_ws_stages(32), moe::kGroupWsBatches, Prims>(a, max_tiles, dev, st);
    } else
    switch (NT) {
      case 16: e = launch_group<16, moe::group_stages(16), moe::pick_tile(16, 1).tile_k>(a, max_tiles, dev, st); break;
      case 32: e = launch_group<32, moe::group_stages(32), moe::pick_tile(32, 1).tile_k>(a, max_tiles, dev, st); break;
      case 64: e = launch_group<64, moe::group_stages(64), moe::pick_tile(64, 1).tile_k>(a, max_tiles, dev, st); break;
      default: e = launch_group_t128(a, max_tiles, dev, st); break;
    }
  }
  if (e == cudaSuccess && splits > 1) {
    a.pdl = false;
    e = launch_pdl(group_finalize_kernel, dim3(unsigned(moe::group_finalize_blocks(a.M, a.N, sms))), dim3(256), 0, st, a);
  }
  if (a.ws) cudaFreeAsync(a.ws, st);
  return e;
}

}  // namespace
}  // namespace lowbit::cuda
