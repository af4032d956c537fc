// src/cuda/convert/sm90_tensor_amax.cu: tensor amax, max(|x|) over the finite elements of a
// [L, M, K] strided fp32 / fp16 / bf16 tensor (NaN and +-Inf ignored, as ref::amax_bits).
// Also the first pass of NVFP4 quantize with compute_global_amax (sm90_quantize.cu).
//
// NOTES:
//  * Vector kernel (K % 16 == 0, 16-byte aligned rows): one thread reads 16-element chunks;
//    otherwise one element per thread. Warp max by __reduce_max_sync, then one atomicMax on the
//    bits of |x| per warp (non-negative floats order as their bits).
//  * *out is zeroed on the stream first (cudaMemsetAsync): no host sync.
#include "cuda/common/launch.hpp"
#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/memory.cuh"

namespace lowbit::cuda {
using namespace lowbit::detail;

namespace {

constexpr int kThreads = 256;

// amax(|x|) over the finite elements into *out as max of bits (NaN and +-Inf ignored, as
// ref::amax_bits); *out must be zeroed first.

template <DType T, bool kVec>
__global__ void __launch_bounds__(kThreads) amax_kernel(const void* x, int64_t L, int64_t M, int64_t K, int64_t sL,
                                                        int64_t sM, unsigned* out) {
  (void)L;
  uint32_t am = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  if (kVec) {
    constexpr int kEsz = T == DType::kFloat32 ? 4 : 2;
    const int64_t cpr = K / 16, total = L * M * cpr;
    for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < total; u += stride) {
      const int64_t row = u / cpr, j = u - row * cpr;
      const int64_t l = row / M, m = row - l * M;
      dev::Chunk16<T> ch;
      ch.load(static_cast<const char*>(x) + (l * sL + m * sM + j * 16) * kEsz);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t b = finite_abs_bits(ch.get(i));
        am = b > am ? b : am;
      }
    }
  } else {
    const int64_t total = L * M * K;
    for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < total; u += stride) {
      const int64_t row = u / K, k = u - row * K;
      const int64_t l = row / M, m = row - l * M;
      const uint32_t b = finite_abs_bits(load_float(x, T, l * sL + m * sM + k));
      am = b > am ? b : am;
    }
  }
  am = __reduce_max_sync(0xFFFFFFFFu, am);
  if ((threadIdx.x & 31) == 0 && am) atomicMax(out, am);
}

template <DType T>
cudaError_t launch_amax_t(const void* x, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM, float* out,
                          cudaStream_t s) {
  const int esz = T == DType::kFloat32 ? 4 : 2;
  const bool vec = K % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && (M <= 1 || (sM * esz) % 16 == 0) &&
                   (L <= 1 || (sL * esz) % 16 == 0);
  const int64_t work = vec ? L * M * (K / 16) : L * M * K;
  if (vec) {
    const int64_t g = grid_for(amax_kernel<T, true>, kThreads, work);
    amax_kernel<T, true><<<unsigned(g), kThreads, 0, s>>>(x, L, M, K, sL, sM, reinterpret_cast<unsigned*>(out));
  } else {
    const int64_t g = grid_for(amax_kernel<T, false>, kThreads, work);
    amax_kernel<T, false><<<unsigned(g), kThreads, 0, s>>>(x, L, M, K, sL, sM, reinterpret_cast<unsigned*>(out));
  }
  return cudaGetLastError();
}

cudaError_t launch_amax(const void* x, DType t, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM, float* out,
                        cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(float), s);
  if (e != cudaSuccess) return e;
  if (L * M * K == 0) return cudaSuccess;
  switch (t) {
    case DType::kFloat32: return launch_amax_t<DType::kFloat32>(x, L, M, K, sL, sM, out, s);
    case DType::kFloat16: return launch_amax_t<DType::kFloat16>(x, L, M, K, sL, sM, out, s);
    case DType::kBFloat16: return launch_amax_t<DType::kBFloat16>(x, L, M, K, sL, sM, out, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int tensor_amax(const void* x, DType t, int64_t L, int64_t M, int64_t K, int64_t sL, int64_t sM, float* out,
                void* stream) {
  return launch_amax(x, t, L, M, K, sL, sM, out, static_cast<cudaStream_t>(stream));
}

}  // namespace lowbit::cuda
