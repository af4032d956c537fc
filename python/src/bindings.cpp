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
//
// The functions of each family are registered by bind_<family>.cpp (declared in bind_common.hpp,
// which also holds the array conversion); this file holds the module, the exception translator,
// the enums, the BlockFormat / ScaleLayout classes and build_info.
#include "bind_common.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using lowbit_bind::make_format;
using lowbit_bind::make_layout;

NB_MODULE(_C, m) {
  m.doc() = "lowbit C++ core (nanobind). Use the `lowbit` package, not this module directly.";
  m.attr("__version__") = LOWBIT_VERSION_STRING;
#ifdef NDEBUG
  // NOTE: torch op registrations hold module-level BlockFormat / ScaleLayout objects past teardown.
  nb::set_leak_warnings(false);
#endif

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
  nb::enum_<lowbit::ActQuant>(m, "ActQuant").value("bf16", lowbit::ActQuant::kBF16).value("mxfp8", lowbit::ActQuant::kMXFP8);
  nb::enum_<lowbit::GemmPrecision>(m, "GemmPrecision")
      .value("exact", lowbit::GemmPrecision::kExact)
      .value("fp8", lowbit::GemmPrecision::kFp8TensorCores);
  nb::enum_<lowbit::AttnPrecision>(m, "AttnPrecision")
      .value("exact", lowbit::AttnPrecision::kExact)
      .value("fp8", lowbit::AttnPrecision::kFp8);

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

  // --- functions, one registration function per family -----------------------------------------
  lowbit_bind::bind_formats(m);
  lowbit_bind::bind_kcache(m);
  lowbit_bind::bind_gemm(m);
  lowbit_bind::bind_moe(m);
  lowbit_bind::bind_attention(m);
  lowbit_bind::bind_decode_attention(m);
  lowbit_bind::bind_linear(m);

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
        d["cpu_only_ops"] = b.cpu_only_ops;
        return d;
      },
      "dict: version, cuda_built, cuda_runtime_version, device_count, device_name, sm, cuda_ops, cpu_only_ops.");
}
