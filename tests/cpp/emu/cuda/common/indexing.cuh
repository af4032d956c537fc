// host emulation (tests/cpp/emu/cuda_runtime.h): FastDiv as src/cuda/common/indexing.cuh
#pragma once
#include <cuda_runtime.h>
namespace lowbit::cuda_emu {
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    s = 0;
    while ((uint64_t(1) << s) < div) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - div)) / div + 1);
  }
  uint32_t div(uint32_t n) const { return uint32_t((uint64_t(__umulhi(n, m)) + n) >> s); }
};
}  // namespace lowbit::cuda_emu
