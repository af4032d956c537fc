// python/src/bind_kcache.cpp: the NF4 + residual K cache (nf4_kcache_quantize,
// nf4_kcache_dequantize).
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

void bind_kcache(nb::module_& m) {
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
}

}  // namespace lowbit_bind
