// src/cuda/moe/group_launch.cuh: launch code of the MXFP4 grouped GEMM's cp.async kernel
// (shared-memory opt-in, grid).
#pragma once

#include <atomic>

#include "cuda/common/workspace.cuh"
#include "cuda/moe/group_mainloop.cuh"

namespace lowbit::cuda {
namespace {

template <int kTileN, int kStages, int kTileK, bool kPackedB, bool kItems>
cudaError_t launch_group_pk(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  using SS = StageShape<kTileK>;
  constexpr int kStageBytes = (kTileN * kTileK * 2 + SS::kWBytes + SS::kSBytes + 1023) / 1024 * 1024;
  constexpr int smem = kStages * kStageBytes + 1024;
  auto kern = group_gemm_kernel<kTileN, kStages, kTileK, kPackedB, kItems>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  dim3 grid(unsigned((a.N + kRows - 1) / kRows), unsigned(max_tiles), unsigned(a.splits));
  return launch_pdl(kern, grid, dim3(256), size_t(smem), st, a);
}
/// max_tiles: grid.y (kItems: fewer CTAs than work items, each looping over its items).
template <int kTileN, int kStages, int kTileK, bool kItems = false>
cudaError_t launch_group(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  return a.packed ? launch_group_pk<kTileN, kStages, kTileK, true, kItems>(a, max_tiles, device, st)
                  : launch_group_pk<kTileN, kStages, kTileK, false, kItems>(a, max_tiles, device, st);
}

}  // namespace

/// The cp.async kernel of 128 tokens per CTA, in its own translation unit
/// (sm90_mxfp4_group_gemm_t128.cu).
cudaError_t launch_group_t128(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st);

}  // namespace lowbit::cuda
