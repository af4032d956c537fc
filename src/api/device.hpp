// src/api/device.hpp: running a validated op on the tensors' device. One place for the device
// guard and the error handling of every CUDA launch the API makes.
#pragma once

#include <string>

#include "api/check.hpp"
#include "cuda/common/launch.hpp"  // declarations only (no CUDA headers); defined in CUDA builds
#include "lowbit/error.hpp"

namespace lowbit::detail {

/// The kernels an op's CUDA path needs: the format ops' (any CUDA build) or the sm_90a kernels
/// built on CUTLASS / CuTe (GEMM, MoE, attention: CUDA + CUTLASS builds).
enum class Kernels { kCuda, kSm90Gemm };

#if LOWBIT_WITH_CUDA
inline constexpr bool kBuiltCuda = true;
#else
inline constexpr bool kBuiltCuda = false;
#endif
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
inline constexpr bool kBuiltSm90Gemm = true;
#else
inline constexpr bool kBuiltSm90Gemm = false;
#endif

/// Runs `launch` (a CUDA launcher call returning a cudaError_t as int) with the tensors' device
/// (c.dev_id) current, whatever the caller's current one, and turns a failure into CudaError. A
/// build without the kernels K names refuses with NotSupportedError; `launch` is then never
/// called (nor emitted), so it may name launchers that only CUDA builds define.
template <Kernels K = Kernels::kCuda, typename F>
void run_on_device(const Checker& c, F&& launch) {
  if constexpr (K == Kernels::kCuda ? kBuiltCuda : kBuiltSm90Gemm) {
#if LOWBIT_WITH_CUDA
    const cuda::DeviceGuard guard(c.dev_id);
    if (guard.error() != 0)
      throw CudaError(std::string(c.op) + ": cannot make cuda:" + std::to_string(c.dev_id) + " current: " +
                      cuda::error_string(guard.error()));
    const int err = launch();
    if (err != 0) throw CudaError(std::string(c.op) + ": CUDA error: " + cuda::error_string(err));
#endif
  } else {
    (void)launch;
    if constexpr (K == Kernels::kCuda)
      throw NotSupportedError(std::string(c.op) + ": this build of lowbit has no CUDA kernels; pass CPU tensors");
    else
      throw NotSupportedError(std::string(c.op) +
                              ": this build has no sm_90a GEMM / MoE / attention kernels (CUDA + CUTLASS headers needed)");
  }
}

/// The CPU reference on CPU tensors, else `gpu` through run_on_device.
template <typename Plan, typename Gpu>
void dispatch(const Checker& c, const Plan& p, void (*cpu)(const Plan&), Gpu&& gpu) {
  if (c.dev == Device::kCPU) {
    cpu(p);
    return;
  }
  run_on_device(c, gpu);
}

}  // namespace lowbit::detail
