// python/src/bind_gemm.cpp: the NVFP4 dual GEMM + SiLU (lowbit/gemm.hpp):
// nvfp4_dual_gemm_packed_bytes, nvfp4_dual_gemm, nvfp4_dual_gemm_prepack.
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

void bind_gemm(nb::module_& m) {
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
}

}  // namespace lowbit_bind
