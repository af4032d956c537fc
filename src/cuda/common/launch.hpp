// src/cuda/common/launch.hpp: host launchers of the sm_90a kernels. They trust the validated plans,
// never throw, and return the cudaError_t of the launch (as int, so this header needs no CUDA).
#pragma once

#include <string>

#include "core/plan.hpp"

namespace lowbit::cuda {

/// Number of usable CUDA devices (0 without a driver; never throws).
int device_count();
int runtime_version();
/// Name and compute capability (major*10+minor) of a device.
std::string device_name(int device);
int device_sm(int device);
const char* error_string(int err);
/// The calling thread's current device (-1 on error), and cudaSetDevice (returns the error).
int current_device();
int set_device(int device);

/// Makes `device` current for the lifetime of the guard (the previous device is restored).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : prev_(current_device()) {
    if (prev_ != device) {
      err_ = set_device(device);
      switched_ = err_ == 0 && prev_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (switched_) set_device(prev_);
  }
  int error() const { return err_; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
  int err_ = 0;
  bool switched_ = false;
};

int quantize(const detail::QuantPlan& p, void* stream);
int dequantize(const detail::DequantPlan& p, void* stream);
int transcode(const detail::TranscodePlan& p, void* stream);
int cast(const detail::CastPlan& p, void* stream);
int convert_layout(const detail::LayoutPlan& p, void* stream);
/// Writes amax(|x|) of a [L, M, K] strided tensor to *out (device pointer).
int tensor_amax(const void* x, DType t, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM, float* out,
                void* stream);
int kcache_quantize(const detail::KCachePlan& p, void* stream);
int kcache_dequantize(const detail::KCachePlan& p, void* stream);

}  // namespace lowbit::cuda
