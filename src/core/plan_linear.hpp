// src/core/plan_linear.hpp: the plan of the dense NVFP4 linear (nvfp4_gemm). The dense MXFP4 linear
// (mxfp4_gemm) runs as a one-group GroupGemmPlan (plan_moe.hpp). Part of core/plan.hpp: validated
// values, implementations trust them.
#pragma once

#include "core/plan_formats.hpp"

namespace lowbit::detail {

/// A validated dense NVFP4 linear: strides in elements (bytes for the packed operands).
struct Nvfp4GemmPlan {
  int64_t M = 0, N = 0, K = 0;
  const void* a = nullptr;
  bool a_bf16 = false;  ///< W4A16: a is bfloat16 [M, K]; else NVFP4 codes [M, K/2] with sfa
  int64_t a_sM = 0;
  const uint8_t* sfa = nullptr;
  ScalePlan spa;  ///< M x K/16
  const uint8_t* b = nullptr;  ///< codes [N, K/2] (row stride b_sN), or nvfp4_gemm_prepack's chunks
  bool b_packed = false;        ///< b is prepacked (N % 128 == 0, K % 64 == 0); sfb / spb unused
  int64_t b_sN = 0;
  const uint8_t* sfb = nullptr;
  ScalePlan spb;  ///< N x K/16
  const float* amax_a = nullptr;
  const float* amax_b = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sM = 0;
};

}  // namespace lowbit::detail
