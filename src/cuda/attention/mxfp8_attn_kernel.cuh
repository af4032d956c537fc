// src/cuda/attention/mxfp8_attn_kernel.cuh: the kernel body and the host launch shared by both
// paths of the MXFP8 attention forward (exact: sm90_mxfp8_attention.cu, FP8 tensor cores:
// sm90_mxfp8_attention_fp8.cu). A path supplies its traits (tiles, registers, shared-memory map)
// and its three warpgroup roles: the head's scale scan, the producer and the consumer of a row block.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <atomic>
#include <cstdint>

#include "cuda/attention/mxfp8_attn_host.hpp"
#include "cuda/attention/mxfp8_attn_producer.cuh"  // AttnSmem
#include "cuda/attention/mxfp8_attn_schedule.cuh"
#include "cuda/common/launch_utils.cuh"

// Dev builds only: 0 = causal row blocks in grid order (A/B of the default, 1).
#ifndef LOWBIT_ATTN_HEAVY_FIRST
#define LOWBIT_ATTN_HEAVY_FIRST 1
#endif

namespace lowbit::cuda::attention {

constexpr bool kCausalHeavyFirst = LOWBIT_ATTN_HEAVY_FIRST != 0;

/// The whole kernel of one path: one producer warpgroup (kScan, then kProduce per row block) and
/// two consumer warpgroups (kConsume per row block). Grid: (row blocks, query heads, batch).
template <class T, auto kScan, auto kProduce, auto kConsume>
__device__ __forceinline__ void attn_fwd_kernel_body(const AttnParams& p) {
  extern __shared__ uint8_t smem_dyn[];
  // Aligned to 1024 bytes (swizzle atoms) by an offset from smem_dyn, so that the compiler still
  // knows every derived pointer is shared memory (LDS / STS rather than generic LD / ST).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)) & 1023u;
  uint8_t* base = smem_dyn + ((1024u - misalign) & 1023u);
  const AttnSmem<T> sm(base);
  const int b = blockIdx.z, h = blockIdx.y, hk = h / p.heads_per_kv;
  const SeqBounds s = seq_bounds(p, b);
  const int n_blocks = (s.len_q + T::kBlockM - 1) / T::kBlockM;
  // Causal: a head's heaviest row blocks (the most key tiles) first, so that the light ones fill the tail.
  const int first = (kCausalHeavyFirst && p.causal) ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  if (first >= n_blocks) return;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int st = 0; st < T::kStages; ++st) {
      cutlass::arch::ClusterTransactionBarrier::init(sm.raw_full(st), 1);
      cutlass::arch::ClusterBarrier::init(sm.k_full(st), T::kFullArrivals);
      cutlass::arch::ClusterBarrier::init(sm.k_empty(st), 8);
      cutlass::arch::ClusterBarrier::init(sm.v_full(st), T::kFullArrivals);
      cutlass::arch::ClusterBarrier::init(sm.v_empty(st), 8);
    }
    cutlass::arch::fence_barrier_init();
  }
  if (wg == 0) kScan(p, s, b, hk, sm);
  __syncthreads();

  uint32_t g = 0;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    for (int mb = first; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      kProduce(p, s, b, hk, n_tiles, g, sm);
      g += n_tiles;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
    for (int mb = first; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      kConsume(p, s, b, h, mb * T::kBlockM, n_tiles, g, wg - 1, sm);
      g += n_tiles;
    }
  }
}

/// Launches kKernel (traits T) on stream st; its K / V tensor maps read boxes of box_d bytes with
/// `swizzle`. The kernel is opted into its shared memory once per device.
template <class T, auto kKernel>
cudaError_t launch_attn_fwd(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, int box_d,
                            CUtensorMapSwizzle swizzle, cudaStream_t st) {
  AttnParams p;
  if (cudaError_t e = make_attn_params(pl, ptr, box_d, T::kBlockN, swizzle, &p)) return e;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kKernel, T::kSmemBytes, device, opted)) return e;
  const int64_t row_blocks = (pl.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const dim3 grid(unsigned(row_blocks), unsigned(pl.heads), unsigned(pl.batch));
  kKernel<<<grid, T::kThreads, T::kSmemBytes, st>>>(p);
  return cudaGetLastError();
}

using AttnLaunchFn = cudaError_t (*)(const detail::AttnMxfp8Plan&, const detail::AttnMxfp8Ptrs&, cudaStream_t);

/// The entry of both paths: an empty problem succeeds, grids past the launch limits are refused,
/// then one instantiation per head dimension (64, 128, 256).
inline int run_attn_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream,
                        AttnLaunchFn d64, AttnLaunchFn d128, AttnLaunchFn d256) {
  if (plan.batch == 0 || plan.seqlen_q == 0 || plan.heads == 0) return cudaSuccess;
  if (plan.batch > 65535 || plan.heads > 65535 || (plan.seqlen_q + 127) / 128 > 0x7FFFFFFF)
    return cudaErrorInvalidConfiguration;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (plan.head_dim) {
    case 64: return d64(plan, ptrs, st);
    case 128: return d128(plan, ptrs, st);
    case 256: return d256(plan, ptrs, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace lowbit::cuda::attention
