// src/cuda/attention/mxfp8_attn_host.hpp: host side of the MXFP8 attention kernels: the TMA tensor
// maps of the K and V codes and the one function from the validated plan to AttnParams, shared by the exact path (sm90_mxfp8_attention.cu) and the FP8
// tensor-core path (sm90_mxfp8_attention_fp8.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/plan_attention.hpp"
#include "cuda/attention/mxfp8_attn_params.cuh"
#include "cuda/common/tma.cuh"

namespace lowbit::cuda::attention {

/// Rank-4 uint8 tensor map of k or v: dims (d, tokens, heads_kv, batch), box (box_d, block_n, 1, 1).
/// Varlen: one batch entry, tokens = total_k. `swizzle` as the consumer of the box needs it
/// (SWIZZLE_128B / _64B take boxes of 128 / 64 bytes per row).
inline cudaError_t make_kv_tmap(CUtensorMap* m, const void* base, const detail::AttnMxfp8Plan& pl,
                                const int64_t (&stride)[3], int box_d, int block_n, CUtensorMapSwizzle swizzle) {
  const auto enc = tma_encoder();
  if (!enc) return cudaErrorNotSupported;
  const int64_t tokens = pl.varlen ? pl.total_k : pl.seqlen_k;
  const int64_t batch = pl.varlen ? 1 : pl.batch;
  const int64_t far = ((stride[1] * tokens + stride[2] * pl.heads_kv) + 15) / 16 * 16;
  const cuuint64_t dims[4] = {cuuint64_t(pl.head_dim), cuuint64_t(tokens), cuuint64_t(pl.heads_kv), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(stride[1]), cuuint64_t(stride[2]),
                                 cuuint64_t(pl.varlen ? far : stride[0])};
  const cuuint32_t box[4] = {cuuint32_t(box_d), cuuint32_t(block_n), 1, 1}, estr[4] = {1, 1, 1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/// The one function from the validated plan to the kernel's parameters, all but the K / V tensor
/// maps (the exact path maps k and v themselves: the overload below; the FP8 path its pre-pass's
/// workspace: sm90_mxfp8_attention_fp8.cu).
inline void make_attn_params(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, AttnParams* out) {
  AttnParams& p = *out;
  p.q = ptr.q;
  p.q_scale = ptr.q_scale;
  p.k_scale = ptr.k_scale;
  p.v_scale = ptr.v_scale;
  p.out = ptr.out;
  p.lse = ptr.lse;
  p.cu_seqlens_q = pl.cu_seqlens_q;
  p.cu_seqlens_k = pl.cu_seqlens_k;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = pl.q_stride[i];
    p.o_stride[i] = pl.o_stride[i];
    p.qs_stride[i] = pl.qs_stride[i];
    p.ks_stride[i] = pl.ks_stride[i];
    p.vs_stride[i] = pl.vs_stride[i];
    p.lse_stride[i] = pl.lse_stride[i];
  }
  p.seqlen_q = int(pl.seqlen_q);
  p.seqlen_k = int(pl.seqlen_k);
  p.heads_per_kv = int(pl.heads / pl.heads_kv);
  p.causal = pl.causal ? 1 : 0;
  p.varlen = pl.varlen ? 1 : 0;
  p.scale_log2 = float(double(pl.softmax_scale) * 1.4426950408889634);
}

/// The same with tensor maps of k and v that read boxes of box_d bytes x block_n tokens with
/// `swizzle`.
inline cudaError_t make_attn_params(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, int box_d,
                                    int block_n, CUtensorMapSwizzle swizzle, AttnParams* out) {
  if (cudaError_t e = make_kv_tmap(&out->tm_k, ptr.k, pl, pl.k_stride, box_d, block_n, swizzle)) return e;
  if (cudaError_t e = make_kv_tmap(&out->tm_v, ptr.v, pl, pl.v_stride, box_d, block_n, swizzle)) return e;
  make_attn_params(pl, ptr, out);
  return cudaSuccess;
}

}  // namespace lowbit::cuda::attention
