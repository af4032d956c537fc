// src/cuda/gemm/launch_gemm.hpp: host launchers of the sm_90a GEMM kernels (built only with the
// CUTLASS/CuTe headers). They trust the validated plans, never throw, and return a cudaError_t
// as int.
#pragma once

#include "core/plan.hpp"

namespace lowbit::cuda {

/// Reorders B1/B2 (and their scales) of the plan into the kernel's layout (gate/up rows
/// interleaved by 8, each thread's wgmma A fragments contiguous).
int nvfp4_dual_gemm_prepack(const detail::DualGemmPlan& p, uint8_t* packed, void* stream);
/// C = silu(A B1^T) * (A B2^T). `packed` null: the weights are prepacked into a temporary.
int nvfp4_dual_gemm(const detail::DualGemmPlan& p, const uint8_t* packed, void* stream);

}  // namespace lowbit::cuda

namespace lowbit::cuda {

/// MXFP4-weight grouped GEMM (MXFP8 or bf16 activations), groups from a device m_indptr.
int group_gemm_mxfp4(const detail::GroupGemmPlan& p, void* stream);
/// group_gemm_mxfp4_prepack on the device (same bytes as ref::mxfp4_prepack).
int mxfp4_prepack(const detail::Mxfp4PackPlan& p, void* stream);
/// The gpt-oss expert MLP (route, gather, gate_up + SwiGLU, down, weighted sum) on the device.
int gpt_oss_moe_mlp(const detail::MoeMlpPlan& p, void* stream);

}  // namespace lowbit::cuda
