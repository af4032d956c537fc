// src/cuda/attention/mxfp8_attn_schedule.cuh: which rows and key tiles a CTA works on. Grid:
// (row blocks, query heads, batch). A CTA takes row blocks f, f + gridDim.x, ... of its sequence
// (f = blockIdx.x, or gridDim.x - 1 - blockIdx.x for causal calls: heavy blocks first), so a
// varlen sequence longer than max_seqlen_q is still computed in full.
#pragma once

#include "cuda/attention/mxfp8_attn_params.cuh"

namespace lowbit::cuda::attention {

struct SeqBounds {
  int q_start = 0, len_q = 0;  ///< rows of q / out / lse (varlen: offset in the packed tensors)
  int k_start = 0, len_k = 0;
};

__device__ __forceinline__ SeqBounds seq_bounds(const AttnParams& p, int b) {
  SeqBounds s;
  if (p.varlen) {
    s.q_start = p.cu_seqlens_q[b];
    s.len_q = p.cu_seqlens_q[b + 1] - s.q_start;
    s.k_start = p.cu_seqlens_k[b];
    s.len_k = p.cu_seqlens_k[b + 1] - s.k_start;
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
  }
  return s;
}

/// Key tiles of kBlockN keys that row block m0 .. m0 + kBlockM - 1 reads (0 when no row sees a key).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int key_tiles(const AttnParams& p, const SeqBounds& s, int m0) {
  int kmax = s.len_k;
  if (p.causal) kmax = min(kmax, min(m0 + kBlockM, s.len_q) + s.len_k - s.len_q);  // last row's keys
  return kmax <= 0 ? 0 : (kmax + kBlockN - 1) / kBlockN;
}

}  // namespace lowbit::cuda::attention
