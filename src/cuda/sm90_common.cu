// src/cuda/sm90_common.cu: device queries of the CUDA launchers and the exhaustive self-test
// of the fast codecs (sm90_common.cuh) against the software codecs (lowbit/codecs.hpp).
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "cuda/launch.hpp"
#include "cuda/selftest.hpp"
#include "cuda/sm90_common.cuh"

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

int pointer_device(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return a.device;
  return -1;
}

const DeviceInfo& current_device_info() {
  static DeviceInfo infos[64];
  static bool have[64] = {};
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    d = 0;
  }
  if (d < 0 || d >= 64) d = 0;
  if (!have[d]) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) == cudaSuccess && sms > 0) infos[d].sms = sms;
    else cudaGetLastError();
    have[d] = true;
  }
  return infos[d];
}

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
  if (threadIdx.x < 16) thr[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
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
    record(cnt, first, kCheckE2M1, dev::enc_e2m1(x) != encode_e2m1(x), u, local);
    record(cnt, first, kCheckNF4, dev::enc_nf4(x, thr) != encode_nf4(x), u, local);
    record(cnt, first, kCheckInt4, dev::enc_int4(x) != encode_int4(x), u, local);
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
