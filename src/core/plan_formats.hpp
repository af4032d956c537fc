// src/core/plan_formats.hpp: plans of the format ops (quantize, dequantize, transcode, cast, scale
// layouts), the scale placement every plan shares (ScalePlan) and the scalar loads / stores of the
// reference and the kernels. Part of core/plan.hpp: validated values, implementations trust them.
#pragma once

#include "lowbit/block_quant.hpp"
#include "lowbit/dtype.hpp"
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
