// src/cuda/gemm/sm90_nvfp4_dual_gemm.cu: NVFP4 dual GEMM with fused SiLU on sm_90a.
//
//   C[m, n] = silu(sum_k A[m,k] B1[n,k]) * (sum_k A[m,k] B2[n,k])      (per batch l)
//
// Hopper has no FP4 or block-scaled MMA, and E2M1 x E4M3 products are not exact in E4M3, so the
// exact path is bf16 wgmma (every NVFP4 value e2m1 * e4m3 has <= 6 significant bits and lies in
// [2^-10, 2688]: exact in bf16; bf16 x bf16 products are exact in fp32; only the fp32
// accumulation rounds).
//
// Design ("swap AB", weights in registers):
//  * The 2N weight rows are the wgmma M side (64 rows per warpgroup), tokens are wgmma N (16..128).
//    Gate and up rows are interleaved in groups of 8, so the accumulator rows r and r+8 a thread
//    owns are gate and up of one feature: SiLU * up happens in registers.
//  * Weights are prepacked once (nvfp4_dual_gemm_prepack): per 64-row block and 64-wide K tile,
//    each thread's wgmma A fragments (4 k16 steps x 8 FP4 codes) are 16 contiguous bytes, with the
//    nibbles ordered so that one shift + two masks give a bf16x2 of e2m1 * 2^-126; the 64 rows x 4
//    E4M3 block scales follow. One multiply by bf16(scale * 2^64) per bf16x2 gives the exact value
//    times 2^-62, undone in the epilogue (all powers of two: exact).
//  * Activations (NVFP4) are dequantized exactly to bf16 by a pre-pass and read by wgmma from
//    128B-swizzled shared memory (K-major B operand).
//  * A multi-stage cp.async pipeline feeds shared memory; split-K with a deterministic reduction
//    fills the GPU when M is small.
//
// Files (src/cuda/gemm/): launch_gemm.hpp (the launchers' declarations), heuristics.hpp (tile,
// stages, split-K: host-only), dual_params.cuh (MainArgs, constants, make_dual_params),
// dual_prepack.cuh (weight prepack, activation pre-pass), dual_mainloop.cuh, dual_epilogue.cuh
// (SiLU * up, split-K finalize), dual_launch.cuh. This file holds the entry points and instantiates
// every kernel.
#include <cuda_runtime.h>

#include "cuda/common/workspace.cuh"
#include "cuda/gemm/dual_launch.cuh"
#include "cuda/gemm/dual_prepack.cuh"

namespace lowbit::cuda {

namespace {
thread_local bool g_tuning = false;
thread_local gemm::DualConfig g_tuning_cfg;
}  // namespace

void set_dual_config_for_tuning(const gemm::DualConfig* cfg) {
  g_tuning = cfg != nullptr;
  if (cfg) g_tuning_cfg = *cfg;
}

gemm::DualConfig choose_dual_config(int64_t M, int64_t N, int64_t K, int64_t L, int sms) {
  if (g_tuning) return gemm::dual_config_for(g_tuning_cfg.tile_n, g_tuning_cfg.splits, K, g_tuning_cfg.raster_group);
  return gemm::dual_config(M, N, K, L, sms);
}

int nvfp4_dual_gemm_prepack(const DualGemmPlan& p, uint8_t* packed, void* stream) {
  const int64_t chunks = p.L * (2 * p.N / kRowsPerWG) * (p.K / kTileK);
  prepack_kernel<<<unsigned(chunks), 128, 0, static_cast<cudaStream_t>(stream)>>>(p, packed);
  return int(cudaGetLastError());
}

int nvfp4_dual_gemm(const DualGemmPlan& p, const uint8_t* packed, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  cudaError_t e = cudaSuccess;
  uint8_t* own_packed = nullptr;
  uint16_t* act = nullptr;
  float* ws = nullptr;
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);

  // tokens per CTA and split-K (gemm::dual_config)
  const DualConfig cfg = choose_dual_config(p.M, p.N, p.K, p.L, sms);
  const int NT = cfg.tile_n;
  const int splits = cfg.splits;

  if (!packed) {
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&own_packed), size_t(lowbit::nvfp4_dual_gemm_packed_bytes(p.N, p.K, p.L)), pool, st);
    if (e == cudaSuccess) e = cudaError_t(nvfp4_dual_gemm_prepack(p, own_packed, stream));
    packed = own_packed;
  }
  if (e == cudaSuccess) e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&act), size_t(p.L * p.M * p.K * 2), pool, st);
  if (e == cudaSuccess) {
    const int64_t blocks = p.L * p.M * (p.K / 16);
    const unsigned grid = unsigned(blocks / 256 + 1 < 4 * int64_t(sms) * 8 ? blocks / 256 + 1 : 4 * int64_t(sms) * 8);
    dequant_act_kernel<<<grid, 256, 0, st>>>(p, act);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ws), size_t(splits) * p.L * p.M * p.N * 2 * sizeof(float), pool, st);
  if (e == cudaSuccess) {
    const MainArgs a = make_dual_params(p, packed, act, ws, cfg);
    switch (NT) {
      case 16: e = launch_main<16, dual_stages(16)>(a, dev, st); break;
      case 32: e = launch_main<32, dual_stages(32)>(a, dev, st); break;
      case 64: e = launch_main<64, dual_stages(64)>(a, dev, st); break;
      default: e = launch_main<128, dual_stages(128)>(a, dev, st); break;
    }
  }
  if (e == cudaSuccess && splits > 1) {
    const int64_t n = p.L * p.M * p.N;
    finalize_kernel<<<unsigned(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535), 256, 0, st>>>(p, ws, splits);
    e = cudaGetLastError();
  }
  if (ws) cudaFreeAsync(ws, st);
  if (act) cudaFreeAsync(act, st);
  if (own_packed) cudaFreeAsync(own_packed, st);
  return int(e);
}

}  // namespace lowbit::cuda
