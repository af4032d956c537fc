// src/cuda/attention/cache_append.cuh: what the appends to the decode caches share (the NF4 K
// cache's nf4_kcache_append in sm90_nf4_encode.cu, the FP8 V cache's fp8_vcache_append in
// sm90_fp8_vcache.cu): the work items of the tokens kernel, the device lengths' clamp, the scratch
// (the scales before the call, the flags of rescaled heads) and the two launches' order. Each
// append has its own scales kernel (a thread per (b, h, channel): the new amax, the rescale
// decision) and tokens kernel (CTAs over (b, h, chunk of [0, lengths[b] + N)): the new tokens
// encoded, the cached tokens of rescaled channels re-encoded). tests/cpp/emu compiles this header
// for the host emulation of both files (its namespace renamed like theirs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/common/device_info.cuh"
#include "cuda/common/workspace.cuh"

namespace lowbit::cuda {

/// The shared part of an append's kernel parameters.
struct CacheAppend {
  const int32_t* lengths = nullptr;  ///< device [B]
  int64_t max_len = 0;               ///< cache_T - N: the clamp of every length
  float* old_scale = nullptr;        ///< scratch [B, H, D]: the scales before the call
  int* flag = nullptr;               ///< scratch [B, H]: 1 when a channel of the head is rescaled
  int64_t chunk = 0, n_chunks = 0;   ///< tokens per work item, items per (b, h)
  detail::CachePages pages;          ///< where token t of sequence b lives (dense or paged)

  /// lengths[b] clamped to [0, max_len] (the device lengths are not trusted).
  __device__ __forceinline__ int64_t len(int64_t b) const {
    const int64_t l = lengths[b];
    return l < 0 ? 0 : (l > max_len ? max_len : l);
  }
};

/// Fills x for B sequences of H heads and D channels receiving N new tokens (host lengths: the
/// validated copy, which sizes the grid; chunk tokens per item), takes the scratch from the pool,
/// runs scales(items) then tokens(items) (the caller's launches, items = B H n_chunks) and frees
/// the scratch on the stream.
template <typename Scales, typename Tokens>
cudaError_t run_cache_append(CacheAppend& x, int64_t B, int64_t H, int64_t D, int64_t N, int64_t cache_T,
                             const int32_t* host_lengths, const int32_t* device_lengths,
                             const detail::CachePages& pages, int64_t chunk, cudaStream_t st, Scales scales,
                             Tokens tokens) {
  x.lengths = device_lengths;
  x.max_len = cache_T - N;
  x.pages = pages;
  int64_t longest = 0;  // the grid covers the longest validated sequence (the device clamps)
  for (int64_t b = 0; b < B; ++b) longest = host_lengths[b] > longest ? host_lengths[b] : longest;
  x.chunk = chunk;
  x.n_chunks = (longest + N + chunk - 1) / chunk;
  const size_t old_bytes = size_t(B * H * D) * 4, flag_bytes = size_t(B * H) * 4;
  cudaMemPool_t pool;
  if (cudaError_t e = workspace_pool(&pool)) return e;
  void* ws = nullptr;
  if (cudaError_t e = cudaMallocFromPoolAsync(&ws, old_bytes + flag_bytes, pool, st)) return e;
  x.old_scale = static_cast<float*>(ws);
  x.flag = reinterpret_cast<int*>(static_cast<char*>(ws) + old_bytes);
  cudaError_t e = cudaMemsetAsync(x.flag, 0, flag_bytes, st);
  if (e == cudaSuccess) e = scales();
  if (e == cudaSuccess) e = tokens(B * H * x.n_chunks);
  const cudaError_t f = cudaFreeAsync(ws, st);
  return e == cudaSuccess ? f : e;
}

/// The append of a validated plan (detail::VCacheAppendPlan, detail::KCacheAppendPlan) by the
/// kernels kScales (a thread per (b, h, channel)) and kTokens (kThreads threads per work item, at
/// most 8 CTAs per SM) of parameters P; chunk_of(D): tokens per work item. An empty cache: nothing.
template <auto kScales, auto kTokens, int kThreads, typename P, typename Plan, typename ChunkOf>
cudaError_t append_to_cache(const Plan& plan, ChunkOf chunk_of, cudaStream_t st) {
  const auto& c = plan.cache;
  if (c.B == 0 || c.T == 0 || c.H == 0 || c.D == 0) return cudaSuccess;
  P a;
  a.c = c;
  return run_cache_append(
      a.x, c.B, c.H, c.D, c.T, plan.cache_T, plan.lengths, plan.lengths_device, plan.pages, chunk_of(c.D), st,
      [&] {
        kScales<<<unsigned(grid_for(kScales, kThreads, c.B * c.H * c.D)), kThreads, 0, st>>>(a);
        return cudaGetLastError();
      },
      [&](int64_t items) {
        kTokens<<<unsigned(grid_for(kTokens, kThreads, items * kThreads, 8)), kThreads, 0, st>>>(a);
        return cudaGetLastError();
      });
}

}  // namespace lowbit::cuda
