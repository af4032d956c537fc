// tests/cpp/emu/cuda_runtime.h: the host emulation of the CUDA pieces that
// src/cuda/attention/sm90_nf4_encode.cu, sm90_nf4_decode_fused.cu and src/cuda/moe/group_layout.cuh
// use, for the emu tests
// (kernels run on the CPU: one std::thread per CUDA thread of a CTA, CTAs one after the other,
// std::barrier for __syncthreads and, per warp, for the shuffles, ballots and __syncwarp;
// __shared__ variables as function statics, dynamic shared memory as a buffer per CTA). Warp
// operations must be reached by all 32 lanes of the warp (convergent code). Test code only.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

using std::cos;
using std::fma;
using std::fmaf;
using std::fmaxf;
using std::isfinite;
using std::max;
using std::min;
using std::pow;
using std::sin;

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2 };

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* emu_barrier = nullptr;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }

inline unsigned atomicMax(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned o = a.load();
  while (o < v && !a.compare_exchange_weak(o, v)) {
  }
  return o;
}

struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
struct uint2 { uint32_t x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
/// Two CTAs per SM, whatever the kernel: with device_info's 2 SMs, four CTAs per wave.
template <typename K>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, K, int, size_t) {
  *n = 2;
  return cudaSuccess;
}

inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicAnd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_and(v); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(uint32_t x) { float f; std::memcpy(&f, &x, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t x; std::memcpy(&x, &f, 4); return x; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

namespace emu {
/// The exchange slots and the barrier of one warp.
struct Warp {
  std::barrier<>* bar = nullptr;
  uint64_t slot[32] = {};
  uint32_t mma_a[32][4] = {};  ///< mma.sync fragments (cuda/common/mma_sync.cuh)
  uint32_t mma_b[32][2] = {};
};
inline thread_local Warp* warp_ctx = nullptr;
inline thread_local uint8_t* dyn_smem = nullptr;
inline unsigned lane() { return threadIdx.x % 32; }
}  // namespace emu

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int off) {
  static_assert(sizeof(T) <= 8, "shuffle of a value of at most 8 bytes");
  emu::Warp& w = *emu::warp_ctx;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slot[emu::lane()] = bits;
  w.bar->arrive_and_wait();
  const uint64_t o = w.slot[emu::lane() ^ unsigned(off)];
  w.bar->arrive_and_wait();
  T r;
  std::memcpy(&r, &o, sizeof(T));
  return r;
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a value of at most 8 bytes");
  emu::Warp& w = *emu::warp_ctx;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slot[emu::lane()] = bits;
  w.bar->arrive_and_wait();
  const uint64_t o = w.slot[unsigned(src) & 31u];
  w.bar->arrive_and_wait();
  T r;
  std::memcpy(&r, &o, sizeof(T));
  return r;
}
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  static_assert(sizeof(T) <= 8, "shuffle of a value of at most 8 bytes");
  emu::Warp& w = *emu::warp_ctx;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slot[emu::lane()] = bits;
  w.bar->arrive_and_wait();
  const uint64_t o = emu::lane() >= delta ? w.slot[emu::lane() - delta] : bits;
  w.bar->arrive_and_wait();
  T r;
  std::memcpy(&r, &o, sizeof(T));
  return r;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  emu::Warp& w = *emu::warp_ctx;
  w.slot[emu::lane()] = pred ? 1 : 0;
  w.bar->arrive_and_wait();
  unsigned r = 0;
  for (unsigned l = 0; l < 32; ++l) r |= unsigned(w.slot[l] & 1) << l;
  w.bar->arrive_and_wait();
  return r;
}
inline void __syncwarp() { emu::warp_ctx->bar->arrive_and_wait(); }
/// Scratch comes back filled with 0xEE bytes (a kernel that reads scratch it did not write shows).
inline cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t, cudaStream_t) {
  *p = std::malloc(n + 16);
  if (*p) std::memset(*p, 0xEE, n + 16);
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

namespace emu {

/// kernel<<<grid, block, ...>>>(args) is rewritten as emu::launch(kernel, grid, block, ...)(args)
/// (the third argument, when given, is the dynamic shared memory in bytes).
template <typename K>
struct Launch {
  K k;
  dim3 g, b;
  size_t smem = 0;
  template <typename... A>
  cudaError_t operator()(A... args) {
    gridDim = g;
    blockDim = b;
    std::vector<uint8_t> dyn(smem + 16, 0xCD);  // poisoned, as fresh shared memory may be
    for (unsigned bz = 0; bz < g.z; ++bz)
      for (unsigned by = 0; by < g.y; ++by)
        for (unsigned bx = 0; bx < g.x; ++bx) {
          std::barrier<> bar(b.x);
          emu_barrier = &bar;
          const unsigned nw = (b.x + 31) / 32;
          std::vector<Warp> warps(nw);
          std::vector<std::unique_ptr<std::barrier<>>> wbars;
          for (unsigned w = 0; w < nw; ++w) {
            wbars.emplace_back(std::make_unique<std::barrier<>>(std::min(32u, b.x - 32 * w)));
            warps[w].bar = wbars.back().get();
          }
          std::vector<std::thread> ts;
          for (unsigned t = 0; t < b.x; ++t)
            ts.emplace_back([&, t] {
              threadIdx = dim3(t);
              blockIdx = dim3(bx, by, bz);
              warp_ctx = &warps[t / 32];
              dyn_smem = dyn.data();
              k(args...);
            });
          for (auto& th : ts) th.join();
        }
    return cudaSuccess;
  }
};
template <typename K>
Launch<K> launch(K k, dim3 g, dim3 b) {
  return Launch<K>{k, g, b, 0};
}
template <typename K, typename... R>
Launch<K> launch(K k, dim3 g, dim3 b, size_t smem, R...) {
  return Launch<K>{k, g, b, smem};
}

}  // namespace emu
