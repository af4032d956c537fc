// src/cuda/common/codecs.cuh: fast element codecs of the sm_90a kernels.
//
// * fast element codecs that use the hardware conversions (cvt.*.e4m3x2 / e5m2x2 / f16 / bf16)
//   where they are bit-identical to the software codecs of lowbit/codecs.hpp, with explicit
//   fix-ups for the cases where the hardware differs (NaN payloads, the non-saturating modes).
//   codec_selftest.cu holds an exhaustive self-test over all 2^32 fp32 inputs that proves each
//   fast encoder equal to its software definition (gpu_test_conversions runs it);
// * the x86 (SSE) NaN rules of the CPU reference for the few fp32 products whose NaN bits
//   reach an output (dequantize to fp32 / bf16), so even NaN payloads match byte for byte;
// * the magic-number encoders and the fast division of the quantize paths.
//
// The files that use them compile with -fmad=false --ftz=false --prec-div=true (the common
// and convert families in CMakeLists.txt): the block recipes of lowbit/block_quant.hpp then
// run with the same IEEE fp32 operations as on the host.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include "core/plan.hpp"

namespace lowbit::cuda {
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

}  // namespace dev
}  // namespace lowbit::cuda
