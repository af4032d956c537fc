// src/cuda/attention/mxfp8_attn_fp8_convert.cuh: the element work of the FP8 tensor-core path of
// the MXFP8 attention forward (precision kFp8): E4M3 re-rounding by a power of two, the
// shared-memory layouts of the FP8 wgmma operands, the V transpose units and the packing of P.
//
// Every operand of the FP8 path is an E4M3 code rescaled by 2^-k, k >= 0 (its scale relative to a
// reference exponent that is never smaller), rounded once to nearest even:
//   code (E4M3) -> f16 (exact) -> x 2^-k in f16 (exact for every result an E4M3 rounding can
//   resolve: a result >= 2^-10 keeps its 4 significant bits above 2^-24; a smaller one rounds to
//   at most 2^-10, which E4M3 rounds to 0 like the exact value) -> E4M3 (satfinite: never
//   reached, |x 2^-k| <= 448). NaN codes and a NaN scale (f = NaN) give NaN codes.
// All conversions are the cuda_fp8.h / cuda_fp16.h intrinsics (cvt.*.e4m3x2 on sm_89+). The
// element and index helpers are host-callable too (their host forms are the same arithmetic),
// for tests/cpp/attn_fp8_layout.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include "cuda/common/fp8_cvt.cuh"
#endif

namespace lowbit::cuda::attention::fp8 {

// ---- shared-memory layouts ----

/// Byte offset of byte `col` of row `r` in a K-major FP8 operand of `rows` rows stored in swizzle
/// atoms of kW bytes per row (kW = 128: 128B swizzle, 16-byte chunk c of row r at c ^ (r % 8);
/// kW = 64: 64B swizzle, chunk c at c ^ ((r / 2) % 4)); atoms along the row are rows * kW bytes
/// apart. This is the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B / _64B and boxes of kW
/// bytes, and the one the wgmma descriptors (smem_desc, mxfp8_attn_convert.cuh) describe.
template <int kW>
__host__ __device__ __forceinline__ uint32_t sw_offset(int rows, int r, int col) {
  static_assert(kW == 128 || kW == 64, "swizzle atom of 64 or 128 bytes");
  const int atom = col / kW, within = col % kW, chunk = within >> 4;
  const int sw = kW == 128 ? (r & 7) : ((r >> 1) & 3);
  return uint32_t(atom * rows * kW + r * kW + ((chunk ^ sw) << 4) + (within & 15));
}

/// Byte offset of the k32 step kk of a K-major FP8 operand of `rows` rows (kW-byte atoms).
template <int kW>
__host__ __device__ constexpr uint32_t k32_off(int rows, int kk) {
  return uint32_t((kk * 32 / kW) * rows * kW + (kk * 32) % kW);
}

/// The descriptor of the k32 step kk from the step-0 descriptor d: the start address field (bits
/// 0..13, address / 16) moved by the step's offset (shared memory < 256 KiB: no carry out of it).
template <int kW>
__device__ __forceinline__ uint64_t k32_desc(uint64_t d, int rows, int kk) {
  return d + (k32_off<kW>(rows, kk) >> 4);
}

// ---- E4M3 re-rounding ----

/// __byte_perm (PRMT) on the device, its definition on the host.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(a, b, sel);
#else
  const uint64_t x = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
#endif
}

/// f16 bits of 2^-k (k >= 0): exact down to the f16 subnormal 2^-24, 0 below (2^-25 ties to 0).
__host__ __device__ __forceinline__ uint32_t f16_pow2_neg(int k) {
  const int bits = (127 - (k < 126 ? k : 126)) << 23;
#ifdef __CUDA_ARCH__
  const float f = __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
#endif
  return __half_as_ushort(__float2half_rn(f));
}

/// The f16 factor of a scale byte s against the reference exponent ref (s <= ref unless NaN):
/// 2^(s - ref); NaN for s = 255.
__host__ __device__ __forceinline__ uint32_t f16_factor(int s, int ref) {
  return s == 255 ? 0x7E00u : f16_pow2_neg(ref - s);
}

/// Four E4M3 codes -> two f16x2 (bytes 0, 1 -> lo, 2, 3 -> hi), exact (NaN codes -> NaN).
__host__ __device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
#ifdef __CUDA_ARCH__
  e4m3x4_to_f16x2x2(w, lo, hi);
#else
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xFFFFu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  lo = uint32_t(a.x) | (uint32_t(a.y) << 16);
  hi = uint32_t(b.x) | (uint32_t(b.y) << 16);
#endif
}

/// Two f16x2 -> four E4M3 codes (nearest even, satfinite; NaN -> NaN), lo's halves in bytes 0, 1.
__host__ __device__ __forceinline__ uint32_t f16_to_e4m3x4(uint32_t lo, uint32_t hi) {
#ifdef __CUDA_ARCH__
  return f16x2x2_to_e4m3x4(lo, hi);
#else
  __half2_raw a, b;
  a.x = uint16_t(lo & 0xFFFFu);
  a.y = uint16_t(lo >> 16);
  b.x = uint16_t(hi & 0xFFFFu);
  b.y = uint16_t(hi >> 16);
  return uint32_t(__nv_cvt_halfraw2_to_fp8x2(a, __NV_SATFINITE, __NV_E4M3)) |
         (uint32_t(__nv_cvt_halfraw2_to_fp8x2(b, __NV_SATFINITE, __NV_E4M3)) << 16);
#endif
}

/// f16x2 product (nearest even; f16 keeps subnormals).
__host__ __device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b) {
  __half2 ha, hb;
  std::memcpy(&ha, &a, 4);
  std::memcpy(&hb, &b, 4);
  const __half2 p = __hmul2(ha, hb);
  uint32_t r;
  std::memcpy(&r, &p, 4);
  return r;
}

/// Four E4M3 codes times the f16x2 factor f (both halves), re-rounded to E4M3.
__host__ __device__ __forceinline__ uint32_t rescale_e4m3x4(uint32_t w, uint32_t f) {
  uint32_t lo, hi;
  e4m3x4_to_f16(w, lo, hi);
  return f16_to_e4m3x4(f16x2_mul(lo, f), f16x2_mul(hi, f));
}

// ---- V transpose ----
//
// PV runs with P from registers (the A operand) and V'^T in shared memory, K-major: one row per
// channel, kBlockN token bytes per row. The accumulator of S gives thread t (t = lane % 4) the
// keys {2t, 2t+1, 8+2t, 9+2t} (+16 for the second half) of each 32-key chunk, while the E4M3 A
// fragment of a k32 wgmma holds k = {4t .. 4t+3} (+16): so logical k of V'^T holds token
//   key(k) = (k & ~15) | ((k >> 2) & 3) * 2 | (k & 1) | ((k >> 1) & 1) * 8
// and P feeds the PV wgmma from the S registers without a shuffle. A transpose unit of the
// producer is 8 logical k (one 8-byte half of a 16-byte chunk: kc = k / 8) by kVC channels.

/// Token of logical k of V'^T within a key tile (the order above).
__host__ __device__ constexpr int v_key_of_k(int k) {
  return (k & ~15) | (((k >> 2) & 3) * 2) | (k & 1) | (((k >> 1) & 1) * 8);
}

/// Token (within the tile) of slot e (0..7) of the 8-logical-k unit kc: v_key_of_k(8 kc + e).
__host__ __device__ __forceinline__ int unit_token(int kc, int e) {
  const int w = 2 * (kc & 1) + (e >> 2), ee = e & 3;
  return (kc >> 1) * 16 + 2 * w + (ee & 1) + 8 * (ee >> 1);
}

/// One 4-channel group q of a transpose unit: raw[e][q] = word q (channels 4q .. 4q+3 of the
/// unit) of slot e's token; fp[E] = f16x2 factors of slots 2E (low half) and 2E+1 (high half).
/// Returns out[i][w'] = the E4M3 bytes of channel 4q + i for slots 4w' .. 4w'+3 (slot 4w' in the
/// low byte).
template <int kWords>
__host__ __device__ __forceinline__ void transpose_group(const uint32_t (&raw)[8][kWords], int q, const uint32_t (&fp)[4],
                                                uint32_t (&out)[4][2]) {
  uint32_t y[4][4];  // y[channel 4q + i][E]: f16x2 of slots 2E (low half), 2E + 1 (high half), scaled
#pragma unroll
  for (int E = 0; E < 4; ++E) {
    // bytes: [ch 0: slot 2E, 2E+1 | ch 1: 2E, 2E+1] and [ch 2 | ch 3]
    const uint32_t x01 = byte_perm(raw[2 * E][q], raw[2 * E + 1][q], 0x5140);
    const uint32_t x23 = byte_perm(raw[2 * E][q], raw[2 * E + 1][q], 0x7362);
    e4m3x4_to_f16(x01, y[0][E], y[1][E]);
    e4m3x4_to_f16(x23, y[2][E], y[3][E]);
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i][E] = f16x2_mul(y[i][E], fp[E]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i][0] = f16_to_e4m3x4(y[i][0], y[i][1]);
    out[i][1] = f16_to_e4m3x4(y[i][2], y[i][3]);
  }
}

// ---- P ----

/// The S accumulator (index within a 32-key chunk's 16 values: n8 blocks 4kc .. 4kc+3, entries
/// 4 j + {0, 1} row r0, 4 j + {2, 3} row r1) that byte `byte` of P fragment register `r` holds
/// (ALayout_64x32 of 8-bit wgmma: registers 0 / 1 rows r0 / r1 at k 4t .. 4t+3, registers 2 / 3
/// the same at k 16 + 4t ..; logical k holds key v_key_of_k(k)).
__host__ __device__ constexpr int p_frag_src(int r, int byte) {
  return (r >> 1) * 8 + (r & 1) * 2 + (byte >> 1) * 4 + (byte & 1);
}

/// Four floats -> four E4M3 codes (nearest even, satfinite), a in byte 0 .. d in byte 3.
__host__ __device__ __forceinline__ uint32_t f32x4_to_e4m3(float a, float b, float c, float d) {
#ifdef __CUDA_ARCH__
  return f32x4_to_e4m3x4(a, b, c, d);
#else
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3)) |
         (uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3)) << 16);
#endif
}

}  // namespace lowbit::cuda::attention::fp8
