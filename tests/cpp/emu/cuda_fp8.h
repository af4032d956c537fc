// host emulation (tests/cpp/emu/cuda_runtime.h): the FP8 pair conversion of cuda_fp8.h by the
// library's software codecs; "half" values carried as floats (every FP8 value is one exactly)
#pragma once
#include <cuda_runtime.h>
#include "lowbit/codecs.hpp"
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
typedef unsigned short __nv_fp8x2_storage_t;
struct __half2_raw { float x, y; };
struct __half2 {
  float x, y;
  __half2(__half2_raw r) : x(r.x), y(r.y) {}
};
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t v, __nv_fp8_interpretation_t t) {
  auto d = [&](uint8_t c) { return t == __NV_E4M3 ? lowbit::decode_e4m3(c) : lowbit::decode_e5m2(c); };
  return {d(uint8_t(v & 0xFF)), d(uint8_t(v >> 8))};
}
inline float2 __half22float2(__half2 h) { return {h.x, h.y}; }
