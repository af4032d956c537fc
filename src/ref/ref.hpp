// src/ref/ref.hpp: the CPU reference implementation of every lowbit op. It is the definition
// the CUDA kernels are tested against (byte for byte for the formats), and what the public
// API runs for CPU tensors.
#pragma once

#include "core/plan.hpp"

namespace lowbit::ref {

void quantize(const detail::QuantPlan& p);
void dequantize(const detail::DequantPlan& p);
void transcode(const detail::TranscodePlan& p);
void cast(const detail::CastPlan& p);
void convert_layout(const detail::LayoutPlan& p);
/// Bits of max |x| over the finite elements of a [L, M, K] strided tensor (NaN and +-Inf are
/// ignored; 0 when there is none): the NVFP4 global amax and tensor_amax.
uint32_t amax_bits(const void* x, DType t, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM);
void kcache_quantize(const detail::KCachePlan& p);
void kcache_dequantize(const detail::KCachePlan& p);

}  // namespace lowbit::ref
