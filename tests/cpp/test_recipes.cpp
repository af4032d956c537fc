// Block recipes through the public API (lowbit::quantize / dequantize on CPU tensors) against
// an independent reference quantizer written here in double precision (FORMATS.md sections
// 3, 4, 6, 7): MXFP8 / MXFP4 (RCEIL, FLOOR), NVFP4 (with / without per-tensor scale, every
// ZeroScale), per-token-group FP8 and INT4 / UINT4, NF4 blocks and the NF4 K cache. Odd shapes,
// batched and strided inputs, the GPU MODE layouts, and the SQNR of every format.
//
// The reference quantizer and the helpers are in recipes_ref.hpp; the NaN / Inf policy tests
// are in test_recipes_nan_policy.cpp.
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

TEST(Recipes, BitExactAgainstReference) {
  uint64_t seed = 1;
  for (const Named& n : all_formats())
    for (int64_t M : {1, 3, 129})
      for (int64_t kb : {1, 3}) {
        const int64_t K = n.f.block * kb;
        const auto x = test_matrix(M, K, n.f.block, seed++, true);
        const std::string what = std::string(n.name) + " M=" + std::to_string(M) + " K=" + std::to_string(K);
        if (n.f.rule == ScaleRule::kNvfp4) {
          expect_matches(x, M, K, n.f, nullptr, what + " no global");
          // global amax of the finite part (the NaN / Inf blocks do not enter it)
          float g = 0;
          for (float v : x)
            if (std::isfinite(v)) g = std::max(g, std::fabs(v));
          expect_matches(x, M, K, n.f, &g, what + " global");
          const float g2 = 17.5f;  // a global amax smaller than the data: block scales saturate
          expect_matches(x, M, K, n.f, &g2, what + " small global");
        } else {
          expect_matches(x, M, K, n.f, nullptr, what);
        }
      }
}

TEST(Recipes, Bf16Input) {
  for (const Named& n : all_formats()) {
    const int64_t M = 5, K = n.f.block * 2;
    auto x = test_matrix(M, K, n.f.block, 77, false);
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      b[i] = uint16_t(fbits(x[i]) >> 16);  // truncate to a bf16 value
      x[i] = bitsf(uint32_t(b[i]) << 16);
    }
    const Ref r = ref_quantize(x, M, K, n.f, nullptr);
    const Out o = run(x, M, K, n.f, nullptr, false, &b);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(code_at(n.f, o.q, K, m, k), r.codes[size_t(m * K + k)]) << n.name;
    for (size_t i = 0; i < r.scales.size(); ++i) ASSERT_EQ(o.scales[i], r.scales[i]) << n.name;
  }
}

// Hand-checked values that do not depend on the reference quantizer.
TEST(Recipes, SpecialBlocks) {
  const int64_t K = 32;
  std::vector<float> x(size_t(4 * K), 0.0f);
  x[size_t(1 * K + 3)] = kNaN;
  x[size_t(2 * K + 5)] = kInf;
  x[size_t(2 * K + 6)] = 1.0f;
  for (int64_t k = 0; k < K; ++k) x[size_t(3 * K + k)] = 1.99f * float(k % 3 - 1);  // amax 1.99
  for (bool floor : {false, true}) {
    const BlockFormat f = BlockFormat::mxfp8(Elem::kE4M3, floor);
    const Out o = run(x, 4, K, f, nullptr);
    EXPECT_EQ(o.scales[0], 0x00u);  // zero block
    EXPECT_EQ(o.scales[1], 0xFFu);  // NaN block
    EXPECT_EQ(o.scales[2], 0xFFu);  // Inf block
    for (int64_t k = 0; k < 3 * K; ++k) EXPECT_EQ(o.q[size_t(k)], 0) << k;
    for (int64_t k = K; k < 3 * K; ++k) EXPECT_TRUE(std::isnan(o.deq[size_t(k)])) << k;
    for (int64_t k = 0; k < K; ++k) EXPECT_EQ(o.deq[size_t(k)], 0.0f);
    // amax 1.99: FLOOR scale 2^(0-8), 1.99*256 = 509.4 clips to 448; RCEIL 1.99/448 -> 2^-7, 254.7 -> 256
    EXPECT_EQ(o.scales[3], floor ? 119u : 120u);
    EXPECT_EQ(o.q[size_t(3 * K + 2)], floor ? 0x7E : 0x78);  // 448 or 256
    EXPECT_EQ(o.deq[size_t(3 * K + 2)], floor ? 1.75f : 2.0f);
  }
  // MXFP4: zero and NaN blocks have codes 0
  const Out o4 = run(x, 4, K, BlockFormat::mxfp4(), nullptr);
  for (int64_t i = 0; i < 3 * K / 2; ++i) EXPECT_EQ(o4.q[size_t(i)], 0);
  EXPECT_EQ(o4.scales[1], 0xFFu);
  // NVFP4: E4M3 NaN scale 0x7F for the non-finite block; zero blocks per ZeroScale
  for (ZeroScale z : {ZeroScale::kZero, ZeroScale::kMinSubnormal, ZeroScale::kOne}) {
    const Out on = run(x, 4, K, BlockFormat::nvfp4(z), nullptr);
    const uint32_t zs = z == ZeroScale::kZero ? 0x00 : z == ZeroScale::kMinSubnormal ? 0x01 : 0x38;
    EXPECT_EQ(on.scales[0], zs);
    EXPECT_EQ(on.scales[1], zs);
    EXPECT_EQ(on.scales[2], 0x7Fu);  // row 1, block 0 holds the NaN
    EXPECT_EQ(on.scales[3], zs);
    for (int64_t k = 0; k < 16; ++k) EXPECT_EQ(on.deq[size_t(k)], 0.0f);
  }
  // NVFP4 without global scale, amax 6 * 448: block scale 448 (0x7E), elements exact
  {
    std::vector<float> y(16, 0.0f);
    y[0] = 2688.0f;
    y[1] = -448.0f;
    y[2] = 224.0f;
    const Out on = run(y, 1, 16, BlockFormat::nvfp4(), nullptr);
    EXPECT_EQ(on.scales[0], 0x7Eu);
    EXPECT_EQ(on.q[0], 0xA7);  // 6 | (-1 << 4)
    EXPECT_EQ(on.q[1], 0x01);  // 0.5, 0
    EXPECT_EQ(on.deq[0], 2688.0f);
    EXPECT_EQ(on.deq[1], -448.0f);
    EXPECT_EQ(on.deq[2], 224.0f);
  }
  // NVFP4 block scale multiplies by fp32(1/6) (TransformerEngine), it does not divide by 6:
  // amax 0x4063FFFF gives E4M3 code 50 this way and 49 by division.
  {
    std::vector<float> y(16, 0.0f);
    y[3] = bitsf(0x4063FFFFu);
    ASSERT_EQ(reftest::enc_e4m3().encode(f32(double(y[3]) / 6.0), Sat::kFinite), 49u);
    const Out on = run(y, 1, 16, BlockFormat::nvfp4(), nullptr);
    EXPECT_EQ(on.scales[0], 50u);
  }
  // int4 / fp8 groups: all-zero group uses eps; uint4 constant group
  {
    std::vector<float> y(128, 0.0f);
    const Out oi = run(y, 1, 128, BlockFormat::int4_group(128), nullptr);
    EXPECT_EQ(oi.scales[0], fbits(f32(1e-10 / 7.0)));
    for (uint8_t b : oi.q) EXPECT_EQ(b, 0);
    const Out of = run(y, 1, 128, BlockFormat::fp8_group(128), nullptr);
    EXPECT_EQ(of.scales[0], fbits(f32(double(1e-10f) / 448.0)));
    std::vector<float> c(64, 3.0f);
    const Out ou = run(c, 1, 64, BlockFormat::int4_group(64, true), nullptr);
    EXPECT_EQ(ou.scales[0], fbits(1e-10f));  // (max - min) / 15 = 0 -> eps
    EXPECT_EQ(ou.zeros[0], 0);               // -min / eps is hugely negative: clamped to 0
    for (uint8_t b : ou.q) EXPECT_EQ(b, 0xFF);  // saturates to 15
  }
}

TEST(Recipes, Nvfp4ComputeGlobalAmax) {
  const int64_t M = 7, K = 64;
  const auto x = test_matrix(M, K, 16, 5, false);
  float want = 0;
  for (float v : x) want = std::max(want, std::fabs(v));
  for (ZeroScale z : {ZeroScale::kZero, ZeroScale::kMinSubnormal, ZeroScale::kOne}) {
    const BlockFormat f = BlockFormat::nvfp4(z);
    const Out a = run(x, M, K, f, nullptr, true);
    EXPECT_EQ(a.gamax_written, want);
    const Out b = run(x, M, K, f, &want, false);
    EXPECT_EQ(a.q, b.q);
    EXPECT_EQ(a.scales, b.scales);
    expect_matches(x, M, K, f, &want, "nvfp4 computed amax");
  }
  // the per-tensor scale formulas
  EXPECT_EQ(ref_s_enc(0.0f), 1.0f);
  EXPECT_EQ(ref_s_enc(2688.0f), 1.0f);
  EXPECT_EQ(ref_s_enc(1e-45f), 3.40282346638528859812e+38f);  // FLT_MAX cap
  // tensor_amax agrees
  float t = -1;
  tensor_amax(TensorView(const_cast<float*>(x.data()), DType::kFloat32, {M, K}), TensorView(&t, DType::kFloat32, {1}));
  EXPECT_EQ(t, want);
}

// FORMATS section 3: RCEIL uses the fp32 quotient amax / max_elem. Where the exact quotient
// lies just above a power of two that the fp32 division rounds to (possible only for fp32
// subnormal quotients), the scale is that power of two.
TEST(Recipes, RceilUsesFp32Quotient) {
  std::vector<float> x(32, 0.0f);
  x[0] = std::nextafter(448.0f * std::ldexp(1.0f, -127), kInf);  // quotient 2^-127 * (1 + 2^-23/1.75)
  ASSERT_EQ(f32(double(x[0]) / 448.0), std::ldexp(1.0f, -127));
  const Out o = run(x, 1, 32, BlockFormat::mxfp8(), nullptr);
  EXPECT_EQ(o.scales[0], 0u);  // 2^-127
  EXPECT_EQ(o.q[0], 0x7E);     // 448 * (1 + tiny) still saturates to 448
}

TEST(Recipes, Nf4Blocks) {
  // bitsandbytes: absmax per block, codes of x * (1/absmax), ties to the lower code
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i - 31) / 32.0f;  // absmax 1
  x[5] = reftest::nf4_thr(3);  // exactly on a threshold: lower code
  const Out o = run(x, 1, 64, BlockFormat::nf4(64), nullptr);
  EXPECT_EQ(o.scales[0], fbits(1.0f));
  EXPECT_EQ(code_at(BlockFormat::nf4(64), o.q, 64, 0, 5), 3);
  EXPECT_EQ(code_at(BlockFormat::nf4(64), o.q, 64, 0, 63), 15);
  EXPECT_EQ(code_at(BlockFormat::nf4(64), o.q, 64, 0, 0), 0);   // -31/32 -> -1.0
  EXPECT_EQ(code_at(BlockFormat::nf4(64), o.q, 64, 0, 31), 7);  // 0
  // high-first packs element 0 in the high nibble
  const Out oh = run(x, 1, 64, BlockFormat::nf4(64, NibbleOrder::kHighFirst), nullptr);
  for (size_t i = 0; i < o.q.size(); ++i) EXPECT_EQ(oh.q[i], uint8_t((o.q[i] >> 4) | (o.q[i] << 4)));
  // zero block: 0 * (1/0) is NaN, which bitsandbytes' decision tree sends to code 0; decodes to 0
  std::vector<float> z(64, 0.0f);
  const Out oz = run(z, 1, 64, BlockFormat::nf4(64), nullptr);
  EXPECT_EQ(oz.scales[0], 0u);
  for (float v : oz.deq) EXPECT_EQ(v, 0.0f);
}

// Batched [L, M, K] input with a row pitch larger than K, and q with a padded pitch too.
TEST(Recipes, BatchedStridedInput) {
  for (const Named& n : all_formats()) {
    const BlockFormat& f = n.f;
    const int64_t L = 3, M = 5, K = f.block * 3, pitch = K + 8, qK = f.packed() ? K / 2 : K, qpitch = qK + 3;
    const int64_t C = K / f.block;
    std::vector<float> store(size_t(L * M * pitch), 1e30f);  // poison in the gaps
    std::vector<std::vector<float>> per(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; ++l) {
      per[size_t(l)] = test_matrix(M, K, f.block, uint64_t(100 + l), l == 1);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) store[size_t((l * M + m) * pitch + k)] = per[size_t(l)][size_t(m * K + k)];
    }
    std::vector<uint8_t> q(size_t(L * M * qpitch), 0x5C), s(size_t(L * M * C * f.scale_bytes())), zeros(size_t(L * M * C));
    QuantArgs a;
    if (f.has_zero_point()) a.zeros = TensorView(zeros.data(), DType::kUInt8, {L, M, C});
    quantize(TensorView(store.data(), DType::kFloat32, {L, M, K}, {M * pitch, pitch, 1}), f, ScaleLayout::row_major(),
             TensorView(q.data(), qdtype(f), {L, M, qK}, {M * qpitch, qpitch, 1}), TensorView(s.data(), sdtype(f), {L, M, C}), a);
    for (int64_t l = 0; l < L; ++l) {
      const Out o = run(per[size_t(l)], M, K, f, nullptr);
      for (int64_t m = 0; m < M; ++m) {
        ASSERT_EQ(0, std::memcmp(&q[size_t((l * M + m) * qpitch)], &o.q[size_t(m * qK)], size_t(qK))) << n.name << " l=" << l;
        for (int64_t g = qK; g < qpitch; ++g) ASSERT_EQ(q[size_t((l * M + m) * qpitch + g)], 0x5C) << "gap written";
      }
      for (int64_t i = 0; i < M * C; ++i) {
        uint32_t v = 0;
        std::memcpy(&v, &s[size_t((l * M * C + i) * f.scale_bytes())], size_t(f.scale_bytes()));
        ASSERT_EQ(v, o.scales[size_t(i)]) << n.name;
        if (f.has_zero_point()) ASSERT_EQ(zeros[size_t(l * M * C + i)], o.zeros[size_t(i)]);
      }
    }
    // dequantize into a strided output
    std::vector<float> y(size_t(L * M * pitch), 7.0f);
    dequantize(TensorView(q.data(), qdtype(f), {L, M, qK}, {M * qpitch, qpitch, 1}), TensorView(s.data(), sdtype(f), {L, M, C}), f,
               ScaleLayout::row_major(), TensorView(y.data(), DType::kFloat32, {L, M, K}, {M * pitch, pitch, 1}), a);
    for (int64_t l = 0; l < L; ++l) {
      const Ref r = ref_quantize(per[size_t(l)], M, K, f, nullptr);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < pitch; ++k) {
          const float got = y[size_t((l * M + m) * pitch + k)];
          if (k >= K) { ASSERT_EQ(got, 7.0f); continue; }
          const float want = r.deq[size_t(m * K + k)];
          ASSERT_TRUE((std::isnan(got) && std::isnan(want)) || fbits(got) == fbits(want)) << n.name << " " << got << " vs " << want;
        }
    }
  }
}

// GPU MODE NVFP4: a is a [M, K/2, L] view of (L, M, K/2) storage and the scales a 6-D view;
// quantizing per L through 2-D views into that storage equals one batched call.
TEST(Recipes, GpuModeLayoutPerL) {
  const int64_t L = 2, M = 129, K = 64, C = K / 16, RB = 2, CB = 1;
  const BlockFormat f = BlockFormat::nvfp4();
  std::vector<float> x = reftest::randn(size_t(L * M * K), 42);
  std::vector<uint8_t> qa(size_t(L * M * K / 2), 0x11), qb(qa.size(), 0x22);
  std::vector<uint8_t> sa(size_t(L * RB * CB * 512), 0x11), sb(sa.size(), 0x22);
  // batched call, scales as the 6-D view
  quantize(TensorView(x.data(), DType::kFloat32, {L, M, K}), f, ScaleLayout::blocked128x4(),
           TensorView(qa.data(), DType::kFloat4E2M1x2, {L, M, K / 2}),
           TensorView(sa.data(), DType::kE4M3, {32, 4, RB, 4, CB, L}, {16, 4, CB * 512, 1, 512, RB * CB * 512}));
  // the [M, K/2, L] view's per-L slices: 2-D [M, K/2] views at offset l * M * K/2
  const TensorView gm(qb.data(), DType::kFloat4E2M1x2, {M, K / 2, L}, {K / 2, 1, M * K / 2});
  for (int64_t l = 0; l < L; ++l) {
    TensorView ql(static_cast<uint8_t*>(gm.data) + l * gm.stride(2), gm.dtype, {gm.size(0), gm.size(1)}, {gm.stride(0), gm.stride(1)});
    quantize(TensorView(x.data() + l * M * K, DType::kFloat32, {M, K}), f, ScaleLayout::blocked128x4(), ql,
             TensorView(sb.data() + l * RB * CB * 512, DType::kE4M3, {RB * 128, CB * 4}));
  }
  EXPECT_EQ(qa, qb);
  EXPECT_EQ(sa, sb);
  // and against the reference quantizer, per L
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> xl(x.begin() + l * M * K, x.begin() + (l + 1) * M * K);
    const Ref r = ref_quantize(xl, M, K, f, nullptr);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t b = qa[size_t((l * M + m) * K / 2 + k / 2)];
        ASSERT_EQ((k & 1) ? b >> 4 : b & 0xF, r.codes[size_t(m * K + k)]);
      }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = l * RB * CB * 512 + ((m / 128) * CB + c / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + c % 4;
        ASSERT_EQ(sa[size_t(off)], r.scales[size_t(m * C + c)]);
      }
  }
  // 3-D per-L dequantize through the same storage as [L, M, K/2]
  std::vector<float> y(x.size());
  dequantize(TensorView(qa.data(), DType::kFloat4E2M1x2, {L, M, K / 2}),
             TensorView(sa.data(), DType::kE4M3, {32, 4, RB, 4, CB, L}, {16, 4, CB * 512, 1, 512, RB * CB * 512}), f,
             ScaleLayout::blocked128x4(), TensorView(y.data(), DType::kFloat32, {L, M, K}));
  EXPECT_GT(reftest::sqnr_db(x, y), 14.0);
}

// ---------------------------------------------------------------------------------------------
// NF4 K cache with FP8 residual.

TEST(Recipes, Nf4KCache) {
  const int64_t B = 2, T = 9, H = 3, D = 8;
  std::vector<float> k = reftest::randn(size_t(B * T * H * D), 3);
  for (int64_t i = 0; i < B * T * H; ++i) k[size_t(i * D + 2)] = 0.0f;  // an all-zero channel
  std::vector<uint8_t> codes(size_t(B * T * H * D / 2), 0xEE), res(size_t(B * T * H * D), 0xEE);
  std::vector<float> scale(size_t(B * H * D), -1.0f);
  for (NibbleOrder order : {NibbleOrder::kLowFirst, NibbleOrder::kHighFirst}) {
    nf4_kcache_quantize(TensorView(k.data(), DType::kFloat32, {B, T, H, D}), TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}),
                        TensorView(scale.data(), DType::kFloat32, {B, H, D}), TensorView(res.data(), DType::kE5M2, {B, T, H, D}), order);
    auto K_ = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return k[size_t(((b * T + t) * H + h) * D + d)]; };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          float s = 0;
          for (int64_t t = 0; t < T; ++t) s = std::max(s, std::fabs(K_(b, t, h, d)));
          ASSERT_EQ(scale[size_t((b * H + h) * D + d)], s);
          for (int64_t t = 0; t < T; ++t) {
            const size_t e = size_t(((b * T + t) * H + h) * D + d);
            const uint8_t byte = codes[e / 2];
            const bool low = (order == NibbleOrder::kLowFirst) == ((d & 1) == 0);
            const uint8_t c = low ? (byte & 0xF) : (byte >> 4);
            const float x = K_(b, t, h, d);
            const uint8_t want = s == 0 ? 7 : reftest::nf4_code(f32(double(x) / double(s)));
            ASSERT_EQ(c, want) << b << t << h << d;
            const float r = f32(double(x) - double(f32(double(reftest::nf4_f32(c)) * s)));
            ASSERT_EQ(res[e], reftest::enc_e5m2().encode(r, Sat::kFinite));
          }
        }
    std::vector<float> out(k.size(), 9.0f), out_nores(k.size(), 9.0f);
    nf4_kcache_dequantize(TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}), TensorView(scale.data(), DType::kFloat32, {B, H, D}),
                          TensorView(res.data(), DType::kE5M2, {B, T, H, D}), TensorView(out.data(), DType::kFloat32, {B, T, H, D}), order);
    nf4_kcache_dequantize(TensorView(codes.data(), DType::kUInt8, {B, T, H, D / 2}), TensorView(scale.data(), DType::kFloat32, {B, H, D}),
                          TensorView(), TensorView(out_nores.data(), DType::kFloat32, {B, T, H, D}), order);
    double worst = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      const double r = double(k[i]) - double(out_nores[i]);  // exact residual, up to fp32 rounding
      // e5m2 keeps 3 significant bits: |r - e5m2(r)| <= |r| * 2^-3 (+ the smallest subnormal)
      const double err = std::fabs(double(out[i]) - double(k[i]));
      EXPECT_LE(err, std::fabs(r) * 0.125 + std::ldexp(1.0, -17) + 1e-6 * std::fabs(k[i])) << i;
      worst = std::max(worst, err);
      const size_t c = i % size_t(D);
      if (c == 2) EXPECT_EQ(out[i], 0.0f);
    }
    EXPECT_GT(reftest::sqnr_db(k, out), reftest::sqnr_db(k, out_nores) + 10.0);
  }
}

// ---------------------------------------------------------------------------------------------
// SQNR of quantize -> dequantize on N(0, 1) data.

TEST(Recipes, SqnrTable) {
  const int64_t M = 256, K = 1024;
  const auto x = reftest::randn(size_t(M * K), 2024);
  struct Row {
    BlockFormat f;
    const char* name;
    double min_db;
    bool global;
  };
  const Row rows[] = {
      {BlockFormat::mxfp8(Elem::kE4M3), "mxfp8 e4m3 rceil", 28, false},
      {BlockFormat::mxfp8(Elem::kE4M3, true), "mxfp8 e4m3 floor", 28, false},
      {BlockFormat::mxfp8(Elem::kE5M2), "mxfp8 e5m2 rceil", 22, false},
      {BlockFormat::mxfp8(Elem::kE5M2, true), "mxfp8 e5m2 floor", 22, false},
      {BlockFormat::mxfp4(), "mxfp4 rceil", 16, false},
      {BlockFormat::mxfp4(true), "mxfp4 floor", 16, false},
      {BlockFormat::nvfp4(), "nvfp4 (no global)", 17, false},
      {BlockFormat::nvfp4(), "nvfp4 (global amax)", 17, true},
      {BlockFormat::fp8_group(128), "fp8 e4m3 g128 f32", 28, false},
      {BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kUE8M0), "fp8 e4m3 g128 ue8m0", 28, false},
      {BlockFormat::int4_group(128), "int4 g128 f32", 15, false},
      {BlockFormat::int4_group(32, false, ScaleType::kUE8M0), "int4 g32 ue8m0", 14, false},
      {BlockFormat::int4_group(128, true), "uint4 zp g128", 17, false},
      {BlockFormat::nf4(64), "nf4 b64", 18, false},
  };
  std::printf("  %-22s %8s\n", "format", "SQNR dB");
  for (const Row& r : rows) {
    float g = 0;
    for (float v : x) g = std::max(g, std::fabs(v));
    const Out o = run(x, M, K, r.f, r.global ? &g : nullptr);
    const double db = reftest::sqnr_db(x, o.deq);
    std::printf("  %-22s %8.2f\n", r.name, db);
    EXPECT_GT(db, r.min_db) << r.name;
    EXPECT_LT(db, 60.0) << r.name;  // not lossless: the round trip really went through the format
  }
}

// The UINT4 scale rule at the top of the fp32 range, on compute_block_scale directly: max - min
// overflows -> max/15 - min/15; codes limited to those whose (q - zp) * s is finite.
