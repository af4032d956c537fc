// src/core/plan_kcache.hpp: the plan of the NF4 + residual K-cache quantize / dequantize. Part of
// core/plan.hpp: validated values, implementations trust them.
#pragma once

#include "core/plan_formats.hpp"

namespace lowbit::detail {

struct KCachePlan {
  int64_t B = 0, T = 0, H = 0, D = 0;
  const void* k = nullptr;  ///< quantize: input; dequantize: output
  DType k_dtype = DType::kFloat32;
  int64_t k_s[4] = {};
  uint8_t* codes = nullptr;
  int64_t c_s[4] = {};  ///< byte strides of codes
  float* scale = nullptr;
  int64_t s_s[3] = {};
  uint8_t* residual = nullptr;  ///< may be null on dequantize
  DType r_dtype = DType::kE5M2;
  int64_t r_s[4] = {};
  NibbleOrder order = NibbleOrder::kLowFirst;
};

}  // namespace lowbit::detail
