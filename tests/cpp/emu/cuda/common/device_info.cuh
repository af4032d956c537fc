// host emulation (tests/cpp/emu/cuda_runtime.h): grids of at most 3 CTAs, so the grid-stride
// loops of the kernels run several rounds; 2 SMs by default (emu::sm_count; with two CTAs per SM:
// waves of four CTAs)
#pragma once
#include <cuda_runtime.h>
namespace emu {
/// The emulated SM count (tests change it to steer the grid and split-K heuristics).
inline int sm_count = 2;
}  // namespace emu
namespace lowbit::cuda_emu {
inline int sm_count(int) { return emu::sm_count; }
template <typename Kernel>
inline int64_t grid_for(Kernel, int threads, int64_t units, int = 16) {
  const int64_t need = (units + threads - 1) / threads;
  return std::max<int64_t>(1, std::min<int64_t>(need, 3));
}
}  // namespace lowbit::cuda_emu
