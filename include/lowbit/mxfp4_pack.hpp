// lowbit/mxfp4_pack.hpp: the prepacked MXFP4 weight layout of the sm_90a grouped GEMM and MoE MLP
// (group_gemm_mxfp4_prepack). Host and device.
//
// Shapes: packed_b [G, Np, Kp/2] uint8 and packed_scale [G, Np, Kp/32] uint8 (row-major), with
// Np = N rounded up to 128 and Kp = K rounded up to 256; padding rows / K are zero codes with
// scale byte 127. Each little-endian 32-bit word of a row still holds the 8 elements 8w .. 8w+7,
// with its bits reordered so that the kernel turns the word into the four bf16x2 pairs
// (e0, e1), (e2, e3), (e4, e5), (e6, e7) — each as e2m1 * 2^-126 in bf16 bits: sign at bit 15,
// exponent/mantissa bits e1 e0 m at bits 8..6 — with one mask (and a shift) per pair:
//   pair 0: x & 0x81C081C0          pair 1: (x << 3) & 0x81C081C0
//   pair 2: (x << 6) & 0x81C081C0   pair 3: ((x >> 4) & 0x00C000C0) | ((x >> 5) & 0x01000100) | ((x << 1) & 0x80008000)
// Element 2p of pair p (low half) and 2p + 1 (high half, +16 bits): pairs 0..2 keep the 3 code bits
// at 6-3p .. 8-3p and the sign at 15-3p; pair 3 keeps them at 10, 11, 13 and the sign at 14.
#pragma once

#include <cstdint>

#include "lowbit/config.hpp"

namespace lowbit {

constexpr int64_t kMxfp4PackRows = 128;  ///< Np = N rounded up to this
constexpr int64_t kMxfp4PackK = 256;     ///< Kp = K rounded up to this
constexpr uint8_t kMxfp4PackPadScale = 127;
/// Np and Kp of the packed tensors for N rows of K elements.
constexpr int64_t mxfp4_packed_rows(int64_t N) { return (N + kMxfp4PackRows - 1) / kMxfp4PackRows * kMxfp4PackRows; }
constexpr int64_t mxfp4_packed_k(int64_t K) { return (K + kMxfp4PackK - 1) / kMxfp4PackK * kMxfp4PackK; }

namespace detail {

/// Bit of the packed word that holds bit `i` (0..3: m, e0, e1, sign) of element e (0..7).
LOWBIT_HOST_DEVICE constexpr int mxfp4_pack_bit(int e, int i) {
  const int p = e >> 1, h = 16 * (e & 1);
  if (p < 3) return h + (i < 3 ? 6 - 3 * p + i : 15 - 3 * p);
  constexpr int kP3[4] = {10, 11, 13, 14};
  return h + kP3[i];
}

}  // namespace detail

/// The packed word of 8 naturally ordered E2M1 nibbles (element e in bits 4e .. 4e+3).
LOWBIT_HOST_DEVICE uint32_t mxfp4_pack_word(uint32_t natural) {
  uint32_t r = 0;
  for (int e = 0; e < 8; ++e)
    for (int i = 0; i < 4; ++i) r |= ((natural >> (4 * e + i)) & 1u) << detail::mxfp4_pack_bit(e, i);
  return r;
}

/// Pair q (0..3) of a packed word as bf16x2 bits of e2m1 * 2^-126: elements 2q (low half) and
/// 2q + 1 (high half). The kernel's decode; q is a compile-time constant there.
LOWBIT_HOST_DEVICE constexpr uint32_t mxfp4_packed_pair(uint32_t x, int q) {
  constexpr uint32_t kM = 0x81C081C0u;
  return q == 0   ? x & kM
         : q == 1 ? (x << 3) & kM
         : q == 2 ? (x << 6) & kM
                  : ((x >> 4) & 0x00C000C0u) | ((x >> 5) & 0x01000100u) | ((x << 1) & 0x80008000u);
}

/// E2M1 code of element e (0..7) of a packed word.
LOWBIT_HOST_DEVICE uint32_t mxfp4_packed_code(uint32_t packed, int e) {
  uint32_t c = 0;
  for (int i = 0; i < 4; ++i) c |= ((packed >> detail::mxfp4_pack_bit(e, i)) & 1u) << i;
  return c;
}

/// E2M1 code of element k of a weight row (`packed`: a row of packed_b, 4-byte aligned).
LOWBIT_HOST_DEVICE uint32_t mxfp4_row_code(const uint8_t* row, int64_t k, bool packed) {
  if (!packed) return (row[k >> 1] >> ((k & 1) * 4)) & 0xFu;
  const uint8_t* w = row + (k >> 3) * 4;
  const uint32_t word = uint32_t(w[0]) | (uint32_t(w[1]) << 8) | (uint32_t(w[2]) << 16) | (uint32_t(w[3]) << 24);
  return mxfp4_packed_code(word, int(k & 7));
}

// ---------------------------------------------------------------------------------------------
// The FP8 tensor-core path's packed layout (group_gemm_mxfp4_prepack_fp8; GemmPrecision::
// kFp8TensorCores). Tiles of 128 rows x 128 K, each contiguous:
//   packed_b     [G, Np/128, Kq/128, 128, 64]  uint8 (8 KB per tile: row r's 64 bytes at r * 64)
//   packed_scale [G, Np/128, Kq/128, 128, 4]   uint8 (row r's 4 scale bytes, MX blocks 0..3 of the tile)
// with Np = N rounded up to 128 and Kq = K rounded up to 128; padding rows / K are zero codes with
// scale byte 127. The 64 bytes of a row in a tile are 16 little-endian words: word 4t + b (t, b in
// 0..3) holds the 8 elements of MX block b that lane quad t of a wgmma k32 A fragment takes,
// K = 32b + 4t + i (element i, "A half") and K = 32b + 16 + 4t + i (element 4 + i, "B half"),
// i = 0..3. So one 16-byte load gives a thread its row's words for the whole tile. In a word the
// 3 magnitude bits of element e (e = 0..7) sit at bits 4e .. 4e+2 and its sign at bit 8e + 7
// (e < 4) or 8(e - 4) + 3 (e >= 4): the magnitudes select bytes of a lookup table (PRMT) and the
// signs of the A half are already at bits 7, 15, 23, 31, those of the B half four bits lower.

constexpr int64_t kMxfp4Fp8PackK = 128;  ///< Kq = K rounded up to this (the K tile of the FP8 path)
constexpr int64_t kMxfp4Fp8TileBytes = kMxfp4PackRows * kMxfp4Fp8PackK / 2;   ///< 8192
constexpr int64_t kMxfp4Fp8TileScales = kMxfp4PackRows * kMxfp4Fp8PackK / 32; ///< 512
constexpr int64_t mxfp4_fp8_packed_k(int64_t K) { return (K + kMxfp4Fp8PackK - 1) / kMxfp4Fp8PackK * kMxfp4Fp8PackK; }

namespace detail {
/// Bit of an FP8-path packed word that holds the sign of element e (0..7); its magnitude bits are 4e .. 4e+2.
LOWBIT_HOST_DEVICE constexpr int mxfp4_fp8_sign_bit(int e) { return e < 4 ? 8 * e + 7 : 8 * (e - 4) + 3; }
}  // namespace detail

/// The FP8-path packed word of 8 E2M1 codes given as nibbles (element e in bits 4e .. 4e+3).
LOWBIT_HOST_DEVICE uint32_t mxfp4_fp8_pack_word(uint32_t nibbles) {
  uint32_t r = nibbles & 0x77777777u;
  for (int e = 0; e < 8; ++e) r |= ((nibbles >> (4 * e + 3)) & 1u) << detail::mxfp4_fp8_sign_bit(e);
  return r;
}
/// E2M1 code of element e (0..7) of an FP8-path packed word.
LOWBIT_HOST_DEVICE uint32_t mxfp4_fp8_packed_code(uint32_t packed, int e) {
  return ((packed >> (4 * e)) & 7u) | (((packed >> detail::mxfp4_fp8_sign_bit(e)) & 1u) << 3);
}
/// Word index (0..15) within a row's 64 bytes of a tile, and element (0..7) within the word, of
/// K element kk (0..127) of the tile.
LOWBIT_HOST_DEVICE constexpr int mxfp4_fp8_word_of(int kk) { return 4 * ((kk & 15) >> 2) + (kk >> 5); }
LOWBIT_HOST_DEVICE constexpr int mxfp4_fp8_elem_of(int kk) { return (kk & 3) + 4 * ((kk >> 4) & 1); }
/// Byte offset in packed_b of the word holding element k of row n of expert g (Np = packed rows,
/// Kq = mxfp4_fp8_packed_k(K)); the scale byte of MX block k / 32 is at mxfp4_fp8_scale_offset.
LOWBIT_HOST_DEVICE int64_t mxfp4_fp8_tile(int64_t g, int64_t n, int64_t k, int64_t Np, int64_t Kq) {
  return (g * (Np / kMxfp4PackRows) + n / kMxfp4PackRows) * (Kq / kMxfp4Fp8PackK) + k / kMxfp4Fp8PackK;
}
LOWBIT_HOST_DEVICE int64_t mxfp4_fp8_word_offset(int64_t g, int64_t n, int64_t k, int64_t Np, int64_t Kq) {
  return mxfp4_fp8_tile(g, n, k, Np, Kq) * kMxfp4Fp8TileBytes + (n % kMxfp4PackRows) * 64 +
         4 * mxfp4_fp8_word_of(int(k % kMxfp4Fp8PackK));
}
LOWBIT_HOST_DEVICE int64_t mxfp4_fp8_scale_offset(int64_t g, int64_t n, int64_t k, int64_t Np, int64_t Kq) {
  return mxfp4_fp8_tile(g, n, k, Np, Kq) * kMxfp4Fp8TileScales + (n % kMxfp4PackRows) * 4 + (k % kMxfp4Fp8PackK) / 32;
}
/// E2M1 code of element k of row n of expert g in FP8-path packed weights.
LOWBIT_HOST_DEVICE uint32_t mxfp4_fp8_code(const uint8_t* packed_b, int64_t g, int64_t n, int64_t k, int64_t Np,
                                           int64_t Kq) {
  const uint8_t* w = packed_b + mxfp4_fp8_word_offset(g, n, k, Np, Kq);
  const uint32_t word = uint32_t(w[0]) | (uint32_t(w[1]) << 8) | (uint32_t(w[2]) << 16) | (uint32_t(w[3]) << 24);
  return mxfp4_fp8_packed_code(word, mxfp4_fp8_elem_of(int(k % kMxfp4Fp8PackK)));
}

}  // namespace lowbit
