// tests/cpp/emu/cuda_runtime.h: the host emulation of the CUDA pieces that
// src/cuda/attention/sm90_nf4_encode.cu uses, for test_nf4_encode_emu.cpp (kernels run on the
// CPU: one std::thread per CUDA thread of a CTA, CTAs one after the other, std::barrier for
// __syncthreads, __shared__ variables as function statics). Test code only.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

using std::cos;
using std::fma;
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
struct uint2 { uint32_t x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
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

/// kernel<<<grid, block, ...>>>(args) is rewritten as emu::launch(kernel, grid, block, ...)(args).
template <typename K>
struct Launch {
  K k;
  dim3 g, b;
  template <typename... A>
  cudaError_t operator()(A... args) {
    gridDim = g;
    blockDim = b;
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        std::barrier<> bar(b.x);
        emu_barrier = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < b.x; ++t)
          ts.emplace_back([&, t] {
            threadIdx = dim3(t);
            blockIdx = dim3(bx, by);
            k(args...);
          });
        for (auto& th : ts) th.join();
      }
    return cudaSuccess;
  }
};
template <typename K, typename... R>
Launch<K> launch(K k, dim3 g, dim3 b, R...) {
  return Launch<K>{k, g, b};
}

}  // namespace emu
