// src/cuda/attention/launch_decode.hpp: host launchers of the NF4 K-cache decode kernels
// (lowbit/decode_attention.hpp). Declarations only: no kernel is written yet, so the C++ API
// never calls them (its CUDA path throws NotSupportedError). A launcher will trust the validated
// plan, never throw, and return the cudaError_t of its launches (as int, so this header needs no
// CUDA).
#pragma once

#include "core/plan_decode.hpp"

namespace lowbit::cuda {

/// Pruned decode attention, stage 1 (per-block m, l, o and keep mask into `workspace`) and
/// stage 2 (log-sum-exp merge of the kept blocks into out), sm_90a.
int attn_decode_nf4(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                    int64_t workspace_bytes, void* stream);

/// Fused K projection + RoPE + NF4 / FP8-residual encode (amax pass, then encode pass), sm_90a.
int kproj_rope_nf4_encode(const detail::KprojRopePlan& plan, void* stream);

/// Append of decode tokens to the cache (rescaling the channels they outgrow), sm_90a.
int nf4_kcache_append(const detail::KCacheAppendPlan& plan, void* stream);

}  // namespace lowbit::cuda
