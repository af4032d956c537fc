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

/// Tuning: the tile (tokens per CTA: 16 / 32 / 64 / 128, with moe::pick_tile's K tile) and split
/// count (made valid by moe::group_split_for) that this thread's next grouped GEMM launches use
/// instead of moe::pick_layout_tile's and moe::group_split's; 0 keeps the heuristic's for that
/// one. Only bench/dev/gemm_config_sweep.cu sets them (to measure the choices); the library never
/// does.
void set_group_config_for_tuning(int tile_n, int splits);
/// The tile and split count set by set_group_config_for_tuning on this thread (0: none).
int group_tile_for_tuning();
int group_splits_for_tuning();

}  // namespace lowbit::cuda
