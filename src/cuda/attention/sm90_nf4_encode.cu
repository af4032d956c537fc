// src/cuda/attention/sm90_nf4_encode.cu: the kernels that fill an NF4 + FP8-residual K cache
// (lowbit/decode_attention.hpp; reference: src/ref/ref_kcache_encode.cpp).
//
// kproj_rope_nf4_encode, three kernels on one stream (no host sync):
//   1. zero the scales;
//   2. projection + RoPE + amax: a CTA per (128 token rows, 32 channel pairs (c, c + D/2)), so a
//      thread holds both halves a rotation mixes in the epilogue. Two mainloops: for bf16 / fp16
//      x and w_k (tc_ok) mma.sync tensor cores with fp32 sums (within hidden x 2^-24 x sum |x w|
//      of the reference); otherwise a tiled CUDA-core GEMM whose products and sums are fp64: a
//      product of two fp32-exact values is exact in fp64, so the FMA equals the reference's
//      multiply-then-add, and each output sums over hidden in the reference's order (0, 1, 2,
//      ...): the fp32-rounded projection is bit for bit the reference's. RoPE in fp64 as the
//      reference: the frequencies from the host's
//      std::pow (D <= 512; the angles are then the reference's), cos and sin from the CUDA math
//      library, which may differ from the host's libm in the last fp64 bit: a key can then differ
//      by one fp32 ulp, very rarely. The rotated fp32 keys go to k_out (or pool scratch), and each
//      column's finite amax over the tile's rows of one sequence is folded into the scale with
//      atomicMax on the fp32 bits (the scale IS the amax, bits included);
//   3. encode: one thread per 16 channels of a (b, t, h) (16-byte loads / stores) when the cache
//      is contiguous along D, else per channel pair: codes and residuals by the kcache.hpp rule.
//   Bytes: the keys are written once (fp32) and read once by the encode.
//
// nf4_kcache_append, two kernels (lengths read on the device, clamped to [0, T - N]):
//   1. a thread per (b, h, channel): a = finite amax of the N new tokens, s = stored scale;
//      the old scale is kept in pool scratch, k_scale becomes a where a > s (the rescale), and
//      the (b, h) is flagged when any of its channels is rescaled;
//   2. CTAs over (b, h, chunk of tokens [0, lengths[b] + N)): new tokens are encoded with the
//      final scale; cached tokens of rescaled channels are decoded with the old scale
//      (nf4 * s + residual) and re-encoded with the new one; chunks of unflagged heads holding
//      no new token exit at once, so a step without rescale costs the N new tokens' bytes.
//
// The projection's kernels (step 2) and the constants and parameters shared with it are in
// nf4_encode_proj.cuh.
//
// Exact arithmetic: this file is compiled with -fmad=false --ftz=false --prec-div=true (see
// CMakeLists.txt), so x / s and x - nf4 * s are the IEEE fp32 operations of the reference.
// tests/cpp/emu also compiles this file for the CPU (host emulation against the reference): keep
// the launches in the kernel<<<grid, block, smem, stream>>>(args) form and the CUDA use within
// the shims there.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/attention/cache_append.cuh"
#include "cuda/attention/launch_decode.hpp"
#include "cuda/attention/nf4_encode_proj.cuh"
#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/indexing.cuh"
#include "cuda/common/memory.cuh"
#include "cuda/common/mma_sync.cuh"
#include "cuda/common/workspace.cuh"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda {
namespace kenc {
namespace {

__global__ void kc_zero_scale(const KCachePlan p) {
  const int64_t n = p.B * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % p.D, bh = i / p.D, h = bh % p.H, b = bh / p.H;
    p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]] = 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------
// encode of the fp32 keys (scales final): codes and residuals

/// The NF4 encoder of the kernels: binary search over thresholds staged in shared memory
/// (equal to encode_nf4 for every fp32 input: the codec self-test).
struct SmemNF4Encode {
  const float* thr;
  __device__ __forceinline__ uint32_t operator()(float v) const { return dev::enc_nf4(v, thr); }
};

__device__ __forceinline__ void stage_nf4(float* thr, float* cb) {
  if (threadIdx.x < 16) {
    thr[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
    cb[threadIdx.x] = nf4_value(uint8_t(threadIdx.x));
  }
  __syncthreads();
}

// one thread per (b, t, h, channel pair): any strides
__global__ void __launch_bounds__(kThreads) kc_encode_pairs(const KCachePlan p) {
  __shared__ float thr[16], cb[16];
  stage_nf4(thr, cb);
  const int64_t D2 = p.D / 2, n = p.B * p.T * p.H * D2;
  const float* k = static_cast<const float*>(p.k);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t dp = i % D2;
    int64_t r = i / D2;
    const int64_t h = r % p.H;
    r /= p.H;
    const int64_t t = r % p.T, b = r / p.T;
    uint32_t code[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t d = 2 * dp + j;
      const float s = p.scale[b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2]];
      const float x = k[b * p.k_s[0] + t * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3]];
      code[j] = kcache_code(x, s, SmemNF4Encode{thr});
      store_float(p.residual, p.r_dtype, b * p.r_s[0] + t * p.r_s[1] + h * p.r_s[2] + d * p.r_s[3],
                  kcache_residual(x, cb[code[j]], s), kcache_residual_saturate(x));
    }
    p.codes[b * p.c_s[0] + t * p.c_s[1] + h * p.c_s[2] + dp * p.c_s[3]] =
        pack_nibbles(p.order, uint8_t(code[0]), uint8_t(code[1]));
  }
}

// one thread per (b, t, h, 16 channels): 64 B of keys in, 8 B of codes and 16 B of residuals out
__global__ void __launch_bounds__(kThreads) kc_encode_vec(const KCachePlan p, FastDiv d16, FastDiv hdiv, FastDiv tdiv,
                                                          int64_t units) {
  __shared__ float thr[16], cb[16];
  stage_nf4(thr, cb);
  const bool e5 = p.r_dtype == DType::kE5M2;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < units; i += int64_t(gridDim.x) * kThreads) {
    const uint32_t r = d16.div(uint32_t(i));
    const uint32_t dc = uint32_t(i) - r * d16.d;
    const uint32_t rh = hdiv.div(r);
    const uint32_t h = r - rh * hdiv.d;
    const uint32_t b = tdiv.div(rh);
    const uint32_t t = rh - b * tdiv.d;
    dev::Chunk16<DType::kFloat32> ch;
    ch.load(static_cast<const float*>(p.k) + int64_t(b) * p.k_s[0] + int64_t(t) * p.k_s[1] + int64_t(h) * p.k_s[2] +
            int64_t(dc) * 16);
    const float4* sp =
        reinterpret_cast<const float4*>(p.scale + int64_t(b) * p.s_s[0] + int64_t(h) * p.s_s[1] + int64_t(dc) * 16);
    float s[16], res[16];
    uint32_t code[16];
    bool nonfinite = false;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = sp[v];
      s[4 * v] = f.x;
      s[4 * v + 1] = f.y;
      s[4 * v + 2] = f.z;
      s[4 * v + 3] = f.w;
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const float x = ch.get(e);
      code[e] = kcache_code(x, s[e], SmemNF4Encode{thr});
      res[e] = kcache_residual(x, cb[code[e]], s[e]);
      nonfinite |= !is_finite_bits(dev::fbits(x));
    }
    uint2 cw = make_uint2(0, 0);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      cw.x |= uint32_t(pack_nibbles(p.order, uint8_t(code[e]), uint8_t(code[e + 1]))) << (4 * e);
      cw.y |= uint32_t(pack_nibbles(p.order, uint8_t(code[8 + e]), uint8_t(code[9 + e]))) << (4 * e);
    }
    dev::st_stream8(p.codes + int64_t(b) * p.c_s[0] + int64_t(t) * p.c_s[1] + int64_t(h) * p.c_s[2] + int64_t(dc) * 8,
                    cw);
    uint32_t rw[4];
#pragma unroll
    for (int v = 0; v < 4; ++v)
      rw[v] = e5 ? dev::enc_fp8x4<true>(res + 4 * v, Saturate::kFinite) : dev::enc_fp8x4<false>(res + 4 * v, Saturate::kFinite);
    if (nonfinite) {  // NaN / Inf keys: residual without saturation (kcache_residual_saturate)
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        if (is_finite_bits(dev::fbits(ch.get(e)))) continue;
        const uint32_t c = e5 ? encode_e5m2(res[e], Saturate::kNone) : encode_e4m3(res[e], Saturate::kNone);
        rw[e >> 2] = (rw[e >> 2] & ~(0xFFu << (8 * (e & 3)))) | (c << (8 * (e & 3)));
      }
    }
    dev::st_stream(p.residual + int64_t(b) * p.r_s[0] + int64_t(t) * p.r_s[1] + int64_t(h) * p.r_s[2] + int64_t(dc) * 16,
                   make_uint4(rw[0], rw[1], rw[2], rw[3]));
  }
}

/// The vector encode applies: 16-channel pieces contiguous and aligned, unit count < 2^32.
bool vec_ok(const KCachePlan& p) {
  bool ok = p.D % 16 == 0 && p.k_s[3] == 1 && p.c_s[3] == 1 && p.s_s[2] == 1 && p.r_s[3] == 1 && aligned(p.k, 16) &&
            aligned(p.codes, 8) && aligned(p.scale, 16) && aligned(p.residual, 16) &&
            p.B * p.T * p.H * (p.D / 16) < (int64_t(1) << 32);
  for (int i = 0; ok && i < 3; ++i) ok = (p.k_s[i] * 4) % 16 == 0 && p.c_s[i] % 8 == 0 && p.r_s[i] % 16 == 0;
  for (int i = 0; ok && i < 2; ++i) ok = p.s_s[i] % 4 == 0;
  return ok;
}

cudaError_t encode(const KCachePlan& c, cudaStream_t st) {
  if (vec_ok(c)) {
    const int64_t units = c.B * c.T * c.H * (c.D / 16);
    const FastDiv d16(uint32_t(c.D / 16)), hd(uint32_t(c.H)), td(uint32_t(c.T));
    kc_encode_vec<<<unsigned(grid_for(kc_encode_vec, kThreads, units)), kThreads, 0, st>>>(c, d16, hd, td, units);
  } else {
    const int64_t n = c.B * c.T * c.H * (c.D / 2);
    kc_encode_pairs<<<unsigned(grid_for(kc_encode_pairs, kThreads, n)), kThreads, 0, st>>>(c);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// append

struct AppendParams {
  KCachePlan c;  ///< k = k_new [B, N, H, D]; T = N
  CacheAppend x;
};

// one thread per (b, h, channel)
__global__ void __launch_bounds__(kThreads) append_scales(const AppendParams a) {
  const KCachePlan& p = a.c;
  const int64_t n = p.B * p.H * p.D;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % p.D, bh = i / p.D, h = bh % p.H, b = bh / p.H;
    uint32_t amax = 0;
    for (int64_t j = 0; j < p.T; ++j) {
      const uint32_t v = finite_abs_bits(load_float(p.k, p.k_dtype, b * p.k_s[0] + j * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3]));
      amax = v > amax ? v : amax;
    }
    float* sp = p.scale + b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2];
    const float s_old = *sp, s_new = bits_float(amax);
    a.x.old_scale[i] = s_old;
    if (s_new > s_old) {
      *sp = s_new;
      a.x.flag[bh] = 1;
    }
  }
}

__device__ __forceinline__ uint8_t set_nibble(NibbleOrder o, uint8_t byte, int which, uint32_t code) {
  const int shift = (o == NibbleOrder::kLowFirst) == (which == 0) ? 0 : 4;
  return uint8_t((byte & ~(0xF << shift)) | ((code & 0xF) << shift));
}

/// Code of x under scale s; its residual stored at *res (the kcache.hpp rule; the hardware FP8
/// encoders with their fix-ups equal encode_e5m2 / encode_e4m3 in both saturation modes).
__device__ __forceinline__ uint32_t put(float x, float s, uint8_t* res, DType rt, const float* thr, const float* cb) {
  const uint32_t code = kcache_code(x, s, SmemNF4Encode{thr});
  const float r = kcache_residual(x, cb[code], s);
  const Saturate sat = kcache_residual_saturate(x);
  *res = uint8_t(rt == DType::kE5M2 ? dev::enc_fp8x2<true>(r, 0.0f, sat) : dev::enc_fp8x2<false>(r, 0.0f, sat));
  return code;
}

// CTAs over items (b, h, token chunk) of [0, len + N); threads over (token, channel pair)
__global__ void __launch_bounds__(kThreads) append_tokens(const AppendParams a) {
  __shared__ float thr[16], cb[16];
  stage_nf4(thr, cb);
  const KCachePlan& p = a.c;
  const CacheAppend& x = a.x;
  const int64_t D2 = p.D / 2, items = p.B * p.H * x.n_chunks;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t bh = it / x.n_chunks, t0 = (it - bh * x.n_chunks) * x.chunk, b = bh / p.H, h = bh - b * p.H;
    const int64_t len = x.len(b), end = len + p.T;
    const bool flagged = x.flag[bh] != 0;
    if (t0 >= end || (!flagged && t0 + x.chunk <= len)) continue;  // uniform over the CTA
    const int64_t t1 = t0 + x.chunk < end ? t0 + x.chunk : end;
    for (int64_t e = threadIdx.x; e < (t1 - t0) * D2; e += kThreads) {
      const int64_t t = t0 + e / D2, dp = e % D2, d = 2 * dp;
      if (t < len && !flagged) continue;
      const float* sp = p.scale + b * p.s_s[0] + h * p.s_s[1] + d * p.s_s[2];
      const float s_fin[2] = {sp[0], sp[p.s_s[2]]};
      uint8_t* cp = p.codes + x.pages.offset(p.c_s, b, t) + h * p.c_s[2] + dp * p.c_s[3];
      uint8_t* rp = p.residual + x.pages.offset(p.r_s, b, t) + h * p.r_s[2] + d * p.r_s[3];
      if (t >= len) {  // new token t - len, encoded with the final scale
        const int64_t ko = b * p.k_s[0] + (t - len) * p.k_s[1] + h * p.k_s[2] + d * p.k_s[3];
        const uint32_t c0 = put(load_float(p.k, p.k_dtype, ko), s_fin[0], rp, p.r_dtype, thr, cb);
        const uint32_t c1 = put(load_float(p.k, p.k_dtype, ko + p.k_s[3]), s_fin[1], rp + p.r_s[3], p.r_dtype, thr, cb);
        *cp = pack_nibbles(p.order, uint8_t(c0), uint8_t(c1));
        continue;
      }
      // a cached token: the rescaled channels of the pair (their stored bits changed) rewritten
      const float* so = x.old_scale + bh * p.D + d;
      const bool re[2] = {float_bits(so[0]) != float_bits(s_fin[0]), float_bits(so[1]) != float_bits(s_fin[1])};
      if (!re[0] && !re[1]) continue;
      uint8_t byte = *cp;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (!re[j]) continue;
        uint8_t* r = rp + j * p.r_s[3];
        const float rv = p.r_dtype == DType::kE5M2 ? decode_e5m2(*r) : decode_e4m3(*r);
        const float x = kcache_decode(unpack_nibble(p.order, byte, j), so[j], rv);
        byte = set_nibble(p.order, byte, j, put(x, s_fin[j], r, p.r_dtype, thr, cb));
      }
      *cp = byte;
    }
  }
}

}  // namespace
}  // namespace kenc

int kproj_rope_nf4_encode(const detail::KprojRopePlan& plan, void* stream) {
  using namespace kenc;
  const auto st = static_cast<cudaStream_t>(stream);
  const int64_t B = plan.batch, T = plan.seqlen, H = plan.heads_kv, D = plan.head_dim;
  if (B == 0 || T == 0 || H == 0 || D == 0) return cudaSuccess;  // as the reference: nothing written
  ProjParams q;
  q.p = plan;
  q.M = B * T;
  q.half = D / 2;
  q.P = H * q.half;
  q.host_freq = q.half <= kMaxHostFreq;
  for (int64_t c = 0; q.host_freq && c < q.half; ++c)  // the reference's expression, the host's pow
    q.inv_freq[c] = std::pow(plan.rope_theta, -double(2 * c) / double(D));
  const int64_t m_tiles = (q.M + kBM - 1) / kBM, p_tiles = (q.P + kBP - 1) / kBP;
  if (m_tiles > INT32_MAX || p_tiles > 65535) return cudaErrorInvalidConfiguration;
  void* own = nullptr;
  if (plan.k_out) {
    q.k = plan.k_out;
    for (int i = 0; i < 3; ++i) q.ks[i] = plan.ko_stride[i];
  } else {
    cudaMemPool_t pool;
    if (cudaError_t e = workspace_pool(&pool)) return e;
    if (cudaError_t e = cudaMallocFromPoolAsync(&own, size_t(q.M * H * D) * 4, pool, st)) return e;
    q.k = static_cast<float*>(own);
    q.ks[0] = T * H * D;
    q.ks[1] = H * D;
    q.ks[2] = D;
  }
  KCachePlan c = plan.cache;
  c.k = q.k;
  c.k_dtype = DType::kFloat32;
  for (int i = 0; i < 3; ++i) c.k_s[i] = q.ks[i];
  c.k_s[3] = 1;
  q.p.cache = c;
  kc_zero_scale<<<unsigned(grid_for(kc_zero_scale, kThreads, B * H * D)), kThreads, 0, st>>>(c);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    const dim3 grid{unsigned(m_tiles), unsigned(p_tiles)};
    if (!tc_ok(plan))
      kproj_rope_amax<<<grid, kThreads, 0, st>>>(q);
    else if (plan.x_dtype == DType::kFloat16)
      kproj_rope_amax_tc<true><<<grid, kThreads, 0, st>>>(q);
    else
      kproj_rope_amax_tc<false><<<grid, kThreads, 0, st>>>(q);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = encode(c, st);
  if (own) {
    const cudaError_t f = cudaFreeAsync(own, st);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

int nf4_kcache_append(const detail::KCacheAppendPlan& plan, void* stream) {
  using namespace kenc;
  return append_to_cache<append_scales, append_tokens, kThreads, AppendParams>(
      plan,
      [](int64_t D) {
        const int64_t D2 = D / 2;
        return D2 >= 2048 ? 1 : 4096 / D2;
      },
      static_cast<cudaStream_t>(stream));
}

int read_int32(const int32_t* device_src, int64_t n, int32_t* host_dst, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (n == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemcpyAsync(host_dst, device_src, size_t(n) * 4, cudaMemcpyDeviceToHost, st)) return e;
  return cudaStreamSynchronize(st);
}

}  // namespace lowbit::cuda
