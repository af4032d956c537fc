// tests/cpp/emu/cuda_runtime.h: the host emulation of the CUDA pieces that the emulated kernels
// use (src/cuda/attention/sm90_nf4_encode.cu, sm90_nf4_decode_fused.cu, sm90_fp8_vcache.cu, the MXFP4
// grouped GEMM of src/cuda/moe/, the NVFP4 dual GEMM of src/cuda/gemm/), for the emu tests
// (kernels run on the CPU: one std::thread per CUDA thread of a CTA, CTAs one after the other,
// std::barrier for __syncthreads and, per warp, for the shuffles, ballots and __syncwarp;
// __shared__ variables as function statics, or, in the sources rewritten with SHARED_WINDOW
// (tests/cpp/CMakeLists.txt), inside the CTA's shared-memory window; dynamic shared memory inside
// that window too). Warp operations must be reached by all 32 lanes of the warp (convergent code).
// The sm_90 asynchronous pieces (mbarriers, TMA, cp.async with 32-bit shared addresses, wgmma) are
// in emu_sm90.hpp. Test code only.
//
// The shared-memory window of a CTA: 32-bit shared addresses (__cvta_generic_to_shared) are offsets
// into one host buffer per CTA. Static shared variables (SHARED_WINDOW) start at kSmemStatic, the
// dynamic shared memory at kSmemDynamic (16-byte aligned, deliberately not 1024-byte aligned, so a
// kernel's own alignment of its stages is exercised). Fresh windows are poisoned with 0xCD bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

using std::cos;
using std::fma;
using std::fmaf;
using std::fmaxf;
using std::isfinite;
using std::max;
using std::min;
using std::pow;
using std::sin;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotSupported = 801
};
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
inline float2 make_float2(float a, float b) { return {a, b}; }

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
/// fma.rn.f32: the exact a b + c rounded once (std::fma).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
/// prmt.b32 in its default mode as __byte_perm documents it: result byte n is byte s<4n+2:4n> of
/// {y, x} (x bytes 0..3, y bytes 4..7). The sign-replicating selector bit (bit 3 of a nibble) is
/// not emulated: no emulated kernel sets it.
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 0xFu;
    if (sel & 8u) {
      std::fprintf(stderr, "emu: __byte_perm selector 0x%x sets a sign-replicate bit (not emulated)\n", s);
      std::abort();
    }
    r |= uint32_t((v >> (8 * sel)) & 0xFFu) << (8 * n);
  }
  return r;
}
/// Per 16-bit half unsigned min / max.
inline uint32_t __vminu2(uint32_t a, uint32_t b) {
  const uint32_t lo = std::min(a & 0xFFFFu, b & 0xFFFFu), hi = std::min(a >> 16, b >> 16);
  return lo | (hi << 16);
}
inline uint32_t __vmaxu2(uint32_t a, uint32_t b) {
  const uint32_t lo = std::max(a & 0xFFFFu, b & 0xFFFFu), hi = std::max(a >> 16, b >> 16);
  return lo | (hi << 16);
}

/// Per byte unsigned min / max.
inline uint32_t __vminu4(uint32_t a, uint32_t b) {
  uint32_t r = 0;
  for (int i = 0; i < 32; i += 8) r |= std::min((a >> i) & 0xFFu, (b >> i) & 0xFFu) << i;
  return r;
}
inline uint32_t __vmaxu4(uint32_t a, uint32_t b) {
  uint32_t r = 0;
  for (int i = 0; i < 32; i += 8) r |= std::max((a >> i) & 0xFFu, (b >> i) & 0xFFu) << i;
  return r;
}

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

/// A violation of the PTX / CUDA rules that the emulation checks (an mbarrier misuse, a TMA
/// argument outside the documented ranges, ...): reported with the CTA and thread, then the process
/// stops (the test that ran it fails).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "emu: CTA (%u, %u, %u) thread %u: %s\n", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
               what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Where the async copies (cp.async, TMA) land: kImmediate at issue (the earliest the hardware may
/// land them), kDeferred at the latest (when the thread waits for them: cp.async.wait_group, or a
/// wait on the mbarrier that counts them). See cuda/common/cp_async.cuh and emu_sm90.hpp.
enum class CpAsyncMode { kImmediate, kDeferred };
inline CpAsyncMode cp_async_mode = CpAsyncMode::kImmediate;

/// Shared-memory window layout (see the file comment).
constexpr uint32_t kSmemStatic = 0x400, kSmemStaticEnd = 0x800, kSmemDynamic = 0x810;
/// The sm_90 limit of dynamic shared memory per block (227 KiB).
constexpr size_t kSmemDynamicMax = 232448;

struct Sm90Cta;  // emu_sm90.hpp: mbarriers, async copies in flight, warpgroup MMA state

/// Per-CTA state of the emulation.
struct Cta {
  uint8_t* window = nullptr;  ///< the shared-memory window (shared address a = window[a])
  size_t window_bytes = 0;
  std::mutex mu;  ///< statics, reductions
  std::map<const void*, uint32_t> statics;
  uint32_t static_top = kSmemStatic;
  std::atomic<uint32_t> red{0};  ///< __syncthreads_or
  std::atomic<Sm90Cta*> sm90{nullptr};  ///< created on first use (emu_sm90.hpp)
  void (*sm90_finish)(Cta&) = nullptr;  ///< end-of-CTA checks and cleanup of sm90
};
inline thread_local Cta* cta = nullptr;

/// Offset in the window of the static shared variable keyed by `key` (allocated on first use).
inline uint32_t static_alloc(const void* key, size_t bytes, size_t align) {
  std::lock_guard<std::mutex> lock(cta->mu);
  auto it = cta->statics.find(key);
  if (it != cta->statics.end()) return it->second;
  const uint32_t off = uint32_t((cta->static_top + align - 1) / align * align);
  if (off + bytes > kSmemStaticEnd) fail("static shared variables exceed the emulated static region");
  cta->static_top = uint32_t(off + bytes);
  cta->statics.emplace(key, off);
  return off;
}
/// A static __shared__ variable of type T (SHARED_WINDOW rewrite: `__shared__ T name;` becomes
/// `auto& name = emu::shared_var<T>([] {});`, one lambda type per declaration and instantiation).
template <typename T, typename Tag>
inline T& shared_var(Tag) {
  static const char key = 0;
  const size_t align = alignof(T) > 16 ? alignof(T) : 16;
  return *reinterpret_cast<T*>(cta->window + static_alloc(&key, sizeof(T), align));
}
}  // namespace emu

/// Generic <-> shared-window address conversions (32-bit shared addresses are window offsets).
inline size_t __cvta_generic_to_shared(const void* p) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (!emu::cta || b < emu::cta->window || b >= emu::cta->window + emu::cta->window_bytes)
    emu::fail("__cvta_generic_to_shared of a pointer outside the CTA's shared-memory window");
  return size_t(b - emu::cta->window);
}
inline void* __cvta_shared_to_generic(size_t a) {
  if (!emu::cta || a >= emu::cta->window_bytes) emu::fail("__cvta_shared_to_generic of an address outside the window");
  return emu::cta->window + a;
}

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
inline bool __any_sync(unsigned m, bool pred) { return __ballot_sync(m, pred) != 0; }
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
  emu::Warp& w = *emu::warp_ctx;
  w.slot[emu::lane()] = v;
  w.bar->arrive_and_wait();
  unsigned r = ~0u;
  for (unsigned l = 0; l < 32; ++l) r = std::min(r, unsigned(w.slot[l]));
  w.bar->arrive_and_wait();
  return r;
}
/// CTA-wide OR (as __syncthreads: every thread of the CTA must reach it).
inline int __syncthreads_or(int pred) {
  emu_barrier->arrive_and_wait();  // the previous reduction's reads are done
  if (threadIdx.x == 0) emu::cta->red.store(0);
  emu_barrier->arrive_and_wait();
  if (pred) emu::cta->red.fetch_or(1);
  emu_barrier->arrive_and_wait();
  return int(emu::cta->red.load());
}
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
/// A __device__ variable is a host global here: its "device address" is its address.
template <typename T>
inline cudaError_t cudaGetSymbolAddress(void** p, T& symbol) {
  *p = static_cast<void*>(&symbol);
  return cudaSuccess;
}

namespace emu {

/// Every launch, in order (tests check which kernels a host path launched).
struct LaunchRecord {
  dim3 grid, block;
  size_t smem;
};
inline std::vector<LaunchRecord> launch_log;

/// kernel<<<grid, block, ...>>>(args) is rewritten as emu::launch(kernel, grid, block, ...)(args)
/// (the third argument, when given, is the dynamic shared memory in bytes). Each CTA gets a fresh
/// shared-memory window, poisoned with 0xCD bytes (as fresh shared memory may hold anything).
template <typename K>
struct Launch {
  K k;
  dim3 g, b;
  size_t smem = 0;
  template <typename... A>
  cudaError_t operator()(A... args) {
    if (smem > kSmemDynamicMax) {
      std::fprintf(stderr, "emu: %zu bytes of dynamic shared memory exceed the sm_90 limit of %zu\n", smem,
                   kSmemDynamicMax);
      return cudaErrorInvalidValue;
    }
    launch_log.push_back({g, b, smem});
    gridDim = g;
    blockDim = b;
    const size_t wbytes = (kSmemDynamic + smem + 16 + 4095) / 4096 * 4096;
    for (unsigned bz = 0; bz < g.z; ++bz)
      for (unsigned by = 0; by < g.y; ++by)
        for (unsigned bx = 0; bx < g.x; ++bx) {
          Cta c;
          std::unique_ptr<uint8_t, void (*)(void*)> win(static_cast<uint8_t*>(std::aligned_alloc(4096, wbytes)),
                                                       std::free);
          std::memset(win.get(), 0xCD, wbytes);
          c.window = win.get();
          c.window_bytes = wbytes;
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
              cta = &c;
              dyn_smem = c.window + kSmemDynamic;
              k(args...);
            });
          for (auto& th : ts) th.join();
          if (c.sm90_finish) {
            blockIdx = dim3(bx, by, bz);  // for the report of fail()
            c.sm90_finish(c);
          }
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
