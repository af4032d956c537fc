// src/core/plan_gemm.hpp: the plan of the NVFP4 dual GEMM + SiLU. Part of core/plan.hpp: validated
// values, implementations trust them.
#pragma once

#include "core/plan_formats.hpp"

namespace lowbit::detail {

/// A validated NVFP4 dual GEMM: all strides in elements (bytes for the packed operands).
struct DualGemmPlan {
  int64_t M = 0, N = 0, K = 0, L = 1;
  const uint8_t* a = nullptr;
  const uint8_t* b1 = nullptr;
  const uint8_t* b2 = nullptr;
  int64_t a_sM = 0, a_sL = 0, b1_sN = 0, b1_sL = 0, b2_sN = 0, b2_sL = 0;
  const uint8_t* sfa = nullptr;
  const uint8_t* sfb1 = nullptr;
  const uint8_t* sfb2 = nullptr;
  ScalePlan spa, spb;  ///< M x K/16 and N x K/16
  const float* amax_a = nullptr;
  const float* amax_b1 = nullptr;
  const float* amax_b2 = nullptr;
  void* c = nullptr;
  DType c_dtype = DType::kFloat16;
  int64_t c_sM = 0, c_sL = 0;
};

}  // namespace lowbit::detail
