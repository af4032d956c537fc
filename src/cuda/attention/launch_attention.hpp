// src/cuda/attention/launch_attention.hpp: host launchers of the attention kernels. They trust the
// validated plan, never throw, and return the cudaError_t of the launch (as int, so this header
// needs no CUDA).
#pragma once

#include "core/plan_attention.hpp"

namespace lowbit::cuda {

/// Block-scaled FP8 (MXFP8) flash-attention forward (sm_90a), fixed length or varlen.
int attn_mxfp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream);

}  // namespace lowbit::cuda
