// src/cuda/common/memory.cuh: streaming vector loads and stores, warp-contiguous stores and
// 16-element input chunks of the sm_90a conversion kernels.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/codecs.cuh"

namespace lowbit::cuda {
namespace dev {

// ---------------------------------------------------------------------------------------------
// vector memory access
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ void st_stream(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_stream8(void* p, uint2 v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

/// Warp-contiguous wide stores: each lane owns N (2 or 4) 16-byte vectors for p, p + 16, ...
/// Stored as they are, one store instruction covers 16 B every 16 N bytes (partial sectors).
/// A butterfly transpose over groups of N lanes gives lane q of a group the vector q of every
/// lane i of the group instead, stored at p_i + 16 q: each instruction then writes 16 N
/// contiguous bytes per group when the group's lanes own consecutive pieces (any addresses
/// stay correct). All 32 lanes must call it; a lane with p == nullptr stores nothing.
template <int N>
__device__ __forceinline__ void st_group(char* p, uint4* v) {
  const unsigned lane = threadIdx.x & 31u;
#pragma unroll
  for (int bit = N / 2; bit >= 1; bit >>= 1) {
    const bool up = (lane & unsigned(bit)) != 0;
#pragma unroll
    for (int v0 = 0; v0 < N; ++v0) {
      if (v0 & bit) continue;
      const int v1 = v0 | bit;
      uint4 snd = up ? v[v0] : v[v1];
      uint4 rcv;
      rcv.x = __shfl_xor_sync(0xFFFFFFFFu, snd.x, bit);
      rcv.y = __shfl_xor_sync(0xFFFFFFFFu, snd.y, bit);
      rcv.z = __shfl_xor_sync(0xFFFFFFFFu, snd.z, bit);
      rcv.w = __shfl_xor_sync(0xFFFFFFFFu, snd.w, bit);
      if (up) v[v0] = rcv;
      else v[v1] = rcv;
    }
  }
  const unsigned base = lane & ~unsigned(N - 1), q = lane & unsigned(N - 1);
  const unsigned long long pa = reinterpret_cast<unsigned long long>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    char* pi = reinterpret_cast<char*>(__shfl_sync(0xFFFFFFFFu, pa, base + unsigned(i)));
    if (pi) st_stream(pi + 16 * q, v[i]);
  }
}

/// Raw 16-element input chunk: fp32 needs 4 x 16 B, fp16 / bf16 2 x 16 B.
template <DType T>
struct Chunk16 {
  static constexpr int kWords = T == DType::kFloat32 ? 16 : 8;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const void* p) {
    const uint4* q = static_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = ld_stream(q + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  }
  /// Element i as fp32, exactly as load_float (fp16 NaN canonical).
  __device__ __forceinline__ float get(int i) const {
    if (T == DType::kFloat32) return bitsf(w[i]);
    const uint32_t h = (w[i >> 1] >> ((i & 1) * 16)) & 0xFFFFu;
    if (T == DType::kBFloat16) return bitsf(h << 16);
    return dec_f16(uint16_t(h));
  }
};

}  // namespace dev
}  // namespace lowbit::cuda
