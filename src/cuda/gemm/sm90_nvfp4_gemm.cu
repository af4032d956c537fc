// src/cuda/gemm/sm90_nvfp4_gemm.cu: the dense NVFP4 linear (nvfp4_gemm) on the NVFP4 dual GEMM's
// mainloop (exact: E2M1 x E4M3 weights decoded to bf16 in registers, bf16 wgmma, fp32
// accumulation), with its own prepack, activation pass and epilogue (single_epilogue.cuh).
#include <cuda_runtime.h>

#include "cuda/common/workspace.cuh"
#include "cuda/gemm/dual_launch.cuh"
#include "cuda/gemm/single_epilogue.cuh"

namespace lowbit::cuda {

int nvfp4_gemm(const Nvfp4GemmPlan& q, void* stream) {
  if (q.M == 0 || q.N == 0) return cudaSuccess;
  if (q.N % 128 != 0 || q.K % kTileK != 0) return cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  // the mainloop's view: N / 2 "features" of two 64-row blocks each, one batch
  DualGemmPlan p;
  p.M = q.M;
  p.N = q.N / 2;
  p.K = q.K;
  p.L = 1;
  const DualConfig cfg = choose_dual_config(p.M, p.N, p.K, p.L, sms);
  const int64_t kTiles = q.K / kTileK, chunks = (q.N / kRowsPerWG) * kTiles;
  uint8_t* own = nullptr;  // the per-call prepack (weights not prepacked by nvfp4_gemm_prepack)
  const uint8_t* packed = q.b;
  const uint16_t* act = nullptr;  // the activations the mainloop reads
  uint16_t* own_act = nullptr;    // the activation pass's output, when one runs
  float* ws = nullptr;
  cudaError_t e = cudaSuccess;
  if (!q.b_packed) {
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&own), size_t(chunks * kChunkBytes), pool, st);
    if (e == cudaSuccess) {
      single_prepack_kernel<<<unsigned(chunks), 128, 0, st>>>(q, own);
      e = cudaGetLastError();
    }
    packed = own;
  }
  // the mainloop reads bf16 rows of K elements, 16-byte aligned: contiguous bf16 activations as
  // they are, anything else (NVFP4 codes, strided rows) through the activation pass
  const bool direct = q.a_bf16 && q.a_sM == q.K && reinterpret_cast<uintptr_t>(q.a) % 16 == 0;
  if (direct) {
    act = static_cast<const uint16_t*>(q.a);
  } else {
    if (e == cudaSuccess) e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&own_act), size_t(q.M * q.K * 2), pool, st);
    if (e == cudaSuccess) {
      const int64_t blocks = q.M * (q.K / 16);
      const unsigned grid = unsigned(blocks / 256 + 1 < 4 * int64_t(sms) * 8 ? blocks / 256 + 1 : 4 * int64_t(sms) * 8);
      single_act_kernel<<<grid, 256, 0, st>>>(q, own_act);
      e = cudaGetLastError();
    }
    act = own_act;
  }
  if (e == cudaSuccess && cfg.splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ws), size_t(cfg.splits) * q.M * q.N * sizeof(float), pool, st);
  if (e == cudaSuccess) {
    const SingleArgs a{make_dual_params(p, packed, act, ws, cfg), q};
    switch (cfg.tile_n) {
      case 16: e = launch_main<16, dual_stages(16)>(a, dev, st); break;
      case 32: e = launch_main<32, dual_stages(32)>(a, dev, st); break;
      case 64: e = launch_main<64, dual_stages(64)>(a, dev, st); break;
      default: e = launch_main<128, dual_stages(128)>(a, dev, st); break;
    }
  }
  if (e == cudaSuccess && cfg.splits > 1) {
    const int64_t n = q.M * q.N;
    single_finalize_kernel<<<unsigned(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535), 256, 0, st>>>(q, ws, cfg.splits);
    e = cudaGetLastError();
  }
  if (ws) cudaFreeAsync(ws, st);
  if (own_act) cudaFreeAsync(own_act, st);
  if (own) cudaFreeAsync(own, st);
  return int(e);
}

int nvfp4_gemm_prepack(const Nvfp4GemmPlan& q, uint8_t* out, void* stream) {
  if (q.N % 128 != 0 || q.K % kTileK != 0) return cudaErrorInvalidValue;
  const int64_t chunks = (q.N / kRowsPerWG) * (q.K / kTileK);
  if (chunks == 0) return cudaSuccess;
  single_prepack_kernel<<<unsigned(chunks), 128, 0, static_cast<cudaStream_t>(stream)>>>(q, out);
  return int(cudaGetLastError());
}

}  // namespace lowbit::cuda
