// src/cuda/moe/launch_moe.hpp: host launchers of the sm_90a MXFP4 grouped GEMM, the dense MXFP4
// linear on it, its weight prepack and the gpt-oss expert MLP (built only with the CUTLASS/CuTe headers). They trust the validated
// plans, never throw, and return a cudaError_t as int.
#pragma once

#include "core/plan_moe.hpp"

namespace lowbit::cuda {

/// MXFP4-weight grouped GEMM (MXFP8 or bf16 activations), groups from a device m_indptr or device
/// m_counts (contiguous or masked layout).
int group_gemm_mxfp4(const detail::GroupGemmPlan& p, void* stream);
/// The FP8 tensor-core path of group_gemm_mxfp4 (p.fp8: MXFP8 activations, FP8-path packed weights;
/// sm90_mxfp4_group_gemm_fp8.cu).
int group_gemm_mxfp4_fp8(const detail::GroupGemmPlan& p, void* stream);
/// group_gemm_mxfp4_prepack_fp8 on the device (same bytes as ref::mxfp4_prepack_fp8).
int mxfp4_prepack_fp8(const detail::Mxfp4PackPlan& p, void* stream);
/// The dense MXFP4 linear (mxfp4_gemm): group_gemm_mxfp4 with one group; the plan's m_indptr is
/// replaced by a device-resident constant (sm90_mxfp4_gemm.cu).
int mxfp4_gemm(detail::GroupGemmPlan p, void* stream);
/// group_gemm_mxfp4_prepack on the device (same bytes as ref::mxfp4_prepack).
int mxfp4_prepack(const detail::Mxfp4PackPlan& p, void* stream);
/// The gpt-oss expert MLP (route, gather, gate_up + SwiGLU, down, weighted sum) on the device.
int gpt_oss_moe_mlp(const detail::MoeMlpPlan& p, void* stream);
/// The gpt-oss expert MLP over expert-grouped rows (p.expert_rows, device counts): group bounds,
/// gather, gate_up + SwiGLU, down into out's rows (no routing, no weighting).
int gpt_oss_expert_mlp(const detail::MoeMlpPlan& p, void* stream);

}  // namespace lowbit::cuda
