// The NaN / Inf policy of the block recipes (docs/formats.md "NaN, Inf and overflow") through
// the public API on CPU tensors: a block holding NaN / Inf decodes to NaN and no other block
// depends on it; per-tensor amaxes are finite; finite input never overflows. Against the
// reference quantizer of recipes_ref.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lowbit/block_quant.hpp"
#include "lowbit/ops.hpp"
#include "recipes_ref.hpp"
#include "ref_formats.hpp"

using namespace lowbit;
using namespace recipes_test;
using reftest::bitsf;
using reftest::f32;
using reftest::fbits;
using reftest::Sat;

// ---------------------------------------------------------------------------------------------
// NaN / Inf policy (docs/formats.md "NaN, Inf and overflow"): a block holding NaN / Inf decodes
// to NaN and no other block depends on it; per-tensor amaxes are finite; finite input never
// overflows.

// The blocks of x that hold a NaN / Inf, and x with those elements replaced by 0.
std::vector<bool> nonfinite_blocks(const std::vector<float>& x, int64_t block, std::vector<float>* clean) {
  std::vector<bool> bad(x.size() / size_t(block), false);
  *clean = x;
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i])) {
      bad[i / size_t(block)] = true;
      (*clean)[i] = 0.0f;
    }
  return bad;
}

TEST(NanPolicy, FiniteBlocksUnchangedByNonFiniteElsewhere) {
  for (const Named& n : all_formats()) {
    const BlockFormat& f = n.f;
    const int64_t M = 6, K = f.block * 4, C = 4;
    std::vector<float> x = reftest::randn(size_t(M * K), 21, 3.0f);
    x[size_t(1 * K + 3)] = kNaN;
    x[size_t(2 * K + f.block + 5)] = kInf;
    x[size_t(3 * K + 2 * f.block)] = -kInf;
    x[size_t(4 * K + 1)] = -kNaN;
    x[size_t(4 * K + 2)] = kInf;
    std::vector<float> clean;
    const std::vector<bool> bad = nonfinite_blocks(x, f.block, &clean);
    const bool nv = f.rule == ScaleRule::kNvfp4;
    const Out od = run(x, M, K, f, nullptr, nv), oc = run(clean, M, K, f, nullptr, nv);
    if (nv) {  // the computed global amax is the finite amax, the same for both
      EXPECT_TRUE(std::isfinite(od.gamax_written)) << n.name;
      EXPECT_EQ(od.gamax_written, oc.gamax_written) << n.name;
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c) {
        const size_t bi = size_t(m * C + c);
        if (bad[bi]) {
          const uint32_t nan_code = f.scale_type == ScaleType::kF32 ? 0x7FC00000u : f.scale_type == ScaleType::kUE8M0 ? 0xFFu : 0x7Fu;
          EXPECT_EQ(od.scales[bi], nan_code) << n.name << " m=" << m << " c=" << c;
          for (int64_t k = 0; k < f.block; ++k) EXPECT_TRUE(std::isnan(od.deq[size_t(m * K + c * f.block + k)])) << n.name;
          continue;
        }
        EXPECT_EQ(od.scales[bi], oc.scales[bi]) << n.name << " m=" << m << " c=" << c;
        if (f.has_zero_point()) EXPECT_EQ(od.zeros[bi], oc.zeros[bi]) << n.name;
        for (int64_t k = 0; k < f.block; ++k) {
          const int64_t kk = c * f.block + k;
          ASSERT_EQ(code_at(f, od.q, K, m, kk), code_at(f, oc.q, K, m, kk)) << n.name << " m=" << m << " k=" << kk;
          ASSERT_EQ(fbits(od.deq[size_t(m * K + kk)]), fbits(oc.deq[size_t(m * K + kk)])) << n.name;
        }
      }
    // and the whole result matches the independent reference
    if (nv) expect_matches(x, M, K, f, &oc.gamax_written, std::string(n.name) + " nonfinite");
    else expect_matches(x, M, K, f, nullptr, std::string(n.name) + " nonfinite");
  }
}

// Regression: one NaN with compute_global_amax made every finite NVFP4 value about +-7.9e-36.
TEST(NanPolicy, Nvfp4OneNanKeepsFiniteValues) {
  const int64_t M = 8, K = 64;
  std::vector<float> x = reftest::randn(size_t(M * K), 4);
  const Out ref = run(x, M, K, BlockFormat::nvfp4(), nullptr, true);
  x[size_t(5 * K + 20)] = kNaN;
  const Out o = run(x, M, K, BlockFormat::nvfp4(), nullptr, true);
  EXPECT_EQ(o.gamax_written, ref.gamax_written);
  std::vector<float> xf, yf;
  for (int64_t i = 0; i < M * K; ++i) {
    if (i / 16 == (5 * K + 20) / 16) {
      EXPECT_TRUE(std::isnan(o.deq[size_t(i)]));
    } else {
      ASSERT_EQ(fbits(o.deq[size_t(i)]), fbits(ref.deq[size_t(i)])) << i;
      xf.push_back(x[size_t(i)]);
      yf.push_back(o.deq[size_t(i)]);
    }
  }
  EXPECT_GT(reftest::sqnr_db(xf, yf), 17.0);
  // tensor_amax is the same finite amax
  float t = -1;
  tensor_amax(TensorView(x.data(), DType::kFloat32, {M, K}), TensorView(&t, DType::kFloat32, {1}));
  EXPECT_EQ(t, o.gamax_written);
  std::vector<float> all_nan(16, kNaN);
  tensor_amax(TensorView(all_nan.data(), DType::kFloat32, {1, 16}), TensorView(&t, DType::kFloat32, {1}));
  EXPECT_EQ(t, 0.0f);
}

// A per-tensor amax that is not a positive finite number means no per-tensor scale.
TEST(NanPolicy, Nvfp4NonFiniteGlobalAmax) {
  for (float g : {kNaN, -kNaN, kInf, -kInf, -3.0f, 0.0f, -0.0f}) {
    EXPECT_EQ(nvfp4_global_encode_scale(g), 1.0f) << g;
    EXPECT_EQ(nvfp4_global_decode_scale(g), 1.0f) << g;
  }
  EXPECT_EQ(nvfp4_global_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(1344.0f), 2.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(3.40282346638528859812e+38f), f32(2688.0 / 3.40282346638528859812e+38));
  EXPECT_EQ(finite_abs_bits(kNaN), 0u);
  EXPECT_EQ(finite_abs_bits(-kInf), 0u);
  EXPECT_EQ(finite_abs_bits(-2.0f), fbits(2.0f));
  EXPECT_EQ(finite_abs_bits(-3.40282346638528859812e+38f), 0x7F7FFFFFu);
}

// Regression: a UINT4 block holding +-2e38 got an Inf scale and decoded to NaN.
TEST(NanPolicy, Uint4BlockWiderThanFltMax) {
  const BlockFormat f = BlockFormat::int4_group(32, true);
  const float fm = 3.40282346638528859812e+38f;
  std::vector<float> x(size_t(3 * 32), 0.0f);
  x[0] = 2e38f;
  x[1] = -2e38f;
  for (int k = 0; k < 32; ++k) x[size_t(32 + k)] = (k & 1) ? -fm : fm;
  for (int k = 0; k < 32; ++k) x[size_t(64 + k)] = (-fm + float(k) * 1e37f) + float(k) * 1e37f;  // max 2.8e38
  const Out o = run(x, 3, 32, f, nullptr);
  for (int r = 0; r < 3; ++r) {
    const float s = bitsf(o.scales[size_t(r)]);
    ASSERT_TRUE(std::isfinite(s)) << r;
    float mx = x[size_t(32 * r)], mn = mx;
    for (int k = 0; k < 32; ++k) {
      mx = std::max(mx, x[size_t(32 * r + k)]);
      mn = std::min(mn, x[size_t(32 * r + k)]);
    }
    if (std::isinf(mx - mn)) EXPECT_EQ(s, mx / 15.0f - mn / 15.0f) << r;
    for (int k = 0; k < 32; ++k) {
      const float y = o.deq[size_t(32 * r + k)];
      ASSERT_TRUE(std::isfinite(y)) << r << " " << k;
      EXPECT_LE(std::fabs(double(y) - double(x[size_t(32 * r + k)])), double(s)) << r << " " << k;
    }
  }
  // row 0: s = 4e38 / 15 would overflow in fp32; max/15 - min/15 = 2.67e37, zp 8
  EXPECT_EQ(o.zeros[0], 8);
  expect_matches(x, 3, 32, f, nullptr, "uint4 wide");
}

// Regression: +Inf came back as -Inf and the finite tokens of its channel as NaN.
TEST(NanPolicy, Nf4KCacheNonFiniteTokens) {
  const int64_t B = 1, T = 7, H = 2, D = 4;
  for (DType rt : {DType::kE5M2, DType::kE4M3}) {
    std::vector<float> k = reftest::randn(size_t(B * T * H * D), 9);
    auto at = [&](std::vector<float>& v, int64_t t, int64_t h, int64_t d) -> float& { return v[size_t((t * H + h) * D + d)]; };
    at(k, 2, 0, 1) = kInf;
    at(k, 4, 0, 1) = kNaN;  // same channel
    at(k, 0, 1, 2) = -kInf;
    for (int64_t t = 0; t < T; ++t) at(k, t, 1, 3) = t % 2 ? kNaN : kInf;  // no finite token: scale 0
    std::vector<float> clean = k;
    for (auto& v : clean)
      if (!std::isfinite(v)) v = 0.0f;
    auto quant = [&](std::vector<float>& in, std::vector<uint8_t>& codes, std::vector<float>& scale, std::vector<uint8_t>& res) {
      codes.assign(size_t(B * T * H * D / 2), 0xEE);
      scale.assign(size_t(B * H * D), -1.0f);
      res.assign(size_t(B * T * H * D), 0xEE);
      nf4_kcache_quantize(TensorView(in.data(), DType::kFloat32, {B, T, H, D}), TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}),
                          TensorView(scale.data(), DType::kFloat32, {B, H, D}), TensorView(res.data(), rt, {B, T, H, D}));
    };
    auto dequant = [&](std::vector<uint8_t>& codes, std::vector<float>& scale, std::vector<uint8_t>& res) {
      std::vector<float> out(size_t(B * T * H * D), 9.0f);
      nf4_kcache_dequantize(TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}), TensorView(scale.data(), DType::kFloat32, {B, H, D}),
                            TensorView(res.data(), rt, {B, T, H, D}), TensorView(out.data(), DType::kFloat32, {B, T, H, D}));
      return out;
    };
    std::vector<uint8_t> cd, rd, cc, rc;
    std::vector<float> sd, sc;
    quant(k, cd, sd, rd);
    quant(clean, cc, sc, rc);
    EXPECT_EQ(sd, sc);  // the finite amax of each channel
    EXPECT_EQ(sd[size_t(1 * D + 3)], 0.0f);
    const std::vector<float> yd = dequant(cd, sd, rd), yc = dequant(cc, sc, rc);
    for (size_t i = 0; i < k.size(); ++i) {
      if (std::isfinite(k[i])) {
        EXPECT_EQ(rd[i], rc[i]) << i;
        EXPECT_EQ(fbits(yd[i]), fbits(yc[i])) << i;
      } else if (std::isnan(k[i]) || rt == DType::kE4M3) {
        EXPECT_TRUE(std::isnan(yd[i])) << i;  // E4M3 has no Inf: an Inf token decodes to NaN
      } else {
        EXPECT_EQ(yd[i], k[i]) << i;  // +-Inf comes back with its sign
      }
    }
  }
}

TEST(NanPolicy, Uint4ScaleAtTheTopOfFp32) {
  const BlockFormat f = BlockFormat::int4_group(32, true);
  const float fm = 3.40282346638528859812e+38f;
  auto scale_of = [&](float mn, float mx) {
    BlockStats st = block_stats_init(mn);
    st.add(mx);
    return compute_block_scale(f, st, QuantContext{});
  };
  {  // +-FLT_MAX: s = 2 FLT_MAX / 15, zp = rne(7.5) = 8, 8 s overflows: codes [1, 15]
    const BlockScale b = scale_of(-fm, fm);
    EXPECT_EQ(bitsf(b.code), fm / 15.0f - (-fm) / 15.0f);
    EXPECT_EQ(b.zero, 8);
    EXPECT_EQ(b.qlo, 1);
    EXPECT_EQ(b.qhi, 15);
    EXPECT_EQ(encode_element(f, b, -fm), 1);  // rne(-7.5) + 8 = 0 would decode to -8 s = -Inf
    EXPECT_EQ(encode_element(f, b, fm), 15);
    EXPECT_TRUE(std::isfinite(decode_element(f, 1, b.code, b.zero)));
  }
  {  // +-2e38: s = 4e38 / 15 would overflow in fp32 (4e38 > FLT_MAX); every code decodes finite
    const BlockScale b = scale_of(-2e38f, 2e38f);
    EXPECT_EQ(bitsf(b.code), 2e38f / 15.0f - (-2e38f) / 15.0f);
    EXPECT_EQ(b.qlo, 0);
    EXPECT_EQ(b.qhi, 15);
    for (int c = 0; c < 16; ++c) EXPECT_TRUE(std::isfinite(decode_element(f, uint8_t(c), b.code, b.zero))) << c;
  }
  {  // below the top: FORMATS.md's (max - min) / 15, every code
    const BlockScale b = scale_of(-1e38f, 2e38f);
    EXPECT_EQ(bitsf(b.code), (2e38f - (-1e38f)) / 15.0f);
    EXPECT_EQ(b.qlo, 0);
    EXPECT_EQ(b.qhi, 15);
  }
}
