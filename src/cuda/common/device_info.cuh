// src/cuda/common/device_info.cuh: the one cache of per-device facts (SM count) and kernel
// occupancies the launchers size their grids with.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

// ---------------------------------------------------------------------------------------------
// host helpers
struct DeviceInfo {
  int sms = 132;
};
/// Facts of `device`, queried once per device (defaults for a device outside [0, 64) or when
/// the query fails).
const DeviceInfo& device_info(int device);
/// device_info of the calling thread's current device (device 0 when that query fails).
const DeviceInfo& current_device_info();
/// SM count of a device (132 when it cannot be queried).
inline int sm_count(int device) { return device_info(device).sms; }

/// Resident CTAs per SM of a kernel (cached per kernel; 4 when the query fails).
int occupancy(const void* kernel, int threads);

/// CTAs to launch for `units` work items of one thread each (grid-stride kernels): enough to
/// fill every SM at the kernel's occupancy, never more than the work needs.
template <typename Kernel>
inline int64_t grid_for(Kernel k, int threads, int64_t units, int per_sm_cap = 16) {
  const int occ = occupancy(reinterpret_cast<const void*>(k), threads);
  const int64_t full = int64_t(current_device_info().sms) * (occ < per_sm_cap ? occ : per_sm_cap);
  const int64_t need = (units + threads - 1) / threads;
  return need < full ? (need > 0 ? need : 1) : full;
}

}  // namespace lowbit::cuda
