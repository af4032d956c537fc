// src/cuda/attention/launch_decode.hpp: host launchers of the NF4 K-cache decode kernels
// (lowbit/decode_attention.hpp): the decode attention (sm90_nf4_decode.cu), the fused K
// projection + RoPE + encode and the append (sm90_nf4_encode.cu), the FP8 V cache
// (sm90_fp8_vcache.cu). A launcher trusts the
// validated plan, never throws, and returns the cudaError_t of its launches (as int, so this
// header needs no CUDA).
#pragma once

#include "core/plan_decode.hpp"

namespace lowbit::cuda {

/// Pruned decode attention, stage 1 (per-block m, l, o and keep mask into `workspace`) and
/// stage 2 (log-sum-exp merge of the kept blocks into out), sm_90a.
int attn_decode_nf4(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                    int64_t workspace_bytes, void* stream);

/// Fused K projection + RoPE + NF4 / FP8-residual encode (amax pass, then encode pass), sm_90a.
int kproj_rope_nf4_encode(const detail::KprojRopePlan& plan, void* stream);

/// Append of decode tokens to the cache (rescaling the channels they outgrow), sm_90a. Reads
/// plan.lengths_device; plan.lengths (the validated host copy) only sizes the grid.
int nf4_kcache_append(const detail::KCacheAppendPlan& plan, void* stream);

/// The FP8 V cache (lowbit/vcache.hpp): quantize of a whole cache, and the append with per-channel
/// rescaling (reads plan.lengths_device; plan.lengths only sizes the grid), sm90_fp8_vcache.cu.
int fp8_vcache_quantize(const detail::VCachePlan& plan, void* stream);
int fp8_vcache_append(const detail::VCacheAppendPlan& plan, void* stream);

/// Copies n int32 from the device to the host, ordered on `stream`, and waits for it (the
/// append's lengths, validated on the host).
int read_int32(const int32_t* device_src, int64_t n, int32_t* host_dst, void* stream);

}  // namespace lowbit::cuda
