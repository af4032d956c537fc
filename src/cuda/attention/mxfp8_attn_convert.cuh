// src/cuda/attention/mxfp8_attn_convert.cuh: element conversions and shared-memory layouts of the
// MXFP8 attention kernel.
//
// Both products run on bf16 wgmma: E4M3 x 2^e is exactly a bf16 value, so the per-32 scales of Q,
// K and V are folded into the operands without rounding (relative to a per-row exponent for Q and
// a per-head exponent for K and V; what remains is one power of two per query row, applied with
// the softmax scale, and one per head, applied to the output).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>  // E4M3 -> half conversions

#include <cstdint>

namespace lowbit::cuda::attention {

// ---- shared-memory layouts (byte offsets within a region) ----

/// K-major bf16 operand of `rows` rows, 128B swizzle: atoms of [rows][64 elements], 16-byte chunk
/// c of row r stored at chunk c ^ (r % 8). `col` is a multiple of 8 (one 16-byte chunk).
__device__ __forceinline__ uint32_t bf16_sw128_offset(int rows, int r, int col) {
  const int atom = col >> 6, chunk = (col & 63) >> 3;
  return uint32_t(atom * rows * 128 + r * 128 + ((chunk ^ (r & 7)) << 4));
}

/// wgmma shared-memory descriptor, K-major, swizzled rows of kRowBytes (128 or 64 bytes; 8-row groups
/// 8 * kRowBytes apart). Both paths: the bf16 operands here, the FP8 ones (mxfp8_attn_fp8_convert.cuh).
template <int kRowBytes>
__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;                          // leading byte offset: unused (swizzled K-major)
  d |= uint64_t((8 * kRowBytes) >> 4) << 32;       // stride byte offset: 8 rows
  d |= uint64_t(kRowBytes == 128 ? 1 : 2) << 62;   // 128B / 64B swizzle
  return d;
}

// ---- element conversions ----

/// Four E4M3 codes (bytes of w) -> two bf16x2 words holding code * 2^-120 exactly (the E4M3 bits
/// moved into the bf16 fields; subnormal codes land on bf16 subnormals of the same ratio).
/// NaN codes are not preserved (see has_nan_code).
__device__ __forceinline__ void e4m3x4_to_bf16x4_tiny(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = __byte_perm(w, 0, 0x1404);  // bytes 0, 1 -> bits 8..15, 24..31
  const uint32_t b = __byte_perm(w, 0, 0x3424);  // bytes 2, 3
  lo = ((a >> 4) & 0x07F007F0u) | (a & 0x80008000u);
  hi = ((b >> 4) & 0x07F007F0u) | (b & 0x80008000u);
}

/// True when a byte of w is an E4M3 NaN code (0x7F / 0xFF).
__device__ __forceinline__ bool has_nan_code(uint32_t w) {
  return (((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0;
}

/// bf16x2 multiply (round to nearest even); exact for power-of-two factors with normal results.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

/// bf16x2 with both halves 2^e (e in [-126, 127]); 0 below.
__device__ __forceinline__ uint32_t bf16x2_pow2(int e) {
  const uint32_t h = e >= -126 ? uint32_t(e + 127) << 7 : 0u;
  return h | (h << 16);
}

/// Replaces the halves of (lo, hi) whose source byte in w is a NaN code by a bf16 NaN.
__device__ __forceinline__ void patch_nan_codes(uint32_t w, uint32_t& lo, uint32_t& hi) {
  auto is_nan = [](uint32_t byte) { return (byte & 0x7Fu) == 0x7Fu; };
  if (is_nan(w & 0xFF)) lo = (lo & 0xFFFF0000u) | 0x7FC0u;
  if (is_nan((w >> 8) & 0xFF)) lo = (lo & 0x0000FFFFu) | 0x7FC00000u;
  if (is_nan((w >> 16) & 0xFF)) hi = (hi & 0xFFFF0000u) | 0x7FC0u;
  if (is_nan(w >> 24)) hi = (hi & 0x0000FFFFu) | 0x7FC00000u;
}

/// wgmma shared-memory descriptor, MN-major bf16, 128B swizzle: 64-element rows (one per K index),
/// 8-row atoms 1024 B apart along K, 64-element column groups `lbo` bytes apart along MN.
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t smem_addr, uint32_t lbo) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFF) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

/// Two floats -> bf16x2 (nearest even), x0 in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float x0, float x1) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// 2^x (MUFU.EX2; flushes subnormal results to zero: P below 2^-126 of the row maximum is 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// E4M3 code -> float (exact; NaN codes -> NaN).
__device__ __forceinline__ float e4m3_to_f32(uint32_t byte) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(byte & 0xFF), __NV_E4M3);
  return __half2float(__ushort_as_half(r.x));
}

}  // namespace lowbit::cuda::attention
