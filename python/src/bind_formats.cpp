// python/src/bind_formats.cpp: the format functions (validate_format, format_name, dtype_bytes,
// scale_shape) and the conversions: quantize, dequantize, transcode, cast, convert_scale_layout,
// tensor_amax.
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

namespace {

void quantize_op(const Array& x, lowbit::DType x_dtype, nb::handle q, lowbit::DType q_dtype, nb::handle scales,
                 lowbit::DType scales_dtype, const lowbit::BlockFormat& format, const lowbit::ScaleLayout& layout,
                 nb::handle zeros, nb::handle global_amax, bool compute_global_amax, const OptArray& m_indptr,
                 uintptr_t stream) {
  const char* op = "quantize";
  const lowbit::TensorView xv = to_view(x, x_dtype, op, "x");
  const Out qo = out_array(q, q_dtype, op, "q"), so = out_array(scales, scales_dtype, op, "scales");
  const Out zo = out_array(zeros, std::nullopt, op, "zeros");
  Out go;  // written when compute_global_amax
  In gi;
  lowbit::QuantArgs args;
  if (compute_global_amax) {
    go = out_array(global_amax, std::nullopt, op, "global_amax");
    args.global_amax = go.v;
  } else {
    gi = in_array(global_amax, op, "global_amax");
    args.global_amax = gi.v;
  }
  const lowbit::TensorView qv = qo.v, sv = so.v;
  args.zeros = zo.v;
  args.compute_global_amax = compute_global_amax;
  args.m_indptr = opt_view(m_indptr, op, "m_indptr");
  const lowbit::BlockFormat f = format;
  const lowbit::ScaleLayout l = layout;
  nb::gil_scoped_release release;
  lowbit::quantize(xv, f, l, qv, sv, args, make_stream(stream));
}

void dequantize_op(const Array& q, lowbit::DType q_dtype, const Array& scales, lowbit::DType scales_dtype, nb::handle out,
                   lowbit::DType out_dtype, const lowbit::BlockFormat& format, const lowbit::ScaleLayout& layout,
                   const OptArray& zeros, const OptArray& global_amax, const OptArray& m_indptr, uintptr_t stream) {
  const char* op = "dequantize";
  const lowbit::TensorView qv = to_view(q, q_dtype, op, "q"), sv = to_view(scales, scales_dtype, op, "scales");
  const Out oo = out_array(out, out_dtype, op, "out");
  const lowbit::TensorView ov = oo.v;
  lowbit::QuantArgs args;
  args.zeros = opt_view(zeros, op, "zeros");
  args.global_amax = opt_view(global_amax, op, "global_amax");
  args.m_indptr = opt_view(m_indptr, op, "m_indptr");
  const lowbit::BlockFormat f = format;
  const lowbit::ScaleLayout l = layout;
  nb::gil_scoped_release release;
  lowbit::dequantize(qv, sv, f, l, ov, args, make_stream(stream));
}

void transcode_op(const Array& q, lowbit::DType q_dtype, nb::handle out, lowbit::DType out_dtype,
                  const lowbit::BlockFormat& format, const OptArray& zeros, uintptr_t stream) {
  const char* op = "transcode";
  const Out oo = out_array(out, out_dtype, op, "out");
  const lowbit::TensorView qv = to_view(q, q_dtype, op, "q"), ov = oo.v;
  lowbit::QuantArgs args;
  args.zeros = opt_view(zeros, op, "zeros");
  const lowbit::BlockFormat f = format;
  nb::gil_scoped_release release;
  lowbit::transcode(qv, f, ov, args, make_stream(stream));
}

}  // namespace

void bind_formats(nb::module_& m) {
  m.def("validate_format", [](const lowbit::BlockFormat& f) { lowbit::validate_format(f, "Format"); }, "format"_a,
        "Raises ValueError unless the format is one lowbit implements.");
  m.def(
      "validate_format",
      [](lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule, lowbit::NibbleOrder nib,
         lowbit::ZeroScale zs, float eps) { lowbit::validate_format(make_format(elem, block, st, rule, nib, zs, eps), "Format"); },
      "elem"_a, "block"_a, "scale_type"_a, "rule"_a, "nibbles"_a, "zero_scale"_a, "eps"_a);
  m.def("format_name", [](const lowbit::BlockFormat& f) { return lowbit::format_name(f); }, "format"_a);
  m.def(
      "format_name",
      [](lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule, lowbit::NibbleOrder nib,
         lowbit::ZeroScale zs, float eps) { return lowbit::format_name(make_format(elem, block, st, rule, nib, zs, eps)); },
      "elem"_a, "block"_a, "scale_type"_a, "rule"_a, "nibbles"_a, "zero_scale"_a, "eps"_a);
  m.def("dtype_bytes", [](lowbit::DType t) { return lowbit::dtype_bytes(t); }, "dtype"_a);

  m.def(
      "scale_shape",
      [](const lowbit::BlockFormat& f, const lowbit::ScaleLayout& l, int64_t L, int64_t M, int64_t K, int64_t groups) {
        return lowbit::scale_shape(f, l, L, M, K, groups);
      },
      "format"_a, "layout"_a, "L"_a, "M"_a, "K"_a, "groups"_a = 0,
      "[L, rows, cols] of the stored scale matrices for a [L, M, K] input (column-major: [L, K/block, Mp]).");
  m.def(
      "scale_shape",
      [](lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule, lowbit::NibbleOrder nib,
         lowbit::ZeroScale zs, float eps, lowbit::ScaleLayoutKind kind, int32_t row_align, lowbit::GroupPad pad, int64_t L,
         int64_t M, int64_t K, int64_t groups) {
        return lowbit::scale_shape(make_format(elem, block, st, rule, nib, zs, eps), make_layout(kind, row_align, pad), L, M, K,
                                   groups);
      },
      "elem"_a, "block"_a, "scale_type"_a, "rule"_a, "nibbles"_a, "zero_scale"_a, "eps"_a, "layout"_a, "row_align"_a,
      "group_pad"_a, "L"_a, "M"_a, "K"_a, "groups"_a = 0);

  // --- ops -------------------------------------------------------------------------------------
  // quantize / dequantize / transcode: the format (and layout) as bound classes; the forms with
  // loose fields convert them and call the same function.
  m.def("quantize", &quantize_op, "x"_a, "x_dtype"_a, "q"_a, "q_dtype"_a, "scales"_a, "scales_dtype"_a, "format"_a,
        "layout"_a, "zeros"_a = nb::none(), "global_amax"_a = nb::none(), "compute_global_amax"_a = false,
        "m_indptr"_a.none() = nb::none(), "stream"_a = 0,
        "q, scales (, zeros) = quantize(x) into caller-allocated outputs (lowbit::quantize).");
  m.def(
      "quantize",
      [](const Array& x, lowbit::DType x_dtype, nb::handle q, lowbit::DType q_dtype, nb::handle scales,
         lowbit::DType scales_dtype, lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule,
         lowbit::NibbleOrder nib, lowbit::ZeroScale zs, float eps, lowbit::ScaleLayoutKind kind, int32_t row_align,
         lowbit::GroupPad pad, nb::handle zeros, nb::handle global_amax, bool compute_global_amax,
         const OptArray& m_indptr, uintptr_t stream) {
        quantize_op(x, x_dtype, q, q_dtype, scales, scales_dtype, make_format(elem, block, st, rule, nib, zs, eps),
                    make_layout(kind, row_align, pad), zeros, global_amax, compute_global_amax, m_indptr, stream);
      },
      "x"_a, "x_dtype"_a, "q"_a, "q_dtype"_a, "scales"_a, "scales_dtype"_a, "elem"_a, "block"_a, "scale_type"_a, "rule"_a,
      "nibbles"_a, "zero_scale"_a, "eps"_a, "layout"_a, "row_align"_a, "group_pad"_a, "zeros"_a = nb::none(),
      "global_amax"_a = nb::none(), "compute_global_amax"_a = false, "m_indptr"_a.none() = nb::none(),
      "stream"_a = 0);

  m.def("dequantize", &dequantize_op, "q"_a, "q_dtype"_a, "scales"_a, "scales_dtype"_a, "out"_a, "out_dtype"_a,
        "format"_a, "layout"_a, "zeros"_a.none() = nb::none(), "global_amax"_a.none() = nb::none(),
        "m_indptr"_a.none() = nb::none(), "stream"_a = 0, "out = dequantize(q, scales) (lowbit::dequantize).");
  m.def(
      "dequantize",
      [](const Array& q, lowbit::DType q_dtype, const Array& scales, lowbit::DType scales_dtype, nb::handle out,
         lowbit::DType out_dtype, lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule,
         lowbit::NibbleOrder nib, lowbit::ZeroScale zs, float eps, lowbit::ScaleLayoutKind kind, int32_t row_align,
         lowbit::GroupPad pad, const OptArray& zeros, const OptArray& global_amax, const OptArray& m_indptr,
         uintptr_t stream) {
        dequantize_op(q, q_dtype, scales, scales_dtype, out, out_dtype, make_format(elem, block, st, rule, nib, zs, eps),
                      make_layout(kind, row_align, pad), zeros, global_amax, m_indptr, stream);
      },
      "q"_a, "q_dtype"_a, "scales"_a, "scales_dtype"_a, "out"_a, "out_dtype"_a, "elem"_a, "block"_a, "scale_type"_a,
      "rule"_a, "nibbles"_a, "zero_scale"_a, "eps"_a, "layout"_a, "row_align"_a, "group_pad"_a,
      "zeros"_a.none() = nb::none(), "global_amax"_a.none() = nb::none(), "m_indptr"_a.none() = nb::none(),
      "stream"_a = 0);

  m.def("transcode", &transcode_op, "q"_a, "q_dtype"_a, "out"_a, "out_dtype"_a, "format"_a,
        "zeros"_a.none() = nb::none(), "stream"_a = 0, "Exact INT4 / UINT4 / E2M1 codes -> FP8 codes (lowbit::transcode).");
  m.def(
      "transcode",
      [](const Array& q, lowbit::DType q_dtype, nb::handle out, lowbit::DType out_dtype, lowbit::Elem elem, int32_t block,
         lowbit::ScaleType st, lowbit::ScaleRule rule, lowbit::NibbleOrder nib, lowbit::ZeroScale zs, float eps,
         const OptArray& zeros, uintptr_t stream) {
        transcode_op(q, q_dtype, out, out_dtype, make_format(elem, block, st, rule, nib, zs, eps), zeros, stream);
      },
      "q"_a, "q_dtype"_a, "out"_a, "out_dtype"_a, "elem"_a, "block"_a, "scale_type"_a, "rule"_a, "nibbles"_a,
      "zero_scale"_a, "eps"_a, "zeros"_a.none() = nb::none(), "stream"_a = 0);

  m.def(
      "cast",
      [](const Array& x, lowbit::DType x_dtype, nb::handle out, lowbit::DType out_dtype, lowbit::Saturate sat,
         uintptr_t stream) {
        const Out oo = out_array(out, out_dtype, "cast", "out");
        const lowbit::TensorView xv = to_view(x, x_dtype, "cast", "x"), ov = oo.v;
        nb::gil_scoped_release release;
        lowbit::cast(xv, ov, sat, make_stream(stream));
      },
      "x"_a, "x_dtype"_a, "out"_a, "out_dtype"_a, "saturate"_a, "stream"_a = 0, "out = cast(x) elementwise (lowbit::cast).");

  m.def(
      "convert_scale_layout",
      [](const Array& in, nb::handle out, lowbit::DType dtype, lowbit::ScaleLayoutKind src, int32_t src_row_align,
         lowbit::GroupPad src_pad, lowbit::ScaleLayoutKind dst, int32_t dst_row_align, lowbit::GroupPad dst_pad, int64_t R,
         int64_t C, const OptArray& m_indptr, uintptr_t stream) {
        const char* op = "convert_scale_layout";
        const Out oo = out_array(out, dtype, op, "out");
        const lowbit::TensorView iv = to_view(in, dtype, op, "in"), ov = oo.v;
        const lowbit::TensorView mv = opt_view(m_indptr, op, "m_indptr");
        const auto from = make_layout(src, src_row_align, src_pad), to = make_layout(dst, dst_row_align, dst_pad);
        nb::gil_scoped_release release;
        lowbit::convert_scale_layout(iv, from, ov, to, R, C, mv, make_stream(stream));
      },
      "in"_a, "out"_a, "dtype"_a, "src"_a, "src_row_align"_a, "src_group_pad"_a, "dst"_a, "dst_row_align"_a,
      "dst_group_pad"_a, "R"_a, "C"_a, "m_indptr"_a.none() = nb::none(), "stream"_a = 0,
      "Copies L stored R x C scale matrices from one layout to another (lowbit::convert_scale_layout).");

  m.def(
      "tensor_amax",
      [](const Array& x, lowbit::DType x_dtype, nb::handle out, uintptr_t stream) {
        const lowbit::TensorView xv = to_view(x, x_dtype, "tensor_amax", "x");
        const Out oo = out_array(out, lowbit::DType::kFloat32, "tensor_amax", "out");
        const lowbit::TensorView ov = oo.v;
        nb::gil_scoped_release release;
        lowbit::tensor_amax(xv, ov, make_stream(stream));
      },
      "x"_a, "x_dtype"_a, "out"_a, "stream"_a = 0, "out[0] = max(|x|) over the finite elements (NaN / Inf ignored) (lowbit::tensor_amax).");
}

}  // namespace lowbit_bind
