// host emulation (tests/cpp/emu/cuda_runtime.h): the device codecs by their software definitions
// (the hardware ones equal them: src/cuda/common/codec_selftest.cu)
#pragma once
#include <cuda_runtime.h>
#include "core/plan.hpp"
namespace lowbit::cuda_emu::dev {
inline uint32_t fbits(float x) { return float_bits(x); }
inline uint32_t enc_nf4(float x, const float* t) {  // as src/cuda/common/codecs.cuh
  uint32_t c = x > t[7] ? 8u : 0u;
  c += x > t[c + 3] ? 4u : 0u;
  c += x > t[c + 1] ? 2u : 0u;
  c += x > t[c] ? 1u : 0u;
  return c;
}
template <bool kE5M2>
inline uint32_t enc_fp8x2(float lo, float hi, Saturate sat) {
  auto e = [&](float v) { return uint32_t(kE5M2 ? encode_e5m2(v, sat) : encode_e4m3(v, sat)); };
  return e(lo) | (e(hi) << 8);
}
template <bool kE5M2>
inline uint32_t enc_fp8x4(const float* v, Saturate sat) {
  return enc_fp8x2<kE5M2>(v[0], v[1], sat) | (enc_fp8x2<kE5M2>(v[2], v[3], sat) << 16);
}
}  // namespace lowbit::cuda_emu::dev
