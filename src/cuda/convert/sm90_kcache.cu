// src/cuda/convert/sm90_kcache.cu: NF4 K cache with fp8 residual (quantize / dequantize).
//
// NOTES:
//  * quantize needs amax over all T tokens of each (b, h, d) before any code can be written:
//    kernel 1 zeroes the scales, kernel 2 splits T into chunks of 64 tokens and folds each
//    chunk's finite amax(|k|) into the scale with atomicMax on the fp32 bits (the scale IS the amax,
//    bits included), kernel 3 writes codes and residuals, one thread per 16 channels when the
//    channel dimension is contiguous (16-byte loads/stores), else per channel pair. k is read
//    twice (the amax pass and the encode pass); all three run on one stream, no host sync.
//  * dequantize: one thread per 16 channels of one (b, t, h): 8 B of codes + 16 B of residual
//    in, 16 outputs out; the per-channel scales are L1/L2 hits (shared by all T tokens).
//  * NaN / Inf: the scales are the finite amax (NaN / Inf tokens ignored), the residual of a
//    NaN / Inf token is stored without saturation (kcache_residual_saturate), as the reference.
//  * arithmetic as the reference, through the element rules of lowbit/kcache.hpp: x / s (IEEE),
//    x - nf4[q] * s (no FMA); NaN payloads of fp32 / bf16 outputs follow the reference's x86
//    rules (x86_mul / x86_add).
#include "cuda/common/launch.hpp"
#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/indexing.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/memory.cuh"
#include "cuda/common/static_switch.hpp"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;

namespace {

constexpr int kThreads = 256;
constexpr int kTokChunk = 64;

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uint64_t(a) == 0; }

__global__ void kc_zero_scale(const KCachePlan p) {
  const int64_t n = p.B * p.H * p.D;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % p.D, bh = i / p.D, h = bh % p.H, b = bh / p.H;
    p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]] = 0.0f;
  }
}

// one thread: (b, token chunk, h, channel pair); the dtype is a template argument so the
// unrolled token loop is straight-line code with its loads in flight together
template <DType T>
__global__ void __launch_bounds__(kThreads) kc_amax(const KCachePlan p, int64_t tchunks) {
  const int64_t D2 = p.D / 2;
  const int64_t n = p.B * tchunks * p.H * D2;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t dp = i % D2;
    int64_t r = i / D2;
    const int64_t h = r % p.H;
    r /= p.H;
    const int64_t tc = r % tchunks, b = r / tchunks;
    const int64_t t0 = tc * kTokChunk, t1 = t0 + kTokChunk < p.T ? t0 + kTokChunk : p.T;
    const int64_t base = b * p.k_s[0] + h * p.k_s[2] + 2 * dp * p.k_s[3];
    uint32_t a0 = 0, a1 = 0;
#pragma unroll 8
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = base + t * p.k_s[1];
      const uint32_t x0 = finite_abs_bits(load_float(p.k, T, o));  // NaN / Inf ignored
      const uint32_t x1 = finite_abs_bits(load_float(p.k, T, o + p.k_s[3]));
      a0 = x0 > a0 ? x0 : a0;
      a1 = x1 > a1 ? x1 : a1;
    }
    unsigned* s = reinterpret_cast<unsigned*>(p.scale) + b * p.s_s[0] + h * p.s_s[1] + 2 * dp * p.s_s[2];
    if (a0) atomicMax(s, a0);
    if (a1) atomicMax(s + p.s_s[2], a1);
  }
}

/// The NF4 encoder of the kernels: binary search over thresholds staged in shared memory.
struct SmemNF4Encode {
  const float* thr;
  __device__ __forceinline__ uint32_t operator()(float v) const { return dev::enc_nf4(v, thr); }
};

__device__ __forceinline__ uint32_t kc_code(float x, float s, const float* thr) {
  return kcache_code(x, s, SmemNF4Encode{thr});
}

// generic encode: one thread per (b, t, h, channel pair)
__global__ void __launch_bounds__(kThreads) kc_encode_generic(const KCachePlan p) {
  __shared__ float thr[16], cb[16];
  if (threadIdx.x < 16) {
    thr[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
    cb[threadIdx.x] = nf4_value(uint8_t(threadIdx.x));
  }
  __syncthreads();
  const int64_t D2 = p.D / 2;
  const int64_t n = p.B * p.T * p.H * D2;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t dp = i % D2;
    int64_t r = i / D2;
    const int64_t h = r % p.H;
    r /= p.H;
    const int64_t t = r % p.T, b = r / p.T;
    uint32_t code[2];
    for (int j = 0; j < 2; ++j) {
      const int64_t d = 2 * dp + j;
      const float s = p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]];
      const float x = load_float(p.k, p.k_dtype, b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3]);
      code[j] = kc_code(x, s, thr);
      const float res = kcache_residual(x, cb[code[j]], s);
      store_float(p.residual, p.r_dtype, b * p.r_s[0] + t * p.r_s[1] + h * p.r_s[2] + d * p.r_s[3], res,
                  kcache_residual_saturate(x));
    }
    p.codes[b * p.c_s[0] + t * p.c_s[1] + h * p.c_s[2] + dp * p.c_s[3]] =
        pack_nibbles(p.order, uint8_t(code[0]), uint8_t(code[1]));
  }
}

// vector encode: one thread per (b, t, h, 16 channels); channel dims contiguous
template <DType T>
__global__ void __launch_bounds__(kThreads) kc_encode_vec(const KCachePlan p, FastDiv d16, FastDiv hdiv, FastDiv tdiv,
                                                          int64_t units) {
  __shared__ float thr[16], cb[16];
  if (threadIdx.x < 16) {
    thr[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
    cb[threadIdx.x] = nf4_value(uint8_t(threadIdx.x));
  }
  __syncthreads();
  constexpr int kEsz = T == DType::kFloat32 ? 4 : 2;
  const bool e5 = p.r_dtype == DType::kE5M2;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < units; i += stride) {
    uint32_t r = d16.div(uint32_t(i));
    const uint32_t dc = uint32_t(i) - r * d16.d;
    const uint32_t rh = hdiv.div(r);
    const uint32_t h = r - rh * hdiv.d;
    const uint32_t b = tdiv.div(rh);
    const uint32_t t = rh - b * tdiv.d;
    dev::Chunk16<T> ch;
    ch.load(static_cast<const char*>(p.k) +
            (int64_t(b) * p.k_s[0] + int64_t(t) * p.k_s[1] + int64_t(h) * p.k_s[2] + int64_t(dc) * 16) * kEsz);
    const float4* sp = reinterpret_cast<const float4*>(p.scale + int64_t(b) * p.s_s[0] + int64_t(h) * p.s_s[1] +
                                                       int64_t(dc) * 16);
    float s[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 f = sp[q];
      s[4 * q] = f.x;
      s[4 * q + 1] = f.y;
      s[4 * q + 2] = f.z;
      s[4 * q + 3] = f.w;
    }
    uint32_t code[16];
    float res[16];
    bool nonfinite = false;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const float x = ch.get(e);
      code[e] = kc_code(x, s[e], thr);
      res[e] = kcache_residual(x, cb[code[e]], s[e]);
      nonfinite |= !is_finite_bits(dev::fbits(x));
    }
    uint2 cw = make_uint2(0, 0);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      cw.x |= pack_nibbles(p.order, uint8_t(code[e]), uint8_t(code[e + 1])) << (4 * e);
      cw.y |= pack_nibbles(p.order, uint8_t(code[8 + e]), uint8_t(code[9 + e])) << (4 * e);
    }
    dev::st_stream8(p.codes + int64_t(b) * p.c_s[0] + int64_t(t) * p.c_s[1] + int64_t(h) * p.c_s[2] + int64_t(dc) * 8,
                    cw);
    uint32_t rw[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      rw[q] = e5 ? dev::enc_fp8x4<true>(res + 4 * q, Saturate::kFinite) : dev::enc_fp8x4<false>(res + 4 * q, Saturate::kFinite);
    if (nonfinite) {  // NaN / Inf tokens: residual without saturation (kcache_residual_saturate)
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const float x = ch.get(e);
        if (is_finite_bits(dev::fbits(x))) continue;
        const uint32_t c = e5 ? encode_e5m2(res[e], Saturate::kNone) : encode_e4m3(res[e], Saturate::kNone);
        rw[e >> 2] = (rw[e >> 2] & ~(0xFFu << (8 * (e & 3)))) | (c << (8 * (e & 3)));
      }
    }
    dev::st_stream(p.residual + int64_t(b) * p.r_s[0] + int64_t(t) * p.r_s[1] + int64_t(h) * p.r_s[2] + int64_t(dc) * 16,
                   make_uint4(rw[0], rw[1], rw[2], rw[3]));
  }
}

// ---------------------------------------------------------------------------------------------
// dequantize

/// fp32 products and sums with the reference's x86 NaN rules.
struct X86Ops {
  static __device__ __forceinline__ float mul(float a, float b) { return dev::x86_mul(a, b); }
  static __device__ __forceinline__ float add(float a, float b) { return dev::x86_add(a, b); }
};

__device__ __forceinline__ float kc_value(uint32_t code, float s, const uint8_t* res, DType rt) {
  float v = kcache_decode<X86Ops>(uint8_t(code), s);
  if (res) v = kcache_add_residual<X86Ops>(v, rt == DType::kE5M2 ? decode_e5m2(*res) : decode_e4m3(*res));
  return v;
}

__global__ void __launch_bounds__(kThreads) kc_decode_generic(const KCachePlan p) {
  const int64_t n = p.B * p.T * p.H * p.D;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % p.D;
    int64_t r = i / p.D;
    const int64_t h = r % p.H;
    r /= p.H;
    const int64_t t = r % p.T, b = r / p.T;
    const uint8_t byte = p.codes[b * p.c_s[0] + t * p.c_s[1] + h * p.c_s[2] + (d / 2) * p.c_s[3]];
    const uint8_t code = unpack_nibble(p.order, byte, int(d & 1));
    const float s = p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]];
    const uint8_t* res = p.residual ? p.residual + b * p.r_s[0] + t * p.r_s[1] + h * p.r_s[2] + d * p.r_s[3] : nullptr;
    store_float(const_cast<void*>(p.k), p.k_dtype, b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3],
                kc_value(code, s, res, p.r_dtype));
  }
}

template <DType O>
__global__ void __launch_bounds__(kThreads) kc_decode_vec(const KCachePlan p, FastDiv d16, FastDiv hdiv, FastDiv tdiv,
                                                          int64_t units) {
  __shared__ float cb[16];
  if (threadIdx.x < 16) cb[threadIdx.x] = nf4_value(uint8_t(threadIdx.x));
  __syncthreads();
  const bool e5 = p.r_dtype == DType::kE5M2;
  const bool hi_first = p.order == NibbleOrder::kHighFirst;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < units; i += stride) {
    uint32_t r = d16.div(uint32_t(i));
    const uint32_t dc = uint32_t(i) - r * d16.d;
    const uint32_t rh = hdiv.div(r);
    const uint32_t h = r - rh * hdiv.d;
    const uint32_t b = tdiv.div(rh);
    const uint32_t t = rh - b * tdiv.d;
    const uint2 cw = dev::ld_stream8(p.codes + int64_t(b) * p.c_s[0] + int64_t(t) * p.c_s[1] + int64_t(h) * p.c_s[2] +
                                     int64_t(dc) * 8);
    uint32_t qw[2] = {cw.x, cw.y};
    if (hi_first) {
      qw[0] = ((qw[0] >> 4) & 0x0F0F0F0Fu) | ((qw[0] & 0x0F0F0F0Fu) << 4);
      qw[1] = ((qw[1] >> 4) & 0x0F0F0F0Fu) | ((qw[1] & 0x0F0F0F0Fu) << 4);
    }
    const float4* sp = reinterpret_cast<const float4*>(p.scale + int64_t(b) * p.s_s[0] + int64_t(h) * p.s_s[1] +
                                                       int64_t(dc) * 16);
    float s[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 f = sp[q];
      s[4 * q] = f.x;
      s[4 * q + 1] = f.y;
      s[4 * q + 2] = f.z;
      s[4 * q + 3] = f.w;
    }
    float v[16];
    bool nan = false;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = cb[(qw[e >> 3] >> ((e & 7) * 4)) & 0xFu] * s[e];
    }
    uint4 rw = make_uint4(0, 0, 0, 0);
    const uint8_t* rp = nullptr;
    if (p.residual) {
      rp = p.residual + int64_t(b) * p.r_s[0] + int64_t(t) * p.r_s[1] + int64_t(h) * p.r_s[2] + int64_t(dc) * 16;
      rw = dev::ld_stream(rp);
      const uint32_t ws[4] = {rw.x, rw.y, rw.z, rw.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float rr[2];
        if (e5) dev::dec_fp8x2<true>(ws[e >> 1] >> ((e & 1) * 16), rr);
        else dev::dec_fp8x2<false>(ws[e >> 1] >> ((e & 1) * 16), rr);
        v[2 * e] = v[2 * e] + rr[0];
        v[2 * e + 1] = v[2 * e + 1] + rr[1];
      }
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) nan |= v[e] != v[e];
    if (nan) {
#pragma unroll
      for (int e = 0; e < 16; ++e)
        v[e] = kc_value((qw[e >> 3] >> ((e & 7) * 4)) & 0xFu, s[e], rp ? rp + e : nullptr, p.r_dtype);
    }
    char* op = static_cast<char*>(const_cast<void*>(p.k)) +
               (int64_t(b) * p.k_s[0] + int64_t(t) * p.k_s[1] + int64_t(h) * p.k_s[2] + int64_t(dc) * 16) *
                   dtype_bytes(O);
    if (O == DType::kFloat32) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dev::st_stream(op + 16 * q, make_uint4(dev::fbits(v[4 * q]), dev::fbits(v[4 * q + 1]), dev::fbits(v[4 * q + 2]),
                                               dev::fbits(v[4 * q + 3])));
    } else {
      uint32_t w[8];
#pragma unroll
      for (int q = 0; q < 8; ++q)
        w[q] = O == DType::kBFloat16 ? dev::enc_bf16x2(v[2 * q], v[2 * q + 1])
                                     : uint32_t(dev::enc_f16(v[2 * q])) | (uint32_t(dev::enc_f16(v[2 * q + 1])) << 16);
      dev::st_stream(op, make_uint4(w[0], w[1], w[2], w[3]));
      dev::st_stream(op + 16, make_uint4(w[4], w[5], w[6], w[7]));
    }
  }
}

bool vec_ok(const KCachePlan& p) {
  const int esz = dtype_bytes(p.k_dtype);
  bool ok = p.D % 16 == 0 && p.k_s[3] == 1 && p.c_s[3] == 1 && p.s_s[2] == 1 && aligned(p.k, 16) &&
            aligned(p.codes, 8) && aligned(p.scale, 16) && p.B * p.T * p.H * (p.D / 16) < (int64_t(1) << 32);
  for (int i = 0; ok && i < 3; ++i) ok = (p.k_s[i] * esz) % 16 == 0 && p.c_s[i] % 8 == 0;
  for (int i = 0; ok && i < 2; ++i) ok = p.s_s[i] % 4 == 0;
  if (ok && p.residual) {
    ok = p.r_s[3] == 1 && aligned(p.residual, 16);
    for (int i = 0; ok && i < 3; ++i) ok = p.r_s[i] % 16 == 0;
  }
  return ok;
}

}  // namespace

int kcache_quantize(const KCachePlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.B * p.H * p.D == 0) return cudaSuccess;
  {
    const int64_t n = p.B * p.H * p.D;
    kc_zero_scale<<<unsigned(grid_for(kc_zero_scale, kThreads, n)), kThreads, 0, s>>>(p);
  }
  if (p.T == 0) return cudaGetLastError();
  const int64_t tchunks = (p.T + kTokChunk - 1) / kTokChunk;
  {
    const int64_t n = p.B * tchunks * p.H * (p.D / 2);
    const cudaError_t e = with_float_dtype(p.k_dtype, [&](auto t) {
      constexpr DType T = decltype(t)::value;
      kc_amax<T><<<unsigned(grid_for(kc_amax<T>, kThreads, n)), kThreads, 0, s>>>(p, tchunks);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  if (vec_ok(p)) {
    const int64_t units = p.B * p.T * p.H * (p.D / 16);
    const FastDiv d16(uint32_t(p.D / 16)), hd(uint32_t(p.H)), td(uint32_t(p.T));
    return with_float_dtype(p.k_dtype, [&](auto t) {
      constexpr DType T = decltype(t)::value;
      kc_encode_vec<T><<<unsigned(grid_for(kc_encode_vec<T>, kThreads, units)), kThreads, 0, s>>>(p, d16, hd, td, units);
      return cudaGetLastError();
    });
  }
  const int64_t n = p.B * p.T * p.H * (p.D / 2);
  kc_encode_generic<<<unsigned(grid_for(kc_encode_generic, kThreads, n)), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

int kcache_dequantize(const KCachePlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.B * p.T * p.H * p.D == 0) return cudaSuccess;
  if (vec_ok(p)) {
    const int64_t units = p.B * p.T * p.H * (p.D / 16);
    const FastDiv d16(uint32_t(p.D / 16)), hd(uint32_t(p.H)), td(uint32_t(p.T));
    return with_float_dtype(p.k_dtype, [&](auto t) {
      constexpr DType T = decltype(t)::value;
      kc_decode_vec<T><<<unsigned(grid_for(kc_decode_vec<T>, kThreads, units)), kThreads, 0, s>>>(p, d16, hd, td, units);
      return cudaGetLastError();
    });
  }
  const int64_t n = p.B * p.T * p.H * p.D;
  kc_decode_generic<<<unsigned(grid_for(kc_decode_generic, kThreads, n)), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace lowbit::cuda
