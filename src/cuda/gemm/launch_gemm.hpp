// src/cuda/gemm/launch_gemm.hpp: host launchers of the sm_90a NVFP4 dual GEMM (built only with the
// CUTLASS/CuTe headers). They trust the validated plan, never throw, and return a cudaError_t as
// int. The grouped GEMM / MoE launchers: cuda/moe/launch_moe.hpp.
#pragma once

#include "core/plan_gemm.hpp"
#include "core/plan_linear.hpp"
#include "cuda/gemm/heuristics.hpp"

namespace lowbit::cuda {

/// Reorders B1/B2 (and their scales) of the plan into the kernel's layout (gate/up rows
/// interleaved by 8, each thread's wgmma A fragments contiguous).
int nvfp4_dual_gemm_prepack(const detail::DualGemmPlan& p, uint8_t* packed, void* stream);
/// C = silu(A B1^T) * (A B2^T). `packed` null: the weights are prepacked into a temporary.
int nvfp4_dual_gemm(const detail::DualGemmPlan& p, const uint8_t* packed, void* stream);
/// The dense NVFP4 linear out = A B^T (* global scales, + bias) on the dual GEMM's mainloop
/// (N a multiple of 128, K of 64; B prepacked into a temporary at each call).
int nvfp4_gemm(const detail::Nvfp4GemmPlan& q, void* stream);
/// nvfp4_gemm's prepacked weights (q.b / q.sfb / q.spb; N % 128, K % 64) into `out`.
int nvfp4_gemm_prepack(const detail::Nvfp4GemmPlan& q, uint8_t* out, void* stream);

/// Tuning: the tile / split-K choice (made valid by gemm::dual_config_for) that this thread's next
/// nvfp4_dual_gemm and nvfp4_gemm launches use instead of gemm::dual_config; null restores the
/// heuristic. Only bench/dev/gemm_config_sweep.cu sets it (to measure the choices the heuristic
/// picks from); the library never does.
void set_dual_config_for_tuning(const gemm::DualConfig* cfg);
/// The choice of the next launch on this thread: the tuning one when set, else gemm::dual_config.
gemm::DualConfig choose_dual_config(int64_t M, int64_t N, int64_t K, int64_t L, int sms);

}  // namespace lowbit::cuda
