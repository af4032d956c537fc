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

}  // namespace
}  // namespace lowbit::cuda
