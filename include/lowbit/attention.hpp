// lowbit/attention.hpp: attention operations (C++ API). CPU tensors run the fp64 reference in
// src/ref; CUDA tensors run the sm_90a kernels, and otherwise throw NotSupportedError (never a
// silent fallback).
#pragma once

#include <cstdint>
#include <limits>

#include "lowbit/ops.hpp"

namespace lowbit {

/// Block-scaled FP8 (MXFP8) flash-attention forward. Every element of Q, K and V is an E4M3 code
/// times the UE8M0 scale of its 32 head-dimension channels:
///
///   q[b, i, h, c] = e4m3(q code) * 2^(q_scale[b, h, i, c / 32] - 127)      (k, v likewise)
///   S[i, j]  = softmax_scale * sum_c q[i, c] k[j, c]
///   out[i]   = sum_j softmax_j(S[i, :]) v[j],   lse[i] = log(sum_j exp(S[i, j]))  (natural log)
///
/// Shapes (fixed length): q [b, s_q, h, d], k and v [b, s_k, h_kv, d] (float8_e4m3fn or uint8
/// codes, d contiguous, other strides free); q_scale [b, h, s_q, d/32], k_scale and v_scale
/// [b, h_kv, s_k, d/32] (uint8 or float8_e8m0fnu; byte 255 = NaN; last dimension contiguous);
/// out [b, s_q, h, d] bfloat16 (d contiguous); lse [b, h, s_q] float32 (contiguous).
/// d in {64, 128, 256}; h % h_kv == 0 (query head h reads KV head h / (h / h_kv)); any
/// s_q, s_k >= 1. Causal masks are aligned bottom-right (key j visible to query i when
/// j <= i + s_k - s_q); a row that sees no key gets out = 0 and lse = -inf.
/// How the products are computed (docs/attention.md, "Precision").
enum class AttnPrecision : uint8_t {
  /// The default. CUDA: both products on bf16 tensor cores with every block scale folded exactly
  /// into bf16 operands, P rounded to bf16. CPU: the fp64 reference above (out rounded once).
  kExact = 0,
  /// Opt-in. CUDA: QK^T and PV on FP8 (E4M3) tensor cores. Every block scale is applied: K's and
  /// V's are folded into E4M3 operands against the head's largest scale of each 32-channel block
  /// (exact where a token's block scale equals it; otherwise one rounding of the codes that fall
  /// below E4M3's normal range), Q's against its row's largest block product with K's reference;
  /// P is rounded to E4M3 after scaling by 2^8 (never saturates). Within FlashAttention-3's
  /// accuracy rule for its FP8 forward. CPU: the model of that arithmetic (the kernel's E4M3
  /// operands bit for bit, fp64 scores and softmax, P rounded to E4M3 against the row maximum).
  kFp8 = 1,
};

struct AttnArgs {
  /// Multiplies the scores; NaN (the default) means 1 / sqrt(d). Must be finite and > 0 otherwise.
  float softmax_scale = std::numeric_limits<float>::quiet_NaN();
  bool causal = false;
  AttnPrecision precision = AttnPrecision::kExact;
};

void flash_attn_mxfp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_scale,
                      const TensorView& k_scale, const TensorView& v_scale, const TensorView& out,
                      const TensorView& lse, const AttnArgs& args = {}, Stream stream = {});

/// Varlen (packed batches, FlashAttention's convention): q [total_q, h, d], k and v
/// [total_k, h_kv, d]; sequence b holds rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q (int32
/// [batch + 1], starting at 0, non-decreasing, last = total_q; cu_seqlens_k likewise);
/// q_scale [h, total_q, d/32], k_scale and v_scale [h_kv, total_k, d/32]; out [total_q, h, d];
/// lse [h, total_q]. max_seqlen_q / max_seqlen_k (>= 1) are sizing hints: the CUDA kernel's grid
/// is sized from max_seqlen_q, and a longer sequence is still computed in full (a CTA then takes
/// more than one block of rows); CUDA calls never read cu_seqlens on the host. The causal rule
/// applies per sequence.
void flash_attn_mxfp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& q_scale, const TensorView& k_scale, const TensorView& v_scale,
                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, const TensorView& out, const TensorView& lse,
                             const AttnArgs& args = {}, Stream stream = {});

}  // namespace lowbit
