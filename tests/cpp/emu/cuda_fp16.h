// tests/cpp/emu/cuda_fp16.h: host emulation of the few cuda_fp16.h pieces the emulated sources
// use (the half type as its bits, __ushort_as_half, __half2float by the library's software codec).
// Test code only.
#pragma once
#include <cuda_runtime.h>
#include "lowbit/codecs.hpp"
struct __half {
  uint16_t x;
};
inline __half __ushort_as_half(unsigned short v) { return __half{uint16_t(v)}; }
inline float __half2float(__half h) { return lowbit::decode_fp16(h.x); }
