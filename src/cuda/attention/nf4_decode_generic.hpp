// src/cuda/attention/nf4_decode_generic.hpp: the generic kernels of the NF4 K-cache decode attention
// (sm90_nf4_decode.cu: scores to scratch, per-chunk pruning with (m, l, o), merge), for the calls the
// fused path of sm90_nf4_decode_fused.cu does not take (D != Dv, rows not 16-byte aligned, pruning
// blocks that do not divide its 128-token tile, more than 64 query heads per KV head when pruning).
#pragma once

#include <cstdint>

#include "core/plan_decode.hpp"

namespace lowbit::cuda {

int attn_decode_nf4_generic(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                            int64_t workspace_bytes, void* stream);

}  // namespace lowbit::cuda
