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

/// fp64 -> bfloat16 bits, rounded once to nearest even (no double rounding through fp32);
/// overflow gives +-Inf, NaN stays NaN.
uint16_t bf16_from_double(double x);

}  // namespace lowbit::ref
