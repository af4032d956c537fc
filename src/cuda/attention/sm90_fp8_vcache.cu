// src/cuda/attention/sm90_fp8_vcache.cu: the FP8 V cache of the decode attention (the element rules
// of lowbit/vcache.hpp): fp8_vcache_quantize and fp8_vcache_append (lowbit/decode_attention.hpp).
//
// NOTES:
//  * quantize: the scale of a channel needs the amax of all its T tokens before any code is
//    written: kernel 1 zeroes the scales, kernel 2 folds the finite amax of chunks of 64 tokens into
//    them with atomicMax on the fp32 bits, kernel 3 turns each amax into its power-of-two scale,
//    kernel 4 writes the codes (a thread per element). One stream, no host synchronisation; v is
//    read twice.
//  * append: kernel 1, a thread per (b, h, d): the finite amax of the N new values; where it
//    outgrows the scale the scale is replaced (the old one kept in scratch) and the head is
//    flagged; kernel 2, CTAs over (b, h, chunk of tokens [0, len + N)): the new tokens encoded with
//    the final scale, the cached tokens of rescaled channels re-encoded from their values; chunks
//    of unflagged heads that hold no new token exit at once.
//  * arithmetic as the reference (src/ref/ref_vcache.cpp): x / s (IEEE), fp8(q) * s, the
//    hardware FP8 encoders with the fix-ups of codecs.cuh (equal to encode_e4m3 / encode_e5m2,
//    Saturate::kNone); built with the exact fp32 flags (LOWBIT_CUDA_EXACT_FILES).
#include <cstdint>

#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/attention/cache_append.cuh"
#include "cuda/attention/launch_decode.hpp"
#include "cuda/common/workspace.cuh"
#include "lowbit/block_quant.hpp"
#include "lowbit/vcache.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;

namespace vcache {

constexpr int kThreads = 256;
constexpr int kTokChunk = 64;

__device__ __forceinline__ int64_t at(const int64_t* s, int64_t b, int64_t t, int64_t h, int64_t d) {
  return b * s[0] + t * s[1] + h * s[2] + d * s[3];
}
__device__ __forceinline__ float* scale_at(const VCachePlan& p, int64_t b, int64_t h, int64_t d) {
  return p.scale + b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2];
}
/// The code of x under scale s (lowbit/vcache.hpp vcache_code, on the hardware encoders).
__device__ __forceinline__ uint8_t code_of(float x, float s, bool e5m2) {
  const float v = vcache_value(x, s);
  return uint8_t((e5m2 ? dev::enc_fp8x2<true>(v, 0.0f, Saturate::kNone) : dev::enc_fp8x2<false>(v, 0.0f, Saturate::kNone)) &
                 0xFFu);
}

// ---------------------------------------------------------------------------------------------
// quantize

__global__ void __launch_bounds__(kThreads) vc_zero_scale(const VCachePlan p) {
  const int64_t n = p.B * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, bh = i / p.D;
    *scale_at(p, bh / p.H, bh % p.H, d) = 0.0f;
  }
}

// a thread per (b, token chunk, h, d): the chunk's finite amax folded into the scale's bits
__global__ void __launch_bounds__(kThreads) vc_amax(const VCachePlan p, int64_t tchunks) {
  const int64_t n = p.B * tchunks * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, r = i / p.D, h = r % p.H, bt = r / p.H, tc = bt % tchunks, b = bt / tchunks;
    const int64_t t0 = tc * kTokChunk, t1 = t0 + kTokChunk < p.T ? t0 + kTokChunk : p.T;
    uint32_t amax = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const uint32_t a = finite_abs_bits(load_float(p.v, p.v_dtype, at(p.v_s, b, t, h, d)));
      amax = a > amax ? a : amax;
    }
    if (amax != 0) atomicMax(reinterpret_cast<unsigned*>(scale_at(p, b, h, d)), unsigned(amax));
  }
}

__global__ void __launch_bounds__(kThreads) vc_scale(const VCachePlan p) {
  const int64_t n = p.B * p.H * p.D;
  const float fmax = vcache_fp8_max(p.e5m2);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, bh = i / p.D;
    float* sp = scale_at(p, bh / p.H, bh % p.H, d);
    *sp = vcache_scale(*sp, fmax);
  }
}

// a thread per element (b, t, h, d)
__global__ void __launch_bounds__(kThreads) vc_encode(const VCachePlan p) {
  const int64_t n = p.B * p.T * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, r = i / p.D, h = r % p.H, bt = r / p.H, t = bt % p.T, b = bt / p.T;
    p.codes[at(p.c_s, b, t, h, d)] = code_of(load_float(p.v, p.v_dtype, at(p.v_s, b, t, h, d)), *scale_at(p, b, h, d), p.e5m2);
  }
}

// ---------------------------------------------------------------------------------------------
// append

struct AppendParams {
  VCachePlan c;  ///< v = v_new [B, N, H, D]; T = N
  CacheAppend x;
};

// a thread per (b, h, d)
__global__ void __launch_bounds__(kThreads) vc_append_scales(const AppendParams a) {
  const VCachePlan& p = a.c;
  const int64_t n = p.B * p.H * p.D;
  const float fmax = vcache_fp8_max(p.e5m2);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, bh = i / p.D, h = bh % p.H, b = bh / p.H;
    uint32_t amax = 0;
    for (int64_t j = 0; j < p.T; ++j) {
      const uint32_t v = finite_abs_bits(load_float(p.v, p.v_dtype, at(p.v_s, b, j, h, d)));
      amax = v > amax ? v : amax;
    }
    float* sp = scale_at(p, b, h, d);
    const float s_old = *sp, a_new = bits_float(amax);
    a.x.old_scale[i] = s_old;
    if (vcache_outgrows(a_new, s_old, fmax)) {
      *sp = vcache_scale(a_new, fmax);
      a.x.flag[bh] = 1;
    }
  }
}

// CTAs over items (b, h, token chunk) of [0, len + N); threads over (token, channel)
__global__ void __launch_bounds__(kThreads) vc_append_tokens(const AppendParams a) {
  const VCachePlan& p = a.c;
  const CacheAppend& x = a.x;
  const int64_t items = p.B * p.H * x.n_chunks;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t bh = it / x.n_chunks, t0 = (it - bh * x.n_chunks) * x.chunk, b = bh / p.H, h = bh - b * p.H;
    const int64_t len = x.len(b), end = len + p.T;
    const bool flagged = x.flag[bh] != 0;
    if (t0 >= end || (!flagged && t0 + x.chunk <= len)) continue;  // uniform over the CTA
    const int64_t t1 = t0 + x.chunk < end ? t0 + x.chunk : end;
    for (int64_t e = threadIdx.x; e < (t1 - t0) * p.D; e += kThreads) {
      const int64_t t = t0 + e / p.D, d = e % p.D;
      if (t < len && !flagged) continue;
      const float s = *scale_at(p, b, h, d);
      uint8_t* cp = p.codes + x.pages.offset(p.c_s, b, t) + h * p.c_s[2] + d * p.c_s[3];
      if (t >= len) {  // new token t - len, encoded with the final scale
        *cp = code_of(load_float(p.v, p.v_dtype, at(p.v_s, b, t - len, h, d)), s, p.e5m2);
        continue;
      }
      const float s_old = x.old_scale[bh * p.D + d];  // a cached token of a rescaled channel
      if (float_bits(s_old) != float_bits(s)) *cp = code_of(vcache_decode(*cp, s_old, p.e5m2), s, p.e5m2);
    }
  }
}

}  // namespace vcache

int fp8_vcache_quantize(const detail::VCachePlan& p, void* stream) {
  using namespace vcache;
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.B == 0 || p.H == 0 || p.D == 0) return cudaSuccess;
  const int64_t nbhd = p.B * p.H * p.D, tchunks = (p.T + kTokChunk - 1) / kTokChunk;
  vc_zero_scale<<<unsigned(grid_for(vc_zero_scale, kThreads, nbhd)), kThreads, 0, st>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && p.T > 0) {
    vc_amax<<<unsigned(grid_for(vc_amax, kThreads, nbhd * tchunks)), kThreads, 0, st>>>(p, tchunks);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    vc_scale<<<unsigned(grid_for(vc_scale, kThreads, nbhd)), kThreads, 0, st>>>(p);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && p.T > 0) {
    vc_encode<<<unsigned(grid_for(vc_encode, kThreads, nbhd * p.T)), kThreads, 0, st>>>(p);
    e = cudaGetLastError();
  }
  return e;
}

int fp8_vcache_append(const detail::VCacheAppendPlan& plan, void* stream) {
  using namespace vcache;
  return append_to_cache<vc_append_scales, vc_append_tokens, kThreads, AppendParams>(
      plan, [](int64_t D) { return D >= 4096 ? 1 : 4096 / D; }, static_cast<cudaStream_t>(stream));
}

}  // namespace lowbit::cuda
