// src/cuda/moe/group_scheduler.cuh: tile scheduler of the MXFP4 grouped GEMM: each CTA finds its
// (group, token tile) from m_indptr on the device.
#pragma once

#include "cuda/moe/group_params.cuh"

namespace lowbit::cuda {
namespace {

/// Warp-wide: the (group, token tile) of work item y, from m_indptr. False: no such item.
__device__ bool find_tile(const GroupArgs& A, int NT, int64_t y, int64_t* grp, int64_t* tile) {
  const int lane = threadIdx.x & 31;
  int64_t base = 0;
  for (int64_t c = 0; c < A.G; c += 32) {
    const int64_t gi = c + lane;
    const int64_t cnt = gi < A.G ? A.bound(gi + 1) - A.bound(gi) : 0;
    const int64_t tiles = cnt > 0 ? (cnt + NT - 1) / NT : 0;
    int64_t inc = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, o);
      if (lane >= o) inc += v;
    }
    const int64_t total = __shfl_sync(0xFFFFFFFFu, inc, 31);
    if (y < base + total) {
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, y < base + inc);
      const int L = __ffs(hit) - 1;
      const int64_t excl = __shfl_sync(0xFFFFFFFFu, inc - tiles, L);
      *grp = c + L;
      *tile = y - base - excl;
      return true;
    }
    base += total;
  }
  return false;
}

/// Warp-wide (the CTA's first warp): claims the CTA's next work item and publishes it in s_work
/// (s_work[0]: its group, -1 when there is none; s_work[1]: its token tile). kItems: the items are
/// s_work[2], + gridDim.y, ... below A.max_tiles (s_work[2] moves on); otherwise blockIdx.y alone.
/// Read by the CTA after its next barrier.
template <bool kItems>
__device__ __forceinline__ void claim_tile(const GroupArgs& A, int NT, int lane, int64_t* s_work) {
  if constexpr (kItems) __syncwarp();
  const int64_t y = kItems ? s_work[2] : int64_t(blockIdx.y);
  int64_t grp = -1, tile = 0;
  if ((kItems && y >= A.max_tiles) || !find_tile(A, NT, y, &grp, &tile)) grp = -1;
  if constexpr (kItems) __syncwarp();
  if (lane == 0) {
    s_work[0] = grp;
    s_work[1] = tile;
    if constexpr (kItems) s_work[2] = y + gridDim.y;
  }
}

}  // namespace
}  // namespace lowbit::cuda
