// src/core/plan_moe.hpp: plans of the MXFP4 grouped GEMM, its weight prepack and the gpt-oss expert
// MLP. Part of core/plan.hpp: validated values, implementations trust them.
#pragma once

#include "core/plan_formats.hpp"
#include "lowbit/mxfp4_pack.hpp"

namespace lowbit::detail {

struct GroupGemmPlan {
  int64_t M = 0, N = 0, K = 0, G = 0;
  const void* a = nullptr;
  DType a_dtype = DType::kE4M3;  ///< kE4M3 / kE5M2 (MXFP8) or kBFloat16
  int64_t a_sM = 0;
  const uint8_t* a_scale = nullptr;  ///< null for bf16 A
  ScalePlan spa;                     ///< cum_m x K/32 (grouped or row-major)
  const uint8_t* b = nullptr;
  int64_t b_sG = 0, b_sN = 0;
  bool b_packed = false;  ///< b / b_scale in the group_gemm_mxfp4_prepack layout (spb: row-major Np x Kp/32)
  const uint8_t* b_scale = nullptr;
  ScalePlan spb;  ///< N x K/32 per group (batch = group)
  /// Group bounds [G+1] in the compact row space: m_indptr itself, or (m_counts given on the host)
  /// the prefix sums of the validated counts; null when the counts live on the device (`counts`:
  /// the kernels derive the bounds there).
  const void* m_indptr = nullptr;
  bool indptr64 = false;
  const void* counts = nullptr;  ///< device m_counts [G] (int32 / int64), not validated: clamped by the kernels
  bool counts64 = false;
  /// Masked layout: rows per group of a, a_scale and out (M = G x max_tokens rows); 0: the rows of
  /// a group are its compact rows (boundaries and contiguous counts).
  int64_t max_tokens = 0;
  int64_t expected_m = 0;  ///< masked layout: tile-size hint (0: max_tokens)
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sM = 0;
  /// Optional bias [N] added to every row in fp32 (the dense mxfp4_gemm sets it; the grouped
  /// GEMM's API leaves it null).
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  /// GemmPrecision::kFp8TensorCores: MXFP8 a, b / b_scale in the FP8-path packed layout
  /// (group_gemm_mxfp4_prepack_fp8: [G, Np/128, Kq/128, 128, 64] / [.., 128, 4]; spb unused). The
  /// CPU reference computes the exact result from them.
  bool fp8 = false;

  LOWBIT_HOST_DEVICE int64_t bound(int64_t g) const {
    return indptr64 ? static_cast<const int64_t*>(m_indptr)[g] : int64_t(static_cast<const int32_t*>(m_indptr)[g]);
  }
  /// Row of a, a_scale and out of compact row m of group g.
  LOWBIT_HOST_DEVICE int64_t phys_row(int64_t g, int64_t m) const {
    return max_tokens ? g * max_tokens + (m - bound(g)) : m;
  }
};

/// group_gemm_mxfp4_prepack: plain b [G, N, K/2] (+ scales in spb) -> packed_b [G, Np, Kp/2],
/// packed_scale [G, Np, Kp/32] (contiguous, lowbit/mxfp4_pack.hpp).
struct Mxfp4PackPlan {
  int64_t G = 0, N = 0, K = 0;
  const uint8_t* b = nullptr;
  int64_t b_sG = 0, b_sN = 0;
  const uint8_t* b_scale = nullptr;
  ScalePlan spb;
  uint8_t* packed_b = nullptr;
  uint8_t* packed_scale = nullptr;

  /// Packed word w (elements 8w .. 8w+7) of padded row n of expert g (zero beyond N and K).
  LOWBIT_HOST_DEVICE uint32_t word(int64_t g, int64_t n, int64_t w) const {
    if (n >= N || 8 * w >= K) return 0;
    const uint8_t* src = b + g * b_sG + n * b_sN + 4 * w;
    return mxfp4_pack_word(uint32_t(src[0]) | (uint32_t(src[1]) << 8) | (uint32_t(src[2]) << 16) |
                           (uint32_t(src[3]) << 24));
  }
  /// Packed scale byte of MX block c of padded row n of expert g.
  LOWBIT_HOST_DEVICE uint8_t scale(int64_t g, int64_t n, int64_t c) const {
    return n < N && c < K / 32 ? b_scale[spb.offset(g, n, c)] : kMxfp4PackPadScale;
  }
  /// FP8-path packed word w (0..15) of padded row n of expert g in K tile kt (128 K each; zero
  /// beyond N and K): elements 4t .. 4t+3 and 16+4t .. 16+4t+3 (t = w / 4) of MX block 4 kt + w % 4,
  /// i.e. bytes 2t, 2t+1 and 8+2t, 9+2t of the block's 16 bytes.
  LOWBIT_HOST_DEVICE uint32_t fp8_word(int64_t g, int64_t n, int64_t kt, int w) const {
    const int t = w >> 2;
    const int64_t blk = kt * (kMxfp4Fp8PackK / 32) + (w & 3);
    if (n >= N || blk >= K / 32) return 0;
    const uint8_t* src = b + g * b_sG + n * b_sN + blk * 16;
    return mxfp4_fp8_pack_word(uint32_t(src[2 * t]) | (uint32_t(src[2 * t + 1]) << 8) |
                               (uint32_t(src[8 + 2 * t]) << 16) | (uint32_t(src[9 + 2 * t]) << 24));
  }
};

struct MoeMlpPlan {
  int64_t T = 0, H = 0, I = 0, E = 0, topk = 0;
  const void* x = nullptr;
  DType x_dtype = DType::kBFloat16;
  int64_t x_sT = 0;
  const int32_t* ids = nullptr;
  int64_t ids_sT = 0;
  const float* weights = nullptr;
  int64_t w_sT = 0;
  const uint8_t *w1 = nullptr, *w1s = nullptr, *w2 = nullptr, *w2s = nullptr;
  int64_t w1_sE = 0, w1_sR = 0, w1s_sE = 0, w1s_sR = 0, w2_sE = 0, w2_sR = 0, w2s_sE = 0, w2s_sR = 0;
  const void *b1 = nullptr, *b2 = nullptr;
  DType b1_dtype = DType::kFloat32, b2_dtype = DType::kFloat32;
  int64_t b1_sE = 0, b2_sE = 0;
  float alpha = 1.702f, limit = 7.0f;
  bool act_mxfp8 = false;
  bool packed = false;  ///< w1 / w2 and their scales in the group_gemm_mxfp4_prepack layout
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sT = 0;

  // gpt_oss_expert_mlp: rows already grouped by expert, no routing, no weighting (ids / weights /
  // topk unused). T: the rows of x and out (masked: E x max_tokens).
  bool expert_rows = false;
  /// Host: the compact bounds [E+1] of the validated counts (CPU reference); null when the counts
  /// live on the device (`counts`, clamped by the kernels).
  const int64_t* row_indptr = nullptr;
  const void* counts = nullptr;
  bool counts64 = false;
  int64_t max_tokens = 0;  ///< masked layout: rows per expert of x / out; 0: contiguous
  int64_t expected_m = 0;  ///< masked layout: tile-size hint (0: max_tokens)
  /// MXFP8 x (x_dtype kE4M3): UE8M0 scale bytes, one per 32 elements, row r's at x_scale + r * xs_sT.
  const uint8_t* x_scale = nullptr;
  int64_t xs_sT = 0;

  /// Element k of x row r in fp32 (MXFP8 x decoded exactly; NaN scale byte -> NaN).
  LOWBIT_HOST_DEVICE float x_value(int64_t r, int64_t k) const {
    if (x_scale) return decode_e4m3(static_cast<const uint8_t*>(x)[r * x_sT + k]) * decode_ue8m0(x_scale[r * xs_sT + k / 32]);
    return load_float(x, x_dtype, r * x_sT + k);
  }
  /// Row of x / out of compact row r of expert e (expert_rows; `ind` the compact bounds).
  template <typename IndT>
  LOWBIT_HOST_DEVICE int64_t expert_row(const IndT* ind, int64_t e, int64_t r) const {
    return max_tokens ? e * max_tokens + (r - int64_t(ind[e])) : r;
  }
};

}  // namespace lowbit::detail
