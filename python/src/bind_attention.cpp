// python/src/bind_attention.cpp: the MXFP8 flash-attention forward (flash_attn_mxfp8,
// flash_attn_mxfp8_varlen; lowbit/attention.hpp).
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

namespace {

lowbit::AttnArgs attn_args(float softmax_scale, bool causal, lowbit::AttnPrecision precision) {
  lowbit::AttnArgs a;
  a.softmax_scale = softmax_scale;
  a.causal = causal;
  a.precision = precision;
  return a;
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def(
      "flash_attn_mxfp8",
      [](const Array& q, lowbit::DType q_dtype, const Array& k, lowbit::DType k_dtype, const Array& v,
         lowbit::DType v_dtype, const Array& q_scale, lowbit::DType q_scale_dtype, const Array& k_scale,
         lowbit::DType k_scale_dtype, const Array& v_scale, lowbit::DType v_scale_dtype, nb::handle out, nb::handle lse,
         float softmax_scale, bool causal, lowbit::AttnPrecision precision, uintptr_t stream) {
        const char* op = "flash_attn_mxfp8";
        const lowbit::TensorView qv = to_view(q, q_dtype, op, "q"), kv = to_view(k, k_dtype, op, "k"),
                                 vv = to_view(v, v_dtype, op, "v"), qsv = to_view(q_scale, q_scale_dtype, op, "q_scale"),
                                 ksv = to_view(k_scale, k_scale_dtype, op, "k_scale"),
                                 vsv = to_view(v_scale, v_scale_dtype, op, "v_scale");
        const Out oo = out_array(out, lowbit::DType::kBFloat16, op, "out"),
                  lo = out_array(lse, lowbit::DType::kFloat32, op, "lse");
        const lowbit::TensorView ov = oo.v, lv = lo.v;
        const lowbit::AttnArgs a = attn_args(softmax_scale, causal, precision);
        nb::gil_scoped_release release;
        lowbit::flash_attn_mxfp8(qv, kv, vv, qsv, ksv, vsv, ov, lv, a, make_stream(stream));
      },
      "q"_a, "q_dtype"_a, "k"_a, "k_dtype"_a, "v"_a, "v_dtype"_a, "q_scale"_a, "q_scale_dtype"_a, "k_scale"_a,
      "k_scale_dtype"_a, "v_scale"_a, "v_scale_dtype"_a, "out"_a, "lse"_a, "softmax_scale"_a, "causal"_a,
      "precision"_a = lowbit::AttnPrecision::kExact, "stream"_a = 0, "MXFP8 flash-attention forward: writes out (bf16) and lse (fp32) (lowbit::flash_attn_mxfp8).");

  m.def(
      "flash_attn_mxfp8_varlen",
      [](const Array& q, lowbit::DType q_dtype, const Array& k, lowbit::DType k_dtype, const Array& v,
         lowbit::DType v_dtype, const Array& q_scale, lowbit::DType q_scale_dtype, const Array& k_scale,
         lowbit::DType k_scale_dtype, const Array& v_scale, lowbit::DType v_scale_dtype, const Array& cu_seqlens_q,
         const Array& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle out, nb::handle lse,
         float softmax_scale, bool causal, lowbit::AttnPrecision precision, uintptr_t stream) {
        const char* op = "flash_attn_mxfp8_varlen";
        const lowbit::TensorView qv = to_view(q, q_dtype, op, "q"), kv = to_view(k, k_dtype, op, "k"),
                                 vv = to_view(v, v_dtype, op, "v"), qsv = to_view(q_scale, q_scale_dtype, op, "q_scale"),
                                 ksv = to_view(k_scale, k_scale_dtype, op, "k_scale"),
                                 vsv = to_view(v_scale, v_scale_dtype, op, "v_scale"),
                                 cqv = to_view(cu_seqlens_q, infer_dtype(cu_seqlens_q, op, "cu_seqlens_q"), op,
                                               "cu_seqlens_q"),
                                 ckv = to_view(cu_seqlens_k, infer_dtype(cu_seqlens_k, op, "cu_seqlens_k"), op,
                                               "cu_seqlens_k");
        const Out oo = out_array(out, lowbit::DType::kBFloat16, op, "out"),
                  lo = out_array(lse, lowbit::DType::kFloat32, op, "lse");
        const lowbit::TensorView ov = oo.v, lv = lo.v;
        const lowbit::AttnArgs a = attn_args(softmax_scale, causal, precision);
        nb::gil_scoped_release release;
        lowbit::flash_attn_mxfp8_varlen(qv, kv, vv, qsv, ksv, vsv, cqv, ckv, max_seqlen_q, max_seqlen_k, ov, lv, a,
                                        make_stream(stream));
      },
      "q"_a, "q_dtype"_a, "k"_a, "k_dtype"_a, "v"_a, "v_dtype"_a, "q_scale"_a, "q_scale_dtype"_a, "k_scale"_a,
      "k_scale_dtype"_a, "v_scale"_a, "v_scale_dtype"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a,
      "max_seqlen_k"_a, "out"_a, "lse"_a, "softmax_scale"_a, "causal"_a,
      "precision"_a = lowbit::AttnPrecision::kExact, "stream"_a = 0,
      "Varlen MXFP8 flash-attention forward (lowbit::flash_attn_mxfp8_varlen).");
}

}  // namespace lowbit_bind
