// src/core/plan_attention.hpp: the validated description of one block-scaled FP8 (MXFP8)
// flash-attention forward call, shared by the CPU reference (src/ref/ref_attention.cpp) and the
// sm_90a kernel (src/cuda/attention/). Everything here has been checked by the API layer
// (src/api/attention.cpp): implementations trust it.
//
// Element value: q[b, i, h, c] = e4m3(q code) * 2^(q_scale[b, h, i, c / 32] - 127) (UE8M0 byte;
// 255 = NaN), likewise k and v with their own scales. Scores S[i, j] = softmax_scale *
// sum_c q[i, c] k[j, c]; out[i] = sum_j softmax(S[i, :])_j v[j]; lse[i] = log(sum_j exp(S[i, j]))
// (natural log). Causal: key j is visible to query i when j <= i + (s_k - s_q) (bottom-right
// aligned, FlashAttention's convention); a row that sees no key gets out = 0 and lse = -inf.
// GQA / MQA: query head h reads KV head h / (heads / heads_kv).
#pragma once

#include <cstdint>

namespace lowbit::detail {

struct AttnMxfp8Plan {
  int64_t batch = 0;      ///< fixed length: batch size; varlen: number of sequences
  int64_t seqlen_q = 0;   ///< fixed length: s_q; varlen: max_seqlen_q (an upper bound)
  int64_t seqlen_k = 0;   ///< fixed length: s_k; varlen: max_seqlen_k (an upper bound)
  int64_t heads = 0;      ///< query heads h
  int64_t heads_kv = 0;   ///< KV heads h_kv (heads % heads_kv == 0)
  int64_t head_dim = 0;   ///< d in {64, 128, 256}
  bool causal = false;
  float softmax_scale = 0.f;  ///< already resolved (default 1/sqrt(d))
  /// AttnPrecision::kFp8: the FP8 tensor-core path (CUDA) / its arithmetic model (CPU,
  /// ref::flash_attn_mxfp8_fp8); otherwise the exact path and the fp64 reference.
  bool fp8 = false;

  /// Varlen: sequence b of the packed batch holds rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q
  /// (and out, lse, q_scale), cu_seqlens_k likewise for k, v and their scales. int32, batch + 1
  /// entries, non-decreasing, starting at 0; the pointers live where the tensors live.
  bool varlen = false;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0;  ///< varlen: rows of q (= cu_seqlens_q[batch])
  int64_t total_k = 0;  ///< varlen: rows of k / v

  // Element strides (last dimension contiguous, stride 1). Fixed length: q [b, s, h, d] ->
  // {batch, seq, head}. Varlen: q [total, h, d] -> batch stride 0, {0, row, head}.
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  int64_t o_stride[3] = {0, 0, 0};
  // Scale strides in bytes (last dimension d/32 contiguous). Fixed length: [b, h, s, d/32] ->
  // {batch, head, seq}. Varlen: [h, total, d/32] -> {0, head, row}.
  int64_t qs_stride[3] = {0, 0, 0};
  int64_t ks_stride[3] = {0, 0, 0};
  int64_t vs_stride[3] = {0, 0, 0};
  // lse element strides. Fixed length: [b, h, s_q] -> {batch, head, seq}; varlen: [h, total_q]
  // -> {0, head, row}.
  int64_t lse_stride[3] = {0, 0, 0};
};

/// The operands of one call (device pointers for the kernel, host pointers for the reference).
struct AttnMxfp8Ptrs {
  const uint8_t* q = nullptr;  ///< e4m3 codes
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  const uint8_t* q_scale = nullptr;  ///< UE8M0 bytes
  const uint8_t* k_scale = nullptr;
  const uint8_t* v_scale = nullptr;
  uint16_t* out = nullptr;  ///< bf16 bits
  float* lse = nullptr;
};

}  // namespace lowbit::detail
