// python/src/bind_linear.cpp: the dense linears (lowbit/linear.hpp): mxfp4_gemm, nvfp4_gemm and
// nvfp4_gemm's prepack.
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

void bind_linear(nb::module_& m) {
  m.def(
      "mxfp4_gemm",
      [](const Array& a, lowbit::DType a_dtype, const OptArray& a_scale, lowbit::ScaleLayoutKind a_kind, const Array& b,
         const Array& b_scale, lowbit::ScaleLayoutKind b_kind, const OptArray& bias, lowbit::DType bias_dtype,
         nb::handle out, lowbit::DType out_dtype, bool b_packed, uintptr_t stream) {
        const char* op = "mxfp4_gemm";
        lowbit::Mxfp4GemmArgs x;
        x.a = to_view(a, a_dtype, op, "a");
        x.a_scale = a_scale ? to_view(*a_scale, lowbit::DType::kUE8M0, op, "a_scale") : lowbit::TensorView{};
        x.a_scale_layout = make_layout(a_kind, 1, lowbit::GroupPad::kNone);
        x.b = to_view(b, lowbit::DType::kUInt8, op, "b");
        x.b_scale = to_view(b_scale, lowbit::DType::kUE8M0, op, "b_scale");
        x.b_scale_layout = make_layout(b_kind, 1, lowbit::GroupPad::kNone);
        x.b_packed = b_packed;
        x.bias = bias ? to_view(*bias, bias_dtype, op, "bias") : lowbit::TensorView{};
        const Out oo = out_array(out, out_dtype, op, "out");
        x.out = oo.v;
        nb::gil_scoped_release release;
        lowbit::mxfp4_gemm(x, make_stream(stream));
      },
      "a"_a, "a_dtype"_a, "a_scale"_a.none(), "a_scale_layout"_a, "b"_a, "b_scale"_a, "b_scale_layout"_a,
      "bias"_a.none(), "bias_dtype"_a, "out"_a, "out_dtype"_a, "b_packed"_a = false, "stream"_a = 0,
      "C = A @ B^T (+ bias) with MXFP4 weights (lowbit::mxfp4_gemm).");

  m.def(
      "nvfp4_gemm",
      [](const Array& a, lowbit::DType a_dtype, const OptArray& a_scale, lowbit::ScaleLayoutKind a_kind,
         const OptArray& amax_a, const Array& b, const OptArray& b_scale, lowbit::ScaleLayoutKind b_kind,
         const OptArray& amax_b, const OptArray& bias, lowbit::DType bias_dtype, nb::handle out,
         lowbit::DType out_dtype, bool b_packed, uintptr_t stream) {
        const char* op = "nvfp4_gemm";
        lowbit::Nvfp4GemmArgs x;
        x.a = to_view(a, a_dtype, op, "a");
        x.a_scale = a_scale ? to_view(*a_scale, lowbit::DType::kE4M3, op, "a_scale") : lowbit::TensorView{};
        x.a_scale_layout = make_layout(a_kind, 1, lowbit::GroupPad::kNone);
        x.amax_a = amax_a ? float32_view(*amax_a, op, "amax_a") : lowbit::TensorView{};
        x.b = to_view(b, lowbit::DType::kUInt8, op, "b");
        x.b_scale = b_scale ? to_view(*b_scale, lowbit::DType::kE4M3, op, "b_scale") : lowbit::TensorView{};
        x.b_scale_layout = make_layout(b_kind, 1, lowbit::GroupPad::kNone);
        x.b_packed = b_packed;
        x.amax_b = amax_b ? float32_view(*amax_b, op, "amax_b") : lowbit::TensorView{};
        x.bias = bias ? to_view(*bias, bias_dtype, op, "bias") : lowbit::TensorView{};
        const Out oo = out_array(out, out_dtype, op, "out");
        x.out = oo.v;
        nb::gil_scoped_release release;
        lowbit::nvfp4_gemm(x, make_stream(stream));
      },
      "a"_a, "a_dtype"_a, "a_scale"_a.none(), "a_scale_layout"_a, "amax_a"_a.none(), "b"_a, "b_scale"_a.none(),
      "b_scale_layout"_a, "amax_b"_a.none(), "bias"_a.none(), "bias_dtype"_a, "out"_a, "out_dtype"_a,
      "b_packed"_a = false, "stream"_a = 0, "C = A @ B^T (+ bias) with NVFP4 weights (lowbit::nvfp4_gemm).");

  m.def("nvfp4_gemm_packed_bytes", &lowbit::nvfp4_gemm_packed_bytes, "N"_a, "K"_a,
        "Bytes of nvfp4_gemm's prepacked weights (lowbit::nvfp4_gemm_packed_bytes).");

  m.def(
      "nvfp4_gemm_prepack",
      [](const Array& b, const Array& b_scale, lowbit::ScaleLayoutKind b_kind, nb::handle packed, uintptr_t stream) {
        const char* op = "nvfp4_gemm_prepack";
        const lowbit::TensorView bv = to_view(b, lowbit::DType::kUInt8, op, "b"),
                                 sv = to_view(b_scale, lowbit::DType::kE4M3, op, "b_scale");
        const Out po = out_array(packed, lowbit::DType::kUInt8, op, "packed");
        const lowbit::ScaleLayout layout = make_layout(b_kind, 1, lowbit::GroupPad::kNone);
        nb::gil_scoped_release release;
        lowbit::nvfp4_gemm_prepack(bv, sv, layout, po.v, make_stream(stream));
      },
      "b"_a, "b_scale"_a, "b_scale_layout"_a, "packed"_a, "stream"_a = 0,
      "nvfp4_gemm's weights prepacked once (lowbit::nvfp4_gemm_prepack).");
}

}  // namespace lowbit_bind
