// python/src/bindings.cpp: the nanobind module lowbit._C. Registration and conversion only:
// every function converts its arrays (any DLPack producer: NumPy, torch, CuPy, JAX; CPU or
// CUDA) plus an explicit lowbit DType into lowbit::TensorView, releases the GIL and calls the
// C++ API of include/lowbit/ops.hpp, which validates and computes. The Python layer
// (python/lowbit) allocates outputs and passes dtypes explicitly, because NumPy cannot export
// the ml_dtypes types through DLPack and packed fp4 exports are fragile: it passes
// same-itemsize views (bf16 as uint16/int16, fp8 and fp4x2 as uint8) and the real dtype.
//
// Errors: lowbit::ArgumentError -> ValueError, NotSupportedError -> NotImplementedError,
// CudaError (and any other lowbit::Error) -> RuntimeError, messages kept.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "lowbit/error.hpp"
#include "lowbit/format.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/ops.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<nb::ro>;  // any dtype, any device, read-only accepted
using OptArray = std::optional<Array>;

template <typename Arr>
lowbit::TensorView to_view(const Arr& a, lowbit::DType t, const char* op, const char* arg) {
  lowbit::TensorView v;
  const auto dt = a.dtype();
  const int64_t item_bits = int64_t(dt.bits) * int64_t(dt.lanes);
  if (item_bits != 8 * int64_t(lowbit::dtype_bytes(t)))
    throw lowbit::ArgumentError(op, arg,
                                std::string("the array's element size (") + std::to_string(item_bits) +
                                    " bits) does not match the declared dtype " + lowbit::dtype_name(t));
  if (a.ndim() > size_t(lowbit::kMaxDims))
    throw lowbit::ArgumentError(op, arg, "has more than 8 dimensions");
  if (dt.code == uint8_t(nb::dlpack::dtype_code::Bool) || dt.code == uint8_t(nb::dlpack::dtype_code::Complex))
    throw lowbit::ArgumentError(op, arg,
                                std::string("a ") + (dt.code == uint8_t(nb::dlpack::dtype_code::Bool) ? "bool" : "complex") +
                                    " array is not " + lowbit::dtype_name(t) + " data");
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = t;
  v.ndim = int32_t(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    v.shape[d] = int64_t(a.shape(d));
    v.strides[d] = int64_t(a.stride(d));
  }
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value || dev == nb::device::cuda_host::value) {
    v.device = lowbit::Device::kCPU;
    v.device_id = 0;
  } else if (dev == nb::device::cuda::value || dev == nb::device::cuda_managed::value) {
    v.device = lowbit::Device::kCUDA;
    v.device_id = a.device_id();
  } else {
    throw lowbit::ArgumentError(op, arg, "expected a CPU or CUDA array, got DLPack device type " + std::to_string(dev));
  }
  return v;
}

/// A float32 argument whose own type must be float32 (to_view checks the element size only, so
/// an int32 / uint32 array would be reinterpreted as floats).
template <typename Arr>
lowbit::TensorView float32_view(const Arr& a, const char* op, const char* arg) {
  const auto dt = a.dtype();
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Float) || dt.bits != 32 || dt.lanes != 1)
    throw lowbit::ArgumentError(op, arg,
                                "expected float32, got DLPack dtype (code " + std::to_string(int(dt.code)) + ", bits " +
                                    std::to_string(int(dt.bits)) + ")");
  return to_view(a, lowbit::DType::kFloat32, op, arg);
}

/// The lowbit dtype of an array from its DLPack type (for arguments of standard dtypes).
template <typename Arr>
lowbit::DType infer_dtype(const Arr& a, const char* op, const char* arg) {
  const auto dt = a.dtype();
  lowbit::DType t;
  if (!lowbit::from_dlpack({dt.code, dt.bits, dt.lanes}, &t))
    throw lowbit::ArgumentError(op, arg,
                                "unsupported DLPack dtype (code " + std::to_string(int(dt.code)) + ", bits " +
                                    std::to_string(int(dt.bits)) + ", lanes " + std::to_string(int(dt.lanes)) + ")");
  return t;
}

lowbit::TensorView opt_view(const OptArray& a, const char* op, const char* arg) {
  if (!a) return {};
  return to_view(*a, infer_dtype(*a, op, arg), op, arg);
}

/// An array the call writes. Outputs are taken as plain objects and converted here, so that a
/// read-only array (a read-only NumPy array or np.memmap, a DLPack export flagged read-only) is
/// refused with an ArgumentError naming the argument instead of being written (or faulting).
/// The holder keeps the converted array alive for the call; None gives an absent view.
struct Out {
  nb::ndarray<> arr;
  lowbit::TensorView v;
};

Out out_array(nb::handle h, std::optional<lowbit::DType> t, const char* op, const char* arg) {
  Out o;
  if (h.is_none()) return o;
  if (!nb::try_cast(h, o.arr, false)) {
    Array ro;
    if (nb::try_cast(h, ro, false))
      throw lowbit::ArgumentError(op, arg, "is read-only: an output must be a writable array");
    throw lowbit::ArgumentError(op, arg,
                                std::string("expected an array (DLPack or buffer protocol), got ") + nb::inst_name(h).c_str());
  }
  o.v = to_view(o.arr, t ? *t : infer_dtype(o.arr, op, arg), op, arg);
  return o;
}

/// An array the call only reads, given as a plain object (None: absent).
struct In {
  Array arr;
  lowbit::TensorView v;
};

In in_array(nb::handle h, const char* op, const char* arg) {
  In i;
  if (h.is_none()) return i;
  if (!nb::try_cast(h, i.arr, false))
    throw lowbit::ArgumentError(op, arg,
                                std::string("expected an array (DLPack or buffer protocol), got ") + nb::inst_name(h).c_str());
  i.v = to_view(i.arr, infer_dtype(i.arr, op, arg), op, arg);
  return i;
}

lowbit::BlockFormat make_format(lowbit::Elem elem, int32_t block, lowbit::ScaleType scale_type, lowbit::ScaleRule rule,
                                lowbit::NibbleOrder nibbles, lowbit::ZeroScale zero_scale, float eps) {
  lowbit::BlockFormat f;
  f.elem = elem;
  f.block = block;
  f.scale_type = scale_type;
  f.rule = rule;
  f.nibbles = nibbles;
  f.zero_scale = zero_scale;
  f.eps = eps;
  return f;
}

lowbit::ScaleLayout make_layout(lowbit::ScaleLayoutKind kind, int32_t row_align, lowbit::GroupPad pad) {
  lowbit::ScaleLayout l;
  l.kind = kind;
  l.row_align = row_align;
  l.group_pad = pad;
  return l;
}

lowbit::Stream make_stream(uintptr_t s) { return lowbit::Stream{reinterpret_cast<void*>(s)}; }

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

NB_MODULE(_C, m) {
  m.doc() = "lowbit C++ core (nanobind). Use the `lowbit` package, not this module directly.";
  m.attr("__version__") = LOWBIT_VERSION_STRING;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const lowbit::ArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lowbit::NotSupportedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const lowbit::Error& e) {  // CudaError and internal checks
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  // --- enums (values mirror the C++ enums) ------------------------------------------------
  nb::enum_<lowbit::DType>(m, "DType")
      .value("float32", lowbit::DType::kFloat32)
      .value("float16", lowbit::DType::kFloat16)
      .value("bfloat16", lowbit::DType::kBFloat16)
      .value("float64", lowbit::DType::kFloat64)
      .value("float8_e4m3fn", lowbit::DType::kE4M3)
      .value("float8_e5m2", lowbit::DType::kE5M2)
      .value("float8_e8m0fnu", lowbit::DType::kUE8M0)
      .value("float4_e2m1fn_x2", lowbit::DType::kFloat4E2M1x2)
      .value("uint8", lowbit::DType::kUInt8)
      .value("int8", lowbit::DType::kInt8)
      .value("int16", lowbit::DType::kInt16)
      .value("int32", lowbit::DType::kInt32)
      .value("int64", lowbit::DType::kInt64);
  nb::enum_<lowbit::Elem>(m, "Elem")
      .value("e4m3", lowbit::Elem::kE4M3)
      .value("e5m2", lowbit::Elem::kE5M2)
      .value("e2m1", lowbit::Elem::kE2M1)
      .value("int4", lowbit::Elem::kInt4)
      .value("uint4", lowbit::Elem::kUInt4)
      .value("nf4", lowbit::Elem::kNF4);
  nb::enum_<lowbit::ScaleType>(m, "ScaleType")
      .value("f32", lowbit::ScaleType::kF32)
      .value("ue8m0", lowbit::ScaleType::kUE8M0)
      .value("e4m3", lowbit::ScaleType::kE4M3);
  nb::enum_<lowbit::ScaleRule>(m, "ScaleRule")
      .value("amax", lowbit::ScaleRule::kAmax)
      .value("minmax", lowbit::ScaleRule::kMinMax)
      .value("mx_floor", lowbit::ScaleRule::kMxFloor)
      .value("mx_rceil", lowbit::ScaleRule::kMxRceil)
      .value("nvfp4", lowbit::ScaleRule::kNvfp4)
      .value("absmax", lowbit::ScaleRule::kAbsmax);
  nb::enum_<lowbit::NibbleOrder>(m, "NibbleOrder")
      .value("low", lowbit::NibbleOrder::kLowFirst)
      .value("high", lowbit::NibbleOrder::kHighFirst);
  nb::enum_<lowbit::ZeroScale>(m, "ZeroScale")
      .value("zero", lowbit::ZeroScale::kZero)
      .value("min", lowbit::ZeroScale::kMinSubnormal)
      .value("one", lowbit::ZeroScale::kOne);
  nb::enum_<lowbit::ScaleLayoutKind>(m, "ScaleLayoutKind")
      .value("row_major", lowbit::ScaleLayoutKind::kRowMajor)
      .value("col_major", lowbit::ScaleLayoutKind::kColMajor)
      .value("blocked128x4", lowbit::ScaleLayoutKind::kBlocked128x4)
      .value("blocked8x4", lowbit::ScaleLayoutKind::kBlocked8x4);
  nb::enum_<lowbit::GroupPad>(m, "GroupPad")
      .value("none", lowbit::GroupPad::kNone)
      .value("flashinfer", lowbit::GroupPad::kFlashInfer)
      .value("cumsum", lowbit::GroupPad::kCumsum);
  nb::enum_<lowbit::Saturate>(m, "Saturate")
      .value("finite", lowbit::Saturate::kFinite)
      .value("none", lowbit::Saturate::kNone);

  // --- format descriptors ---------------------------------------------------------------------
  // BlockFormat and ScaleLayout are bound as immutable values (fields read-only). Every function
  // that takes them also keeps its form with the fields passed one by one (elem, block,
  // scale_type, rule, nibbles, zero_scale, eps; layout kind, row_align, group_pad).
  nb::class_<lowbit::BlockFormat>(m, "BlockFormat", "lowbit::BlockFormat (fields in the order of the constructor).")
      .def("__init__",
           [](lowbit::BlockFormat* f, lowbit::Elem elem, int32_t block, lowbit::ScaleType st, lowbit::ScaleRule rule,
              lowbit::NibbleOrder nib, lowbit::ZeroScale zs, float eps) {
             new (f) lowbit::BlockFormat(make_format(elem, block, st, rule, nib, zs, eps));
           },
           "elem"_a, "block"_a, "scale_type"_a, "rule"_a, "nibbles"_a, "zero_scale"_a, "eps"_a)
      .def_ro("elem", &lowbit::BlockFormat::elem)
      .def_ro("block", &lowbit::BlockFormat::block)
      .def_ro("scale_type", &lowbit::BlockFormat::scale_type)
      .def_ro("rule", &lowbit::BlockFormat::rule)
      .def_ro("nibbles", &lowbit::BlockFormat::nibbles)
      .def_ro("zero_scale", &lowbit::BlockFormat::zero_scale)
      .def_ro("eps", &lowbit::BlockFormat::eps);
  nb::class_<lowbit::ScaleLayout>(m, "ScaleLayout", "lowbit::ScaleLayout.")
      .def("__init__",
           [](lowbit::ScaleLayout* l, lowbit::ScaleLayoutKind kind, int32_t row_align, lowbit::GroupPad pad) {
             new (l) lowbit::ScaleLayout(make_layout(kind, row_align, pad));
           },
           "kind"_a, "row_align"_a = 1, "group_pad"_a = lowbit::GroupPad::kNone)
      .def_ro("kind", &lowbit::ScaleLayout::kind)
      .def_ro("row_align", &lowbit::ScaleLayout::row_align)
      .def_ro("group_pad", &lowbit::ScaleLayout::group_pad);

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

  m.def(
      "nf4_kcache_quantize",
      [](const Array& k, lowbit::DType k_dtype, nb::handle codes, nb::handle scale, nb::handle residual,
         lowbit::DType residual_dtype, lowbit::NibbleOrder nib, uintptr_t stream) {
        const char* op = "nf4_kcache_quantize";
        const Out co = out_array(codes, lowbit::DType::kUInt8, op, "codes"),
                  so = out_array(scale, lowbit::DType::kFloat32, op, "scale"),
                  ro = out_array(residual, residual_dtype, op, "residual");
        const lowbit::TensorView kv = to_view(k, k_dtype, op, "k"), cv = co.v, sv = so.v, rv = ro.v;
        nb::gil_scoped_release release;
        lowbit::nf4_kcache_quantize(kv, cv, sv, rv, nib, make_stream(stream));
      },
      "k"_a, "k_dtype"_a, "codes"_a, "scale"_a, "residual"_a, "residual_dtype"_a, "nibbles"_a, "stream"_a = 0,
      "NF4 K cache with FP8 residual (lowbit::nf4_kcache_quantize).");

  m.def(
      "nf4_kcache_dequantize",
      [](const Array& codes, const Array& scale, const OptArray& residual, lowbit::DType residual_dtype, nb::handle out,
         lowbit::DType out_dtype, lowbit::NibbleOrder nib, uintptr_t stream) {
        const char* op = "nf4_kcache_dequantize";
        const Out oo = out_array(out, out_dtype, op, "out");
        const lowbit::TensorView cv = to_view(codes, lowbit::DType::kUInt8, op, "codes"),
                                 sv = float32_view(scale, op, "scale"), ov = oo.v;
        const lowbit::TensorView rv = residual ? to_view(*residual, residual_dtype, op, "residual") : lowbit::TensorView{};
        nb::gil_scoped_release release;
        lowbit::nf4_kcache_dequantize(cv, sv, rv, ov, nib, make_stream(stream));
      },
      "codes"_a, "scale"_a, "residual"_a.none(), "residual_dtype"_a, "out"_a, "out_dtype"_a, "nibbles"_a, "stream"_a = 0,
      "out = nf4[code] * scale (+ residual) (lowbit::nf4_kcache_dequantize).");

  // ---------------------------------------------------------------------------------------------
  // GEMMs (lowbit/gemm.hpp)
  nb::enum_<lowbit::ActQuant>(m, "ActQuant").value("bf16", lowbit::ActQuant::kBF16).value("mxfp8", lowbit::ActQuant::kMXFP8);

  m.def("nvfp4_dual_gemm_packed_bytes", &lowbit::nvfp4_dual_gemm_packed_bytes, "N"_a, "K"_a, "L"_a = 1,
        "Bytes of the prepacked NVFP4 dual-GEMM weights.");

  m.def(
      "nvfp4_dual_gemm",
      [](const Array& a, const OptArray& b1, const OptArray& b2, const Array& sfa, const OptArray& sfb1,
         const OptArray& sfb2, lowbit::ScaleLayoutKind sf_kind, const OptArray& amax_a, const OptArray& amax_b1,
         const OptArray& amax_b2, nb::handle c, lowbit::DType c_dtype, const OptArray& packed_b, uintptr_t stream) {
        const char* op = "nvfp4_dual_gemm_silu";
        lowbit::DualGemmArgs x;
        auto u8 = [&](const OptArray& t, const char* arg) {
          return t ? to_view(*t, lowbit::DType::kUInt8, op, arg) : lowbit::TensorView{};
        };
        auto e4 = [&](const OptArray& t, const char* arg) {
          return t ? to_view(*t, lowbit::DType::kE4M3, op, arg) : lowbit::TensorView{};
        };
        x.a = to_view(a, lowbit::DType::kUInt8, op, "a");
        x.b1 = u8(b1, "b1");
        x.b2 = u8(b2, "b2");
        x.sfa = to_view(sfa, lowbit::DType::kE4M3, op, "sfa");
        x.sfb1 = e4(sfb1, "sfb1");
        x.sfb2 = e4(sfb2, "sfb2");
        x.sf_layout = make_layout(sf_kind, 1, lowbit::GroupPad::kNone);
        x.amax_a = opt_view(amax_a, op, "amax_a");
        x.amax_b1 = opt_view(amax_b1, op, "amax_b1");
        x.amax_b2 = opt_view(amax_b2, op, "amax_b2");
        const Out co = out_array(c, c_dtype, op, "c");
        x.c = co.v;
        x.packed_b = u8(packed_b, "packed_b");
        nb::gil_scoped_release release;
        lowbit::nvfp4_dual_gemm_silu(x, make_stream(stream));
      },
      "a"_a, "b1"_a.none(), "b2"_a.none(), "sfa"_a, "sfb1"_a.none(), "sfb2"_a.none(), "sf_layout"_a,
      "amax_a"_a.none() = nb::none(), "amax_b1"_a.none() = nb::none(), "amax_b2"_a.none() = nb::none(), "c"_a,
      "c_dtype"_a, "packed_b"_a.none() = nb::none(), "stream"_a = 0,
      "C = silu(A B1^T) * (A B2^T) on NVFP4 operands (lowbit::nvfp4_dual_gemm_silu).");

  m.def(
      "nvfp4_dual_gemm_prepack",
      [](const Array& b1, const Array& b2, const Array& sfb1, const Array& sfb2, lowbit::ScaleLayoutKind sf_kind,
         nb::handle packed, uintptr_t stream) {
        const char* op = "nvfp4_dual_gemm_prepack";
        lowbit::DualGemmArgs x;
        x.b1 = to_view(b1, lowbit::DType::kUInt8, op, "b1");
        x.b2 = to_view(b2, lowbit::DType::kUInt8, op, "b2");
        x.sfb1 = to_view(sfb1, lowbit::DType::kE4M3, op, "sfb1");
        x.sfb2 = to_view(sfb2, lowbit::DType::kE4M3, op, "sfb2");
        x.sf_layout = make_layout(sf_kind, 1, lowbit::GroupPad::kNone);
        const Out po = out_array(packed, lowbit::DType::kUInt8, op, "packed");
        const lowbit::TensorView pv = po.v;
        nb::gil_scoped_release release;
        lowbit::nvfp4_dual_gemm_prepack(x, pv, make_stream(stream));
      },
      "b1"_a, "b2"_a, "sfb1"_a, "sfb2"_a, "sf_layout"_a, "packed"_a, "stream"_a = 0,
      "Prepacks the dual-GEMM weights into the kernel layout (lowbit::nvfp4_dual_gemm_prepack).");

  m.def(
      "group_gemm_mxfp4",
      [](const Array& a, lowbit::DType a_dtype, const OptArray& a_scale, lowbit::ScaleLayoutKind a_kind,
         lowbit::GroupPad a_pad, const Array& b, const Array& b_scale, lowbit::ScaleLayoutKind b_kind,
         const Array& m_indptr, nb::handle out, lowbit::DType out_dtype, bool b_packed, uintptr_t stream) {
        const char* op = "group_gemm_mxfp4_nt_groupwise";
        lowbit::GroupGemmArgs x;
        x.a = to_view(a, a_dtype, op, "a");
        x.a_scale = a_scale ? to_view(*a_scale, lowbit::DType::kUE8M0, op, "a_scale") : lowbit::TensorView{};
        x.a_scale_layout = make_layout(a_kind, 1, a_pad);
        x.b = to_view(b, lowbit::DType::kUInt8, op, "b");
        x.b_scale = to_view(b_scale, lowbit::DType::kUE8M0, op, "b_scale");
        x.b_scale_layout = make_layout(b_kind, 1, lowbit::GroupPad::kNone);
        x.m_indptr = to_view(m_indptr, infer_dtype(m_indptr, op, "m_indptr"), op, "m_indptr");
        const Out oo = out_array(out, out_dtype, op, "out");
        x.out = oo.v;
        x.b_packed = b_packed;
        nb::gil_scoped_release release;
        lowbit::group_gemm_mxfp4_nt_groupwise(x, make_stream(stream));
      },
      "a"_a, "a_dtype"_a, "a_scale"_a.none(), "a_scale_layout"_a, "a_group_pad"_a, "b"_a, "b_scale"_a,
      "b_scale_layout"_a, "m_indptr"_a, "out"_a, "out_dtype"_a, "b_packed"_a = false, "stream"_a = 0,
      "out[m] = A[m] @ B[g]^T per group (lowbit::group_gemm_mxfp4_nt_groupwise).");

  m.def(
      "group_gemm_mxfp4_prepack",
      [](const Array& b, const Array& b_scale, lowbit::ScaleLayoutKind b_kind, nb::handle packed_b,
         nb::handle packed_scale, uintptr_t stream) {
        const char* op = "group_gemm_mxfp4_prepack";
        const lowbit::TensorView bv = to_view(b, lowbit::DType::kUInt8, op, "b");
        const lowbit::TensorView sv = to_view(b_scale, lowbit::DType::kUE8M0, op, "b_scale");
        const Out pbo = out_array(packed_b, lowbit::DType::kUInt8, op, "packed_b"),
                  pso = out_array(packed_scale, lowbit::DType::kUE8M0, op, "packed_scale");
        const lowbit::TensorView pb = pbo.v, ps = pso.v;
        nb::gil_scoped_release release;
        lowbit::group_gemm_mxfp4_prepack(bv, sv, make_layout(b_kind, 1, lowbit::GroupPad::kNone), pb, ps,
                                         make_stream(stream));
      },
      "b"_a, "b_scale"_a, "b_scale_layout"_a, "packed_b"_a, "packed_scale"_a, "stream"_a = 0,
      "MXFP4 expert weights into the grouped GEMM's packed layout (lowbit::group_gemm_mxfp4_prepack).");

  m.def(
      "gpt_oss_moe_mlp",
      [](const Array& x, lowbit::DType x_dtype, const Array& ids, const Array& weights, const Array& w1,
         const Array& w1_scale, const Array& b1, lowbit::DType b1_dtype, const Array& w2, const Array& w2_scale,
         const Array& b2, lowbit::DType b2_dtype, float alpha, float limit, lowbit::ActQuant act, nb::handle out,
         lowbit::DType out_dtype, bool packed, uintptr_t stream) {
        const char* op = "gpt_oss_moe_mlp";
        lowbit::MoeMlpArgs a;
        a.x = to_view(x, x_dtype, op, "x");
        a.topk_ids = to_view(ids, infer_dtype(ids, op, "topk_ids"), op, "topk_ids");
        a.topk_weights = float32_view(weights, op, "topk_weights");
        a.w1 = to_view(w1, lowbit::DType::kUInt8, op, "w1");
        a.w1_scale = to_view(w1_scale, lowbit::DType::kUE8M0, op, "w1_scale");
        a.b1 = to_view(b1, b1_dtype, op, "b1");
        a.w2 = to_view(w2, lowbit::DType::kUInt8, op, "w2");
        a.w2_scale = to_view(w2_scale, lowbit::DType::kUE8M0, op, "w2_scale");
        a.b2 = to_view(b2, b2_dtype, op, "b2");
        a.alpha = alpha;
        a.limit = limit;
        a.act = act;
        const Out oo = out_array(out, out_dtype, op, "out");
        a.out = oo.v;
        a.packed = packed;
        nb::gil_scoped_release release;
        lowbit::gpt_oss_moe_mlp(a, make_stream(stream));
      },
      "x"_a, "x_dtype"_a, "topk_ids"_a, "topk_weights"_a, "w1"_a, "w1_scale"_a, "b1"_a, "b1_dtype"_a, "w2"_a,
      "w2_scale"_a, "b2"_a, "b2_dtype"_a, "alpha"_a, "limit"_a, "act"_a, "out"_a, "out_dtype"_a,
      "packed"_a = false, "stream"_a = 0,
      "The gpt-oss expert MLP (lowbit::gpt_oss_moe_mlp).");

  m.def(
      "build_info",
      []() {
        lowbit::BuildInfo b;
        {
          nb::gil_scoped_release release;
          b = lowbit::build_info();
        }
        nb::dict d;
        d["version"] = b.version;
        d["cuda_built"] = b.cuda_built;
        d["cuda_runtime_version"] = b.cuda_runtime_version;
        d["device_count"] = b.device_count;
        d["device_name"] = b.device_name;
        d["sm"] = b.sm;
        d["cuda_ops"] = b.cuda_ops;
        return d;
      },
      "dict: version, cuda_built, cuda_runtime_version, device_count, device_name, sm, cuda_ops.");
}
