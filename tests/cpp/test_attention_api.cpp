// Argument validation of lowbit::flash_attn_mxfp8 / flash_attn_mxfp8_varlen: every bad argument
// throws ArgumentError naming the op and the argument, and no output byte is written; CUDA
// tensors on a build without the kernels throw NotSupportedError.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "arg_error_util.hpp"
#include "lowbit/attention.hpp"
#include "lowbit/error.hpp"

using namespace lowbit;

namespace {

constexpr uint8_t kPoison = 0xCC;

/// Valid buffers of one fixed-length call (b 1, s_q 3, s_k 5, h 4, h_kv 2, d 64) and one varlen
/// call (two sequences: 1 + 2 query rows, 3 + 2 keys), with poisoned outputs.
struct Bufs {
  static constexpr int64_t B = 1, SQ = 3, SK = 5, H = 4, HK = 2, D = 64;
  std::vector<uint8_t> q = std::vector<uint8_t>(size_t(B * SQ * H * D * 2), 0x38);  // room for d 128 views
  std::vector<uint8_t> k = std::vector<uint8_t>(size_t(B * SK * HK * D * 2), 0x30);
  std::vector<uint8_t> v = std::vector<uint8_t>(size_t(B * SK * HK * D * 2), 0x30);
  std::vector<uint8_t> qs = std::vector<uint8_t>(size_t(B * H * SQ * 4), 127);
  std::vector<uint8_t> ks = std::vector<uint8_t>(size_t(B * HK * SK * 4), 127);
  std::vector<uint8_t> vs = std::vector<uint8_t>(size_t(B * HK * SK * 4), 127);
  std::vector<uint8_t> out = std::vector<uint8_t>(size_t(B * SQ * H * D * 2 * 2), kPoison);
  std::vector<uint8_t> lse = std::vector<uint8_t>(size_t(B * H * SQ * 4 * 2), kPoison);
  std::vector<int32_t> cq = {0, 1, 3}, ck = {0, 3, 5};
  std::vector<int64_t> cq64 = {0, 1, 3};

  TensorView qv() { return TensorView(q.data(), DType::kE4M3, {B, SQ, H, D}); }
  TensorView kv() { return TensorView(k.data(), DType::kE4M3, {B, SK, HK, D}); }
  TensorView vv() { return TensorView(v.data(), DType::kE4M3, {B, SK, HK, D}); }
  TensorView qsv() { return TensorView(qs.data(), DType::kUE8M0, {B, H, SQ, D / 32}); }
  TensorView ksv() { return TensorView(ks.data(), DType::kUE8M0, {B, HK, SK, D / 32}); }
  TensorView vsv() { return TensorView(vs.data(), DType::kUE8M0, {B, HK, SK, D / 32}); }
  TensorView ov() { return TensorView(out.data(), DType::kBFloat16, {B, SQ, H, D}); }
  TensorView lv() { return TensorView(lse.data(), DType::kFloat32, {B, H, SQ}); }
  // varlen: q [3, 4, 64], k / v [5, 2, 64]
  TensorView vq() { return TensorView(q.data(), DType::kE4M3, {SQ, H, D}); }
  TensorView vk() { return TensorView(k.data(), DType::kE4M3, {SK, HK, D}); }
  TensorView vv_() { return TensorView(v.data(), DType::kE4M3, {SK, HK, D}); }
  TensorView vqs() { return TensorView(qs.data(), DType::kUE8M0, {H, SQ, D / 32}); }
  TensorView vks() { return TensorView(ks.data(), DType::kUE8M0, {HK, SK, D / 32}); }
  TensorView vvs() { return TensorView(vs.data(), DType::kUE8M0, {HK, SK, D / 32}); }
  TensorView vcq() { return TensorView(cq.data(), DType::kInt32, {3}); }
  TensorView vck() { return TensorView(ck.data(), DType::kInt32, {3}); }
  TensorView vo() { return TensorView(out.data(), DType::kBFloat16, {SQ, H, D}); }
  TensorView vl() { return TensorView(lse.data(), DType::kFloat32, {H, SQ}); }

  /// The fixed-length call with one argument replaced (by name).
  std::function<void()> fixed(const std::string& which, TensorView t, AttnArgs a = {}) {
    return [=]() mutable {
      auto pick = [&](const char* n, TensorView d) { return which == n ? t : d; };
      flash_attn_mxfp8(pick("q", qv()), pick("k", kv()), pick("v", vv()), pick("q_scale", qsv()),
                       pick("k_scale", ksv()), pick("v_scale", vsv()), pick("out", ov()), pick("lse", lv()), a);
    };
  }
  std::function<void()> varlen(const std::string& which, TensorView t, int64_t mq = 2, int64_t mk = 3) {
    return [=]() mutable {
      auto pick = [&](const char* n, TensorView d) { return which == n ? t : d; };
      flash_attn_mxfp8_varlen(pick("q", vq()), pick("k", vk()), pick("v", vv_()), pick("q_scale", vqs()),
                              pick("k_scale", vks()), pick("v_scale", vvs()), pick("cu_seqlens_q", vcq()),
                              pick("cu_seqlens_k", vck()), mq, mk, pick("out", vo()), pick("lse", vl()));
    };
  }
};

bool untouched(const Bufs& b) {
  for (uint8_t x : b.out)
    if (x != kPoison) return false;
  for (uint8_t x : b.lse)
    if (x != kPoison) return false;
  return true;
}

void expect_arg_error(const std::function<void()>& fn, const std::string& op, const std::string& arg, Bufs& b,
                      const std::string& also = "") {
  argtest::expect_arg_error(fn, arg, also, op);
  EXPECT_TRUE(untouched(b)) << "an output was written before the error for '" << arg << "'";
}

constexpr const char* kOp = "flash_attn_mxfp8";
constexpr const char* kVarOp = "flash_attn_mxfp8_varlen";

TEST(AttentionApi, ValidCallsWriteOutputs) {
  Bufs b;
  b.fixed("", {})();
  EXPECT_FALSE(untouched(b));
  Bufs c;
  c.varlen("", {})();
  EXPECT_FALSE(untouched(c));
}

TEST(AttentionApi, FixedLengthArguments) {
  Bufs b;
  using TV = TensorView;
  const int64_t B = 1, SQ = 3, SK = 5, H = 4, HK = 2;
  expect_arg_error(b.fixed("q", TV()), kOp, "q", b, "is required");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kFloat32, {1, 3, 4, 16})), kOp, "q", b, "dtype");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kE4M3, {3, 4, 64})), kOp, "q", b, "[b, s_q, h, d]");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kE4M3, {1, 3, 4, 96})), kOp, "q", b, "64, 128 or 256");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kE4M3, {1, 3, 4, 32})), kOp, "q", b, "head dim");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kE4M3, {1, 0, 4, 64})), kOp, "q", b, "s_q >= 1");
  expect_arg_error(b.fixed("q", TV(b.q.data(), DType::kE4M3, {1, 3, 4, 64}, {1536, 512, 128, 2})), kOp, "q", b,
                   "contiguous");
  expect_arg_error(b.fixed("k", TV(b.k.data(), DType::kFloat16, {B, SK, HK, 64})), kOp, "k", b, "dtype");
  expect_arg_error(b.fixed("k", TV(b.k.data(), DType::kE4M3, {2, SK, 1, 64})), kOp, "k", b, "shape");
  expect_arg_error(b.fixed("k", TV(b.k.data(), DType::kE4M3, {B, SK, HK, 128})), kOp, "k", b, "shape");
  expect_arg_error(b.fixed("k", TV(b.k.data(), DType::kE4M3, {B, 0, HK, 64})), kOp, "k", b, "s_k >= 1");
  expect_arg_error(b.fixed("k", TV(b.k.data(), DType::kE4M3, {B, 3, 3, 64})), kOp, "k", b, "multiple");
  expect_arg_error(b.fixed("v", TV(b.v.data(), DType::kE4M3, {B, 4, HK, 64})), kOp, "v", b, "shape");
  expect_arg_error(b.fixed("v", TV(b.v.data(), DType::kBFloat16, {B, SK, HK, 64})), kOp, "v", b, "dtype");
  expect_arg_error(b.fixed("q_scale", TV(b.qs.data(), DType::kUE8M0, {B, SQ, H, 2})), kOp, "q_scale", b, "shape");
  expect_arg_error(b.fixed("q_scale", TV(b.qs.data(), DType::kFloat32, {B, H, SQ, 2})), kOp, "q_scale", b, "dtype");
  expect_arg_error(b.fixed("q_scale", TV(b.qs.data(), DType::kUE8M0, {B, H, SQ, 2}, {24, 6, 1, 3})), kOp, "q_scale",
                   b, "contiguous");
  expect_arg_error(b.fixed("k_scale", TV(b.ks.data(), DType::kUE8M0, {B, HK, SK, 4})), kOp, "k_scale", b, "shape");
  expect_arg_error(b.fixed("v_scale", TV(b.vs.data(), DType::kE4M3, {B, HK, SK, 2})), kOp, "v_scale", b, "dtype");
  expect_arg_error(b.fixed("out", TV(b.out.data(), DType::kFloat16, {B, SQ, H, 64})), kOp, "out", b, "dtype");
  expect_arg_error(b.fixed("out", TV(b.out.data(), DType::kBFloat16, {B, SQ, H, 128})), kOp, "out", b, "shape");
  expect_arg_error(b.fixed("out", TV(b.out.data(), DType::kBFloat16, {B, SQ, H, 64}, {1536, 512, 128, 2})), kOp, "out",
                   b, "contiguous");
  expect_arg_error(b.fixed("out", TV(b.q.data(), DType::kBFloat16, {B, SQ, H, 64})), kOp, "out", b, "overlaps");
  expect_arg_error(b.fixed("out", TV(b.out.data(), DType::kBFloat16, {B, SQ, H, 64}, {0, 0, 64, 1})), kOp, "out", b,
                   "share memory");
  expect_arg_error(b.fixed("lse", TV(b.lse.data(), DType::kFloat16, {B, H, SQ})), kOp, "lse", b, "dtype");
  expect_arg_error(b.fixed("lse", TV(b.lse.data(), DType::kFloat32, {B, SQ, H})), kOp, "lse", b, "shape");
  expect_arg_error(b.fixed("lse", TV(b.lse.data(), DType::kFloat32, {B, H, SQ}, {12, 1, 4})), kOp, "lse", b,
                   "contiguous");
  expect_arg_error(b.fixed("lse", TV(b.k.data(), DType::kFloat32, {B, H, SQ})), kOp, "lse", b, "overlaps argument 'k'");
  expect_arg_error(b.fixed("lse", TV(b.out.data(), DType::kFloat32, {B, H, SQ})), kOp, "out", b, "overlaps argument 'lse'");
  for (float s : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    AttnArgs a;
    a.softmax_scale = s;
    expect_arg_error(b.fixed("", TV(), a), kOp, "softmax_scale", b, "finite value > 0");
  }
  {
    AttnArgs a;
    a.precision = static_cast<AttnPrecision>(7);
    expect_arg_error(b.fixed("", TV(), a), kOp, "precision", b, "kExact or kFp8");
  }
  // device mismatch (a CUDA view among CPU tensors): named before anything runs
  expect_arg_error(b.fixed("v", TV(b.v.data(), DType::kE4M3, {B, SK, HK, 64}, Device::kCUDA)), kOp, "v", b,
                   "same device");
}

TEST(AttentionApi, VarlenArguments) {
  Bufs b;
  using TV = TensorView;
  expect_arg_error(b.varlen("q", TV(b.q.data(), DType::kE4M3, {1, 3, 4, 64})), kVarOp, "q", b, "[total_q, h, d]");
  expect_arg_error(b.varlen("q", TV(b.q.data(), DType::kE4M3, {3, 4, 48})), kVarOp, "q", b, "head dim");
  expect_arg_error(b.varlen("k", TV(b.k.data(), DType::kE4M3, {5, 3, 64})), kVarOp, "k", b, "multiple");
  expect_arg_error(b.varlen("v", TV(b.v.data(), DType::kE4M3, {4, 2, 64})), kVarOp, "v", b, "shape");
  expect_arg_error(b.varlen("q_scale", TV(b.qs.data(), DType::kUE8M0, {3, 4, 2})), kVarOp, "q_scale", b, "shape");
  expect_arg_error(b.varlen("k_scale", TV(b.ks.data(), DType::kUE8M0, {5, 2, 2})), kVarOp, "k_scale", b, "shape");
  expect_arg_error(b.varlen("v_scale", TV(b.vs.data(), DType::kFloat16, {2, 5, 2})), kVarOp, "v_scale", b, "dtype");
  expect_arg_error(b.varlen("cu_seqlens_q", TV()), kVarOp, "cu_seqlens_q", b, "is required");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(b.cq64.data(), DType::kInt64, {3})), kVarOp, "cu_seqlens_q", b, "int32");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(b.cq.data(), DType::kInt32, {1, 3})), kVarOp, "cu_seqlens_q", b, "1-D");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(b.cq.data(), DType::kInt32, {0})), kVarOp, "cu_seqlens_q", b, ">= 1");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(b.cq.data(), DType::kInt32, {2}, {2})), kVarOp, "cu_seqlens_q", b,
                   "contiguous");
  expect_arg_error(b.varlen("cu_seqlens_k", TV(b.ck.data(), DType::kInt32, {2})), kVarOp, "cu_seqlens_k", b, "shape");
  expect_arg_error(b.varlen("", TV(), 0, 3), kVarOp, "max_seqlen_q", b, ">= 1");
  expect_arg_error(b.varlen("", TV(), 2, -1), kVarOp, "max_seqlen_k", b, ">= 1");
  expect_arg_error(b.varlen("", TV(), int64_t(1) << 31, 3), kVarOp, "max_seqlen_q", b, "2^31");
  expect_arg_error(b.varlen("out", TV(b.out.data(), DType::kBFloat16, {3, 4, 128})), kVarOp, "out", b, "shape");
  expect_arg_error(b.varlen("lse", TV(b.lse.data(), DType::kFloat32, {3, 4})), kVarOp, "lse", b, "shape");
  expect_arg_error(b.varlen("out", TV(b.cq.data(), DType::kBFloat16, {3, 4, 64})), kVarOp, "out", b, "");
  // the boundaries' values (host tensors): start at 0, non-decreasing, last = rows
  std::vector<int32_t> bad_start = {1, 1, 3}, decreasing = {0, 2, 1}, short_last = {0, 1, 2}, long_last = {0, 2, 6};
  expect_arg_error(b.varlen("cu_seqlens_q", TV(bad_start.data(), DType::kInt32, {3})), kVarOp, "cu_seqlens_q", b,
                   "start at 0");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(decreasing.data(), DType::kInt32, {3})), kVarOp, "cu_seqlens_q", b,
                   "non-decreasing");
  expect_arg_error(b.varlen("cu_seqlens_q", TV(short_last.data(), DType::kInt32, {3})), kVarOp, "cu_seqlens_q", b,
                   "last boundary");
  expect_arg_error(b.varlen("cu_seqlens_k", TV(long_last.data(), DType::kInt32, {3})), kVarOp, "cu_seqlens_k", b,
                   "last boundary");
  expect_arg_error(b.varlen("cu_seqlens_k", TV(b.ck.data(), DType::kInt32, {3}, Device::kCUDA)), kVarOp,
                   "cu_seqlens_k", b, "same device");
}

TEST(AttentionApi, PrecisionSelectsTheCpuModel) {
  // CPU tensors: kExact (the default) runs the fp64 reference, kFp8 the FP8 path's model (P
  // rounded to E4M3): both write every output; on this data (non-uniform scores) they differ.
  Bufs e, f;
  for (Bufs* b : {&e, &f}) {
    for (size_t i = 0; i < b->q.size(); ++i) b->q[i] = uint8_t(0x30 + (i * 7) % 23);
    for (size_t i = 0; i < b->k.size(); ++i) b->k[i] = uint8_t(0x28 + (i * 5) % 31);
    for (size_t i = 0; i < b->v.size(); ++i) b->v[i] = uint8_t(0xB0 + (i * 3) % 29);
  }
  e.fixed("", {})();
  AttnArgs a;
  a.precision = AttnPrecision::kFp8;
  f.fixed("", {}, a)();
  EXPECT_FALSE(untouched(e));
  EXPECT_FALSE(untouched(f));
  EXPECT_NE(std::memcmp(e.out.data(), f.out.data(), size_t(Bufs::B * Bufs::SQ * Bufs::H * Bufs::D * 2)), 0);
}

TEST(AttentionApi, CudaTensorsWithoutKernels) {
  if (build_info().cuda_built) GTEST_SKIP() << "CUDA build";
  Bufs b;
  auto cu = [](TensorView t) {
    t.device = Device::kCUDA;
    return t;
  };
  try {
    flash_attn_mxfp8(cu(b.qv()), cu(b.kv()), cu(b.vv()), cu(b.qsv()), cu(b.ksv()), cu(b.vsv()), cu(b.ov()), cu(b.lv()));
    ADD_FAILURE() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(kOp), std::string::npos) << e.what();
  }
  try {
    AttnArgs a;
    a.precision = AttnPrecision::kFp8;
    flash_attn_mxfp8(cu(b.qv()), cu(b.kv()), cu(b.vv()), cu(b.qsv()), cu(b.ksv()), cu(b.vsv()), cu(b.ov()), cu(b.lv()), a);
    ADD_FAILURE() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(kOp), std::string::npos) << e.what();
  }
  try {
    flash_attn_mxfp8_varlen(cu(b.vq()), cu(b.vk()), cu(b.vv_()), cu(b.vqs()), cu(b.vks()), cu(b.vvs()), cu(b.vcq()),
                            cu(b.vck()), 2, 3, cu(b.vo()), cu(b.vl()));
    ADD_FAILURE() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(kVarOp), std::string::npos) << e.what();
  }
  EXPECT_TRUE(untouched(b));
}

TEST(AttentionApi, EmptyBatchIsANoOp) {
  Bufs b;
  std::vector<int32_t> zero = {0};
  flash_attn_mxfp8_varlen(TensorView(b.q.data(), DType::kE4M3, {0, 4, 64}), TensorView(b.k.data(), DType::kE4M3, {0, 2, 64}),
                          TensorView(b.v.data(), DType::kE4M3, {0, 2, 64}),
                          TensorView(b.qs.data(), DType::kUE8M0, {4, 0, 2}),
                          TensorView(b.ks.data(), DType::kUE8M0, {2, 0, 2}),
                          TensorView(b.vs.data(), DType::kUE8M0, {2, 0, 2}), TensorView(zero.data(), DType::kInt32, {1}),
                          TensorView(zero.data(), DType::kInt32, {1}), 1, 1,
                          TensorView(b.out.data(), DType::kBFloat16, {0, 4, 64}),
                          TensorView(b.lse.data(), DType::kFloat32, {4, 0}));
  EXPECT_TRUE(untouched(b));
}

}  // namespace
