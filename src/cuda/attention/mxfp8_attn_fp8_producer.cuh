// src/cuda/attention/mxfp8_attn_fp8_producer.cuh: the producer warpgroup of the FP8 tensor-core
// path (precision kFp8). The operands come converted from the pre-pass (mxfp8_attn_fp8_prep.cuh):
// once per CTA the (sequence, KV head)'s per-block references Ak[b] and Av[b] into shared memory;
// per key tile one thread issues the TMA loads of
//   K'[j, c]   = e4m3(k code * 2^(k_scale[j, b] - Ak[b]))                 (swizzled boxes of kWQK bytes)
//   V'^T[c, k] = e4m3(v code[key(k), c] * 2^(v_scale[key(k), b] - Av[b]))  (one box of kWV bytes x kD rows)
// into their 2-stage rings, which are the consumers' wgmma operands as they land.
#pragma once

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/mxfp8_attn_fp8_prep.cuh"
#include "cuda/attention/mxfp8_attn_fp8_traits.cuh"
#include "cuda/attention/mxfp8_attn_producer.cuh"  // AttnSmem
#include "cuda/attention/mxfp8_attn_schedule.cuh"

namespace lowbit::cuda::attention::fp8 {

/// misc[0 .. 8): Ak[b], misc[8 .. 16): Av[b].
constexpr int kMiscAk = 0, kMiscAv = 8;

/// The (sequence, KV head)'s Ak[b] and Av[b] from the pre-pass into shared memory. Run by the
/// producer warpgroup; visible to all after the next CTA barrier.
template <class T>
__device__ void load_block_refs(const AttnParams& p, const SeqBounds&, int b, int hk, const AttnSmem<T>& sm) {
  const int tid = threadIdx.x % 128;
  const int heads_kv = int(gridDim.y) / p.heads_per_kv;
  if (tid < 16) sm.misc()[tid] = prep_ref(p.kv_ref[(int64_t(b) * heads_kv + hk) * 16 + tid]);
}

/// The producer's work for one row block: n_tiles key tiles; g counts the tiles of earlier row
/// blocks (the ring positions continue across row blocks). One thread works; K'(t) is issued as
/// soon as its stage is free, V'^T(t) after it.
template <class T>
__device__ void produce_row_block(const AttnParams& p, const SeqBounds& s, int b, int hk, int n_tiles, uint32_t g,
                                  const AttnSmem<T>& sm) {
  if (threadIdx.x % 128 != 0) return;
  const int64_t k_abs = p.varlen ? int64_t(s.k_start) : int64_t(b) * p.seqlen_k;
  const int row0 = int(prep_token_offset(k_abs, b, T::kBlockN));
  constexpr uint64_t kHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  for (int t = 0; t < n_tiles; ++t) {
    const uint32_t gt = g + t;
    const int st = gt % T::kStages;
    const uint32_t ph = (gt / T::kStages) & 1;
    const int row = row0 + t * T::kBlockN;
    cutlass::arch::ClusterBarrier::wait(sm.k_empty(st), ph ^ 1);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(sm.k_full(st), T::kKBytes);
#pragma unroll
    for (int a = 0; a < T::kD / T::kWQK; ++a)  // one box per swizzle atom of the row
      cute::SM90_TMA_LOAD_3D::copy(&p.tm_k, sm.k_full(st), kHint, sm.k(st) + a * T::kBlockN * T::kWQK, a * T::kWQK,
                                   row, hk);
    cutlass::arch::ClusterBarrier::wait(sm.v_empty(st), ph ^ 1);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(sm.v_full(st), T::kVBytes);
    cute::SM90_TMA_LOAD_3D::copy(&p.tm_v, sm.v_full(st), kHint, sm.v(st), row, 0, hk);
  }
}

}  // namespace lowbit::cuda::attention::fp8
