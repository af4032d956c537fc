// src/api/check.hpp: argument checking shared by the API translation units. Every failure
// throws ArgumentError naming the op, the argument and what was expected.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/plan.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

namespace lowbit::detail {

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

struct Checker {
  const char* op;
  bool have_device = false;
  Device dev = Device::kCPU;
  int dev_id = 0;

  [[noreturn]] void fail(const char* arg, const std::string& what) const { throw ArgumentError(op, arg, what); }

  void present(const TensorView& t, const char* arg) {
    if (!t.present()) fail(arg, "is required");
    if (t.ndim > kMaxDims) fail(arg, "has more than 8 dimensions");
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] < 0) fail(arg, "has a negative size: " + t.describe());
    if (t.numel() > 0 && t.data == nullptr) fail(arg, "has a null data pointer");
    if (!have_device) {
      have_device = true;
      dev = t.device;
      dev_id = t.device_id;
    } else if (t.device != dev || (dev == Device::kCUDA && t.device_id != dev_id)) {
      fail(arg, std::string("must be on the same device as the first tensor (") +
                    (dev == Device::kCPU ? "cpu" : "cuda:" + std::to_string(dev_id)) + "), got " + t.describe());
    }
  }

  void dtype(const TensorView& t, const char* arg, std::initializer_list<DType> ok) {
    for (DType d : ok)
      if (t.dtype == d) return;
    std::string names;
    size_t i = 0;
    for (DType d : ok) names += std::string(i++ ? (i == ok.size() ? " or " : ", ") : "") + dtype_name(d);
    fail(arg, "expected dtype " + names + ", got " + dtype_name(t.dtype));
  }

  void shape(const TensorView& t, const char* arg, const std::vector<int64_t>& want) {
    bool ok = int(want.size()) == t.ndim;
    for (int d = 0; ok && d < t.ndim; ++d) ok = t.shape[d] == want[size_t(d)];
    if (!ok) fail(arg, "expected shape " + shape_str(want) + ", got " + t.describe());
  }

  void last_contiguous(const TensorView& t, const char* arg) {
    if (t.ndim > 0 && t.numel() > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
      fail(arg, "the last dimension must be contiguous (stride 1), got " + t.describe());
  }

  void dense(const TensorView& t, const char* arg, int64_t numel) {
    if (!t.is_dense()) fail(arg, "must be a dense buffer (strides a permutation of a contiguous layout), got " + t.describe());
    if (t.numel() != numel)
      fail(arg, "expected " + std::to_string(numel) + " elements for this layout and shape, got " + t.describe());
  }

  /// False when two index tuples of `t` address the same element (a zero stride on a dimension of
  /// size > 1, or strides that interleave): dimensions sorted by |stride| must each step past
  /// everything the smaller ones span. Interleaved layouts that happen not to collide are refused too.
  static bool non_self_overlapping(const TensorView& t) {
    std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of dimensions of size > 1
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] > 1) dims.emplace_back(t.strides[d] < 0 ? -t.strides[d] : t.strides[d], t.shape[d]);
    std::sort(dims.begin(), dims.end());
    int64_t span = 0;  // elements spanned by the dimensions so far, minus one
    for (auto& [st, n] : dims) {
      if (st <= span) return false;
      span += st * (n - 1);
    }
    return true;
  }

  /// Outputs must not overlap each other or any input, nor themselves.
  using Named = std::vector<std::pair<const char*, const TensorView*>>;
  void no_overlap(const Named& outs, const Named& ins) {
    for (auto& o : outs)
      if (o.second->present() && o.second->numel() > 1 && !non_self_overlapping(*o.second))
        fail(o.first, "has elements that share memory (a zero or interleaved stride): " + o.second->describe());
    auto ext = [](const TensorView* t, int64_t* lo, int64_t* hi) {
      t->byte_extent(lo, hi);
      *lo += reinterpret_cast<intptr_t>(t->data);
      *hi += reinterpret_cast<intptr_t>(t->data);
    };
    std::vector<std::pair<const char*, const TensorView*>> all(outs);
    all.insert(all.end(), ins.begin(), ins.end());
    size_t i = 0;
    for (auto& o : outs) {
      if (!o.second->present() || o.second->numel() == 0) { ++i; continue; }
      int64_t a0, a1;
      ext(o.second, &a0, &a1);
      for (size_t j = 0; j < all.size(); ++j) {
        if (j == i || !all[j].second->present() || all[j].second->numel() == 0) continue;
        int64_t b0, b1;
        ext(all[j].second, &b0, &b1);
        if (a0 < b1 && b0 < a1) fail(o.first, std::string("overlaps argument '") + all[j].first + "'");
      }
      ++i;
    }
  }
};

/// [L, M, K] view of a 2-D or 3-D tensor: sizes and element strides.
struct Mat {
  int64_t L = 1, M = 0, K = 0, sL = 0, sM = 0;
};

inline Mat as_mat(const Checker& c, const TensorView& t, const char* arg) {
  if (t.ndim != 2 && t.ndim != 3) c.fail(arg, "expected a 2-D [M, K] or 3-D [L, M, K] tensor, got " + t.describe());
  Mat m;
  if (t.ndim == 3) {
    m.L = t.shape[0];
    m.sL = t.strides[0];
  }
  m.M = t.size(-2);
  m.K = t.size(-1);
  m.sM = t.stride(-2);
  return m;
}

inline std::vector<int64_t> with_batch(const TensorView& like, int64_t L, int64_t M, int64_t K) {
  if (like.ndim == 3) return {L, M, K};
  return {M, K};
}

inline void check_layout(const Checker& c, const ScaleLayout& l) {
  if (l.kind == ScaleLayoutKind::kColMajor && l.row_align < 1)
    c.fail("layout", "column-major row_align must be >= 1, got " + std::to_string(l.row_align));
  if (l.group_pad != GroupPad::kNone && l.kind != ScaleLayoutKind::kBlocked128x4)
    c.fail("layout", "per-group padding is defined for the 128x4 blocked layout only");
}

/// Validates m_indptr (when the layout is grouped) and fills the grouped part of sp.
inline void check_groups(Checker& c, const ScaleLayout& l, const TensorView& ind, int64_t L, int64_t M, ScalePlan* sp) {
  if (l.group_pad == GroupPad::kNone) {
    if (ind.present()) c.fail("m_indptr", "is only used with a grouped (per-group padded) scale layout");
    return;
  }
  c.present(ind, "m_indptr");
  c.dtype(ind, "m_indptr", {DType::kInt32, DType::kInt64});
  if (ind.ndim != 1 || ind.shape[0] < 2) c.fail("m_indptr", "expected a 1-D tensor of G+1 >= 2 boundaries, got " + ind.describe());
  if (ind.strides[0] != 1) c.fail("m_indptr", "must be contiguous");
  if (L != 1) c.fail("scales", "grouped layouts take a 2-D input (no batch dimension)");
  sp->groups = ind.shape[0] - 1;
  sp->m_indptr = ind.data;
  sp->indptr64 = ind.dtype == DType::kInt64;
  if (ind.device == Device::kCPU) {  // device-resident boundaries are trusted (no host sync)
    int64_t prev = 0;
    for (int64_t g = 0; g <= sp->groups; ++g) {
      const int64_t v = sp->indptr64 ? ind.ptr<int64_t>()[g] : ind.ptr<int32_t>()[g];
      if ((g == 0 && v != 0) || v < prev)
        c.fail("m_indptr", "must start at 0 and be non-decreasing (element " + std::to_string(g) + " is " +
                               std::to_string(v) + ")");
      prev = v;
    }
    if (prev != M) c.fail("m_indptr", "last boundary must equal the number of rows " + std::to_string(M) + ", got " + std::to_string(prev));
  }
}

/// Fills sp for L matrices of R x C and checks the scale tensor holds exactly that storage
/// (grouped layouts: at least the rows the padding rule needs, in whole rows).
inline void plan_scales(Checker& c, const TensorView& s, const char* arg, const ScaleLayout& l, int64_t L, int64_t R,
                 int64_t C, ScalePlan* sp) {
  sp->layout = l;
  sp->rows = R;
  sp->cols = C;
  if (sp->groups > 0) {
    const int64_t Cp = scale_cols_padded(l, C);
    const int64_t need = grouped_rows_alloc(l.group_pad, R, sp->groups);
    if (!s.is_dense()) c.fail(arg, "must be a dense buffer, got " + s.describe());
    if (s.numel() % Cp != 0 || s.numel() / Cp < need)
      c.fail(arg, "grouped layout needs at least " + std::to_string(need) + " x " + std::to_string(Cp) +
                      " elements (whole rows of " + std::to_string(Cp) + "), got " + s.describe());
    sp->rows_pad = s.numel() / Cp;
    sp->batch_stride = s.numel();
    return;
  }
  sp->rows_pad = scale_rows_padded(l, R);
  sp->batch_stride = scale_size_rows(l, sp->rows_pad, C);
  c.dense(s, arg, L * sp->batch_stride);
}

inline void scale_dtype(Checker& c, const TensorView& s, const char* arg, ScaleType t) {
  switch (t) {
    case ScaleType::kF32: c.dtype(s, arg, {DType::kFloat32}); return;
    case ScaleType::kUE8M0: c.dtype(s, arg, {DType::kUE8M0, DType::kUInt8}); return;
    case ScaleType::kE4M3: c.dtype(s, arg, {DType::kE4M3, DType::kUInt8}); return;
  }
}

inline void code_dtype(Checker& c, const TensorView& q, const char* arg, const BlockFormat& f) {
  if (f.elem == Elem::kE4M3) c.dtype(q, arg, {DType::kE4M3, DType::kUInt8});
  else if (f.elem == Elem::kE5M2) c.dtype(q, arg, {DType::kE5M2, DType::kUInt8});
  else if (f.elem == Elem::kE2M1) c.dtype(q, arg, {DType::kUInt8, DType::kFloat4E2M1x2});
  else c.dtype(q, arg, {DType::kUInt8});
}

inline void check_block(const Checker& c, const BlockFormat& f, int64_t K, const char* arg) {
  if (K % f.block != 0)
    c.fail(arg, "the last dimension K = " + std::to_string(K) + " must be a multiple of the block size " +
                    std::to_string(f.block) + " of " + format_name(f) + " (lowbit neither pads nor truncates)");
}

}  // namespace lowbit::detail
