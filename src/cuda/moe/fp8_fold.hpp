// src/cuda/moe/fp8_fold.hpp: the arithmetic of the MXFP4 grouped GEMM's FP8 tensor-core path
// (GemmPrecision::kFp8TensorCores; docs/design/moe_grouped_gemm.md, "FP8 tensor-core path"):
// folding a weight row's UE8M0 scale into E4M3 codes, the E2M1 -> E4M3 decode of the FP8-path
// packed words (lowbit/mxfp4_pack.hpp) and the fp32 multipliers of the promotion. Pure functions of
// bits, host and device (no CUDA types), so that tests/cpp/test_group_gemm_fp8.cpp checks them
// exhaustively on the CPU against the exact decoders.
//
// Fold. A K block of 32 of a 128-row tile holds weights e2m1 * 2^(s_r - 127) with one scale byte
// s_r per row. With smax the largest s_r of the block (rows < N), row r's codes go to the tensor
// cores as E4M3 bytes of e2m1 * 2^(D_r - 6), D_r = s_r + 12 - smax, and the block's weights are those
// E4M3 values times 2^(smax - 133) (shared by every row). e2m1 * 2^(D - 6) is exact in E4M3 for
// every code exactly when D is in [-2, 12]: the largest value 6 * 2^6 = 384 <= 448, the smallest
// 0.5 * 2^-8 = 2^-9 is E4M3's smallest subnormal, and every value in between is a multiple of 2^-9
// with at most 2 significant bits (E2M1 has one mantissa bit). (D = 13 would give 768, D = -3 gives
// 2^-10.) So the fold is exact for blocks whose bytes spread by at most kFoldSpread = 14. Blocks that
// spread wider, or hold a byte above kFoldMaxScale (253, 254: decoded weights near fp32's top; 255:
// NaN), take the slow form: codes as E4M3 e2m1 (D = 6 on every row) and the promotion multiplies by
// the row's 2^(s_r - 127) too.
//
// Promotion. The wgmma of one K block (scale-d 0) gives P[r, c] = sum_k w8[r, k] a8[c, k]; the
// fp32 total gets P * m[c] with m[c] = 2^(smax + sa_c - 260) (fast block: the weights' 2^(smax -
// 133) times the activation's 2^(sa_c - 127)), or (slow) (P * 2^(s_r - 127)) * 2^(sa_c - 127). A
// block whose m[c] of some column leaves fp32's normal range takes the slow form too, so the fast
// form never flushes a multiplier. The slow form is exact up to its one rounding while P * 2^(s_r -
// 127) stays normal: a nonzero |P| lies in [2^-18, 2^23] with E4M3 activations (products of
// 2^-9 .. 448, 32 terms) and in [2^-25, 2^30] with E5M2 (2^-16 .. 57344), so for weight scale
// bytes in [26, 225] with either; outside (weights below 2^-100 or above 2^98) results may flush or
// overflow where the fp64 reference does not.
#pragma once

#include <cstdint>

#include "lowbit/config.hpp"

namespace lowbit::cuda::fp8 {

/// Largest spread (max - min) of a block's weight scale bytes that the fold takes.
constexpr uint32_t kFoldSpread = 14;
/// Largest weight scale byte the fold takes (253, 254 decode near fp32's top; 255 is NaN).
constexpr uint32_t kFoldMaxScale = 252;
/// D of the slow form (codes as e2m1 exactly: e2m1 * 2^0).
constexpr uint32_t kSlowD = 6;

/// A block folds (one FFMA per element in the promotion) when its bytes (rows < N) spread by at
/// most kFoldSpread and none exceeds kFoldMaxScale.
LOWBIT_HOST_DEVICE constexpr bool block_folds(uint32_t smin, uint32_t smax) {
  return smax <= kFoldMaxScale && smax - smin <= kFoldSpread;
}
/// D of a row with scale byte s in a block with largest byte smax: s + 12 - smax for a folding
/// block (clamped to [-2, 12]: only rows >= N, whose codes are zero, fall outside), kSlowD otherwise.
LOWBIT_HOST_DEVICE constexpr int fold_d(uint32_t s, bool folds, uint32_t smax) {
  if (!folds) return int(kSlowD);
  const int d = int(s) + 12 - int(smax);
  return d < -2 ? -2 : (d > 12 ? 12 : d);
}
/// E4M3 byte of (1 + h/2) * 2^e (h = 0, 1) for e in [-9, 8] (h = 0 at e = -9): normal from 2^-6
/// (biased exponent e + 7, mantissa bit 2 for the half), else the subnormal (2 + h) * 2^(e + 8) * 2^-9.
LOWBIT_HOST_DEVICE constexpr uint32_t e4m3_pow2(int e, uint32_t h) {
  return e >= -6 ? (uint32_t(e + 7) << 3) | (h << 2) : e >= -8 ? (2u + h) << (e + 8) : 1u;
}
/// The lookup table of a row, for D in [-2, 12]: byte i (0..7) of {hi:lo} is the E4M3 encoding of
/// E2M1 magnitude i times 2^(D - 6), i.e. 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2^(D - 6). Byte 0 is 0 for
/// every D, so a zero code stays zero. For D >= 1 (every byte a normal) two IMADs:
/// 0x0C080000 + D * 0x08080800 and 0x1C181410 + D * 0x08080808 (no carries between bytes).
LOWBIT_HOST_DEVICE constexpr uint32_t fold_lo(int D) {
  return D >= 1 ? 0x0C080000u + uint32_t(D) * 0x08080800u
                : (e4m3_pow2(D - 7, 0) << 8) | (e4m3_pow2(D - 6, 0) << 16) | (e4m3_pow2(D - 6, 1) << 24);
}
LOWBIT_HOST_DEVICE constexpr uint32_t fold_hi(int D) {
  return D >= 1 ? 0x1C181410u + uint32_t(D) * 0x08080808u
                : e4m3_pow2(D - 5, 0) | (e4m3_pow2(D - 5, 1) << 8) | (e4m3_pow2(D - 4, 0) << 16) |
                      (e4m3_pow2(D - 4, 1) << 24);
}

/// __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y:x}.
LOWBIT_HOST_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
  return r;
#endif
}
/// The E4M3 bytes of the A half (elements 0..3: K = 4t + i of the block) and of the B half
/// (elements 4..7: K = 16 + 4t + i) of an FP8-path packed word, through the row's table:
/// one PRMT for the magnitudes (the selector's fourth bits are masked off), the signs ORed in.
LOWBIT_HOST_DEVICE uint32_t decode_a(uint32_t x, uint32_t lo, uint32_t hi) {
  return byte_perm(lo, hi, x) | (x & 0x80808080u);
}
LOWBIT_HOST_DEVICE uint32_t decode_b(uint32_t x, uint32_t lo, uint32_t hi) {
  return byte_perm(lo, hi, x >> 16) | ((x << 4) & 0x80808080u);
}

/// fp32 bits of 2^e, clamped to fp32's range: 2^127 above it, subnormals down to 2^-149, 0 below.
LOWBIT_HOST_DEVICE constexpr uint32_t pow2_bits(int e) {
  return e > 127 ? 0x7F000000u : e >= -126 ? uint32_t(e + 127) << 23 : e >= -149 ? 1u << (e + 149) : 0u;
}
constexpr uint32_t kNanBits = 0x7FC00000u;
/// fp32 bits of the promotion's column multiplier for activation scale byte sa: 2^(smax + sa -
/// 260) in a folding block, 2^(sa - 127) in a slow one; NaN for the NaN byte 255.
LOWBIT_HOST_DEVICE constexpr uint32_t col_mult_bits(uint32_t sa, bool folds, uint32_t smax) {
  return sa == 255u ? kNanBits : pow2_bits(folds ? int(smax) + int(sa) - 260 : int(sa) - 127);
}
/// The folding block's column multiplier 2^(smax + sa - 260) is an fp32 normal (or the NaN of sa =
/// 255): the fast form's one FFMA then rounds like the exact path's products. A block with a column
/// outside takes the slow form.
LOWBIT_HOST_DEVICE constexpr bool col_mult_normal(uint32_t sa, uint32_t smax) {
  return sa == 255u || (int(smax) + int(sa) - 260 >= -126 && int(smax) + int(sa) - 260 <= 127);
}
/// fp32 bits of the slow form's row multiplier 2^(s - 127) (NaN for 255): the exact UE8M0 value.
LOWBIT_HOST_DEVICE constexpr uint32_t row_mult_bits(uint32_t s) { return s == 255u ? kNanBits : pow2_bits(int(s) - 127); }

}  // namespace lowbit::cuda::fp8
