// src/ref/ref_linear.hpp: CPU reference of the dense NVFP4 linear (nvfp4_gemm), the definition a
// CUDA kernel will be checked against with the GEMM rule |out - ref| <= 1e-3 + 1e-3 |ref|. The
// dense MXFP4 linear (mxfp4_gemm) runs ref::group_gemm_mxfp4 with one group (ref_moe.hpp).
#pragma once

#include "core/plan_linear.hpp"

namespace lowbit::ref {

void nvfp4_gemm(const detail::Nvfp4GemmPlan& p);

}  // namespace lowbit::ref
