// src/api/check.hpp: argument checking shared by the API translation units. Every failure
// throws ArgumentError naming the op, the argument and what was expected.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/checked.hpp"
#include "core/plan.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

namespace lowbit::detail {

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

/// The dtypes an argument accepts (at most 8), in the order an error message lists them.
struct DTypes {
  DType v[8] = {};
  size_t n = 0;
  DTypes() = default;
  DTypes(std::initializer_list<DType> l) {
    for (DType d : l)
      if (n < 8) v[n++] = d;
  }
  const DType* begin() const { return v; }
  const DType* end() const { return v + n; }
  size_t size() const { return n; }
};

/// The description of a 2-D or 3-D matrix argument in errors (Req::matrix, as_mat).
inline constexpr const char* kMatrixShape = "a 2-D [M, K] or 3-D [L, M, K] tensor";

/// What one tensor argument must be, checked by Checker::require. The checks run in this order,
/// each failing with the message of the single Checker check it stands for:
///   present (always: on the first tensor's device, sizes that fit 64 bits, an element-aligned
///   data pointer), dtype, rank ("expected <what>, got <tensor>"), exact shape, element count
///   ("expected <what>, got <tensor>"), last dimension contiguous, whole tensor contiguous
///   ("<what> must be contiguous, got <tensor>").
/// Checks that do not fit this order or wording stay written out where they are made.
struct Req {
  explicit Req(const char* a) : arg(a) {}
  Req& dtypes(const DTypes& d) { dtypes_ = d; return *this; }
  /// ndim in [lo, hi]; `what` names the expected shape, e.g. "[T, H]".
  Req& rank(int lo, int hi, const char* what) { rank_lo = lo; rank_hi = hi; rank_what = what; return *this; }
  Req& rank(int n, const char* what) { return rank(n, n, what); }
  /// ndim 2 or 3 (as_mat's [M, K] / [L, M, K]).
  Req& matrix() { return rank(2, 3, kMatrixShape); }
  Req& shape(std::vector<int64_t> s) { shape_ = std::move(s); has_shape = true; return *this; }
  /// exactly one element; `what` e.g. "one element".
  Req& one_element(const char* what) { numel_what = what; return *this; }
  Req& last_contiguous() { last_contiguous_ = true; return *this; }
  /// C-contiguous; `what` starts the message, e.g. "packed weights".
  Req& contiguous(const char* what) { contiguous_what = what; return *this; }

  const char* arg;
  DTypes dtypes_;
  int rank_lo = -1, rank_hi = -1;
  const char* rank_what = nullptr;
  std::vector<int64_t> shape_;
  bool has_shape = false;
  const char* numel_what = nullptr;
  bool last_contiguous_ = false;
  const char* contiguous_what = nullptr;
};

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
    // sizes: the element count and the byte span the strides address must fit in int64
    int64_t n = 1;
    bool empty = false;
    for (int d = 0; d < t.ndim; ++d) empty = empty || t.shape[d] == 0;
    if (!empty) {
      int64_t lo = 0, hi = 0;
      for (int d = 0; d < t.ndim; ++d) {
        if (!checked_mul(n, t.shape[d], &n))
          fail(arg, "has more elements than a 64-bit size can count: " + t.describe());
        const int64_t st = t.strides[d];
        int64_t span;
        if (st == INT64_MIN || !checked_mul(t.shape[d] - 1, st < 0 ? -st : st, &span) ||
            !checked_add(st < 0 ? lo : hi, span, st < 0 ? &lo : &hi))
          fail(arg, "its strides address more bytes than a 64-bit size can count: " + t.describe());
      }
      int64_t bytes;
      if (!checked_add(lo, hi, &bytes) || !checked_add(bytes, 1, &bytes) ||
          !checked_mul(bytes, dtype_bytes(t.dtype), &bytes))
        fail(arg, "its strides address more bytes than a 64-bit size can count: " + t.describe());
    }
    if (t.numel() > 0 && t.data == nullptr) fail(arg, "has a null data pointer");
    if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data) % uintptr_t(dtype_bytes(t.dtype)) != 0)
      fail(arg, "data pointer is not aligned to its " + std::to_string(dtype_bytes(t.dtype)) + "-byte " +
                    dtype_name(t.dtype) + " elements (required alignment " + std::to_string(dtype_bytes(t.dtype)) +
                    " bytes; e.g. a view offset by one byte): pass an aligned copy, got " + t.describe());
    if (!have_device) {
      have_device = true;
      dev = t.device;
      dev_id = t.device_id;
    } else if (t.device != dev || (dev == Device::kCUDA && t.device_id != dev_id)) {
      fail(arg, std::string("must be on the same device as the first tensor (") +
                    (dev == Device::kCPU ? "cpu" : "cuda:" + std::to_string(dev_id)) + "), got " + t.describe());
    }
  }

  void dtype(const TensorView& t, const char* arg, const DTypes& ok) {
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

  void require(const TensorView& t, const Req& r) {
    present(t, r.arg);
    if (r.dtypes_.size() > 0) dtype(t, r.arg, r.dtypes_);
    if (r.rank_what != nullptr && (t.ndim < r.rank_lo || t.ndim > r.rank_hi))
      fail(r.arg, std::string("expected ") + r.rank_what + ", got " + t.describe());
    if (r.has_shape) shape(t, r.arg, r.shape_);
    if (r.numel_what != nullptr && t.numel() != 1)
      fail(r.arg, std::string("expected ") + r.numel_what + ", got " + t.describe());
    if (r.last_contiguous_) last_contiguous(t, r.arg);
    if (r.contiguous_what != nullptr && !t.is_contiguous())
      fail(r.arg, std::string(r.contiguous_what) + " must be contiguous, got " + t.describe());
  }

  /// Overflow-checked a * b (sizes derived from arguments); the error names `arg`.
  int64_t mul(const char* arg, int64_t a, int64_t b) const {
    int64_t r;
    if (!checked_mul(a, b, &r))
      fail(arg, "size " + std::to_string(a) + " x " + std::to_string(b) + " overflows a 64-bit integer");
    return r;
  }

  /// Where the batch dimension of a scale tensor's documented index shape lies: kFirst for the
  /// ops whose scales are [L, rows, cols] (grouped GEMM operands: no batch-last view),
  /// kLast for those documented as [rows, cols, L] (the dual GEMM's GPU MODE scales: a tensor of
  /// that shape is read by index), kAny for the format ops, which take both.
  enum class Batch { kAny, kFirst, kLast };

  /// True when t has exactly `n` dimensions of sizes shp and the strides str on every dimension of
  /// size > 1.
  static bool has_strides(const TensorView& t, int n, const int64_t* shp, const int64_t* str) {
    if (t.ndim != n) return false;
    for (int d = 0; d < n; ++d)
      if (t.shape[d] != shp[d] || (t.shape[d] > 1 && t.strides[d] != str[d])) return false;
    return true;
  }

  static std::string ints_str(int n, const int64_t* v) {
    std::string r = "(";
    for (int d = 0; d < n; ++d) r += (d ? ", " : "") + std::to_string(v[d]);
    return r + ")";
  }

  /// A buffer of `numel` elements that lowbit addresses through its storage (scales, zero
  /// points, packed weights). Its element order must be its index order, so that what is read
  /// is what the caller's indices say: a contiguous (row-major) tensor of any shape, or one of
  /// the documented views of such storage — the batch-last view [.., L] of (L, ..) storage (the
  /// GPU MODE [MN, K/16, L] reference scales) and, for 128x4 blocked scales, the 6-D view
  /// [32, 4, Rp/128, 4, Cp/4, L] (rows_pad / cols_pad: Rp / Cp of one stored matrix). Any other
  /// strides (a Fortran-ordered or transposed array) are refused rather than misread.
  /// L: the number of stored matrices (-1: unknown). A tensor whose shape is a documented index
  /// shape — the 6-D view, or (row-major scales, L > 1, batch kAny / kLast) [Rp, Cp, L] — is read
  /// by index: it must have that view's strides, even when it happens to be C-contiguous (a
  /// C-contiguous [Rp, Cp, L] tensor holds its L matrices interleaved, not one after the other).
  /// The batch-last view of any other shape is taken only when its last dimension is the L
  /// matrices (kAny / kLast, L known) or, with L unknown, whenever it is dense (the rule before
  /// L was known).
  void storage(const TensorView& t, const char* arg, int64_t numel, const ScaleLayout* layout = nullptr,
               int64_t rows_pad = 0, int64_t cols_pad = 0, int64_t L = -1, Batch batch = Batch::kAny) {
    if (t.numel() != numel)
      fail(arg, "expected " + std::to_string(numel) + " elements for this layout and shape, got " + t.describe());
    if (layout != nullptr && layout->kind == ScaleLayoutKind::kBlocked128x4 && layout->group_pad == GroupPad::kNone &&
        t.ndim == 6 && rows_pad % 128 == 0 && cols_pad % 4 == 0 && rows_pad > 0 && cols_pad > 0) {
      const int64_t shp[6] = {32, 4, rows_pad / 128, 4, cols_pad / 4, t.shape[5]};
      const int64_t str[6] = {16, 4, (cols_pad / 4) * 512, 1, 512, rows_pad * cols_pad};
      bool shape_ok = true;
      for (int d = 0; d < 6; ++d) shape_ok = shape_ok && t.shape[d] == shp[d];
      if (shape_ok) {
        if (has_strides(t, 6, shp, str)) return;
        fail(arg, "a 6-D 128x4 blocked scale tensor " + shape_str(std::vector<int64_t>(shp, shp + 6)) +
                      " is read by index as the GPU MODE view [32, 4, rows/128, 4, cols/4, L] of the blocked storage: "
                      "expected element strides " + ints_str(6, str) + " (dimensions of size 1 excepted), got " +
                      t.describe());
      }
    }
    const bool row_major = layout == nullptr || layout->kind == ScaleLayoutKind::kRowMajor;
    if (batch != Batch::kFirst && L > 1 && row_major && t.ndim == 3 && t.shape[0] == rows_pad && t.shape[1] == cols_pad &&
        t.shape[2] == L && !(batch == Batch::kAny && t.is_contiguous() && rows_pad == L && cols_pad == rows_pad)) {
      const int64_t shp[3] = {rows_pad, cols_pad, L};
      const int64_t str[3] = {cols_pad, 1, rows_pad * cols_pad};
      if (has_strides(t, 3, shp, str)) return;
      fail(arg, "a " + shape_str({rows_pad, cols_pad, L}) + " scale tensor is read by index as the batch-last [rows, cols, L] "
                    "view of (L, rows, cols) row-major storage (the GPU MODE reference layout, e.g. "
                    "x.permute(2, 0, 1).contiguous().permute(1, 2, 0)): expected element strides " + ints_str(3, str) +
                    " (dimensions of size 1 excepted), got " + t.describe());
    }
    if (t.is_contiguous()) return;
    if (batch != Batch::kFirst && t.ndim >= 3 && (L < 0 || (L > 1 && t.shape[t.ndim - 1] == L))) {
      // batch-last view: the last dimension moved to the front is contiguous
      TensorView v = t;
      v.shape[0] = t.shape[t.ndim - 1];
      v.strides[0] = t.strides[t.ndim - 1];
      for (int d = 1; d < t.ndim; ++d) {
        v.shape[d] = t.shape[d - 1];
        v.strides[d] = t.strides[d - 1];
      }
      if (v.is_contiguous()) return;
    }
    fail(arg, std::string("must be a dense buffer stored in index order: a row-major (C-contiguous) tensor") +
                  (batch == Batch::kFirst ? "" : ", the batch-last view [.., L] of one") +
                  (layout != nullptr && layout->kind == ScaleLayoutKind::kBlocked128x4
                       ? ", or (128x4 blocked scales) the 6-D view [32, 4, rows/128, 4, cols/4, L]" : "") +
                  "; other strides (e.g. a Fortran-ordered or transposed array) would be read in memory order, not by "
                  "index: pass a contiguous copy, got " + t.describe());
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
  if (t.ndim != 2 && t.ndim != 3) c.fail(arg, std::string("expected ") + kMatrixShape + ", got " + t.describe());
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

/// An attention op's softmax_scale: NaN means 1/sqrt(head dim d); otherwise finite and > 0.
/// d_name spells the head dimension in the message ("d", "D").
inline float resolve_softmax_scale(const Checker& c, float s, int64_t d, const char* d_name) {
  if (std::isnan(s)) return float(1.0 / std::sqrt(double(d)));
  if (!std::isfinite(s) || !(s > 0.0f))
    c.fail("softmax_scale", std::string("expected a finite value > 0 (or NaN for 1/sqrt(") + d_name + ")), got " +
                                std::to_string(s));
  return s;
}

/// An optional per-tensor amax (float32, one element; the GEMMs' amax_a, amax_b ...): its data or
/// nullptr when absent; a CPU value must not be negative.
inline const float* amax_arg(Checker& c, const TensorView& t, const char* arg) {
  if (!t.present()) return nullptr;
  c.require(t, Req(arg).dtypes({DType::kFloat32}).one_element("one element (the per-tensor amax)"));
  if (t.device == Device::kCPU && *t.ptr<float>() < 0.0f)
    c.fail(arg, "the per-tensor amax must be >= 0, got " + std::to_string(*t.ptr<float>()));
  return t.ptr<float>();
}

inline void check_layout(const Checker& c, const ScaleLayout& l) {
  if (l.kind == ScaleLayoutKind::kColMajor && l.row_align < 1)
    c.fail("layout", "column-major row_align must be >= 1, got " + std::to_string(l.row_align));
  if (l.group_pad != GroupPad::kNone && l.kind != ScaleLayoutKind::kBlocked128x4)
    c.fail("layout", "per-group padding is defined for the 128x4 blocked layout only");
}

/// Validates m_indptr (when the layout is grouped) and fills the grouped part of sp.
/// Host boundaries are copied once into *host_copy (as int64) before they are validated, and sp
/// points at that copy: the computation reads exactly the values that were checked, whatever
/// another thread does to the caller's array meanwhile. One host_copy may serve several calls
/// with the same m_indptr (it is filled once).
inline void check_groups(Checker& c, const ScaleLayout& l, const TensorView& ind, int64_t L, int64_t M, ScalePlan* sp,
                         std::vector<int64_t>* host_copy) {
  if (l.group_pad == GroupPad::kNone) {
    if (ind.present()) c.fail("m_indptr", "is only used with a grouped (per-group padded) scale layout");
    return;
  }
  c.require(ind, Req("m_indptr").dtypes({DType::kInt32, DType::kInt64}));
  if (ind.ndim != 1 || ind.shape[0] < 2) c.fail("m_indptr", "expected a 1-D tensor of G+1 >= 2 boundaries, got " + ind.describe());
  if (ind.strides[0] != 1) c.fail("m_indptr", "must be contiguous");
  if (L != 1) c.fail("scales", "grouped layouts take a 2-D input (no batch dimension)");
  sp->groups = ind.shape[0] - 1;
  sp->m_indptr = ind.data;
  sp->indptr64 = ind.dtype == DType::kInt64;
  if (ind.device == Device::kCPU) {  // device-resident boundaries are trusted (no host sync)
    const size_t n = size_t(ind.shape[0]);
    if (host_copy->size() != n) {
      host_copy->assign(n, 0);
      if (sp->indptr64) {
        std::memcpy(host_copy->data(), ind.data, n * sizeof(int64_t));
      } else {
        std::vector<int32_t> tmp(n);
        std::memcpy(tmp.data(), ind.data, n * sizeof(int32_t));
        for (size_t i = 0; i < n; ++i) (*host_copy)[i] = tmp[i];
      }
    }
    sp->m_indptr = host_copy->data();
    sp->indptr64 = true;
    int64_t prev = 0;
    for (int64_t g = 0; g <= sp->groups; ++g) {
      const int64_t v = (*host_copy)[size_t(g)];
      if ((g == 0 && v != 0) || v < prev)
        c.fail("m_indptr", "must start at 0 and be non-decreasing (element " + std::to_string(g) + " is " +
                               std::to_string(v) + ")");
      prev = v;
    }
    if (prev != M) c.fail("m_indptr", "last boundary must equal the number of rows " + std::to_string(M) + ", got " + std::to_string(prev));
  }
}

/// Fills sp for L matrices of R x C and checks the scale tensor holds exactly that storage
/// (grouped layouts: at least the rows the padding rule needs, in whole rows). Every size is
/// computed with overflow checks.
inline void plan_scales(Checker& c, const TensorView& s, const char* arg, const ScaleLayout& l, int64_t L, int64_t R,
                        int64_t C, ScalePlan* sp, Checker::Batch batch = Checker::Batch::kAny) {
  sp->layout = l;
  sp->rows = R;
  sp->cols = C;
  int64_t Cp;
  if (L < 0 || R < 0 || C < 0) c.fail(arg, "negative scale matrix size");
  if (!checked_scale_cols_padded(l, C, &Cp))
    c.fail(arg, "the padded scale columns of " + std::to_string(C) + " overflow a 64-bit integer");
  if (sp->groups > 0) {
    int64_t need;
    if (!checked_grouped_rows_alloc(l.group_pad, R, sp->groups, &need))
      c.fail(arg, "the grouped rows for " + std::to_string(R) + " rows in " + std::to_string(sp->groups) +
                      " groups overflow a 64-bit integer");
    c.mul(arg, need, Cp);
    if (!s.is_contiguous()) c.fail(arg, "must be a contiguous (row-major) buffer, got " + s.describe());
    if (Cp == 0) {  // K = 0: no scale columns
      if (s.numel() != 0) c.fail(arg, "expected no elements (K = 0), got " + s.describe());
      sp->rows_pad = need;
      sp->batch_stride = 0;
      return;
    }
    if (s.numel() % Cp != 0 || s.numel() / Cp < need)
      c.fail(arg, "grouped layout needs at least " + std::to_string(need) + " x " + std::to_string(Cp) +
                      " elements (whole rows of " + std::to_string(Cp) + "), got " + s.describe());
    sp->rows_pad = s.numel() / Cp;
    sp->batch_stride = s.numel();
    return;
  }
  if (!checked_scale_rows_padded(l, R, &sp->rows_pad))
    c.fail(arg, "the padded scale rows of " + std::to_string(R) + " overflow a 64-bit integer");
  sp->batch_stride = c.mul(arg, sp->rows_pad, Cp);
  c.storage(s, arg, c.mul(arg, L, sp->batch_stride), &l, sp->rows_pad, Cp, L, batch);
}

/// The dtypes a scale tensor of type t may have.
inline DTypes scale_dtypes(ScaleType t) {
  switch (t) {
    case ScaleType::kF32: return {DType::kFloat32};
    case ScaleType::kUE8M0: return {DType::kUE8M0, DType::kUInt8};
    case ScaleType::kE4M3: return {DType::kE4M3, DType::kUInt8};
  }
  return {};
}

/// The dtypes the code tensor of format f may have.
inline DTypes code_dtypes(const BlockFormat& f) {
  if (f.elem == Elem::kE4M3) return {DType::kE4M3, DType::kUInt8};
  if (f.elem == Elem::kE5M2) return {DType::kE5M2, DType::kUInt8};
  if (f.elem == Elem::kE2M1) return {DType::kUInt8, DType::kFloat4E2M1x2};
  return {DType::kUInt8};
}

inline void check_block(const Checker& c, const BlockFormat& f, int64_t K, const char* arg) {
  if (K % f.block != 0)
    c.fail(arg, "the last dimension K = " + std::to_string(K) + " must be a multiple of the block size " +
                    std::to_string(f.block) + " of " + format_name(f) + " (lowbit neither pads nor truncates)");
}

}  // namespace lowbit::detail
