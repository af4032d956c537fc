// src/cuda/common/codec_selftest.cu: the exhaustive self-test of the fast codecs (codecs.cuh)
// against the software codecs (lowbit/codecs.hpp).
#include <cuda_runtime.h>

#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/selftest.hpp"

namespace lowbit::cuda {

// ---------------------------------------------------------------------------------------------
// self-test

namespace {

__device__ __forceinline__ void record(unsigned long long* cnt, unsigned* first, int check, bool bad, uint32_t input,
                                       unsigned long long* local) {
  (void)cnt;
  (void)first;
  if (bad) {
    ++local[check];
    atomicMin(first + check, input);
  }
}

__global__ void selftest_kernel(unsigned long long* cnt, unsigned* first) {
  __shared__ float thr[16];
  __shared__ dev::NF4Cell cells[dev::kNF4Cells];
  if (threadIdx.x < 16) thr[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
  if (threadIdx.x < dev::kNF4Cells) cells[threadIdx.x] = dev::nf4_cell_init(int(threadIdx.x));
  __syncthreads();
  unsigned long long local[kSelftestCount] = {};
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const uint32_t u = uint32_t(i);
    const float x = dev::bitsf(u);
    const float y = dev::bitsf(u ^ 0x5A5A5A5Au);  // a second, unrelated lane of the pair
    // fp8 (both lanes of the x2 instruction are checked)
    {
      const uint32_t f = dev::enc_fp8x2<false>(x, y, Saturate::kFinite);
      const uint32_t n = dev::enc_fp8x2<false>(x, y, Saturate::kNone);
      record(cnt, first, kCheckE4M3Finite,
             (f & 0xFF) != encode_e4m3(x, Saturate::kFinite) || (f >> 8) != encode_e4m3(y, Saturate::kFinite), u, local);
      record(cnt, first, kCheckE4M3None,
             (n & 0xFF) != encode_e4m3(x, Saturate::kNone) || (n >> 8) != encode_e4m3(y, Saturate::kNone), u, local);
      const uint32_t raw = dev::hw_e4m3x2(x, y);
      record(cnt, first, kCheckRawE4M3NaN, (raw & 0xFF) != encode_e4m3(x, Saturate::kFinite), u, local);
    }
    {
      const uint32_t f = dev::enc_fp8x2<true>(x, y, Saturate::kFinite);
      const uint32_t n = dev::enc_fp8x2<true>(x, y, Saturate::kNone);
      record(cnt, first, kCheckE5M2Finite,
             (f & 0xFF) != encode_e5m2(x, Saturate::kFinite) || (f >> 8) != encode_e5m2(y, Saturate::kFinite), u, local);
      record(cnt, first, kCheckE5M2None,
             (n & 0xFF) != encode_e5m2(x, Saturate::kNone) || (n >> 8) != encode_e5m2(y, Saturate::kNone), u, local);
      const uint32_t raw = dev::hw_e5m2x2(x, y);
      record(cnt, first, kCheckRawE5M2NaN, (raw & 0xFF) != encode_e5m2(x, Saturate::kFinite), u, local);
    }
    const bool finite = (u & 0x7F800000u) != 0x7F800000u;
    {
      // E2M1: the branchless encoder, and the magic-number encoder of the quantize fast paths
      // (finite inputs only there) with multipliers 1, 2^-3 and 2^100 folded into the FMAs
      bool bad = dev::enc_e2m1(x) != encode_e2m1(x);
      if (finite) {
        const uint32_t sg = (u >> 28) & 8u;
        const float ax = fabsf(x);
        bad |= ((dev::e2m1_biased(ax, 0.5f, 0.25f, 0.125f) - dev::kE2M1Bias) | sg) != encode_e2m1(x);
        bad |= ((dev::e2m1_biased(ax, 0.0625f, 0.03125f, 0.015625f) - dev::kE2M1Bias) | sg) != encode_e2m1(x * 0.125f);
        bad |= ((dev::e2m1_biased(ax, 0x1p99f, 0x1p98f, 0x1p97f) - dev::kE2M1Bias) | sg) != encode_e2m1(x * 0x1p100f);
      }
      record(cnt, first, kCheckE2M1, bad, u, local);
    }
    {
      // NF4: binary search, and the cell lookup on |x| <= 1 + 2^-23 (the range of x / amax)
      bool bad = dev::enc_nf4(x, thr) != encode_nf4(x);
      if (finite && fabsf(x) <= 1.00000012f) bad |= dev::nf4_cell_code(x, cells) != encode_nf4(x);
      record(cnt, first, kCheckNF4, bad, u, local);
    }
    {
      // INT4 / UINT4 and the division of the F32-scale group recipes:
      //  * int4 magic (|x| <= 7.5, the range the amax recipes produce), uint4 magic with zero
      //    point u % 16 against the reference formula, every finite x;
      //  * div_by_recip(x, s) against x / s for a divisor s drawn from u, whenever
      //    fast_div_ok holds: equal bits for |x / s| >= 2^-18, else tiny with the same sign.
      bool bad = dev::enc_int4(x) != encode_int4(x);
      if (finite && x >= -8.5f && x < 7.5f)
        bad |= (((dev::fbits(x + dev::kInt4Magic) - dev::kInt4Bias) ^ 8u) & 0xFu) != encode_int4(x);
      if (finite) {
        const int z = int(u & 15u), lo = int(dev::kInt4Bias) - z;
        const uint32_t c = uint32_t(min(max(int(dev::fbits(x + 12582912.0f)), lo), lo + 15) - lo);
        const float r = rintf(x) + float(z);
        bad |= c != uint32_t(int(r < 0.0f ? 0.0f : (r > 15.0f ? 15.0f : r)));
      }
      uint32_t h = u * 0x9E3779B9u;
      h ^= h >> 16;
      h *= 0x85EBCA6Bu;
      h ^= h >> 13;
      const float s = dev::bitsf((uint32_t(127 - 60 + int(h % 161u)) << 23) | (h >> 9));
      if (finite && dev::fast_div_ok(u & 0x7FFFFFFFu, dev::fbits(s))) {
        const float q = dev::div_by_recip(x, s, 1.0f / s), ref = x / s;
        bad |= fabsf(ref) >= 0x1p-18f ? dev::fbits(q) != dev::fbits(ref)
                                      : !(fabsf(q) < 0x1p-17f) || ((dev::fbits(q) ^ u) >> 31) != 0;
      }
      record(cnt, first, kCheckInt4, bad, u, local);
    }
    record(cnt, first, kCheckF16, dev::enc_f16(x) != encode_fp16(x), u, local);
    {
      const uint32_t b = dev::enc_bf16x2(x, y);
      record(cnt, first, kCheckBF16, (b & 0xFFFF) != encode_bf16(x) || (b >> 16) != encode_bf16(y), u, local);
    }
    if (u < 65536u) {
      record(cnt, first, kCheckDecF16, dev::fbits(dev::dec_f16(uint16_t(u))) != float_bits(decode_fp16(uint16_t(u))), u,
             local);
    }
    if (u < 65536u) {
      float a[2], b[2];
      dev::dec_fp8x2<false>(u, a);
      dev::dec_fp8x2<true>(u, b);
      a[0] = dev::canon_nan(a[0], (u & 0x80u) << 24);
      a[1] = dev::canon_nan(a[1], (u & 0x8000u) << 16);
      b[0] = dev::canon_nan(b[0], (u & 0x80u) << 24);
      b[1] = dev::canon_nan(b[1], (u & 0x8000u) << 16);
      record(cnt, first, kCheckDecE4M3,
             dev::fbits(a[0]) != float_bits(decode_e4m3(uint8_t(u))) ||
                 dev::fbits(a[1]) != float_bits(decode_e4m3(uint8_t(u >> 8))),
             u, local);
      record(cnt, first, kCheckDecE5M2,
             dev::fbits(b[0]) != float_bits(decode_e5m2(uint8_t(u))) ||
                 dev::fbits(b[1]) != float_bits(decode_e5m2(uint8_t(u >> 8))),
             u, local);
    }
  }
  for (int c = 0; c < kSelftestCount; ++c)
    if (local[c]) atomicAdd(cnt + c, local[c]);
}

}  // namespace

int selftest_encoders(uint64_t* mismatches, uint32_t* first_bad) {
  unsigned long long* cnt = nullptr;
  unsigned* first = nullptr;
  cudaError_t e = cudaMalloc(&cnt, sizeof(unsigned long long) * kSelftestCount);
  if (e != cudaSuccess) return e;
  e = cudaMalloc(&first, sizeof(unsigned) * kSelftestCount);
  if (e == cudaSuccess) e = cudaMemset(cnt, 0, sizeof(unsigned long long) * kSelftestCount);
  if (e == cudaSuccess) e = cudaMemset(first, 0xFF, sizeof(unsigned) * kSelftestCount);
  if (e == cudaSuccess) {
    selftest_kernel<<<current_device_info().sms * 8, 256>>>(cnt, first);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(mismatches, cnt, sizeof(uint64_t) * kSelftestCount, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(first_bad, first, sizeof(uint32_t) * kSelftestCount, cudaMemcpyDeviceToHost);
  cudaFree(cnt);
  if (first) cudaFree(first);
  return e;
}

}  // namespace lowbit::cuda
