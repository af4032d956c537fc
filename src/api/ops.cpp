// src/api/ops.cpp: argument validation and CPU/CUDA dispatch of the format ops (lowbit/ops.hpp).
// Nothing here computes: it checks every argument, builds a plan (core/plan.hpp) and hands it
// to the CPU reference (src/ref) or to a CUDA launcher (src/cuda).
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"
#include "ref/ref.hpp"
#if LOWBIT_WITH_CUDA
#include "cuda/launch.hpp"
#endif

namespace lowbit {
using namespace detail;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
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
    if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
      fail(arg, "the last dimension must be contiguous (stride 1), got " + t.describe());
  }

  void dense(const TensorView& t, const char* arg, int64_t numel) {
    if (!t.is_dense()) fail(arg, "must be a dense buffer (strides a permutation of a contiguous layout), got " + t.describe());
    if (t.numel() != numel)
      fail(arg, "expected " + std::to_string(numel) + " elements for this layout and shape, got " + t.describe());
  }

  /// Outputs must not overlap each other or any input.
  using Named = std::vector<std::pair<const char*, const TensorView*>>;
  void no_overlap(const Named& outs, const Named& ins) {
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

Mat as_mat(const Checker& c, const TensorView& t, const char* arg) {
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

std::vector<int64_t> with_batch(const TensorView& like, int64_t L, int64_t M, int64_t K) {
  if (like.ndim == 3) return {L, M, K};
  return {M, K};
}

void check_layout(const Checker& c, const ScaleLayout& l) {
  if (l.kind == ScaleLayoutKind::kColMajor && l.row_align < 1)
    c.fail("layout", "column-major row_align must be >= 1, got " + std::to_string(l.row_align));
  if (l.group_pad != GroupPad::kNone && l.kind != ScaleLayoutKind::kBlocked128x4)
    c.fail("layout", "per-group padding is defined for the 128x4 blocked layout only");
}

/// Validates m_indptr (when the layout is grouped) and fills the grouped part of sp.
void check_groups(Checker& c, const ScaleLayout& l, const TensorView& ind, int64_t L, int64_t M, ScalePlan* sp) {
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
void plan_scales(Checker& c, const TensorView& s, const char* arg, const ScaleLayout& l, int64_t L, int64_t R,
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

void scale_dtype(Checker& c, const TensorView& s, const char* arg, ScaleType t) {
  switch (t) {
    case ScaleType::kF32: c.dtype(s, arg, {DType::kFloat32}); return;
    case ScaleType::kUE8M0: c.dtype(s, arg, {DType::kUE8M0, DType::kUInt8}); return;
    case ScaleType::kE4M3: c.dtype(s, arg, {DType::kE4M3, DType::kUInt8}); return;
  }
}

void code_dtype(Checker& c, const TensorView& q, const char* arg, const BlockFormat& f) {
  if (f.elem == Elem::kE4M3) c.dtype(q, arg, {DType::kE4M3, DType::kUInt8});
  else if (f.elem == Elem::kE5M2) c.dtype(q, arg, {DType::kE5M2, DType::kUInt8});
  else if (f.elem == Elem::kE2M1) c.dtype(q, arg, {DType::kUInt8, DType::kFloat4E2M1x2});
  else c.dtype(q, arg, {DType::kUInt8});
}

void check_block(const Checker& c, const BlockFormat& f, int64_t K, const char* arg) {
  if (K % f.block != 0)
    c.fail(arg, "the last dimension K = " + std::to_string(K) + " must be a multiple of the block size " +
                    std::to_string(f.block) + " of " + format_name(f) + " (lowbit neither pads nor truncates)");
}

template <typename Plan>
void dispatch(const Checker& c, const Plan& p, void (*cpu)(const Plan&), int (*gpu)(const Plan&, void*), Stream s) {
  if (c.dev == Device::kCPU) {
    cpu(p);
    return;
  }
#if LOWBIT_WITH_CUDA
  const int err = gpu(p, s.handle);
  if (err != 0) throw CudaError(std::string(c.op) + ": CUDA error: " + cuda::error_string(err));
#else
  (void)gpu;
  (void)p;
  (void)s;
  throw NotSupportedError(std::string(c.op) + ": this build of lowbit has no CUDA kernels; pass CPU tensors");
#endif
}

#if !LOWBIT_WITH_CUDA
// Placeholders so dispatch() has a function to name in a CPU-only build (never called).
template <typename Plan>
int no_gpu(const Plan&, void*) { return -1; }
#define LOWBIT_GPU(fn) no_gpu
#else
#define LOWBIT_GPU(fn) cuda::fn
#endif

}  // namespace

// ---------------------------------------------------------------------------------------------

std::vector<int64_t> scale_shape(const BlockFormat& f, const ScaleLayout& layout, int64_t L, int64_t M, int64_t K,
                                 int64_t groups) {
  validate_format(f, "scale_shape");
  Checker c{"scale_shape"};
  check_layout(c, layout);
  check_block(c, f, K, "K");
  const int64_t C = K / f.block;
  if (layout.group_pad != GroupPad::kNone) {
    if (groups <= 0) c.fail("groups", "a grouped layout needs groups > 0");
    return {1, grouped_rows_alloc(layout.group_pad, M, groups), scale_cols_padded(layout, C)};
  }
  if (layout.kind == ScaleLayoutKind::kColMajor) return {L, C, scale_rows_padded(layout, M)};
  return {L, scale_rows_padded(layout, M), scale_cols_padded(layout, C)};
}

void quantize(const TensorView& x, const BlockFormat& f, const ScaleLayout& layout, const TensorView& q,
              const TensorView& scales, const QuantArgs& args, Stream stream) {
  Checker c{"quantize"};
  validate_format(f, c.op);
  check_layout(c, layout);
  c.present(x, "x");
  c.dtype(x, "x", {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  const Mat m = as_mat(c, x, "x");
  c.last_contiguous(x, "x");
  check_block(c, f, m.K, "x");
  c.present(q, "q");
  code_dtype(c, q, "q", f);
  c.shape(q, "q", with_batch(x, m.L, m.M, f.packed() ? m.K / 2 : m.K));
  c.last_contiguous(q, "q");
  c.present(scales, "scales");
  scale_dtype(c, scales, "scales", f.scale_type);

  QuantPlan p;
  p.f = f;
  p.L = m.L;
  p.M = m.M;
  p.K = m.K;
  p.x = x.data;
  p.x_dtype = x.dtype;
  p.x_sL = m.sL;
  p.x_sM = m.sM;
  const Mat qm = as_mat(c, q, "q");
  p.q = q.ptr<uint8_t>();
  p.q_sL = qm.sL;
  p.q_sM = qm.sM;
  p.scales = scales.data;
  check_groups(c, layout, args.m_indptr, m.L, m.M, &p.sp);
  plan_scales(c, scales, "scales", layout, m.L, m.M, m.K / f.block, &p.sp);

  if (f.has_zero_point()) {
    c.present(args.zeros, "zeros");
    c.dtype(args.zeros, "zeros", {DType::kUInt8});
    c.dense(args.zeros, "zeros", scales.numel());
    p.zeros = args.zeros.ptr<uint8_t>();
  } else if (args.zeros.present()) {
    c.fail("zeros", "only the UINT4 zero-point format has zero points");
  }
  if (args.global_amax.present()) {
    if (!f.has_global_scale()) c.fail("global_amax", "only NVFP4 has a per-tensor scale");
    c.present(args.global_amax, "global_amax");
    c.dtype(args.global_amax, "global_amax", {DType::kFloat32});
    if (args.global_amax.numel() != 1) c.fail("global_amax", "expected one element, got " + args.global_amax.describe());
    p.global_amax = args.global_amax.ptr<float>();
    p.compute_global_amax = args.compute_global_amax;
  } else if (args.compute_global_amax) {
    c.fail("global_amax", "compute_global_amax needs a float32 [1] tensor to write the amax into");
  }
  Checker::Named outs = {{"q", &q}, {"scales", &scales}, {"zeros", &args.zeros}};
  Checker::Named ins = {{"x", &x}, {"m_indptr", &args.m_indptr}};
  (p.compute_global_amax ? outs : ins).push_back({"global_amax", &args.global_amax});
  c.no_overlap(outs, ins);
  dispatch(c, p, &ref::quantize, &LOWBIT_GPU(quantize), stream);
}

void dequantize(const TensorView& q, const TensorView& scales, const BlockFormat& f, const ScaleLayout& layout,
                const TensorView& out, const QuantArgs& args, Stream stream) {
  Checker c{"dequantize"};
  validate_format(f, c.op);
  check_layout(c, layout);
  c.present(out, "out");
  c.dtype(out, "out", {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kE4M3, DType::kE5M2});
  const Mat m = as_mat(c, out, "out");
  c.last_contiguous(out, "out");
  check_block(c, f, m.K, "out");
  c.present(q, "q");
  code_dtype(c, q, "q", f);
  c.shape(q, "q", with_batch(out, m.L, m.M, f.packed() ? m.K / 2 : m.K));
  c.last_contiguous(q, "q");
  c.present(scales, "scales");
  scale_dtype(c, scales, "scales", f.scale_type);
  if (args.compute_global_amax) c.fail("compute_global_amax", "is a quantize option");

  DequantPlan p;
  p.f = f;
  p.L = m.L;
  p.M = m.M;
  p.K = m.K;
  const Mat qm = as_mat(c, q, "q");
  p.q = q.ptr<uint8_t>();
  p.q_sL = qm.sL;
  p.q_sM = qm.sM;
  p.scales = scales.data;
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.o_sL = m.sL;
  p.o_sM = m.sM;
  check_groups(c, layout, args.m_indptr, m.L, m.M, &p.sp);
  plan_scales(c, scales, "scales", layout, m.L, m.M, m.K / f.block, &p.sp);
  if (f.has_zero_point()) {
    c.present(args.zeros, "zeros");
    c.dtype(args.zeros, "zeros", {DType::kUInt8});
    c.dense(args.zeros, "zeros", scales.numel());
    p.zeros = args.zeros.ptr<uint8_t>();
  } else if (args.zeros.present()) {
    c.fail("zeros", "only the UINT4 zero-point format has zero points");
  }
  if (args.global_amax.present()) {
    if (!f.has_global_scale()) c.fail("global_amax", "only NVFP4 has a per-tensor scale");
    c.present(args.global_amax, "global_amax");
    c.dtype(args.global_amax, "global_amax", {DType::kFloat32});
    if (args.global_amax.numel() != 1) c.fail("global_amax", "expected one element, got " + args.global_amax.describe());
    p.global_amax = args.global_amax.ptr<float>();
  }
  c.no_overlap({{"out", &out}}, {{"q", &q}, {"scales", &scales}, {"zeros", &args.zeros}, {"global_amax", &args.global_amax},
                                 {"m_indptr", &args.m_indptr}});
  dispatch(c, p, &ref::dequantize, &LOWBIT_GPU(dequantize), stream);
}

void transcode(const TensorView& q, const BlockFormat& f, const TensorView& out, const QuantArgs& args, Stream stream) {
  Checker c{"transcode"};
  validate_format(f, c.op);
  if (!(f.elem == Elem::kInt4 || f.elem == Elem::kUInt4 || f.elem == Elem::kE2M1))
    c.fail("format", "exact transcoding takes INT4, UINT4 (zero point) or E2M1 codes, got " + format_name(f));
  c.present(out, "out");
  c.dtype(out, "out", {DType::kE4M3, DType::kE5M2});
  if (f.elem == Elem::kUInt4 && out.dtype != DType::kE4M3)
    c.fail("out", "UINT4 codes minus zero points (-15..15) are exact in float8_e4m3fn only");
  const Mat m = as_mat(c, out, "out");
  c.last_contiguous(out, "out");
  check_block(c, f, m.K, "out");
  c.present(q, "q");
  code_dtype(c, q, "q", f);
  c.shape(q, "q", with_batch(out, m.L, m.M, m.K / 2));
  c.last_contiguous(q, "q");
  TranscodePlan p;
  p.f = f;
  p.L = m.L;
  p.M = m.M;
  p.K = m.K;
  const Mat qm = as_mat(c, q, "q");
  p.q = q.ptr<uint8_t>();
  p.q_sL = qm.sL;
  p.q_sM = qm.sM;
  p.out = out.ptr<uint8_t>();
  p.out_dtype = out.dtype;
  p.o_sL = m.sL;
  p.o_sM = m.sM;
  if (f.elem == Elem::kUInt4) {
    c.present(args.zeros, "zeros");
    c.dtype(args.zeros, "zeros", {DType::kUInt8});
    // zero points are stored row-major [L, M, K/block] for transcode
    c.dense(args.zeros, "zeros", m.L * m.M * (m.K / f.block));
    p.zeros = args.zeros.ptr<uint8_t>();
    p.sp.layout = ScaleLayout::row_major();
    p.sp.rows = p.sp.rows_pad = m.M;
    p.sp.cols = m.K / f.block;
    p.sp.batch_stride = m.M * p.sp.cols;
  } else if (args.zeros.present()) {
    c.fail("zeros", "only UINT4 codes have zero points");
  }
  c.no_overlap({{"out", &out}}, {{"q", &q}, {"zeros", &args.zeros}});
  dispatch(c, p, &ref::transcode, &LOWBIT_GPU(transcode), stream);
}

void cast(const TensorView& x, const TensorView& out, Saturate sat, Stream stream) {
  Checker c{"cast"};
  c.present(x, "x");
  c.present(out, "out");
  const std::initializer_list<DType> fl = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kE4M3, DType::kE5M2};
  c.dtype(x, "x", fl);
  c.dtype(out, "out", fl);
  c.shape(out, "out", std::vector<int64_t>(x.shape, x.shape + x.ndim));
  CastPlan p;
  p.x = x.data;
  p.x_dtype = x.dtype;
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.ndim = x.ndim;
  p.sat = sat;
  for (int d = 0; d < x.ndim; ++d) {
    p.shape[d] = x.shape[d];
    p.xs[d] = x.strides[d];
    p.os[d] = out.strides[d];
  }
  c.no_overlap({{"out", &out}}, {{"x", &x}});
  dispatch(c, p, &ref::cast, &LOWBIT_GPU(cast), stream);
}

void convert_scale_layout(const TensorView& in, const ScaleLayout& from, const TensorView& out, const ScaleLayout& to,
                          int64_t R, int64_t C, const TensorView& m_indptr, Stream stream) {
  Checker c{"convert_scale_layout"};
  check_layout(c, from);
  check_layout(c, to);
  if (R < 0 || C < 0) c.fail("R", "R and C must be >= 0");
  c.present(in, "in");
  c.present(out, "out");
  if (dtype_bytes(in.dtype) != 1 && dtype_bytes(in.dtype) != 4) c.fail("in", "expected 1- or 4-byte scale elements");
  if (in.dtype != out.dtype) c.fail("out", std::string("expected the dtype of 'in' (") + dtype_name(in.dtype) + "), got " + dtype_name(out.dtype));
  LayoutPlan p;
  p.in = in.data;
  p.out = out.data;
  p.elem_bytes = dtype_bytes(in.dtype);
  // L from the ungrouped side
  const ScaleLayout& plain = from.group_pad == GroupPad::kNone ? from : to;
  const TensorView& plain_t = from.group_pad == GroupPad::kNone ? in : out;
  const int64_t per = scale_size(plain, R, C);
  if (per == 0) c.fail("R", "R and C must be positive");
  if (plain_t.numel() % per != 0) c.fail(&plain_t == &in ? "in" : "out", "element count is not a whole number of " + std::to_string(R) + " x " + std::to_string(C) + " matrices in this layout: " + plain_t.describe());
  p.L = plain_t.numel() / per;
  ScalePlan* sides[2] = {&p.from, &p.to};
  const ScaleLayout* ls[2] = {&from, &to};
  const TensorView* ts[2] = {&in, &out};
  const char* names[2] = {"in", "out"};
  bool used_indptr = false;
  for (int i = 0; i < 2; ++i) {
    if (ls[i]->group_pad != GroupPad::kNone) {
      check_groups(c, *ls[i], m_indptr, p.L, R, sides[i]);
      used_indptr = true;
    }
    plan_scales(c, *ts[i], names[i], *ls[i], p.L, R, C, sides[i]);
  }
  if (!used_indptr && m_indptr.present()) c.fail("m_indptr", "is only used with a grouped scale layout");
  c.no_overlap({{"out", &out}}, {{"in", &in}, {"m_indptr", &m_indptr}});
  dispatch(c, p, &ref::convert_layout, &LOWBIT_GPU(convert_layout), stream);
}

void tensor_amax(const TensorView& x, const TensorView& out, Stream stream) {
  Checker c{"tensor_amax"};
  c.present(x, "x");
  c.dtype(x, "x", {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  const Mat m = as_mat(c, x, "x");
  c.last_contiguous(x, "x");
  c.present(out, "out");
  c.dtype(out, "out", {DType::kFloat32});
  if (out.numel() != 1) c.fail("out", "expected one element, got " + out.describe());
  c.no_overlap({{"out", &out}}, {{"x", &x}});
  if (c.dev == Device::kCPU) {
    *out.ptr<float>() = bits_float(ref::amax_bits(x.data, x.dtype, m.L, m.M, m.K, m.sL, m.sM));
    return;
  }
#if LOWBIT_WITH_CUDA
  const int err = cuda::tensor_amax(x.data, x.dtype, m.L, m.M, m.K, m.sL, m.sM, out.ptr<float>(), stream.handle);
  if (err != 0) throw CudaError(std::string("tensor_amax: CUDA error: ") + cuda::error_string(err));
#else
  (void)stream;
  throw NotSupportedError("tensor_amax: this build of lowbit has no CUDA kernels; pass CPU tensors");
#endif
}

namespace {
KCachePlan kcache_plan(Checker& c, const TensorView& k, const TensorView& codes, const TensorView& scale,
                       const TensorView& residual, bool residual_required, NibbleOrder order) {
  c.present(k, "k");
  c.dtype(k, "k", {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  if (k.ndim != 4) c.fail("k", "expected [B, T, H, D], got " + k.describe());
  const int64_t B = k.shape[0], T = k.shape[1], H = k.shape[2], D = k.shape[3];
  if (D % 2 != 0) c.fail("k", "head dim D = " + std::to_string(D) + " must be even (two NF4 codes per byte)");
  c.present(codes, "codes");
  c.dtype(codes, "codes", {DType::kUInt8});
  c.shape(codes, "codes", {B, T, H, D / 2});
  c.present(scale, "scale");
  c.dtype(scale, "scale", {DType::kFloat32});
  c.shape(scale, "scale", {B, H, D});
  KCachePlan p;
  p.B = B; p.T = T; p.H = H; p.D = D;
  p.k = k.data;
  p.k_dtype = k.dtype;
  p.codes = codes.ptr<uint8_t>();
  p.scale = scale.ptr<float>();
  for (int i = 0; i < 4; ++i) {
    p.k_s[i] = k.strides[i];
    p.c_s[i] = codes.strides[i];
  }
  for (int i = 0; i < 3; ++i) p.s_s[i] = scale.strides[i];
  if (residual.present() || residual_required) {
    c.present(residual, "residual");
    c.dtype(residual, "residual", {DType::kE5M2, DType::kE4M3});
    c.shape(residual, "residual", {B, T, H, D});
    p.residual = residual.ptr<uint8_t>();
    p.r_dtype = residual.dtype;
    for (int i = 0; i < 4; ++i) p.r_s[i] = residual.strides[i];
  }
  p.order = order;
  return p;
}
}  // namespace

void nf4_kcache_quantize(const TensorView& k, const TensorView& codes, const TensorView& scale, const TensorView& residual,
                         NibbleOrder order, Stream stream) {
  Checker c{"nf4_kcache_quantize"};
  KCachePlan p = kcache_plan(c, k, codes, scale, residual, true, order);
  c.no_overlap({{"codes", &codes}, {"scale", &scale}, {"residual", &residual}}, {{"k", &k}});
  dispatch(c, p, &ref::kcache_quantize, &LOWBIT_GPU(kcache_quantize), stream);
}

void nf4_kcache_dequantize(const TensorView& codes, const TensorView& scale, const TensorView& residual,
                           const TensorView& out, NibbleOrder order, Stream stream) {
  Checker c{"nf4_kcache_dequantize"};
  KCachePlan p = kcache_plan(c, out, codes, scale, residual, false, order);
  c.no_overlap({{"out", &out}}, {{"codes", &codes}, {"scale", &scale}, {"residual", &residual}});
  dispatch(c, p, &ref::kcache_dequantize, &LOWBIT_GPU(kcache_dequantize), stream);
}

BuildInfo build_info() {
  BuildInfo b;
  b.version = LOWBIT_VERSION_STRING;
#if LOWBIT_WITH_CUDA
  b.cuda_built = true;
  b.cuda_runtime_version = cuda::runtime_version();
  b.device_count = cuda::device_count();
  if (b.device_count > 0) {
    b.device_name = cuda::device_name(0);
    b.sm = cuda::device_sm(0);
    if (b.sm >= 90)
      b.cuda_ops = {"quantize", "dequantize", "transcode", "cast", "convert_scale_layout", "tensor_amax",
                    "nf4_kcache_quantize", "nf4_kcache_dequantize"};
  }
#endif
  return b;
}

}  // namespace lowbit
