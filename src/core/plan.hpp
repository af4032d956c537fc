// src/core/plan.hpp: validated, device-friendly descriptions of one call, produced by the API
// layer (ops.cpp) and consumed by the CPU reference (src/ref) and the CUDA launchers (src/cuda).
// Everything here has already been checked: implementations trust it.
#pragma once

#include "lowbit/block_quant.hpp"
#include "lowbit/dtype.hpp"
#include "lowbit/mxfp4_pack.hpp"
#include "lowbit/scale_layout.hpp"
#include "lowbit/tensor.hpp"

namespace lowbit::detail {

/// Where the L scale matrices of one call live. Offsets are in scale elements.
struct ScalePlan {
  ScaleLayout layout;
  int64_t rows = 0;      ///< logical rows R (= M)
  int64_t cols = 0;      ///< logical cols C (= K / block)
  int64_t rows_pad = 0;  ///< stored rows per matrix (grouped: rows allocated)
  int64_t batch_stride = 0;  ///< elements between consecutive matrices
  const void* m_indptr = nullptr;  ///< grouped only
  bool indptr64 = false;
  int64_t groups = 0;

  /// Stored row of logical row r (grouped layouts move each group to its padded start).
  LOWBIT_HOST_DEVICE int64_t stored_row(int64_t r) const {
    if (groups == 0) return r;
    if (indptr64) {
      const auto* p = static_cast<const int64_t*>(m_indptr);
      const int64_t g = group_of_row(p, groups, r);
      return group_padded_start(layout.group_pad, p, g) + (r - p[g]);
    }
    const auto* p = static_cast<const int32_t*>(m_indptr);
    const int64_t g = group_of_row(p, groups, r);
    return group_padded_start(layout.group_pad, p, g) + (r - int64_t(p[g]));
  }
  LOWBIT_HOST_DEVICE int64_t offset(int64_t l, int64_t r, int64_t c) const {
    return l * batch_stride + scale_offset(layout, rows_pad, cols, stored_row(r), c);
  }
};

struct QuantPlan {
  BlockFormat f;
  int64_t L = 1, M = 0, K = 0;
  const void* x = nullptr;
  DType x_dtype = DType::kFloat32;
  int64_t x_sL = 0, x_sM = 0;  ///< element strides (last dim stride 1)
  uint8_t* q = nullptr;
  int64_t q_sL = 0, q_sM = 0;  ///< byte strides
  void* scales = nullptr;
  uint8_t* zeros = nullptr;
  ScalePlan sp;
  float* global_amax = nullptr;  ///< NVFP4, may be null
  bool compute_global_amax = false;
};

struct DequantPlan {
  BlockFormat f;
  int64_t L = 1, M = 0, K = 0;
  const uint8_t* q = nullptr;
  int64_t q_sL = 0, q_sM = 0;
  const void* scales = nullptr;
  const uint8_t* zeros = nullptr;
  ScalePlan sp;
  const float* global_amax = nullptr;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;
  int64_t o_sL = 0, o_sM = 0;  ///< element strides
};

struct TranscodePlan {
  BlockFormat f;
  int64_t L = 1, M = 0, K = 0;
  const uint8_t* q = nullptr;
  int64_t q_sL = 0, q_sM = 0;
  const uint8_t* zeros = nullptr;  ///< UINT4
  ScalePlan sp;                    ///< for the zero points
  uint8_t* out = nullptr;
  DType out_dtype = DType::kE4M3;
  int64_t o_sL = 0, o_sM = 0;
};

/// An elementwise cast over up to 8 dims with arbitrary strides (elements).
struct CastPlan {
  const void* x = nullptr;
  DType x_dtype = DType::kFloat32;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t xs[kMaxDims] = {};
  int64_t os[kMaxDims] = {};
  Saturate sat = Saturate::kFinite;
};

struct LayoutPlan {
  const void* in = nullptr;
  void* out = nullptr;
  int elem_bytes = 1;
  int64_t L = 1;
  ScalePlan from, to;
};

struct KCachePlan {
  int64_t B = 0, T = 0, H = 0, D = 0;
  const void* k = nullptr;  ///< quantize: input; dequantize: output
  DType k_dtype = DType::kFloat32;
  int64_t k_s[4] = {};
  uint8_t* codes = nullptr;
  int64_t c_s[4] = {};  ///< byte strides of codes
  float* scale = nullptr;
  int64_t s_s[3] = {};
  uint8_t* residual = nullptr;  ///< may be null on dequantize
  DType r_dtype = DType::kE5M2;
  int64_t r_s[4] = {};
  NibbleOrder order = NibbleOrder::kLowFirst;
};

// ---------------------------------------------------------------------------------------------
// Scalar loads / stores shared by the reference and the kernels

LOWBIT_HOST_DEVICE float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat16: return decode_fp16(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16: return decode_bf16(static_cast<const uint16_t*>(p)[i]);
    case DType::kE4M3: return decode_e4m3(static_cast<const uint8_t*>(p)[i]);
    case DType::kE5M2: return decode_e5m2(static_cast<const uint8_t*>(p)[i]);
    case DType::kFloat64: return float(static_cast<const double*>(p)[i]);
    default: return 0.0f;
  }
}

LOWBIT_HOST_DEVICE void store_float(void* p, DType t, int64_t i, float v, Saturate sat = Saturate::kFinite) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = v; return;
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = encode_fp16(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = encode_bf16(v); return;
    case DType::kE4M3: static_cast<uint8_t*>(p)[i] = encode_e4m3(v, sat); return;
    case DType::kE5M2: static_cast<uint8_t*>(p)[i] = encode_e5m2(v, sat); return;
    case DType::kFloat64: static_cast<double*>(p)[i] = double(v); return;
    default: return;
  }
}

LOWBIT_HOST_DEVICE uint32_t load_scale_code(const void* p, ScaleType t, int64_t i) {
  return t == ScaleType::kF32 ? static_cast<const uint32_t*>(p)[i] : uint32_t(static_cast<const uint8_t*>(p)[i]);
}
LOWBIT_HOST_DEVICE void store_scale_code(void* p, ScaleType t, int64_t i, uint32_t code) {
  if (t == ScaleType::kF32) static_cast<uint32_t*>(p)[i] = code;
  else static_cast<uint8_t*>(p)[i] = uint8_t(code);
}

}  // namespace lowbit::detail

namespace lowbit::detail {

/// A validated NVFP4 dual GEMM: all strides in elements (bytes for the packed operands).
struct DualGemmPlan {
  int64_t M = 0, N = 0, K = 0, L = 1;
  const uint8_t* a = nullptr;
  const uint8_t* b1 = nullptr;
  const uint8_t* b2 = nullptr;
  int64_t a_sM = 0, a_sL = 0, b1_sN = 0, b1_sL = 0, b2_sN = 0, b2_sL = 0;
  const uint8_t* sfa = nullptr;
  const uint8_t* sfb1 = nullptr;
  const uint8_t* sfb2 = nullptr;
  ScalePlan spa, spb;  ///< M x K/16 and N x K/16
  const float* amax_a = nullptr;
  const float* amax_b1 = nullptr;
  const float* amax_b2 = nullptr;
  void* c = nullptr;
  DType c_dtype = DType::kFloat16;
  int64_t c_sM = 0, c_sL = 0;
};

}  // namespace lowbit::detail

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
  const void* m_indptr = nullptr;
  bool indptr64 = false;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sM = 0;

  LOWBIT_HOST_DEVICE int64_t bound(int64_t g) const {
    return indptr64 ? static_cast<const int64_t*>(m_indptr)[g] : int64_t(static_cast<const int32_t*>(m_indptr)[g]);
  }
};

}  // namespace lowbit::detail

namespace lowbit::detail {

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
};

}  // namespace lowbit::detail
