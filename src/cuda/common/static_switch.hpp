// src/cuda/common/static_switch.hpp: runtime -> compile-time switches of the launchers.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "lowbit/dtype.hpp"

namespace lowbit::cuda {

/// Calls f(std::integral_constant<decltype(V), V>{}) for the first V of kValues equal to
/// `value` and returns its result; returns `otherwise` when none is equal. The kernels are
/// instantiated for each of kValues.
template <auto kFirst, auto... kRest, typename T, typename R, typename F>
R static_switch(T value, R otherwise, F&& f) {
  if (value == kFirst) return f(std::integral_constant<decltype(kFirst), kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return static_switch<kRest...>(value, otherwise, std::forward<F>(f));
  } else {
    return otherwise;
  }
}

/// The switch over the floating input dtypes (fp32 / fp16 / bf16): returns
/// f(std::integral_constant<DType, T>{}), or cudaErrorInvalidValue for another dtype.
template <typename F>
cudaError_t with_float_dtype(DType t, F&& f) {
  return static_switch<DType::kFloat32, DType::kFloat16, DType::kBFloat16>(t, cudaErrorInvalidValue,
                                                                           std::forward<F>(f));
}

}  // namespace lowbit::cuda
