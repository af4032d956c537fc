// src/ref/ref_attention.hpp: CPU reference of the attention ops (the definition the sm_90a
// kernels are checked against; docs/attention.md has the accuracy rule and the NaN policy).
#pragma once

#include "core/plan_attention.hpp"

namespace lowbit::ref {

/// Block-scaled FP8 (MXFP8) flash-attention forward on host pointers: every element dequantized
/// exactly (e4m3(code) * 2^(scale - 127), scale byte 255 = NaN), scores, max-subtracted softmax,
/// PV product and log-sum-exp in fp64; out rounded once to bfloat16 (nearest even), lse to fp32.
///
/// Rows that see no key: out 0, lse -inf. NaN: a NaN score among the keys row i sees (a NaN
/// element of q[i] or of a visible k[j], through a NaN code or a scale byte 255) makes all of
/// out[i, :] and lse[i] NaN; otherwise a NaN element v[t, c] makes out[i, c] NaN for exactly the
/// rows i that see key t, and lse[i] stays finite. Varlen plans read cu_seqlens from host memory.
void flash_attn_mxfp8(const detail::AttnMxfp8Plan& p, const detail::AttnMxfp8Ptrs& x);

/// The arithmetic model of the FP8 tensor-core path (AttnPrecision::kFp8, docs/attention.md):
/// per (sequence, KV head) the largest finite scale of every 32-channel block of K and of V
/// (Ak[b], Av[b]; 127 where none), then the kernel's E4M3 operands bit for bit:
///   K'[j, c] = e4m3(k[j, c] code * 2^(k_scale[j, b] - Ak[b])),  V' likewise with Av,
///   Q'[i, c] = e4m3(q[i, c] code * 2^(q_scale[i, b] + Ak[b] - R_i)),  R_i = max_b (q_scale[i, b] + Ak[b])
/// (e4m3: nearest even; scale byte 255 or a NaN code: NaN), s_ij = softmax_scale log2(e)
/// 2^(R_i - 254) Q'_i . K'_j in fp64, P_ij = e4m3(2^(8 + s_ij - m_i)) with m_i the row maximum,
/// l_i = sum_j 2^(8 + s_ij - m_i) (unrounded), out = sum_j P_ij V'_j 2^(Av[b] - 127) / l_i rounded
/// once to bf16, lse = (m_i + log2 l_i - 8) ln 2. The kernel rounds P against the running
/// maximum of its key tiles instead and accumulates in fp32. Masks, empty rows and NaN rules as
/// flash_attn_mxfp8 above.
void flash_attn_mxfp8_fp8(const detail::AttnMxfp8Plan& p, const detail::AttnMxfp8Ptrs& x);

/// Nearest-even E4M3 value of x (|x| <= 448 assumed; NaN stays NaN), exactly from fp64.
double round_e4m3(double x);

/// fp64 -> bfloat16 bits, rounded once to nearest even (no double rounding through fp32);
/// overflow gives +-Inf, NaN stays NaN.
uint16_t bf16_from_double(double x);

}  // namespace lowbit::ref
