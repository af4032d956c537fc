// src/ref/ref_moe.hpp: CPU references of the MXFP4 grouped GEMM, its weight prepack and the gpt-oss
// expert MLP (the definitions the kernels are checked against with the GPU MODE rule
// |out - ref| <= 1e-3 + 1e-3 |ref|).
#pragma once

#include "core/plan_moe.hpp"

namespace lowbit::ref {

void group_gemm_mxfp4(const detail::GroupGemmPlan& p);
/// group_gemm_mxfp4_prepack on the CPU (the definition of the packed layout's contents).
void mxfp4_prepack(const detail::Mxfp4PackPlan& p);
/// group_gemm_mxfp4_prepack_fp8 on the CPU (the definition of the FP8-path packed layout's contents).
void mxfp4_prepack_fp8(const detail::Mxfp4PackPlan& p);

void gpt_oss_moe_mlp(const detail::MoeMlpPlan& p);
/// gpt_oss_expert_mlp (p.expert_rows, host p.row_indptr): each row of an expert's group gets that
/// expert's unweighted term, bit for bit the term gpt_oss_moe_mlp weights for the same row.
void gpt_oss_expert_mlp(const detail::MoeMlpPlan& p);
/// Rounds v[0..n) in place as an activation entering an expert GEMM (bf16, or MXFP8 E4M3
/// RCEIL per 32: quantize + dequantize).
void round_activation(float* v, int64_t n, bool mxfp8);

}  // namespace lowbit::ref
