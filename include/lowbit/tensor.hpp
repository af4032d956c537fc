// lowbit/tensor.hpp: a non-owning strided tensor view that maps 1:1 to a DLPack DLTensor.
//
// Strides are in elements of `dtype` (as DLPack's), shape and strides have `ndim` entries.
// A default-constructed view (ndim == -1) means "argument not given".
#pragma once

#include <initializer_list>
#include <string>

#include "lowbit/config.hpp"
#include "lowbit/dtype.hpp"

namespace lowbit {

enum class Device : uint8_t { kCPU, kCUDA };

constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUInt8;
  int32_t ndim = -1;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Device device = Device::kCPU;
  int32_t device_id = 0;

  TensorView() = default;
  /// A contiguous (row-major) view.
  TensorView(void* p, DType t, std::initializer_list<int64_t> dims, Device dev = Device::kCPU, int dev_id = 0)
      : data(p), dtype(t), ndim(int32_t(dims.size())), device(dev), device_id(dev_id) {
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
    int64_t s = 1;
    for (int k = ndim - 1; k >= 0; --k) {
      strides[k] = s;
      s *= shape[k];
    }
  }
  /// A strided view.
  TensorView(void* p, DType t, std::initializer_list<int64_t> dims, std::initializer_list<int64_t> strd,
             Device dev = Device::kCPU, int dev_id = 0)
      : data(p), dtype(t), ndim(int32_t(dims.size())), device(dev), device_id(dev_id) {
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
    i = 0;
    for (int64_t s : strd) strides[i++] = s;
  }

  bool present() const { return ndim >= 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t nbytes_dense() const { return numel() * dtype_bytes(dtype); }
  bool is_contiguous() const {
    if (numel() == 0) return true;  // no element to place: any strides (NumPy gives 0) will do
    int64_t s = 1;
    for (int k = ndim - 1; k >= 0; --k) {
      if (shape[k] != 1 && strides[k] != s) return false;
      s *= shape[k];
    }
    return true;
  }
  /// True if the strides are a permutation of a contiguous layout (a dense buffer of numel()
  /// elements, e.g. the GPU MODE [M, K/2, L] view of (L, M, K/2) storage).
  bool is_dense() const;
  /// Lowest and one-past-highest byte touched, relative to data (for overlap checks).
  void byte_extent(int64_t* lo, int64_t* hi) const;
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  ///< e.g. "float32[4, 7168] (strides [7168, 1]) on cpu"
};

}  // namespace lowbit
