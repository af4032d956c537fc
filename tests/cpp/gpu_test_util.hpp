// tests/cpp/gpu_test_util.hpp: helpers shared by the GPU tests (gpu_test_*.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace gputest {

/// True when a CUDA device is visible (the tests skip otherwise).
inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

/// A device buffer of n elements (16 bytes of slack for vector loads), filled from the host or
/// left uninitialised.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(&p, n * sizeof(T) + 16);
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t count) : n(count) { cudaMalloc(&p, n * sizeof(T) + 16); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

}  // namespace gputest
