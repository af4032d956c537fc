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
}
