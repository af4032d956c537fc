// src/cuda/common/device_info.cu: device queries of the CUDA launchers (launch.hpp) and the
// per-device / per-kernel caches of device_info.cuh.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "cuda/common/device_info.cuh"
#include "cuda/common/launch.hpp"

namespace lowbit::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clears cudaErrorInsufficientDriver / cudaErrorNoDevice
    return 0;
  }
  return n;
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

std::string device_name(int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return p.name;
}

int device_sm(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

const char* error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

const DeviceInfo& device_info(int device) {
  static DeviceInfo infos[64];
  static std::once_flag once[64];
  static const DeviceInfo fallback;
  if (device < 0 || device >= 64) return fallback;
  std::call_once(once[device], [device] {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0)
      infos[device].sms = sms;
    else cudaGetLastError();
  });
  return infos[device];
}

const DeviceInfo& current_device_info() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    d = 0;
  }
  if (d < 0 || d >= 64) d = 0;
  return device_info(d);
}

int current_device() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

int set_device(int device) { return int(cudaSetDevice(device)); }

int occupancy(const void* kernel, int threads) {
  static std::mutex mu;
  static std::unordered_map<const void*, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(kernel);
  if (it != cache.end()) return it->second;
  int o = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, threads, 0) != cudaSuccess || o <= 0) {
    cudaGetLastError();
    o = 4;
  }
  cache[kernel] = o;
  return o;
}

}  // namespace lowbit::cuda
