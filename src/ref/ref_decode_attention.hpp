// src/ref/ref_decode_attention.hpp: CPU reference of the NF4 K-cache decode ops
// and of its FP8 V cache (lowbit/decode_attention.hpp; docs/decode_attention.md): the definitions
// the sm_90a kernels are checked against.
#pragma once

#include "core/plan_decode.hpp"

namespace lowbit::ref {

/// Pruned two-stage decode attention on host pointers. Keys are decoded with the fp32 rule of
/// lowbit/kcache.hpp (nf4[code] * scale + residual), then scores, block maxima, the threshold,
/// the per-block (m, l, o) of stage 1 and the log-sum-exp merge of stage 2 run in fp64; out is
/// rounded once to bfloat16 (nearest even). Parallel over (batch, KV head).
void attn_decode_nf4(const detail::DecodeNf4Plan& p, const detail::DecodeNf4Ptrs& x);

/// Projection and RoPE in fp64 (each rounded once to fp32), then ref::kcache_quantize.
void kproj_rope_nf4_encode(const detail::KprojRopePlan& p);

/// The append with per-channel rescaling (lowbit/decode_attention.hpp nf4_kcache_append).
void nf4_kcache_append(const detail::KCacheAppendPlan& p);

/// The FP8 V cache of v (lowbit/vcache.hpp): per channel the power-of-two scale of its finite
/// amax over T, then every code (src/ref/ref_vcache.cpp).
void fp8_vcache_quantize(const detail::VCachePlan& p);

/// The append with per-channel rescaling (lowbit/decode_attention.hpp fp8_vcache_append).
void fp8_vcache_append(const detail::VCacheAppendPlan& p);

}  // namespace lowbit::ref
