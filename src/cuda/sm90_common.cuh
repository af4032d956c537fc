// src/cuda/sm90_common.cuh: device helpers shared by the sm_90a conversion kernels.
//
// * fast element codecs that use the hardware conversions (cvt.*.e4m3x2 / e5m2x2 / f16 / bf16)
//   where they are bit-identical to the software codecs of lowbit/codecs.hpp, with explicit
//   fix-ups for the cases where the hardware differs (NaN payloads, the non-saturating modes).
//   sm90_common.cu holds an exhaustive self-test over all 2^32 fp32 inputs that proves each
//   fast encoder equal to its software definition (gpu_test_conversions runs it);
// * the x86 (SSE) NaN rules of the CPU reference for the few fp32 products whose NaN bits
//   reach an output (dequantize to fp32 / bf16), so even NaN payloads match byte for byte;
// * 16-element vector loads, fast 32-bit division, grouped-layout (MoE) row maps.
//
// All kernels compile with -fmad=false --ftz=false --prec-div=true (CMakeLists.txt): the
// block recipes of lowbit/block_quant.hpp then run with the same IEEE fp32 operations as on
// the host.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include "core/plan.hpp"

namespace lowbit::cuda {

// ---------------------------------------------------------------------------------------------
// host helpers
struct DeviceInfo {
  int sms = 132;
};
const DeviceInfo& current_device_info();

/// Resident CTAs per SM of a kernel (cached per kernel; 4 when the query fails).
int occupancy(const void* kernel, int threads);

/// CTAs to launch for `units` work items of one thread each (grid-stride kernels): enough to
/// fill every SM at the kernel's occupancy, never more than the work needs.
template <typename Kernel>
inline int64_t grid_for(Kernel k, int threads, int64_t units, int per_sm_cap = 16) {
  const int occ = occupancy(reinterpret_cast<const void*>(k), threads);
  const int64_t full = int64_t(current_device_info().sms) * (occ < per_sm_cap ? occ : per_sm_cap);
  const int64_t need = (units + threads - 1) / threads;
  return need < full ? (need > 0 ? need : 1) : full;
}

/// Unsigned 32-bit division by a run-time constant (n < 2^32): q = (umulhi(n, m) + n) >> s.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    s = 0;
    while ((uint64_t(1) << s) < div) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - div)) / div + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return uint32_t((uint64_t(__umulhi(n, m)) + n) >> s);
  }
};

namespace dev {

// ---------------------------------------------------------------------------------------------
// bits
__device__ __forceinline__ uint32_t fbits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float bitsf(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ bool isnan_f(float x) { return x != x; }

// ---------------------------------------------------------------------------------------------
// x86 SSE NaN rules (the CPU reference is compiled for x86-64): a NaN result of a op b is
// a quieted if a is NaN, else b quieted if b is NaN, else the "real indefinite" 0xFFC00000.
__device__ __forceinline__ float x86_nan(float a, float b) {
  const uint32_t ua = fbits(a), ub = fbits(b);
  if ((ua & 0x7FFFFFFFu) > 0x7F800000u) return bitsf(ua | 0x400000u);
  if ((ub & 0x7FFFFFFFu) > 0x7F800000u) return bitsf(ub | 0x400000u);
  return bitsf(0xFFC00000u);
}
__device__ __forceinline__ float x86_mul(float a, float b) {
  const float r = a * b;
  return r != r ? x86_nan(a, b) : r;
}
__device__ __forceinline__ float x86_add(float a, float b) {
  const float r = a + b;
  return r != r ? x86_nan(a, b) : r;
}
__device__ __forceinline__ float x86_sub(float a, float b) {
  const float r = a - b;
  return r != r ? x86_nan(a, b) : r;
}

// ---------------------------------------------------------------------------------------------
// 8-bit float encoders. Hardware: cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, a, b puts a in the
// HIGH byte. Results equal encode_e4m3 / encode_e5m2 (both Saturate modes) for every fp32 input
// (sm90_selftest_encoders).
__device__ __forceinline__ uint16_t hw_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint16_t hw_e5m2x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

/// Fix-up of one hardware byte `h` for input v: NaN -> 0x7F (sign dropped, as the software
/// codec); Saturate::kNone: overflow -> NaN (E4M3, |v| > 464) or Inf (E5M2, |v| >= 61440).
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8_fix(uint32_t h, float v, Saturate sat) {
  // NOTE: satfinite hardware already maps every NaN to 0x7F (raw_hw_* self-test checks)
  if (sat == Saturate::kFinite) return h;
  const float a = fabsf(v);
  const bool over = kE5M2 ? !(a < 61440.0f) : !(a <= 464.0f);
  if (!over) return h;
  if (v != v) return 0x7Fu;
  return (fbits(v) >> 24 & 0x80u) | (kE5M2 ? 0x7Cu : 0x7Fu);
}

template <bool kE5M2>
__device__ __forceinline__ uint32_t enc_fp8x2(float lo, float hi, Saturate sat) {
  const uint32_t h = kE5M2 ? hw_e5m2x2(lo, hi) : hw_e4m3x2(lo, hi);
  return fp8_fix<kE5M2>(h & 0xFFu, lo, sat) | (fp8_fix<kE5M2>(h >> 8, hi, sat) << 8);
}

/// Four floats -> four fp8 bytes (element 0 in the low byte).
template <bool kE5M2>
__device__ __forceinline__ uint32_t enc_fp8x4(const float* v, Saturate sat) {
  return enc_fp8x2<kE5M2>(v[0], v[1], sat) | (enc_fp8x2<kE5M2>(v[2], v[3], sat) << 16);
}

/// Satfinite fast path without the NaN check (callers that know v is not NaN).
template <bool kE5M2>
__device__ __forceinline__ uint32_t enc_fp8x4_finite(const float* v) {
  const uint32_t a = kE5M2 ? hw_e5m2x2(v[0], v[1]) : hw_e4m3x2(v[0], v[1]);
  const uint32_t b = kE5M2 ? hw_e5m2x2(v[2], v[3]) : hw_e4m3x2(v[2], v[3]);
  return (a & 0xFFFFu) | (b << 16);
}

// ---------------------------------------------------------------------------------------------
// 8-bit / 16-bit float decoders (exact; NaN -> sign | 0x7FC00000 as decode_minifloat).
__device__ __forceinline__ float canon_nan(float v, uint32_t sign_src) {
  return v != v ? bitsf((sign_src & 0x80000000u) | 0x7FC00000u) : v;
}

/// Two fp8 codes (16 bits, element 0 low) -> two floats.
template <bool kE5M2>
__device__ __forceinline__ void dec_fp8x2(uint32_t codes, float* out) {
  uint32_t h2;
  if (kE5M2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(codes)));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(codes)));
  }
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  out[0] = f.x;
  out[1] = f.y;
}

__device__ __forceinline__ float dec_f16(uint16_t h) {
  const float v = __half2float(__ushort_as_half(h));
  return v != v ? bitsf((uint32_t(h & 0x8000u) << 16) | 0x7FC00000u) : v;
}

/// fp32 -> fp16 (RNE, overflow -> Inf, NaN -> 0x7E00) = encode_fp16.
__device__ __forceinline__ uint16_t enc_f16(float v) {
  return v != v ? uint16_t(0x7E00u) : __half_as_ushort(__float2half_rn(v));
}
/// fp32 pair -> bf16 pair (element 0 low) = encode_bf16 (NaN: sign and payload top kept).
__device__ __forceinline__ uint32_t enc_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  if (lo != lo) r = (r & 0xFFFF0000u) | ((fbits(lo) >> 16) | 0x40u);
  if (hi != hi) r = (r & 0x0000FFFFu) | (((fbits(hi) >> 16) | 0x40u) << 16);
  return r;
}

// ---------------------------------------------------------------------------------------------
// 4-bit encoders

/// E2M1 of v (= encode_e2m1): |v| < 1 rounds on the 0.5 grid through the 2^22 magic sum;
/// |v| >= 1 rounds the fp32 bits to one mantissa bit (RNE) and saturates at code 7.
/// NaN -> 0x7 (no sign), +-Inf -> sign | 7.
__device__ __forceinline__ uint32_t enc_e2m1(float v) {
  const uint32_t u = fbits(v);
  const uint32_t a = u & 0x7FFFFFFFu;
  // |v| < 1: multiples of 0.5 through the 2^22 magic sum (RNE)
  const uint32_t c_sub = fbits(bitsf(a) + 4194304.0f) - 0x4A800000u;
  // |v| >= 1: round the fp32 bits to (exponent, 1 mantissa bit), RNE, saturate at code 7
  const uint32_t r = (a + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22;
  const uint32_t c_nrm = min(r - 252u, 7u);
  const uint32_t c = (a < 0x3F800000u ? c_sub : c_nrm) | ((u >> 28) & 8u);
  return a > 0x7F800000u ? 7u : c;
}

/// NF4 code of x (= encode_nf4): the number of thresholds strictly below x, by binary search
/// over the 15 thresholds (t[15] holds +Inf as a sentinel); NaN compares false -> 0.
__device__ __forceinline__ uint32_t enc_nf4(float x, const float* t /* smem, 16 entries */) {
  uint32_t c = x > t[7] ? 8u : 0u;
  c += x > t[c + 3] ? 4u : 0u;
  c += x > t[c + 1] ? 2u : 0u;
  c += x > t[c] ? 1u : 0u;
  return c;
}

__device__ __forceinline__ uint32_t enc_int4(float v) {
  if (v != v) return 0u;
  float r = rintf(v);
  r = fminf(fmaxf(r, -8.0f), 7.0f);
  return uint32_t(int(r)) & 0xFu;
}

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

// ---------------------------------------------------------------------------------------------
// grouped (MoE) layouts: padded starts in shared memory

/// Group boundaries and padded starts of a grouped ScalePlan, staged in shared memory by
/// stage(); row maps then cost a binary search over G+1 shared entries.
struct GroupMap {
  const int64_t* ind = nullptr;    // [G+1] m_indptr (shared)
  const int64_t* start = nullptr;  // [G+1] padded starts (shared)
  int64_t G = 0;

  /// Stored row of logical row r.
  __device__ __forceinline__ int64_t stored_row(int64_t r) const {
    int64_t lo = 0, hi = G;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (ind[mid] <= r) lo = mid; else hi = mid;
    }
    return start[lo] + (r - ind[lo]);
  }
  /// Logical row stored at row s, or -1 for a padding row.
  __device__ __forceinline__ int64_t logical_row(int64_t s) const {
    int64_t lo = 0, hi = G;  // largest g < G with start[g] <= s
    if (s < start[0]) return -1;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (start[mid] <= s) lo = mid; else hi = mid;
    }
    const int64_t off = s - start[lo];
    return off < ind[lo + 1] - ind[lo] ? ind[lo] + off : -1;
  }
};

/// Largest G whose map is staged in shared memory (2 x 8 B x (G+1)).
constexpr int64_t kMaxSmemGroups = 2047;
/// Shared bytes of one staged map: ind + start (G+1 each) + 1024 scan slots.
inline size_t group_smem_bytes(const detail::ScalePlan& sp) {
  return sp.groups > 0 ? size_t(8 * (2 * (sp.groups + 1) + 1024)) : 0;
}

/// Stages m_indptr and the padded starts (exclusive scan for kCumsum) in `smem`; all threads
/// of the CTA call it (it synchronises).
__device__ inline GroupMap stage_groups(const detail::ScalePlan& sp, int64_t* smem) {
  GroupMap g;
  g.G = sp.groups;
  if (sp.groups == 0) return g;
  const int64_t n = sp.groups + 1;
  int64_t* ind = smem;
  int64_t* st = smem + n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    ind[i] = sp.indptr64 ? static_cast<const int64_t*>(sp.m_indptr)[i]
                         : int64_t(static_cast<const int32_t*>(sp.m_indptr)[i]);
  __syncthreads();
  if (sp.layout.group_pad == GroupPad::kFlashInfer) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st[i] = (ind[i] + i * 127) / 128 * 128;
  } else if (sp.layout.group_pad == GroupPad::kCumsum) {
    // st[g] = sum_{i<g} round_up(m_i, 128): each thread scans a contiguous piece, then the
    // piece totals are scanned by thread 0 over at most blockDim pieces.
    int64_t* piece = smem + 2 * n;  // blockDim.x <= 1024 slots
    const int64_t per = (n + blockDim.x - 1) / blockDim.x;
    const int64_t b = threadIdx.x * per, e = b + per < n ? b + per : n;
    int64_t s = 0;
    for (int64_t i = b; i < e; ++i) {
      st[i] = s;
      if (i + 1 < n) s += round_up(ind[i + 1] - ind[i], 128);
    }
    piece[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t acc = 0;
      for (unsigned t = 0; t < blockDim.x; ++t) {
        const int64_t v = piece[t];
        piece[t] = acc;
        acc += v;
      }
    }
    __syncthreads();
    for (int64_t i = b; i < e; ++i) st[i] += piece[threadIdx.x];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st[i] = ind[i];
  }
  __syncthreads();
  g.ind = ind;
  g.start = st;
  return g;
}

/// Offset of logical (l, r, c) in plan sp (grouped: through the staged map).
__device__ __forceinline__ int64_t scale_off(const detail::ScalePlan& sp, const GroupMap& gm, int64_t l, int64_t r,
                                             int64_t c) {
  const int64_t sr = sp.groups > 0 ? gm.stored_row(r) : r;
  return l * sp.batch_stride + scale_offset(sp.layout, sp.rows_pad, sp.cols, sr, c);
}

}  // namespace dev
}  // namespace lowbit::cuda
