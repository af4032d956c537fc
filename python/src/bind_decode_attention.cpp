// python/src/bind_decode_attention.cpp: the NF4 K-cache decode ops (attn_forward_decode_nf4,
// kproj_rope_nf4_encode, nf4_kcache_append) and the FP8 V cache (fp8_vcache_quantize,
// fp8_vcache_append; lowbit/decode_attention.hpp).
// Registration and conversion only (bind_common.hpp); the C++ API validates and computes.
#include "bind_common.hpp"
#include "lowbit/decode_attention.hpp"

namespace lowbit_bind {

using namespace nb::literals;

void bind_decode_attention(nb::module_& m) {
  m.def(
      "attn_forward_decode_nf4",
      [](const Array& q, const Array& k_nf4, const Array& k_scale, lowbit::DType k_scale_dtype,
         const OptArray& k_residual, lowbit::DType k_residual_dtype, const Array& v, lowbit::DType v_dtype,
         const OptArray& v_scale, const OptArray& seq_lens, const OptArray& block_table, const OptArray& threshold,
         nb::handle out, nb::handle skip_ratio, int64_t block_size, int64_t sub_block_size, float delta,
         bool use_fp8_residual, float softmax_scale, lowbit::NibbleOrder nib, uintptr_t stream) {
        const char* op = "attn_forward_decode_nf4";
        const Out oo = out_array(out, lowbit::DType::kBFloat16, op, "out"),
                  so = out_array(skip_ratio, lowbit::DType::kFloat32, op, "skip_ratio");
        const lowbit::TensorView qv = to_view(q, lowbit::DType::kBFloat16, op, "q"),
                                 cv = to_view(k_nf4, lowbit::DType::kUInt8, op, "k_nf4"),
                                 sv = to_view(k_scale, k_scale_dtype, op, "k_scale"),
                                 rv = k_residual ? to_view(*k_residual, k_residual_dtype, op, "k_residual")
                                                 : lowbit::TensorView{},
                                 vv = to_view(v, v_dtype, op, "v"),
                                 vsv = v_scale ? float32_view(*v_scale, op, "v_scale") : lowbit::TensorView{},
                                 lv = opt_view(seq_lens, op, "seq_lens"),
                                 btv = opt_view(block_table, op, "block_table"),
                                 tv = threshold ? float32_view(*threshold, op, "precomputed_threshold")
                                                : lowbit::TensorView{},
                                 ov = oo.v, srv = so.v;
        lowbit::DecodeNf4Args a;
        a.block_size = block_size;
        a.sub_block_size = sub_block_size;
        a.delta = delta;
        a.use_fp8_residual = use_fp8_residual;
        a.softmax_scale = softmax_scale;
        a.nibbles = nib;
        nb::gil_scoped_release release;
        lowbit::attn_forward_decode_nf4(qv, cv, sv, rv, vv, vsv, lv, btv, tv, ov, srv, a, make_stream(stream));
      },
      "q"_a, "k_nf4"_a, "k_scale"_a, "k_scale_dtype"_a, "k_residual"_a.none(), "k_residual_dtype"_a, "v"_a,
      "v_dtype"_a, "v_scale"_a.none(), "seq_lens"_a.none(), "block_table"_a.none(), "precomputed_threshold"_a.none(), "out"_a, "skip_ratio"_a.none(), "block_size"_a,
      "sub_block_size"_a, "delta"_a, "use_fp8_residual"_a, "softmax_scale"_a, "nibbles"_a, "stream"_a = 0,
      "Pruned decode attention over an NF4 + FP8-residual K cache (lowbit::attn_forward_decode_nf4).");

  m.def(
      "kproj_rope_nf4_encode",
      [](const Array& x, lowbit::DType x_dtype, const Array& w_k, lowbit::DType w_dtype, const Array& positions,
         int64_t head_dim, nb::handle k_nf4, nb::handle k_scale, nb::handle k_residual, lowbit::DType residual_dtype,
         nb::handle k_out, double rope_theta, lowbit::NibbleOrder nib, uintptr_t stream) {
        const char* op = "kproj_rope_nf4_encode";
        const Out co = out_array(k_nf4, lowbit::DType::kUInt8, op, "k_nf4"),
                  so = out_array(k_scale, lowbit::DType::kFloat32, op, "k_scale"),
                  ro = out_array(k_residual, residual_dtype, op, "k_residual"),
                  ko = out_array(k_out, lowbit::DType::kFloat32, op, "k_out");
        const lowbit::TensorView xv = to_view(x, x_dtype, op, "x"), wv = to_view(w_k, w_dtype, op, "w_k"),
                                 pv = to_view(positions, infer_dtype(positions, op, "positions"), op, "positions"),
                                 cv = co.v, sv = so.v, rv = ro.v, kv = ko.v;
        lowbit::KprojRopeArgs a;
        a.rope_theta = rope_theta;
        a.nibbles = nib;
        nb::gil_scoped_release release;
        lowbit::kproj_rope_nf4_encode(xv, wv, pv, head_dim, cv, sv, rv, kv, a, make_stream(stream));
      },
      "x"_a, "x_dtype"_a, "w_k"_a, "w_dtype"_a, "positions"_a, "head_dim"_a, "k_nf4"_a, "k_scale"_a, "k_residual"_a,
      "residual_dtype"_a, "k_out"_a.none(), "rope_theta"_a, "nibbles"_a, "stream"_a = 0,
      "Fused K projection + RoPE + NF4 / FP8-residual encode (lowbit::kproj_rope_nf4_encode).");

  m.def(
      "nf4_kcache_append",
      [](const Array& k_new, lowbit::DType k_dtype, nb::handle k_nf4, nb::handle k_scale, nb::handle k_residual,
         lowbit::DType residual_dtype, const Array& lengths, const OptArray& block_table, lowbit::NibbleOrder nib,
         uintptr_t stream) {
        const char* op = "nf4_kcache_append";
        const Out co = out_array(k_nf4, lowbit::DType::kUInt8, op, "k_nf4"),
                  so = out_array(k_scale, lowbit::DType::kFloat32, op, "k_scale"),
                  ro = out_array(k_residual, residual_dtype, op, "k_residual");
        const lowbit::TensorView kv = to_view(k_new, k_dtype, op, "k_new"),
                                 lv = to_view(lengths, infer_dtype(lengths, op, "lengths"), op, "lengths"), cv = co.v,
                                 sv = so.v, rv = ro.v, btv = opt_view(block_table, op, "block_table");
        nb::gil_scoped_release release;
        lowbit::nf4_kcache_append(kv, cv, sv, rv, lv, btv, nib, make_stream(stream));
      },
      "k_new"_a, "k_dtype"_a, "k_nf4"_a, "k_scale"_a, "k_residual"_a, "residual_dtype"_a, "lengths"_a,
      "block_table"_a.none(), "nibbles"_a,
      "stream"_a = 0, "Append keys to an NF4 + FP8-residual K cache in place (lowbit::nf4_kcache_append).");

  m.def(
      "fp8_vcache_quantize",
      [](const Array& v, lowbit::DType v_dtype, nb::handle codes, lowbit::DType codes_dtype, nb::handle scale,
         uintptr_t stream) {
        const char* op = "fp8_vcache_quantize";
        const Out co = out_array(codes, codes_dtype, op, "codes"), so = out_array(scale, lowbit::DType::kFloat32, op, "scale");
        const lowbit::TensorView vv = to_view(v, v_dtype, op, "v"), cv = co.v, sv = so.v;
        nb::gil_scoped_release release;
        lowbit::fp8_vcache_quantize(vv, cv, sv, make_stream(stream));
      },
      "v"_a, "v_dtype"_a, "codes"_a, "codes_dtype"_a, "scale"_a, "stream"_a = 0,
      "FP8 V cache of v: power-of-two channel scales and codes (lowbit::fp8_vcache_quantize).");

  m.def(
      "fp8_vcache_append",
      [](const Array& v_new, lowbit::DType v_dtype, nb::handle codes, lowbit::DType codes_dtype, nb::handle scale,
         const Array& lengths, const OptArray& block_table, uintptr_t stream) {
        const char* op = "fp8_vcache_append";
        const Out co = out_array(codes, codes_dtype, op, "codes"), so = out_array(scale, lowbit::DType::kFloat32, op, "scale");
        const lowbit::TensorView vv = to_view(v_new, v_dtype, op, "v_new"),
                                 lv = to_view(lengths, infer_dtype(lengths, op, "lengths"), op, "lengths"), cv = co.v,
                                 sv = so.v, btv = opt_view(block_table, op, "block_table");
        nb::gil_scoped_release release;
        lowbit::fp8_vcache_append(vv, cv, sv, lv, btv, make_stream(stream));
      },
      "v_new"_a, "v_dtype"_a, "codes"_a, "codes_dtype"_a, "scale"_a, "lengths"_a, "block_table"_a.none(),
      "stream"_a = 0,
      "Append values to an FP8 V cache in place (lowbit::fp8_vcache_append).");
}

}  // namespace lowbit_bind
