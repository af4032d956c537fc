// src/cuda/gemm/dual_launch.cuh: launch code of the NVFP4 dual GEMM mainloop kernel (shared-memory
// opt-in, grid).
#pragma once

#include <atomic>

#include "cuda/gemm/dual_mainloop.cuh"

namespace lowbit::cuda {
namespace {

template <int kTileN, int kStages, class Args = MainArgs>
cudaError_t launch_main(const Args& e, int device, cudaStream_t st) {
  const MainArgs& a = main_args(e);
  constexpr int kStageBytes = kTileN * 128 + ((2 * kChunkBytes + 1023) / 1024) * 1024;
  constexpr int smem = kStages * kStageBytes + 1024;  // stages + alignment slack
  auto kern = dual_gemm_kernel<kTileN, kStages, Args>;
  // the shared-memory opt-in is a per-device function attribute: set it once per device
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  const DualGemmPlan& p = a.p;
  dim3 grid(unsigned(p.N / 64), unsigned((p.M + kTileN - 1) / kTileN), unsigned(p.L * a.splits));
  kern<<<grid, 256, smem, st>>>(e);
  return cudaGetLastError();
}

}  // namespace
}  // namespace lowbit::cuda
