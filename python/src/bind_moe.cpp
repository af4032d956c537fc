// python/src/bind_moe.cpp: the MXFP4 grouped GEMM (group_gemm_mxfp4), its prepack
// (group_gemm_mxfp4_prepack) and the gpt-oss expert MLPs (gpt_oss_moe_mlp, gpt_oss_expert_mlp).
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"

namespace lowbit_bind {

using namespace nb::literals;

namespace {

using PrepackFn = void (*)(const lowbit::TensorView&, const lowbit::TensorView&, const lowbit::ScaleLayout&,
                           const lowbit::TensorView&, const lowbit::TensorView&, lowbit::Stream);

/// A weight prepack (both take the same arguments; `op` names them in errors).
void bind_prepack(nb::module_& m, const char* op, PrepackFn fn, const char* doc) {
  m.def(
      op,
      [op, fn](const Array& b, const Array& b_scale, lowbit::ScaleLayoutKind b_kind, nb::handle packed_b,
               nb::handle packed_scale, uintptr_t stream) {
        const lowbit::TensorView bv = to_view(b, lowbit::DType::kUInt8, op, "b");
        const lowbit::TensorView sv = to_view(b_scale, lowbit::DType::kUE8M0, op, "b_scale");
        const Out pbo = out_array(packed_b, lowbit::DType::kUInt8, op, "packed_b"),
                  pso = out_array(packed_scale, lowbit::DType::kUE8M0, op, "packed_scale");
        const lowbit::TensorView pb = pbo.v, ps = pso.v;
        nb::gil_scoped_release release;
        fn(bv, sv, make_layout(b_kind, 1, lowbit::GroupPad::kNone), pb, ps, make_stream(stream));
      },
      "b"_a, "b_scale"_a, "b_scale_layout"_a, "packed_b"_a, "packed_scale"_a, "stream"_a = 0, doc);
}

/// The expert weights and activation of gpt_oss_moe_mlp and gpt_oss_expert_mlp (MoeMlpArgs or
/// ExpertMlpArgs; `op` names them in errors).
template <typename Args>
void set_mlp_weights(Args& a, const char* op, const Array& w1, const Array& w1_scale, const Array& b1,
                     lowbit::DType b1_dtype, const Array& w2, const Array& w2_scale, const Array& b2,
                     lowbit::DType b2_dtype, float alpha, float limit, lowbit::ActQuant act) {
  a.w1 = to_view(w1, lowbit::DType::kUInt8, op, "w1");
  a.w1_scale = to_view(w1_scale, lowbit::DType::kUE8M0, op, "w1_scale");
  a.b1 = to_view(b1, b1_dtype, op, "b1");
  a.w2 = to_view(w2, lowbit::DType::kUInt8, op, "w2");
  a.w2_scale = to_view(w2_scale, lowbit::DType::kUE8M0, op, "w2_scale");
  a.b2 = to_view(b2, b2_dtype, op, "b2");
  a.alpha = alpha;
  a.limit = limit;
  a.act = act;
}

}  // namespace

void bind_moe(nb::module_& m) {
  m.def(
      "group_gemm_mxfp4",
      [](const Array& a, lowbit::DType a_dtype, const OptArray& a_scale, lowbit::ScaleLayoutKind a_kind,
         lowbit::GroupPad a_pad, const Array& b, const Array& b_scale, lowbit::ScaleLayoutKind b_kind,
         const OptArray& m_indptr, nb::handle out, lowbit::DType out_dtype, bool b_packed, uintptr_t stream,
         const OptArray& m_counts, int64_t expected_m, lowbit::GemmPrecision precision) {
        const char* op = "group_gemm_mxfp4_nt_groupwise";
        lowbit::GroupGemmArgs x;
        x.a = to_view(a, a_dtype, op, "a");
        x.a_scale = a_scale ? to_view(*a_scale, lowbit::DType::kUE8M0, op, "a_scale") : lowbit::TensorView{};
        x.a_scale_layout = make_layout(a_kind, 1, a_pad);
        x.b = to_view(b, lowbit::DType::kUInt8, op, "b");
        x.b_scale = to_view(b_scale, lowbit::DType::kUE8M0, op, "b_scale");
        x.b_scale_layout = make_layout(b_kind, 1, lowbit::GroupPad::kNone);
        x.m_indptr = opt_view(m_indptr, op, "m_indptr");
        x.m_counts = opt_view(m_counts, op, "m_counts");
        x.expected_m = expected_m;
        const Out oo = out_array(out, out_dtype, op, "out");
        x.out = oo.v;
        x.b_packed = b_packed;
        x.precision = precision;
        nb::gil_scoped_release release;
        lowbit::group_gemm_mxfp4_nt_groupwise(x, make_stream(stream));
      },
      "a"_a, "a_dtype"_a, "a_scale"_a.none(), "a_scale_layout"_a, "a_group_pad"_a, "b"_a, "b_scale"_a,
      "b_scale_layout"_a, "m_indptr"_a.none(), "out"_a, "out_dtype"_a, "b_packed"_a = false, "stream"_a = 0,
      "m_counts"_a.none() = nb::none(), "expected_m"_a = 0, "precision"_a = lowbit::GemmPrecision::kExact,
      "out[m] = A[m] @ B[g]^T per group (lowbit::group_gemm_mxfp4_nt_groupwise; m_indptr, or m_counts: "
      "contiguous or masked rows).");

  bind_prepack(m, "group_gemm_mxfp4_prepack", lowbit::group_gemm_mxfp4_prepack,
               "MXFP4 expert weights into the grouped GEMM's packed layout (lowbit::group_gemm_mxfp4_prepack).");
  bind_prepack(m, "group_gemm_mxfp4_prepack_fp8", lowbit::group_gemm_mxfp4_prepack_fp8,
               "MXFP4 expert weights into the FP8 tensor-core path's packed layout "
               "(lowbit::group_gemm_mxfp4_prepack_fp8).");

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
        set_mlp_weights(a, op, w1, w1_scale, b1, b1_dtype, w2, w2_scale, b2, b2_dtype, alpha, limit, act);
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
      "gpt_oss_expert_mlp",
      [](const Array& x, lowbit::DType x_dtype, const OptArray& x_scale, const Array& m_counts, const Array& w1,
         const Array& w1_scale, const Array& b1, lowbit::DType b1_dtype, const Array& w2, const Array& w2_scale,
         const Array& b2, lowbit::DType b2_dtype, float alpha, float limit, lowbit::ActQuant act, nb::handle out,
         lowbit::DType out_dtype, bool packed, int64_t expected_m, uintptr_t stream) {
        const char* op = "gpt_oss_expert_mlp";
        lowbit::ExpertMlpArgs a;
        a.x = to_view(x, x_dtype, op, "x");
        a.x_scale = x_scale ? to_view(*x_scale, lowbit::DType::kUE8M0, op, "x_scale") : lowbit::TensorView{};
        a.m_counts = to_view(m_counts, infer_dtype(m_counts, op, "m_counts"), op, "m_counts");
        set_mlp_weights(a, op, w1, w1_scale, b1, b1_dtype, w2, w2_scale, b2, b2_dtype, alpha, limit, act);
        a.packed = packed;
        a.expected_m = expected_m;
        const Out oo = out_array(out, out_dtype, op, "out");
        a.out = oo.v;
        nb::gil_scoped_release release;
        lowbit::gpt_oss_expert_mlp(a, make_stream(stream));
      },
      "x"_a, "x_dtype"_a, "x_scale"_a.none(), "m_counts"_a, "w1"_a, "w1_scale"_a, "b1"_a, "b1_dtype"_a, "w2"_a,
      "w2_scale"_a, "b2"_a, "b2_dtype"_a, "alpha"_a, "limit"_a, "act"_a, "out"_a, "out_dtype"_a, "packed"_a = false,
      "expected_m"_a = 0, "stream"_a = 0,
      "The gpt-oss expert MLP over expert-grouped rows (lowbit::gpt_oss_expert_mlp).");
}

}  // namespace lowbit_bind
