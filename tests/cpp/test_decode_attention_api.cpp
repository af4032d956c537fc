// Argument validation of lowbit::attn_forward_decode_nf4, kproj_rope_nf4_encode and
// nf4_kcache_append: every bad argument throws ArgumentError naming the op and the argument, and
// no output byte is written; CUDA tensors throw NotSupportedError naming the op (no kernel yet).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "arg_error_util.hpp"
#include "lowbit/codecs.hpp"
#include "lowbit/decode_attention.hpp"
#include "lowbit/error.hpp"

using namespace lowbit;

namespace {

constexpr uint8_t kPoison = 0xCC;
using TV = TensorView;

/// Valid buffers of one decode call: B 2, T 5, H_q 4, H_kv 2, D = Dv = 64; poisoned outputs.
struct Bufs {
  static constexpr int64_t B = 2, T = 5, H = 4, HK = 2, D = 64;
  std::vector<uint16_t> q = std::vector<uint16_t>(size_t(B * H * D * 2), 0x3F80);
  std::vector<uint8_t> codes = std::vector<uint8_t>(size_t(B * T * HK * D), 0x77);
  std::vector<float> scale = std::vector<float>(size_t(B * HK * D * 2), 1.0f);
  std::vector<uint8_t> res = std::vector<uint8_t>(size_t(B * T * HK * D * 2), 0);
  std::vector<uint16_t> v = std::vector<uint16_t>(size_t(B * T * HK * D * 2), 0x3F80);
  std::vector<int32_t> lens = {5, 1};
  std::vector<float> thr = std::vector<float>(size_t(B * H), 0.0f);
  std::vector<uint8_t> out = std::vector<uint8_t>(size_t(B * H * D * 2 * 2), kPoison);
  std::vector<uint8_t> skip = std::vector<uint8_t>(size_t(B * HK * 4), kPoison);

  TV qv() { return TV(q.data(), DType::kBFloat16, {B, 1, H, D}); }
  TV cv() { return TV(codes.data(), DType::kUInt8, {B, T, HK, D / 2}); }
  TV sv() { return TV(scale.data(), DType::kFloat32, {B, HK, D}); }
  TV rv() { return TV(res.data(), DType::kE5M2, {B, T, HK, D}); }
  TV vv() { return TV(v.data(), DType::kBFloat16, {B, T, HK, D}); }
  TV lv() { return TV(lens.data(), DType::kInt32, {B}); }
  TV tv() { return TV(thr.data(), DType::kFloat32, {B, H}); }
  TV ov() { return TV(out.data(), DType::kBFloat16, {B, H, D}); }
  TV kv() { return TV(skip.data(), DType::kFloat32, {B, HK}); }

  std::function<void()> call(const std::string& which, TV t, DecodeNf4Args a = {}) {
    return [=]() mutable {
      auto pick = [&](const char* n, TV d) { return which == n ? t : d; };
      attn_forward_decode_nf4(pick("q", qv()), pick("k_nf4", cv()), pick("k_scale", sv()), pick("k_residual", rv()),
                              pick("v", vv()), pick("v_scale", TV()), pick("seq_lens", lv()), pick("block_table", TV()),
                              pick("precomputed_threshold", tv()),
                              pick("out", ov()), pick("skip_ratio", kv()), a);
    };
  }
  bool untouched() const {
    for (uint8_t x : out)
      if (x != kPoison) return false;
    for (uint8_t x : skip)
      if (x != kPoison) return false;
    return true;
  }
};

template <typename Untouched>
void expect_arg_error(const std::function<void()>& fn, const std::string& op, const std::string& arg,
                      const std::string& also, Untouched untouched) {
  argtest::expect_arg_error(fn, arg, also, op);
  EXPECT_TRUE(untouched()) << "an output was written before the error for '" << arg << "'";
}

constexpr const char* kOp = "attn_forward_decode_nf4";

TEST(DecodeAttentionApi, ValidCallWritesOutputs) {
  Bufs b;
  b.call("", {})();
  EXPECT_FALSE(b.untouched());
  Bufs c;  // optional arguments absent
  c.call("seq_lens", TV())();
  DecodeNf4Args a;
  a.use_fp8_residual = false;
  Bufs d;
  d.call("k_residual", TV(), a)();
  EXPECT_FALSE(d.untouched());
}

TEST(DecodeAttentionApi, Arguments) {
  Bufs b;
  const int64_t B = 2, T = 5, H = 4, HK = 2, D = 64;
  auto u = [&] { return b.untouched(); };
  auto err = [&](const std::string& which, TV t, const std::string& arg, const std::string& also) {
    expect_arg_error(b.call(which, t), kOp, arg, also, u);
  };
  err("q", TV(), "q", "is required");
  err("q", TV(b.q.data(), DType::kFloat16, {B, 1, H, D}), "q", "dtype");
  err("q", TV(b.q.data(), DType::kBFloat16, {B, 2, H, D / 2}), "q", "one query token");
  err("q", TV(b.q.data(), DType::kBFloat16, {B, 1, H, 96}), "q", "64, 128 or 256");
  err("q", TV(b.q.data(), DType::kBFloat16, {B, 1, 3, D}), "q", "multiple of the KV heads");
  err("q", TV(b.q.data(), DType::kBFloat16, {B, 1, H, D}, {2 * H * D, 2 * H * D, 2 * D, 2}), "q", "contiguous");
  err("k_nf4", TV(b.codes.data(), DType::kUInt8, {B, T, HK, D}), "k_nf4", "shape");
  err("k_nf4", TV(b.codes.data(), DType::kInt8, {B, T, HK, D / 2}), "k_nf4", "dtype");
  err("k_nf4", TV(b.codes.data(), DType::kUInt8, {B, 0, HK, D / 2}), "k_nf4", "T >= 1");
  err("k_scale", TV(b.scale.data(), DType::kFloat16, {B, HK, D}), "k_scale", "dtype");
  err("k_scale", TV(b.scale.data(), DType::kFloat32, {B, H, D}), "k_scale", "shape");
  err("k_residual", TV(), "k_residual", "is required");
  err("k_residual", TV(b.res.data(), DType::kUInt8, {B, T, HK, D}), "k_residual", "dtype");
  err("v", TV(b.v.data(), DType::kBFloat16, {B, T, HK, 96}), "v", "Dv");
  err("v", TV(b.v.data(), DType::kBFloat16, {B, 4, HK, D}), "v", "shape");
  err("v", TV(b.v.data(), DType::kFloat32, {B, T, HK, D}), "v", "dtype");
  err("seq_lens", TV(b.lens.data(), DType::kInt64, {1}), "seq_lens", "dtype");
  err("seq_lens", TV(b.lens.data(), DType::kInt32, {1}), "seq_lens", "shape");
  err("precomputed_threshold", TV(b.thr.data(), DType::kFloat32, {B, HK}), "precomputed_threshold", "shape");
  err("out", TV(b.out.data(), DType::kFloat32, {B, H, D}), "out", "dtype");
  err("out", TV(b.out.data(), DType::kBFloat16, {B, 1, H, D}), "out", "shape");
  err("out", TV(b.q.data(), DType::kBFloat16, {B, H, D}), "out", "overlaps");
  err("skip_ratio", TV(b.skip.data(), DType::kFloat32, {B, H}), "skip_ratio", "shape");
  err("skip_ratio", TV(b.q.data(), DType::kFloat32, {B, HK}), "skip_ratio", "overlaps");
  for (int32_t bad : {0, 6, -1}) {
    b.lens = {5, bad};
    err("", TV(), "seq_lens", "1..5");
  }
  b.lens = {5, 1};
  auto arg_err = [&](DecodeNf4Args a, const std::string& arg, const std::string& also) {
    expect_arg_error(b.call("", TV(), a), kOp, arg, also, u);
  };
  DecodeNf4Args a;
  a.block_size = 0;
  arg_err(a, "block_size", "1..2^31-1");
  a.block_size = int64_t(1) << 40;
  arg_err(a, "block_size", "1..2^31-1");
  a = {};
  a.sub_block_size = 24;
  arg_err(a, "sub_block_size", "divisor");
  a = {};
  a.delta = -1.0f;
  arg_err(a, "delta", ">= 0");
  a.delta = std::numeric_limits<float>::quiet_NaN();
  arg_err(a, "delta", ">= 0");
  a = {};
  a.softmax_scale = -1.0f;
  arg_err(a, "softmax_scale", "finite");
}

TEST(DecodeAttentionApi, Fp8ValuesAndTheirScales) {
  Bufs b;
  const int64_t B = 2, T = 5, HK = 2, D = 64;
  auto u = [&] { return b.untouched(); };
  std::vector<uint8_t> v8(size_t(B * T * HK * D), 0x38);  // E4M3 1.0
  std::vector<float> vs(size_t(B * HK * D), 0.5f);
  const TV v8v(v8.data(), DType::kE4M3, {B, T, HK, D}), vsv(vs.data(), DType::kFloat32, {B, HK, D});
  auto call = [&](TV v, TV s) {
    return std::function<void()>([&b, v, s] {
      attn_forward_decode_nf4(b.qv(), b.cv(), b.sv(), b.rv(), v, s, b.lv(), TV(), b.tv(), b.ov(), b.kv());
    });
  };
  expect_arg_error(call(b.vv(), vsv), kOp, "v_scale", "only taken with FP8 v", u);
  expect_arg_error(call(v8v, TV()), kOp, "v_scale", "is required", u);
  expect_arg_error(call(v8v, TV(vs.data(), DType::kFloat16, {B, HK, D})), kOp, "v_scale", "dtype", u);
  expect_arg_error(call(v8v, TV(vs.data(), DType::kFloat32, {B, HK, D / 2})), kOp, "v_scale", "shape", u);
  expect_arg_error(call(TV(v8.data(), DType::kUInt8, {B, T, HK, D}), vsv), kOp, "v", "dtype", u);
  call(v8v, vsv)();  // every value 1.0 * 0.5: out = 0.5 whatever the weights
  const uint16_t half = encode_bf16(0.5f);
  for (size_t i = 0; i < size_t(Bufs::B * Bufs::H * D); ++i) {
    uint16_t o;
    std::memcpy(&o, &b.out[2 * i], 2);
    ASSERT_EQ(o, half) << i;
  }
}

TEST(DecodeAttentionApi, CudaTensorsAreRefusedByName) {
  Bufs b;
  auto cuda = [](TV t) {
    t.device = Device::kCUDA;
    return t;
  };
#if !(LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS)  // (a CUDA + CUTLASS build runs the kernels)
  try {
    attn_forward_decode_nf4(cuda(b.qv()), cuda(b.cv()), cuda(b.sv()), cuda(b.rv()), cuda(b.vv()), TV(), TV(), TV(),
                            TV(), cuda(b.ov()), TV());
    ADD_FAILURE() << "no error";
  } catch (const NotSupportedError& e) {
    // a CPU-only build refuses the CUDA path of the decode attention by its kernel family
    EXPECT_NE(std::string(e.what()).find("attn_forward_decode_nf4: "), std::string::npos) << e.what();
  }
  EXPECT_TRUE(b.untouched());
  std::vector<float> kn(size_t(2 * 1 * 2 * 64));
  try {
    nf4_kcache_append(cuda(TV(kn.data(), DType::kFloat32, {2, 1, 2, 64})), cuda(b.cv()), cuda(b.sv()), cuda(b.rv()),
                      cuda(b.lv()));
    ADD_FAILURE() << "no error";
  } catch (const NotSupportedError& e) {
    // refused before the lengths are read (they are copied from the device on the CUDA path)
    EXPECT_NE(std::string(e.what()).find("nf4_kcache_append: "), std::string::npos) << e.what();
  }
  EXPECT_TRUE(b.untouched());
#endif
}

TEST(DecodeAttentionApi, EncodeAndAppendArguments) {
  std::vector<float> x(2 * 3 * 8, 1.0f), w(2 * 64 * 8, 0.5f), ko(2 * 3 * 2 * 64, 0.0f);
  std::vector<int32_t> pos(6, 0);
  std::vector<uint8_t> codes(2 * 3 * 2 * 32, kPoison), res(2 * 3 * 2 * 64, kPoison);
  std::vector<float> scale(2 * 2 * 64, 0.0f);
  auto untouched = [&] {
    for (uint8_t c : codes)
      if (c != kPoison) return false;
    for (uint8_t r : res)
      if (r != kPoison) return false;
    return true;
  };
  auto enc = [&](TV xv, TV wv, TV pv, int64_t hd, KprojRopeArgs a = {}) {
    return [=, &codes, &scale, &res] {
      kproj_rope_nf4_encode(xv, wv, pv, hd, TV(codes.data(), DType::kUInt8, {2, 3, 2, 32}),
                            TV(scale.data(), DType::kFloat32, {2, 2, 64}), TV(res.data(), DType::kE5M2, {2, 3, 2, 64}),
                            TV(), a);
    };
  };
  const TV xv(x.data(), DType::kFloat32, {2, 3, 8}), wv(w.data(), DType::kFloat32, {128, 8}),
      pv(pos.data(), DType::kInt32, {2, 3});
  const char* op = "kproj_rope_nf4_encode";
  expect_arg_error(enc(TV(x.data(), DType::kFloat32, {2, 24}), wv, pv, 64), op, "x", "[B, T, hidden]", untouched);
  expect_arg_error(enc(xv, TV(w.data(), DType::kFloat32, {128, 7}), pv, 64), op, "w_k", "hidden = 8", untouched);
  expect_arg_error(enc(xv, wv, pv, 63), op, "head_dim", "even", untouched);
  expect_arg_error(enc(xv, TV(w.data(), DType::kFloat32, {96, 8}), pv, 64), op, "w_k", "multiple of head_dim",
                   untouched);
  expect_arg_error(enc(xv, wv, TV(pos.data(), DType::kFloat32, {2, 3}), 64), op, "positions", "dtype", untouched);
  expect_arg_error(enc(xv, wv, TV(pos.data(), DType::kInt32, {6}), 64), op, "positions", "shape", untouched);
  KprojRopeArgs ra;
  ra.rope_theta = 0.0;
  expect_arg_error(enc(xv, wv, pv, 64, ra), op, "rope_theta", "> 0", untouched);

  std::vector<int32_t> lens = {1, 2};
  auto app = [&](TV kn, TV lv) {
    return [=, &codes, &scale, &res] {
      nf4_kcache_append(kn, TV(codes.data(), DType::kUInt8, {2, 3, 2, 32}),
                        TV(scale.data(), DType::kFloat32, {2, 2, 64}), TV(res.data(), DType::kE5M2, {2, 3, 2, 64}), lv);
    };
  };
  const TV kn(ko.data(), DType::kFloat32, {2, 1, 2, 64}), lv(lens.data(), DType::kInt32, {2});
  op = "nf4_kcache_append";
  expect_arg_error(app(TV(ko.data(), DType::kFloat32, {2, 4, 2, 64}), lv), op, "k_new", "exceed", untouched);
  expect_arg_error(app(TV(ko.data(), DType::kFloat32, {2, 1, 3, 64}), lv), op, "k_nf4", "shape", untouched);
  expect_arg_error(app(TV(ko.data(), DType::kUInt8, {2, 1, 2, 64}), lv), op, "k_new", "dtype", untouched);
  expect_arg_error(app(kn, TV(lens.data(), DType::kInt64, {1})), op, "lengths", "dtype", untouched);
  lens = {1, 3};  // 3 + 1 > T = 3
  expect_arg_error(app(kn, lv), op, "lengths", "0..2", untouched);
  lens = {-1, 0};
  expect_arg_error(app(kn, lv), op, "lengths", "0..2", untouched);
}

}  // namespace
