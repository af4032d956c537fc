// src/ref/ref_gemm.hpp: CPU reference of the NVFP4 dual GEMM + SiLU (the definition the kernel is
// checked against with the GPU MODE rule |out - ref| <= 1e-3 + 1e-3 |ref|). The grouped GEMM and
// the MoE MLP: ref_moe.hpp.
#pragma once

#include "core/plan_gemm.hpp"

namespace lowbit::ref {

float silu(float x);
void nvfp4_dual_gemm_silu(const detail::DualGemmPlan& p);

}  // namespace lowbit::ref
