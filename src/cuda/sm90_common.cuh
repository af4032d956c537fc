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

#include <type_traits>

#include "core/plan.hpp"

namespace lowbit::cuda {

/// The one runtime -> compile-time switch over the floating input dtypes (fp32 / fp16 / bf16):
/// returns f(std::integral_constant<DType, T>{}), or cudaErrorInvalidValue for another dtype.
template <typename F>
cudaError_t with_float_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(std::integral_constant<DType, DType::kFloat32>{});
    case DType::kFloat16: return f(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16: return f(std::integral_constant<DType, DType::kBFloat16>{});
    default: return cudaErrorInvalidValue;
  }
}

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
// Magic-number encoders of the fast quantize paths (sm90_quantize.cu). Each rounds with one
// fp32 add/FMA into a binade whose ulp is the target grid step (RNE ties = the reference's
// ties, since every magic constant has an even significand), so the code is an integer
// difference of fp32 bit patterns; the packers below take the biased values directly
// (acc * 16 + b_j) and remove the bias of the 8 nibbles with one subtraction.

/// E2M1 of a >= 0 (not NaN), given c = (f/2, f/4, f/8) where the value is a * f: the code is
/// min(n0, n1 + 2, n2 + 4, 7) with n0 = RNE(2af), n1 = RNE(af), n2 = RNE(af/2) (the E2M1 grid
/// has steps 0.5 / 1 / 2 on [0,2) / [2,4) / [4,6]; outside its own binade each candidate is
/// >= the true code). All three are taken in the binade [2^21, 2^22) (ulp 0.25), so they
/// share the bias kE2M1Bias and the result is kE2M1Bias + code. The products are exact
/// inside the FMA, so a * f need not be representable (MX: f = 2^k, up to 2^127).
constexpr uint32_t kE2M1Bias = 0x4A000000u;  // bits(2^21)
__device__ __forceinline__ uint32_t e2m1_biased(float a, float c0, float c1, float c2) {
  const uint32_t b0 = fbits(fmaf(a, c0, 2097152.0f));
  const uint32_t b1 = fbits(fmaf(a, c1, 2097152.5f));
  const uint32_t b2 = fbits(fmaf(a, c2, 2097153.0f));
  return min(min(b0, b1), min(b2, kE2M1Bias + 7u));
}

/// Round-half-even of v + 8 for |v| <= 8 as bits(v + 1.5 * 2^23 + 8) = kInt4Bias + 8 + rint(v).
constexpr uint32_t kInt4Bias = 0x4B400000u;  // bits(1.5 * 2^23)
constexpr float kInt4Magic = 12582920.0f;    // 1.5 * 2^23 + 8

/// Sign bits of 8 elements, placed at bit 3 of each element's nibble (element j at 4j + 3).
/// 16-bit types: w[0..3] hold elements (2i, 2i+1) as (low, high) halves; fp32: w[0..7].
template <bool k32>
__device__ __forceinline__ uint32_t nibble_signs8(const uint32_t* w) {
  uint32_t E, O;  // byte i: bit 7 = sign of element 2i (E) / 2i+1 (O)
  if (k32) {
    E = __byte_perm(__byte_perm(w[0], w[2], 0x0073), __byte_perm(w[4], w[6], 0x0073), 0x5410);
    O = __byte_perm(__byte_perm(w[1], w[3], 0x0073), __byte_perm(w[5], w[7], 0x0073), 0x5410);
  } else {
    const uint32_t X = __byte_perm(w[0], w[1], 0x7351), Y = __byte_perm(w[2], w[3], 0x7351);
    E = __byte_perm(X, Y, 0x5410);
    O = __byte_perm(X, Y, 0x7632);
  }
  return (O & 0x80808080u) | ((E >> 4) & 0x08080808u);
}

/// Correctly rounded x / s from y = RN(1/s) (the IEEE reciprocal) by two residual corrections:
///   q0 = RN(x y); q1 = RN(q0 - (q0 s - x) y); q2 = RN(q1 - (q1 s - x) y) = RN(x / s).
/// Why: q0 is within 1.5 ulp of x/s (|y - 1/s| <= 2^-24/s), so the exact q0 - (q0 s - x) y =
/// x/s + (1 - s y)(q0 - x/s) lies within 1.5 * 2^-24 ulp of x/s even with the residual rounded,
/// and q1 is faithful (within 1 ulp). For a faithful q1 the residual q1 s - x is exact (FMA)
/// and, y being RN(1/s), Markstein's theorem gives RN(q1 + (x - q1 s) y) = RN(x / s).
/// Preconditions (checked per block by the caller, fast_div_ok): 2^-60 <= s <= 2^100 and
/// |x| / s < 2^64. Then for |x / s| >= 2^-18 (every quotient that an fp8 / int4 encoder can
/// tell from 0) x, q and the residuals are normal (|residual| >= 2^(e_x - 47) >= 2^-125), so
/// the theorem applies; smaller quotients come out tiny (< 2^-17) with the sign of x, which is
/// all the encoders look at. The residual is formed as q s - x (not x - q s) so that x = -0
/// gives -0 like the IEEE division. sm90_selftest_encoders checks it on 2^32 (x, s) pairs.
__device__ __forceinline__ float div_by_recip(float x, float s, float y) {
  const float q0 = x * y;
  const float q1 = fmaf(-fmaf(q0, s, -x), y, q0);
  return fmaf(-fmaf(q1, s, -x), y, q1);
}
/// The preconditions of div_by_recip for every |x| <= amax (fp32 bits of amax and s).
__device__ __forceinline__ bool fast_div_ok(uint32_t amax_bits, uint32_t s_bits) {
  const int es = int(s_bits >> 23), ea = int(amax_bits >> 23);
  return s_bits < 0x7F800000u && es >= 127 - 60 && es <= 127 + 100 && ea - es < 63;
}

/// NF4 code lookup: cell k = RNE(16 v + 16) (k in [0, 32] for |v| <= 1 + 2^-23) covers a
/// closed interval of width 1/16, narrower than the smallest gap between NF4 thresholds
/// (0.0805), so it holds at most one threshold `thr` (+Inf if none); `base` counts the
/// thresholds below the cell. code(v) = base + (v > thr), the reference's count of thresholds
/// strictly below v.
struct NF4Cell {
  float thr;
  uint32_t base;
};
constexpr int kNF4Cells = 33;
__device__ __forceinline__ NF4Cell nf4_cell_init(int k) {
  const float lo = (float(k) - 0.5f) / 16.0f - 1.0f, hi = (float(k) + 0.5f) / 16.0f - 1.0f;  // exact
  NF4Cell c{__int_as_float(0x7F800000), 0u};
  for (int i = 0; i < 15; ++i) {
    const float t = nf4_threshold(i);
    if (t < lo) ++c.base;
    else if (t <= hi) c.thr = t;
  }
  return c;
}
__device__ __forceinline__ uint32_t nf4_cell_code(float v, const NF4Cell* cells) {
  const uint32_t k = fbits(fmaf(v, 16.0f, 8388624.0f)) - 0x4B000000u;  // 2^23 + 16
  const NF4Cell c = cells[k];
  return c.base + (v > c.thr ? 1u : 0u);
}

/// Elementwise min (kMax = false) or max of two bf16x2 / f16x2 words (a NaN lane gives the other
/// operand, as fminf / fmaxf).
template <bool kBf16, bool kMax>
__device__ __forceinline__ uint32_t minmax16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  if (kBf16 && kMax) asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  if (kBf16 && !kMax) asm("min.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  if (!kBf16 && kMax) asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  if (!kBf16 && !kMax) asm("min.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
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
