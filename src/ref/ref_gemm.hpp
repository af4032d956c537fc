// src/ref/ref_gemm.hpp: CPU references of the GEMM ops (the definitions the kernels are
// checked against with the GPU MODE rule |out - ref| <= 1e-3 + 1e-3 |ref|).
#pragma once

#include "core/plan.hpp"

namespace lowbit::ref {

float silu(float x);
void nvfp4_dual_gemm_silu(const detail::DualGemmPlan& p);

}  // namespace lowbit::ref

namespace lowbit::ref {
void group_gemm_mxfp4(const detail::GroupGemmPlan& p);
/// group_gemm_mxfp4_prepack on the CPU (the definition of the packed layout's contents).
void mxfp4_prepack(const detail::Mxfp4PackPlan& p);
}

namespace lowbit::ref {
void gpt_oss_moe_mlp(const detail::MoeMlpPlan& p);
/// Rounds v[0..n) in place as an activation entering an expert GEMM (bf16, or MXFP8 E4M3
/// RCEIL per 32: quantize + dequantize).
void round_activation(float* v, int64_t n, bool mxfp8);
}
