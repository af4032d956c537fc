// host emulation (tests/cpp/emu/cuda_runtime.h): mma.sync.m16n8k16 as src/cuda/common/mma_sync.cuh
// documents its fragments. Warp-collective: the 32 lanes publish their A / B fragments, each lane
// then computes its four C elements (products of the exact bf16 / fp16 values, summed in fp32 in
// k order; the hardware's fp32 summation order may differ in the last bit).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "lowbit/codecs.hpp"
namespace lowbit::cuda_emu {
template <bool kFp16>
inline void mma_16816(float* c, const uint32_t* a, const uint32_t* b) {
  emu::Warp& w = *emu::warp_ctx;
  const unsigned l = emu::lane();
  for (int i = 0; i < 4; ++i) w.mma_a[l][i] = a[i];
  for (int i = 0; i < 2; ++i) w.mma_b[l][i] = b[i];
  w.bar->arrive_and_wait();
  auto val = [](uint32_t reg, int half) {
    const uint16_t h = uint16_t(half ? reg >> 16 : reg & 0xFFFFu);
    return kFp16 ? decode_fp16(h) : decode_bf16(h);
  };
  // A[r][k]: lane 4 (r % 8) + (k % 8) / 2, register (r / 8) + 2 (k / 8), half k % 2
  auto A = [&](int r, int k) { return val(w.mma_a[4 * (r % 8) + (k % 8) / 2][(r / 8) + 2 * (k / 8)], k % 2); };
  // B[k][n]: lane 4 n + (k % 8) / 2, register k / 8, half k % 2
  auto B = [&](int k, int n) { return val(w.mma_b[4 * n + (k % 8) / 2][k / 8], k % 2); };
  const int g = int(l / 4), t = int(l % 4);
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), n = 2 * t + (i % 2);
    float s = c[i];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    c[i] = s;
  }
  w.bar->arrive_and_wait();
}
}  // namespace lowbit::cuda_emu
