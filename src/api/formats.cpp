// src/api/formats.cpp: argument validation and CPU/CUDA dispatch of the format ops of
// lowbit/ops.hpp (quantize, dequantize, transcode, cast, scale layouts, tensor_amax).
// Nothing here computes: it checks every argument, builds a plan (core/plan.hpp) and hands it
// to the CPU reference (src/ref) or to a CUDA launcher (src/cuda).
#include <cstring>
#include <utility>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"
#include "ref/ref.hpp"

namespace lowbit {
using namespace detail;

namespace {

/// UINT4 zero points (formats with a zero point only: otherwise absent): uint8, the layout and
/// element count of the scales, stored in index order.
uint8_t* zero_points(Checker& c, const BlockFormat& f, const TensorView& zeros, const TensorView& scales,
                     const ScaleLayout& layout, const ScalePlan& sp) {
  if (!f.has_zero_point()) {
    if (zeros.present()) c.fail("zeros", "only the UINT4 zero-point format has zero points");
    return nullptr;
  }
  c.require(zeros, Req("zeros").dtypes({DType::kUInt8}));
  int64_t Cp = 0;
  checked_scale_cols_padded(layout, sp.cols, &Cp);  // already checked by plan_scales
  c.storage(zeros, "zeros", scales.numel(), &layout, sp.rows_pad, Cp);
  if (sp.groups > 0 && !zeros.is_contiguous()) c.fail("zeros", "must be a contiguous (row-major) buffer, got " + zeros.describe());
  return zeros.ptr<uint8_t>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

/// check_layout plus row_align >= 1 for every layout kind (also those that do not use it: a
/// value that would be ignored is refused, not silently dropped).
static void check_layout_row_align(const Checker& c, const ScaleLayout& l) {
  check_layout(c, l);
  if (l.row_align < 1) c.fail("layout", "row_align must be >= 1, got " + std::to_string(l.row_align));
}

std::vector<int64_t> scale_shape(const BlockFormat& f, const ScaleLayout& layout, int64_t L, int64_t M, int64_t K,
                                 int64_t groups) {
  validate_format(f, "scale_shape");
  Checker c{"scale_shape"};
  check_layout_row_align(c, layout);
  if (L < 0) c.fail("L", "must be >= 0, got " + std::to_string(L));
  if (M < 0) c.fail("M", "must be >= 0, got " + std::to_string(M));
  if (K < 0) c.fail("K", "must be >= 0, got " + std::to_string(K));
  if (groups < 0) c.fail("groups", "must be >= 0, got " + std::to_string(groups));
  check_block(c, f, K, "K");
  const int64_t C = K / f.block;
  int64_t Rp = 0, Cp = 0;
  if (!checked_scale_cols_padded(layout, C, &Cp)) c.fail("K", "the padded scale columns overflow a 64-bit integer");
  if (layout.group_pad != GroupPad::kNone) {
    if (groups <= 0) c.fail("groups", "a grouped layout needs groups > 0");
    if (!checked_grouped_rows_alloc(layout.group_pad, M, groups, &Rp))
      c.fail("groups", "the grouped rows for M = " + std::to_string(M) + " in " + std::to_string(groups) +
                           " groups overflow a 64-bit integer");
    c.mul("groups", Rp, Cp);
    return {1, Rp, Cp};
  }
  if (!checked_scale_rows_padded(layout, M, &Rp)) c.fail("M", "the padded scale rows overflow a 64-bit integer");
  c.mul("L", L, c.mul("M", Rp, Cp));
  if (layout.kind == ScaleLayoutKind::kColMajor) return {L, C, Rp};
  return {L, Rp, Cp};
}

/// The NVFP4 per-tensor amax argument: checked, and (`read`: an input, on the host) read once into
/// `copy`, so that the value checked is the value used. A NaN amax means "no per-tensor scale" to
/// dequantize (`nan_ok`); quantize refuses it.
static float* global_amax_arg(Checker& c, const BlockFormat& f, const TensorView& t, bool read, bool nan_ok,
                             float* copy) {
  if (!f.has_global_scale()) c.fail("global_amax", "only NVFP4 has a per-tensor scale");
  c.require(t, Req("global_amax").dtypes({DType::kFloat32}).one_element("one element"));
  if (!read || t.device != Device::kCPU) return t.ptr<float>();
  *copy = *t.ptr<float>();
  if (nan_ok ? *copy < 0.0f : !(*copy >= 0.0f))
    c.fail("global_amax", std::string("the per-tensor amax must be >= 0") + (nan_ok ? "" : " and not NaN") + ", got " +
                              std::to_string(*copy));
  return copy;
}

/// What quantize and dequantize plan alike (Plan: QuantPlan or DequantPlan): the format and the
/// sizes of m (x or out), the codes q, the scales (their plan, with the groups of a grouped layout:
/// a host m_indptr is copied once into *indptr_copy) and the zero points.
template <typename Plan>
static void plan_blocks(Checker& c, Plan* p, const BlockFormat& f, const Mat& m, const TensorView& q,
                        const TensorView& scales, const ScaleLayout& layout, const QuantArgs& args,
                        std::vector<int64_t>* indptr_copy) {
  p->f = f;
  p->L = m.L;
  p->M = m.M;
  p->K = m.K;
  const Mat qm = as_mat(c, q, "q");
  p->q = q.ptr<uint8_t>();
  p->q_sL = qm.sL;
  p->q_sM = qm.sM;
  p->scales = scales.data;
  check_groups(c, layout, args.m_indptr, m.L, m.M, &p->sp, indptr_copy);
  plan_scales(c, scales, "scales", layout, m.L, m.M, m.K / f.block, &p->sp);
  p->zeros = zero_points(c, f, args.zeros, scales, layout, p->sp);
}

void quantize(const TensorView& x, const BlockFormat& f, const ScaleLayout& layout, const TensorView& q,
              const TensorView& scales, const QuantArgs& args, Stream stream) {
  Checker c{"quantize"};
  validate_format(f, c.op);
  check_layout_row_align(c, layout);
  c.require(x, Req("x").dtypes({DType::kFloat32, DType::kFloat16, DType::kBFloat16}).matrix().last_contiguous());
  const Mat m = as_mat(c, x, "x");
  check_block(c, f, m.K, "x");
  c.require(q, Req("q").dtypes(code_dtypes(f)).shape(with_batch(x, m.L, m.M, f.packed() ? m.K / 2 : m.K)).last_contiguous());
  c.require(scales, Req("scales").dtypes(scale_dtypes(f.scale_type)));

  QuantPlan p;
  p.x = x.data;
  p.x_dtype = x.dtype;
  p.x_sL = m.sL;
  p.x_sM = m.sM;
  std::vector<int64_t> indptr_copy;  // host m_indptr: the one copy that is validated and used
  float gamax_copy = 0.0f;           // host global_amax (when read, not computed): likewise
  plan_blocks(c, &p, f, m, q, scales, layout, args, &indptr_copy);
  if (args.global_amax.present()) {
    p.compute_global_amax = args.compute_global_amax;
    p.global_amax = global_amax_arg(c, f, args.global_amax, !p.compute_global_amax, /*nan_ok=*/false, &gamax_copy);
  } else if (args.compute_global_amax) {
    c.fail("global_amax", "compute_global_amax needs a float32 [1] tensor to write the amax into");
  }
  Checker::Named outs = {{"q", &q}, {"scales", &scales}, {"zeros", &args.zeros}};
  Checker::Named ins = {{"x", &x}, {"m_indptr", &args.m_indptr}};
  (p.compute_global_amax ? outs : ins).push_back({"global_amax", &args.global_amax});
  c.no_overlap(outs, ins);
  dispatch(c, p, &ref::quantize, [&] { return cuda::quantize(p, stream.handle); });
}

void dequantize(const TensorView& q, const TensorView& scales, const BlockFormat& f, const ScaleLayout& layout,
                const TensorView& out, const QuantArgs& args, Stream stream) {
  Checker c{"dequantize"};
  validate_format(f, c.op);
  check_layout_row_align(c, layout);
  c.require(out, Req("out")
                     .dtypes({DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kE4M3, DType::kE5M2})
                     .matrix()
                     .last_contiguous());
  const Mat m = as_mat(c, out, "out");
  check_block(c, f, m.K, "out");
  c.require(q, Req("q").dtypes(code_dtypes(f)).shape(with_batch(out, m.L, m.M, f.packed() ? m.K / 2 : m.K)).last_contiguous());
  c.require(scales, Req("scales").dtypes(scale_dtypes(f.scale_type)));
  if (args.compute_global_amax) c.fail("compute_global_amax", "is a quantize option");

  DequantPlan p;
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.o_sL = m.sL;
  p.o_sM = m.sM;
  std::vector<int64_t> indptr_copy;  // host m_indptr: the one copy that is validated and used
  float gamax_copy = 0.0f;           // host global_amax (when read, not computed): likewise
  plan_blocks(c, &p, f, m, q, scales, layout, args, &indptr_copy);
  if (args.global_amax.present())
    p.global_amax = global_amax_arg(c, f, args.global_amax, /*read=*/true, /*nan_ok=*/true, &gamax_copy);
  c.no_overlap({{"out", &out}}, {{"q", &q}, {"scales", &scales}, {"zeros", &args.zeros}, {"global_amax", &args.global_amax},
                                 {"m_indptr", &args.m_indptr}});
  dispatch(c, p, &ref::dequantize, [&] { return cuda::dequantize(p, stream.handle); });
}

void transcode(const TensorView& q, const BlockFormat& f, const TensorView& out, const QuantArgs& args, Stream stream) {
  Checker c{"transcode"};
  validate_format(f, c.op);
  if (!(f.elem == Elem::kInt4 || f.elem == Elem::kUInt4 || f.elem == Elem::kE2M1))
    c.fail("format", "exact transcoding takes INT4, UINT4 (zero point) or E2M1 codes, got " + format_name(f));
  c.require(out, Req("out").dtypes({DType::kE4M3, DType::kE5M2}));
  if (f.elem == Elem::kUInt4 && out.dtype != DType::kE4M3)
    c.fail("out", "UINT4 codes minus zero points (-15..15) are exact in float8_e4m3fn only");
  c.require(out, Req("out").matrix().last_contiguous());
  const Mat m = as_mat(c, out, "out");
  check_block(c, f, m.K, "out");
  c.require(q, Req("q").dtypes(code_dtypes(f)).shape(with_batch(out, m.L, m.M, m.K / 2)).last_contiguous());
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
    c.require(args.zeros, Req("zeros").dtypes({DType::kUInt8}));
    // zero points are stored row-major [L, M, K/block] for transcode
    c.storage(args.zeros, "zeros", m.L * m.M * (m.K / f.block));
    p.zeros = args.zeros.ptr<uint8_t>();
    p.sp.layout = ScaleLayout::row_major();
    p.sp.rows = p.sp.rows_pad = m.M;
    p.sp.cols = m.K / f.block;
    p.sp.batch_stride = m.M * p.sp.cols;
  } else if (args.zeros.present()) {
    c.fail("zeros", "only UINT4 codes have zero points");
  }
  c.no_overlap({{"out", &out}}, {{"q", &q}, {"zeros", &args.zeros}});
  dispatch(c, p, &ref::transcode, [&] { return cuda::transcode(p, stream.handle); });
}

void cast(const TensorView& x, const TensorView& out, Saturate sat, Stream stream) {
  Checker c{"cast"};
  c.present(x, "x");
  c.present(out, "out");
  const DTypes fl = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kE4M3, DType::kE5M2};
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
  dispatch(c, p, &ref::cast, [&] { return cuda::cast(p, stream.handle); });
}

void convert_scale_layout(const TensorView& in, const ScaleLayout& from, const TensorView& out, const ScaleLayout& to,
                          int64_t R, int64_t C, const TensorView& m_indptr, Stream stream) {
  Checker c{"convert_scale_layout"};
  check_layout_row_align(c, from);
  check_layout_row_align(c, to);
  if (R <= 0) c.fail("R", "the number of rows must be positive, got " + std::to_string(R));
  if (C <= 0) c.fail("C", "the number of columns must be positive, got " + std::to_string(C));
  c.present(in, "in");
  c.present(out, "out");
  if (dtype_bytes(in.dtype) != 1 && dtype_bytes(in.dtype) != 4) c.fail("in", "expected 1- or 4-byte scale elements");
  if (in.dtype != out.dtype) c.fail("out", std::string("expected the dtype of 'in' (") + dtype_name(in.dtype) + "), got " + dtype_name(out.dtype));
  LayoutPlan p;
  p.in = in.data;
  p.out = out.data;
  p.elem_bytes = dtype_bytes(in.dtype);
  if (from.group_pad != GroupPad::kNone && to.group_pad != GroupPad::kNone) {
    p.L = 1;  // grouped -> grouped (e.g. FlashInfer padding -> cumsum padding): one matrix
  } else {
    // L from the ungrouped side
    const ScaleLayout& plain = from.group_pad == GroupPad::kNone ? from : to;
    const TensorView& plain_t = from.group_pad == GroupPad::kNone ? in : out;
    int64_t Rp, Cp;
    if (!checked_scale_rows_padded(plain, R, &Rp)) c.fail("R", "the padded rows of R = " + std::to_string(R) + " overflow a 64-bit integer");
    if (!checked_scale_cols_padded(plain, C, &Cp)) c.fail("C", "the padded columns of C = " + std::to_string(C) + " overflow a 64-bit integer");
    const int64_t per = c.mul("R", Rp, Cp);
    if (plain_t.numel() % per != 0)
      c.fail(&plain_t == &in ? "in" : "out", "element count is not a whole number of " + std::to_string(R) + " x " +
                                                 std::to_string(C) + " matrices in this layout: " + plain_t.describe());
    p.L = plain_t.numel() / per;
  }
  ScalePlan* sides[2] = {&p.from, &p.to};
  const ScaleLayout* ls[2] = {&from, &to};
  const TensorView* ts[2] = {&in, &out};
  const char* names[2] = {"in", "out"};
  bool used_indptr = false;
  std::vector<int64_t> indptr_copy;  // host m_indptr: the one copy that is validated and used
  for (int i = 0; i < 2; ++i) {
    if (ls[i]->group_pad != GroupPad::kNone) {
      check_groups(c, *ls[i], m_indptr, p.L, R, sides[i], &indptr_copy);
      used_indptr = true;
    }
    plan_scales(c, *ts[i], names[i], *ls[i], p.L, R, C, sides[i]);
  }
  if (!used_indptr && m_indptr.present()) c.fail("m_indptr", "is only used with a grouped scale layout");
  c.no_overlap({{"out", &out}}, {{"in", &in}, {"m_indptr", &m_indptr}});
  dispatch(c, p, &ref::convert_layout, [&] { return cuda::convert_layout(p, stream.handle); });
}

void tensor_amax(const TensorView& x, const TensorView& out, Stream stream) {
  Checker c{"tensor_amax"};
  c.require(x, Req("x").dtypes({DType::kFloat32, DType::kFloat16, DType::kBFloat16}).matrix().last_contiguous());
  const Mat m = as_mat(c, x, "x");
  c.require(out, Req("out").dtypes({DType::kFloat32}).one_element("one element"));
  c.no_overlap({{"out", &out}}, {{"x", &x}});
  if (c.dev == Device::kCPU) {
    *out.ptr<float>() = bits_float(ref::amax_bits(x.data, x.dtype, m.L, m.M, m.K, m.sL, m.sM));
    return;
  }
  run_on_device(c, [&] { return cuda::tensor_amax(x.data, x.dtype, m.L, m.M, m.K, m.sL, m.sM, out.ptr<float>(), stream.handle); });
}

}  // namespace lowbit
