// src/cuda/attention/launch_attention.hpp: host launchers of the attention kernels. They trust the
// validated plan, never throw, and return the cudaError_t of the launch (as int, so this header
// needs no CUDA).
#pragma once

#include "core/plan_attention.hpp"

namespace lowbit::cuda {

/// Block-scaled FP8 (MXFP8) flash-attention forward (sm_90a), fixed length or varlen.
int attn_mxfp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream);

/// Its FP8 tensor-core path (precision kFp8, sm_90a): QK^T and PV on FP8 wgmma with the block
/// scales folded into re-rounded E4M3 operands, P rounded to E4M3 (docs/attention.md).
int attn_mxfp8_fp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream);

}  // namespace lowbit::cuda
