// CPU references of the dense linears (lowbit/linear.hpp): mxfp4_gemm and nvfp4_gemm checked bit for
// bit against a naive fp64 computation written here (operands decoded with the independent tables of
// ref_formats.hpp, the sum rounded once to fp32, + bias in fp32, one rounding to the output), over
// odd shapes (M = 1, M not a multiple of 16 / 64 / 128, N and K at their alignment limits), both scale
// layouts, prepacked weights and bias; and the argument checks (errors name op and argument, the
// output is left untouched).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "lowbit/gemm.hpp"
#include "ref_formats.hpp"

using namespace lowbit;
using reftest::f32;

namespace {

/// Scale bytes of an R x C matrix written in `layout` (zero padding), from row-major values.
std::vector<uint8_t> place_scales(const std::vector<uint8_t>& rm, int64_t R, int64_t C, bool blocked) {
  if (!blocked) return rm;
  const int64_t Rp = (R + 127) / 128 * 128, Cp = (C + 3) / 4 * 4;
  std::vector<uint8_t> out(size_t(Rp * Cp), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[size_t(scale_offset(ScaleLayout::blocked128x4(), Rp, C, r, c))] = rm[size_t(r * C + c)];
  return out;
}

/// The expected output element: fp64 sum -> fp32, * scale, + bias (fp32 each), one rounding to out.
uint16_t expect(double acc, float scale, bool has_bias, float bias, DType out) {
  float v = f32(acc);
  if (scale != 1.0f) v = f32(double(v) * scale);
  if (has_bias) v = f32(double(v) + bias);
  return uint16_t((out == DType::kBFloat16 ? reftest::enc_bf16() : reftest::enc_f16()).encode(v, reftest::Sat::kNone));
}

double e2m1(uint8_t code) { return reftest::kE2M1.decode(code & 0xF); }

struct Case {
  int64_t M, N, K;
  DType a;          // kBFloat16, kE4M3, kE5M2 (mxfp4) / kBFloat16, kUInt8 (nvfp4)
  bool a_blocked, b_blocked, bias, packed_or_amax;
  DType out;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "M=" << c.M << " N=" << c.N << " K=" << c.K << " a=" << dtype_name(c.a) << " out=" << dtype_name(c.out);
}

/// Test name: m7_n24_k64_e4m3_ablk_bblk_bias_packed_f16 (packed_or_amax reads "amax" for nvfp4_gemm).
std::string case_name(const ::testing::TestParamInfo<Case>& info, const char* extra) {
  const Case& c = info.param;
  const char* a = c.a == DType::kBFloat16 ? "bf16" : c.a == DType::kE4M3 ? "e4m3" : c.a == DType::kE5M2 ? "e5m2" : "fp4";
  return "m" + std::to_string(c.M) + "_n" + std::to_string(c.N) + "_k" + std::to_string(c.K) + "_" + a +
         (c.a_blocked ? "_ablk" : "") + (c.b_blocked ? "_bblk" : "") + (c.bias ? "_bias" : "") +
         (c.packed_or_amax ? extra : "") + (c.out == DType::kFloat16 ? "_f16" : "_bf16");
}

}  // namespace

class Mxfp4GemmRef : public ::testing::TestWithParam<Case> {};

TEST_P(Mxfp4GemmRef, MatchesNaiveFp64) {
  const Case t = GetParam();
  const int64_t M = t.M, N = t.N, K = t.K;
  std::mt19937 rng(uint32_t(11 + M * 7 + N * 3 + K));
  std::vector<uint8_t> bq(size_t(N * K / 2)), bs_rm(size_t(N * K / 32));
  for (auto& v : bq) v = uint8_t(rng());
  for (auto& v : bs_rm) v = uint8_t(120 + rng() % 14);
  const bool bf16 = t.a == DType::kBFloat16;
  std::vector<uint16_t> abf(size_t(M * K));
  std::vector<uint8_t> aq(size_t(M * K)), as_rm(size_t(M * K / 32));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : abf) v = uint16_t(reftest::enc_bf16().encode(nd(rng), reftest::Sat::kFinite));
  for (auto& v : aq) {
    v = uint8_t(rng());
    if ((v & 0x7F) == 0x7F || (t.a == DType::kE5M2 && (v & 0x7C) == 0x7C)) v = 0x30;  // no NaN / Inf codes
  }
  for (auto& v : as_rm) v = uint8_t(118 + rng() % 12);
  std::vector<float> bias(static_cast<size_t>(N));
  for (auto& v : bias) v = nd(rng);

  Mxfp4GemmArgs x;
  std::vector<uint8_t> as = place_scales(as_rm, M, K / 32, t.a_blocked), bs = place_scales(bs_rm, N, K / 32, t.b_blocked);
  if (bf16) {
    x.a = TensorView(abf.data(), DType::kBFloat16, {M, K});
  } else {
    x.a = TensorView(aq.data(), t.a, {M, K});
    x.a_scale = TensorView(as.data(), DType::kUE8M0, {int64_t(as.size())});
    x.a_scale_layout = t.a_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  }
  std::vector<uint8_t> pb, ps;
  if (t.packed_or_amax) {  // prepack one group, pass the 2-D packed views
    const int64_t Np = (N + 127) / 128 * 128, Kp = (K + 255) / 256 * 256;
    pb.assign(size_t(Np * Kp / 2), 0xAB);
    ps.assign(size_t(Np * Kp / 32), 0xAB);
    group_gemm_mxfp4_prepack(TensorView(bq.data(), DType::kUInt8, {1, N, K / 2}),
                             TensorView(bs.data(), DType::kUE8M0, {int64_t(bs.size())}),
                             t.b_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major(),
                             TensorView(pb.data(), DType::kUInt8, {1, Np, Kp / 2}),
                             TensorView(ps.data(), DType::kUE8M0, {1, Np, Kp / 32}));
    x.b = TensorView(pb.data(), DType::kUInt8, {Np, Kp / 2});
    x.b_scale = TensorView(ps.data(), DType::kUE8M0, {Np, Kp / 32});
    x.b_packed = true;
  } else {
    x.b = TensorView(bq.data(), DType::kUInt8, {N, K / 2});
    x.b_scale = TensorView(bs.data(), DType::kUE8M0, {int64_t(bs.size())});
    x.b_scale_layout = t.b_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  }
  if (t.bias) x.bias = TensorView(bias.data(), DType::kFloat32, {N});
  std::vector<uint16_t> out(size_t(M * N), 0xFFFF);  // poison (NaN)
  x.out = TensorView(out.data(), t.out, {M, N});
  mxfp4_gemm(x);

  const reftest::Fmt& fa = t.a == DType::kE5M2 ? reftest::kE5M2 : reftest::kE4M3;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = e2m1(uint8_t(bq[size_t(n * K / 2 + k / 2)] >> (4 * (k & 1)))) *
                         std::ldexp(1.0, int(bs_rm[size_t(n * K / 32 + k / 32)]) - 127);
        const double av = bf16 ? reftest::kBF16.decode(abf[size_t(m * K + k)])
                               : fa.decode(aq[size_t(m * K + k)]) * std::ldexp(1.0, int(as_rm[size_t(m * K / 32 + k / 32)]) - 127);
        acc += w * av;
      }
      ASSERT_EQ(out[size_t(m * N + n)], expect(acc, 1.0f, t.bias, bias[size_t(n)], t.out)) << "m=" << m << " n=" << n;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Mxfp4GemmRef,
    ::testing::Values(Case{1, 8, 32, DType::kBFloat16, false, false, false, false, DType::kBFloat16},
                      Case{7, 24, 64, DType::kE4M3, true, true, true, false, DType::kFloat16},
                      Case{130, 16, 96, DType::kE5M2, false, true, true, true, DType::kBFloat16},
                      Case{65, 136, 288, DType::kE4M3, true, false, false, true, DType::kBFloat16},
                      Case{200, 8, 32, DType::kBFloat16, false, true, true, false, DType::kFloat16},
                      Case{0, 8, 32, DType::kE4M3, false, false, true, false, DType::kBFloat16}),
    [](const ::testing::TestParamInfo<Case>& i) { return case_name(i, "_packed"); });

class Nvfp4GemmRef : public ::testing::TestWithParam<Case> {};

TEST_P(Nvfp4GemmRef, MatchesNaiveFp64) {
  const Case t = GetParam();
  const int64_t M = t.M, N = t.N, K = t.K;
  std::mt19937 rng(uint32_t(5 + M * 7 + N * 3 + K));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto codes = [&](int64_t n) { std::vector<uint8_t> v(static_cast<size_t>(n)); for (auto& b : v) b = uint8_t(rng()); return v; };
  auto scales = [&](int64_t n) {  // E4M3 of U(0, 1) plus a zero and a subnormal, as the dual GEMM's test
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& s : v) s = uint8_t(reftest::enc_e4m3().encode(u(rng), reftest::Sat::kFinite));
    v[0] = 0x00;
    if (n > 1) v[1] = 0x03;
    return v;
  };
  const bool bf16 = t.a == DType::kBFloat16;
  std::vector<uint8_t> aq = codes(M * K / 2), bq = codes(N * K / 2), sa_rm = scales(std::max<int64_t>(M, 1) * K / 16),
                       sb_rm = scales(N * K / 16);
  std::vector<uint16_t> abf(size_t(M * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : abf) v = uint16_t(reftest::enc_bf16().encode(nd(rng), reftest::Sat::kFinite));
  std::vector<float> bias(static_cast<size_t>(N));
  for (auto& v : bias) v = nd(rng);
  float amax_a = 3.5f, amax_b = 1000.0f;

  Nvfp4GemmArgs x;
  sa_rm.resize(size_t(M * K / 16));
  std::vector<uint8_t> sa = place_scales(sa_rm, M, K / 16, t.a_blocked), sb = place_scales(sb_rm, N, K / 16, t.b_blocked);
  if (bf16) {
    x.a = TensorView(abf.data(), DType::kBFloat16, {M, K});
  } else {
    x.a = TensorView(aq.data(), DType::kUInt8, {M, K / 2});
    x.a_scale = TensorView(sa.data(), DType::kE4M3, {int64_t(sa.size())});
    x.a_scale_layout = t.a_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
    if (t.packed_or_amax) x.amax_a = TensorView(&amax_a, DType::kFloat32, {1});
  }
  x.b = TensorView(bq.data(), DType::kFloat4E2M1x2, {N, K / 2});
  x.b_scale = TensorView(sb.data(), DType::kE4M3, {int64_t(sb.size())});
  x.b_scale_layout = t.b_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  if (t.packed_or_amax) x.amax_b = TensorView(&amax_b, DType::kFloat32, {1});
  if (t.bias) x.bias = TensorView(bias.data(), DType::kFloat32, {N});
  std::vector<uint16_t> out(size_t(M * N), 0xFFFF);
  x.out = TensorView(out.data(), t.out, {M, N});
  nvfp4_gemm(x);

  // S_dec = 1 / (448 * 6 / amax), each step one fp32 rounding; the product of the two in fp32
  auto sdec = [](float amax) { return f32(1.0 / double(f32(448.0 * 6.0 / double(amax)))); };
  float scale = 1.0f;
  if (t.packed_or_amax) scale = f32(double(bf16 ? 1.0f : sdec(amax_a)) * sdec(amax_b));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = e2m1(uint8_t(bq[size_t(n * K / 2 + k / 2)] >> (4 * (k & 1)))) *
                         reftest::kE4M3.decode(sb_rm[size_t(n * K / 16 + k / 16)]);
        const double av = bf16 ? reftest::kBF16.decode(abf[size_t(m * K + k)])
                               : e2m1(uint8_t(aq[size_t(m * K / 2 + k / 2)] >> (4 * (k & 1)))) *
                                     reftest::kE4M3.decode(sa_rm[size_t(m * K / 16 + k / 16)]);
        acc += w * av;
      }
      ASSERT_EQ(out[size_t(m * N + n)], expect(acc, scale, t.bias, bias[size_t(n)], t.out)) << "m=" << m << " n=" << n;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Nvfp4GemmRef,
    ::testing::Values(Case{1, 1, 16, DType::kUInt8, false, false, false, false, DType::kBFloat16},
                      Case{7, 24, 64, DType::kUInt8, true, true, true, true, DType::kFloat16},
                      Case{130, 9, 48, DType::kBFloat16, false, true, true, true, DType::kBFloat16},
                      Case{65, 128, 256, DType::kUInt8, false, false, false, true, DType::kBFloat16},
                      Case{200, 3, 16, DType::kBFloat16, false, false, false, false, DType::kFloat16}),
    [](const ::testing::TestParamInfo<Case>& i) { return case_name(i, "_amax"); });

namespace {

/// Expects `call` to throw an ArgumentError naming `arg` and containing `what`.
void expect_arg_error(const std::function<void()>& call, const std::string& op, const std::string& arg,
                      const std::string& what) {
  try {
    call();
    FAIL() << "expected an ArgumentError for " << arg;
  } catch (const ArgumentError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(op + ": argument '" + arg + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

}  // namespace

TEST(LinearArgsCheck, Mxfp4RefusesBadArguments) {
  const int64_t M = 4, N = 16, K = 64;
  std::vector<uint16_t> a(size_t(M * K), 0x3F80), out(size_t(M * N), 0x1234);
  std::vector<uint8_t> b(size_t(N * K / 2)), bs(size_t(N * K / 32), 127), a8(size_t(M * K)), as(size_t(M * K / 32), 127);
  std::vector<float> bias(size_t(N + 1));
  auto base = [&] {
    Mxfp4GemmArgs x;
    x.a = TensorView(a.data(), DType::kBFloat16, {M, K});
    x.b = TensorView(b.data(), DType::kUInt8, {N, K / 2});
    x.b_scale = TensorView(bs.data(), DType::kUE8M0, {N, K / 32});
    x.out = TensorView(out.data(), DType::kBFloat16, {M, N});
    return x;
  };
  const std::string op = "mxfp4_gemm";
  expect_arg_error([&] { auto x = base(); x.a = TensorView(a.data(), DType::kBFloat16, {M * 4, K / 4}); mxfp4_gemm(x); },
                   op, "a", "multiple of 32");
  expect_arg_error([&] { auto x = base(); x.b = TensorView(b.data(), DType::kUInt8, {N - 4, K / 2});
                         x.b_scale = TensorView(bs.data(), DType::kUE8M0, {N - 4, K / 32}); mxfp4_gemm(x); },
                   op, "b", "multiple of 8");
  expect_arg_error([&] { auto x = base(); x.b = TensorView(b.data(), DType::kUInt8, {N / 2, K}); mxfp4_gemm(x); },
                   op, "b", "to match a");
  expect_arg_error([&] { auto x = base(); x.a_scale = TensorView(as.data(), DType::kUE8M0, {M, K / 32}); mxfp4_gemm(x); },
                   op, "a_scale", "take no scales");
  expect_arg_error([&] { auto x = base(); x.a = TensorView(a8.data(), DType::kE4M3, {M, K}); mxfp4_gemm(x); },
                   op, "a_scale", "is required");
  expect_arg_error([&] { auto x = base(); x.a = TensorView(a8.data(), DType::kE4M3, {M, K});
                         x.a_scale = TensorView(as.data(), DType::kUE8M0, {M, K / 32});
                         x.a_scale_layout = ScaleLayout::blocked128x4(GroupPad::kFlashInfer); mxfp4_gemm(x); },
                   op, "a_scale_layout", "grouped padding");
  expect_arg_error([&] { auto x = base(); x.bias = TensorView(bias.data(), DType::kFloat32, {N + 1}); mxfp4_gemm(x); },
                   op, "bias", "expected shape");
  expect_arg_error([&] { auto x = base(); x.out = TensorView(out.data(), DType::kFloat32, {M, N / 2}); mxfp4_gemm(x); },
                   op, "out", "expected dtype");
  expect_arg_error([&] { auto x = base(); x.b_packed = true; mxfp4_gemm(x); }, op, "b", "group_gemm_mxfp4_prepack");
  expect_arg_error([&] { auto x = base(); x.b_scale = TensorView(bs.data(), DType::kUE8M0, {N, K / 64}); mxfp4_gemm(x); },
                   op, "b_scale", "elements");
  expect_arg_error([&] { auto x = base(); x.out = TensorView(b.data(), DType::kBFloat16, {M, N}); mxfp4_gemm(x); },
                   op, "out", "overlap");
  for (uint16_t v : out) ASSERT_EQ(v, 0x1234);  // output untouched by every refused call
}

TEST(LinearArgsCheck, Nvfp4RefusesBadArguments) {
  const int64_t M = 4, N = 8, K = 32;
  std::vector<uint16_t> abf(size_t(M * K)), out(size_t(M * N), 0x1234);
  std::vector<uint8_t> a(size_t(M * K / 2)), sa(size_t(M * K / 16), 0x38), b(size_t(N * K / 2)), sb(size_t(N * K / 16), 0x38);
  float amax = 1.0f, neg = -1.0f;
  auto base = [&] {
    Nvfp4GemmArgs x;
    x.a = TensorView(a.data(), DType::kUInt8, {M, K / 2});
    x.a_scale = TensorView(sa.data(), DType::kE4M3, {M, K / 16});
    x.b = TensorView(b.data(), DType::kUInt8, {N, K / 2});
    x.b_scale = TensorView(sb.data(), DType::kE4M3, {N, K / 16});
    x.out = TensorView(out.data(), DType::kFloat16, {M, N});
    return x;
  };
  const std::string op = "nvfp4_gemm";
  expect_arg_error([&] { auto x = base(); x.a = TensorView(a.data(), DType::kUInt8, {M * 4, K / 8}); nvfp4_gemm(x); },
                   op, "a", "multiple of 16");
  expect_arg_error([&] { auto x = base(); x.b = TensorView(b.data(), DType::kUInt8, {N * 2, K / 4}); nvfp4_gemm(x); },
                   op, "b", "to match a");
  expect_arg_error([&] { auto x = base(); x.a_scale = TensorView(); nvfp4_gemm(x); }, op, "a_scale", "is required");
  expect_arg_error([&] { auto x = base(); x.a = TensorView(abf.data(), DType::kBFloat16, {M, K}); nvfp4_gemm(x); },
                   op, "a_scale", "take no scales");
  expect_arg_error([&] { auto x = base(); x.a = TensorView(abf.data(), DType::kBFloat16, {M, K}); x.a_scale = TensorView();
                         x.amax_a = TensorView(&amax, DType::kFloat32, {1}); nvfp4_gemm(x); },
                   op, "amax_a", "no per-tensor amax");
  expect_arg_error([&] { auto x = base(); x.amax_b = TensorView(&neg, DType::kFloat32, {1}); nvfp4_gemm(x); },
                   op, "amax_b", ">= 0");
  expect_arg_error([&] { auto x = base(); x.b_scale = TensorView(sb.data(), DType::kUE8M0, {N, K / 16}); nvfp4_gemm(x); },
                   op, "b_scale", "expected dtype");
  expect_arg_error([&] { auto x = base(); x.b_scale_layout = ScaleLayout::col_major(); nvfp4_gemm(x); },
                   op, "b_scale_layout", "row_major or blocked128x4");
  expect_arg_error([&] { auto x = base(); x.out = TensorView(out.data(), DType::kFloat16, {M, N - 1}); nvfp4_gemm(x); },
                   op, "out", "expected shape");
  for (uint16_t v : out) ASSERT_EQ(v, 0x1234);
}
