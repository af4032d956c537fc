// Element codecs (include/lowbit/codecs.hpp) against the independent references of
// ref_formats.hpp: every code decoded, every non-NaN code round-tripped, every bf16 bit pattern
// encoded, every midpoint (and its fp32 neighbours) encoded, random fp32 for fp16 / bf16, the
// UE8M0 RCEIL / FLOOR edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <random>

#include "lowbit/codecs.hpp"
#include "ref_formats.hpp"

using namespace reftest;
using lowbit::Saturate;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Expects lowbit's value v to equal the reference r bit for bit in meaning: same NaN-ness,
// same value, same sign of zero.
::testing::AssertionResult same_value(double r, float v) {
  if (std::isnan(r) && std::isnan(v)) return ::testing::AssertionSuccess();
  if (std::isnan(r) != std::isnan(v) || double(v) != r || std::signbit(r) != std::signbit(v))
    return ::testing::AssertionFailure() << "expected " << r << " got " << v;
  return ::testing::AssertionSuccess();
}

bool is_nan_code_e4m3(uint32_t c) { return (c & 0x7F) == 0x7F; }
bool is_nan_code_e5m2(uint32_t c) { return (c & 0x7C) == 0x7C && (c & 3) != 0; }
bool is_nan_code_f16(uint32_t c) { return (c & 0x7C00) == 0x7C00 && (c & 0x3FF) != 0; }
bool is_nan_code_bf16(uint32_t c) { return (c & 0x7F80) == 0x7F80 && (c & 0x7F) != 0; }

uint32_t lb_e4m3(float x, Sat s) { return lowbit::encode_e4m3(x, s == Sat::kFinite ? Saturate::kFinite : Saturate::kNone); }
uint32_t lb_e5m2(float x, Sat s) { return lowbit::encode_e5m2(x, s == Sat::kFinite ? Saturate::kFinite : Saturate::kNone); }

// Checks one 8-bit encoder on x in both saturation modes against the reference.
template <typename LB, typename IsNaN>
void check8(const Encoder& ref, LB lb, IsNaN is_nan, float x, int* fails) {
  for (Sat s : {Sat::kFinite, Sat::kNone}) {
    const uint32_t want = ref.encode(double(x), s), got = lb(x, s);
    const bool ok = want == Encoder::kNaN ? is_nan(got) : got == want;
    if (!ok && ++*fails <= 10)
      ADD_FAILURE() << ref.fmt().name << (s == Sat::kFinite ? " satfinite" : " nosat") << " x=" << x << " (bits 0x"
                    << std::hex << fbits(x) << ") want 0x" << want << " got 0x" << got << std::dec;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoding: every code.

TEST(Codecs, DecodeAllE4M3) {
  int nan = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_TRUE(same_value(kE4M3.decode(c), lowbit::decode_e4m3(uint8_t(c)))) << "code " << c;
    nan += std::isnan(lowbit::decode_e4m3(uint8_t(c)));
  }
  EXPECT_EQ(nan, 2);  // 0x7F and 0xFF only
  EXPECT_EQ(lowbit::decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(lowbit::decode_e4m3(0x08), 0.015625f);       // 2^-6, min normal
  EXPECT_EQ(lowbit::decode_e4m3(0x01), 0.001953125f);    // 2^-9, min subnormal
  EXPECT_TRUE(std::signbit(lowbit::decode_e4m3(0x80)));  // -0
}

TEST(Codecs, DecodeAllE5M2) {
  int nan = 0, inf = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = lowbit::decode_e5m2(uint8_t(c));
    EXPECT_TRUE(same_value(kE5M2.decode(c), v)) << "code " << c;
    nan += std::isnan(v);
    inf += std::isinf(v);
  }
  EXPECT_EQ(nan, 6);
  EXPECT_EQ(inf, 2);
  EXPECT_EQ(lowbit::decode_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(lowbit::decode_e5m2(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(lowbit::decode_e5m2(0x01), std::ldexp(1.0f, -16));
}

TEST(Codecs, DecodeAllE2M1) {
  const double table[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};  // FORMATS.md section 1
  for (uint32_t c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -table[c & 7] : table[c & 7];
    EXPECT_TRUE(same_value(want, lowbit::decode_e2m1(uint8_t(c)))) << c;
    EXPECT_TRUE(same_value(kE2M1.decode(c), lowbit::decode_e2m1(uint8_t(c)))) << c;
    // upper bits of the byte are ignored
    EXPECT_TRUE(same_value(want, lowbit::decode_e2m1(uint8_t(c | 0xF0)))) << c;
  }
}

TEST(Codecs, DecodeAllUE8M0) {
  for (uint32_t b = 0; b < 255; ++b) EXPECT_EQ(double(lowbit::decode_ue8m0(uint8_t(b))), std::ldexp(1.0, int(b) - 127)) << b;
  EXPECT_TRUE(std::isnan(lowbit::decode_ue8m0(0xFF)));
  EXPECT_EQ(lowbit::decode_ue8m0(0x00), std::ldexp(1.0f, -127));  // fp32 subnormal, exact
  EXPECT_EQ(lowbit::decode_ue8m0(0xFE), std::ldexp(1.0f, 127));
}

TEST(Codecs, DecodeAllInt4Uint4Nf4) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(lowbit::decode_int4(uint8_t(c)), c < 8 ? c : c - 16) << c;
    EXPECT_EQ(lowbit::decode_int4(uint8_t(c | 0xA0)), c < 8 ? c : c - 16) << c;
    EXPECT_EQ(lowbit::nf4_value(uint8_t(c)), nf4_f32(c)) << c;
  }
  // codebook is sorted, symmetric endpoints, 0 at code 7
  for (int c = 0; c < 15; ++c) EXPECT_LT(nf4_f32(c), nf4_f32(c + 1));
  EXPECT_EQ(lowbit::nf4_value(7), 0.0f);
  EXPECT_EQ(lowbit::nf4_value(0), -1.0f);
  EXPECT_EQ(lowbit::nf4_value(15), 1.0f);
}

// The thresholds lowbit hard-codes (bitsandbytes' fp32 literals) are the fp32-rounded
// midpoints of the double codebook; each lies within half an fp32 ulp of the exact midpoint of
// the fp32 codebook values.
TEST(Codecs, Nf4ThresholdsAreRoundedMidpoints) {
  int odd = 0;
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(fbits(lowbit::nf4_threshold(i)), fbits(nf4_thr(i))) << i;
    const double exact = (double(nf4_f32(i)) + double(nf4_f32(i + 1))) / 2;
    const double half_ulp = std::ldexp(1.0, std::ilogb(exact) - 24);
    EXPECT_LE(std::fabs(double(lowbit::nf4_threshold(i)) - exact), half_ulp) << i;
    odd += fbits(lowbit::nf4_threshold(i)) != fbits(f32(exact));
  }
  EXPECT_EQ(odd, 4);      // and 4 of 15 are not the round-to-nearest-even fp32 of the midpoint
}

// ---------------------------------------------------------------------------------------------
// encode(decode(c)) == c for every non-NaN code.

TEST(Codecs, RoundTripAllCodes) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v4 = lowbit::decode_e4m3(uint8_t(c));
    if (!std::isnan(v4)) {
      EXPECT_EQ(lowbit::encode_e4m3(v4, Saturate::kFinite), c) << c;
      EXPECT_EQ(lowbit::encode_e4m3(v4, Saturate::kNone), c) << c;
    }
    const float v5 = lowbit::decode_e5m2(uint8_t(c));
    if (!std::isnan(v5)) {
      EXPECT_EQ(lowbit::encode_e5m2(v5, Saturate::kNone), c) << c;
      // satfinite maps the Inf codes to +-max
      EXPECT_EQ(lowbit::encode_e5m2(v5, Saturate::kFinite), std::isinf(v5) ? (c & 0x80) | 0x7B : c) << c;
    }
    if (c < 255) {
      const float s = lowbit::decode_ue8m0(uint8_t(c));
      EXPECT_EQ(lowbit::encode_ue8m0_rceil(s), c) << c;
      EXPECT_EQ(lowbit::encode_ue8m0_floor(s), c) << c;
    }
  }
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(lowbit::encode_e2m1(lowbit::decode_e2m1(uint8_t(c))), c) << c;  // includes -0 = 0x8
    EXPECT_EQ(lowbit::encode_int4(float(lowbit::decode_int4(uint8_t(c)))), c) << c;
    EXPECT_EQ(lowbit::encode_uint4(float(c)), c) << c;
    EXPECT_EQ(lowbit::encode_nf4(lowbit::nf4_value(uint8_t(c))), c) << c;
  }
  // -0 keeps its sign in every signed float format
  EXPECT_EQ(lowbit::encode_e4m3(-0.0f), 0x80);
  EXPECT_EQ(lowbit::encode_e5m2(-0.0f), 0x80);
  EXPECT_EQ(lowbit::encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(lowbit::encode_fp16(-0.0f), 0x8000);
  EXPECT_EQ(lowbit::encode_bf16(-0.0f), 0x8000);
  EXPECT_EQ(lowbit::encode_int4(-0.0f), 0);
}

TEST(Codecs, Fp16AllCodesRoundTrip) {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = lowbit::decode_fp16(uint16_t(h));
    ASSERT_TRUE(same_value(kF16.decode(h), v)) << h;
    if (std::isnan(v)) {
      ++nans;
      EXPECT_TRUE(is_nan_code_f16(lowbit::encode_fp16(v))) << h;
    } else {
      ASSERT_EQ(lowbit::encode_fp16(v), h) << h;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Codecs, Bf16AllCodesRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = lowbit::decode_bf16(uint16_t(b));
    ASSERT_TRUE(same_value(kBF16.decode(b), v)) << b;
    if (std::isnan(v)) {
      const uint16_t e = lowbit::encode_bf16(v);
      EXPECT_TRUE(is_nan_code_bf16(e)) << b;
      EXPECT_EQ(e & 0x8000, b & 0x8000) << "NaN sign kept " << b;
      EXPECT_TRUE(e & 0x40) << "quiet NaN " << b;
    } else {
      ASSERT_EQ(lowbit::encode_bf16(v), b) << b;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Exhaustive over the 65536 bf16 bit patterns (as fp32).

TEST(Codecs, ExhaustiveBf16PatternsAllEncoders) {
  int f4 = 0, f5 = 0, f2 = 0, fi = 0, fu = 0, fn = 0, fh = 0, nf4_nearest_diff = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    const float x = bitsf(p << 16);
    check8(enc_e4m3(), lb_e4m3, is_nan_code_e4m3, x, &f4);
    check8(enc_e5m2(), lb_e5m2, is_nan_code_e5m2, x, &f5);
    // E2M1: no NaN / Inf codes; NaN -> +6 (0x7), overflow and Inf -> +-6
    {
      const uint32_t want = std::isnan(x) ? 0x7u : enc_e2m1().encode(x, Sat::kFinite);
      const uint32_t got = lowbit::encode_e2m1(x);
      if (want != got && ++f2 <= 10) ADD_FAILURE() << "e2m1 x=" << x << " want " << want << " got " << got;
    }
    {
      const uint8_t want = int4_code(double(x)), got = lowbit::encode_int4(x);
      if (want != got && ++fi <= 10) ADD_FAILURE() << "int4 x=" << x << " want " << int(want) << " got " << int(got);
    }
    {
      double r = std::isnan(x) ? 0.0 : rne(double(x));
      r = r < 0 ? 0 : (r > 15 ? 15 : r);
      const uint8_t want = uint8_t(r), got = lowbit::encode_uint4(x);
      if (want != got && ++fu <= 10) ADD_FAILURE() << "uint4 x=" << x << " want " << int(want) << " got " << int(got);
    }
    {
      const uint8_t want = nf4_code(x), got = lowbit::encode_nf4(x);
      if (want != got && ++fn <= 10) ADD_FAILURE() << "nf4 x=" << x << " want " << int(want) << " got " << int(got);
      // nearest fp32 codebook value agrees except exactly on an upward-rounded threshold
      if (std::fabs(x) <= 2.0f && nf4_nearest(x) != want && !(want < 15 && x == nf4_thr(want))) ++nf4_nearest_diff;
    }
    {
      const uint32_t want = enc_f16().encode(x, Sat::kNone), got = lowbit::encode_fp16(x);
      const bool ok = want == Encoder::kNaN ? is_nan_code_f16(got) : want == got;
      if (!ok && ++fh <= 10) ADD_FAILURE() << "fp16 x=" << x << " want " << want << " got " << got;
    }
  }
  EXPECT_EQ(f4 + f5 + f2 + fi + fu + fn + fh, 0);
  EXPECT_EQ(nf4_nearest_diff, 0);
}

// ---------------------------------------------------------------------------------------------
// Midpoints between adjacent representable values, and their fp32 neighbours.

namespace {
// For every adjacent pair (k, k+1) of magnitude codes (k+1 may be the overflow value) returns
// the midpoint; checks that the tie goes to the even code, and that just below / above go down
// / up. `lb` encodes with the given saturation.
template <typename LB>
void check_midpoints(const Encoder& ref, LB lb, std::initializer_list<Sat> modes) {
  const auto& m = ref.mags();
  const uint32_t sign = ref.fmt().sign_bit();
  int fails = 0;
  for (uint32_t k = 0; k + 1 < m.size(); ++k) {
    const float mid = f32((m[k] + m[k + 1]) / 2);
    ASSERT_EQ(double(mid), (m[k] + m[k + 1]) / 2) << "midpoint not exact in fp32";
    const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, kInf);
    const float tiny_below = f32(double(mid) * (1 - 1e-6)), tiny_above = f32(double(mid) * (1 + 1e-6));
    for (Sat s : modes) {
      // the reference itself: tie to even, else nearest
      const uint32_t even = (k & 1u) ? k + 1 : k;
      EXPECT_EQ(ref.encode(mid, s) & (sign - 1), std::min<uint32_t>(even, ref.fmt().max_code + (s == Sat::kNone ? 1u : 0u)) & (sign - 1))
          << ref.fmt().name << " k=" << k;
      for (float v : {mid, below, above, tiny_below, tiny_above}) {
        for (float x : {v, -v}) {
          const uint32_t want = ref.encode(x, s), got = lb(x, s);
          if (want != got && ++fails <= 10)
            ADD_FAILURE() << ref.fmt().name << " x=" << x << " (k=" << k << ") want 0x" << std::hex << want << " got 0x" << got
                          << std::dec;
        }
      }
      // direction of the neighbours, checked without the reference
      const uint32_t lo = lb(below, s) & (sign - 1), hi = lb(above, s) & (sign - 1);
      EXPECT_EQ(lo, k) << ref.fmt().name << " below midpoint " << k;
      if (k + 1 <= ref.fmt().max_code) EXPECT_EQ(hi, k + 1) << ref.fmt().name << " above midpoint " << k;
    }
  }
  EXPECT_EQ(fails, 0);
}
}  // namespace

TEST(Codecs, MidpointsE4M3) { check_midpoints(enc_e4m3(), lb_e4m3, {Sat::kFinite, Sat::kNone}); }
TEST(Codecs, MidpointsE5M2) { check_midpoints(enc_e5m2(), lb_e5m2, {Sat::kFinite, Sat::kNone}); }
TEST(Codecs, MidpointsE2M1) {
  check_midpoints(enc_e2m1(), [](float x, Sat) -> uint32_t { return lowbit::encode_e2m1(x); }, {Sat::kFinite});
  // FORMATS.md section 1 tie table, both signs
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};  // 0, 1, 1, 2, 2, 4, 4
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(lowbit::encode_e2m1(ties[i]), want[i]) << ties[i];
    EXPECT_EQ(lowbit::encode_e2m1(-ties[i]), want[i] | 0x8) << -ties[i];
  }
  EXPECT_EQ(lowbit::encode_e2m1(6.0f), 0x7);
  EXPECT_EQ(lowbit::encode_e2m1(7.0f), 0x7);
  EXPECT_EQ(lowbit::encode_e2m1(1e30f), 0x7);
  EXPECT_EQ(lowbit::encode_e2m1(kInf), 0x7);
  EXPECT_EQ(lowbit::encode_e2m1(-kInf), 0xF);
  EXPECT_EQ(lowbit::encode_e2m1(std::numeric_limits<float>::quiet_NaN()), 0x7);
}
TEST(Codecs, MidpointsFp16) {
  check_midpoints(enc_f16(), [](float x, Sat) -> uint32_t { return lowbit::encode_fp16(x); }, {Sat::kNone});
}
TEST(Codecs, MidpointsBf16) {
  // bf16 midpoints carry 9 significant bits: exact in fp32
  const auto& m = enc_bf16().mags();
  int fails = 0;
  for (uint32_t k = 0; k + 1 < m.size(); ++k) {
    const float mid = f32((m[k] + m[k + 1]) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)})
      for (float x : {v, -v}) {
        const uint32_t want = enc_bf16().encode(x, Sat::kNone), got = lowbit::encode_bf16(x);
        if (want != got && ++fails <= 10) ADD_FAILURE() << "bf16 x=" << x << " want " << want << " got " << got;
      }
  }
  EXPECT_EQ(fails, 0);
}

TEST(Codecs, MidpointsInt4Uint4) {
  for (int k = -10; k <= 17; ++k) {
    const float mid = float(k) + 0.5f;
    for (float x : {mid, std::nextafter(mid, -kInf), std::nextafter(mid, kInf)}) {
      EXPECT_EQ(lowbit::encode_int4(x), int4_code(x)) << x;
      double r = rne(x);
      r = r < 0 ? 0 : (r > 15 ? 15 : r);
      EXPECT_EQ(lowbit::encode_uint4(x), uint8_t(r)) << x;
    }
  }
  // explicit ties: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -2.5 -> -2, 6.5 -> 6, 7.5 -> 7 (clamped)
  EXPECT_EQ(lowbit::encode_int4(0.5f), 0);
  EXPECT_EQ(lowbit::encode_int4(1.5f), 2);
  EXPECT_EQ(lowbit::encode_int4(-0.5f), 0);
  EXPECT_EQ(lowbit::encode_int4(-2.5f), 0xE);
  EXPECT_EQ(lowbit::encode_int4(6.5f), 6);
  EXPECT_EQ(lowbit::encode_int4(7.5f), 7);
  EXPECT_EQ(lowbit::encode_int4(-8.5f), 0x8);
  EXPECT_EQ(lowbit::encode_int4(-1e9f), 0x8);
  EXPECT_EQ(lowbit::encode_int4(kInf), 7);
  EXPECT_EQ(lowbit::encode_int4(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(lowbit::encode_uint4(14.5f), 14);
  EXPECT_EQ(lowbit::encode_uint4(15.5f), 15);
  EXPECT_EQ(lowbit::encode_uint4(-0.7f), 0);
}

TEST(Codecs, MidpointsNf4) {
  for (int i = 0; i < 15; ++i) {
    const float t = nf4_thr(i);
    EXPECT_EQ(lowbit::encode_nf4(t), i) << "tie at threshold " << i << " goes to the lower code";
    EXPECT_EQ(lowbit::encode_nf4(std::nextafter(t, kInf)), i + 1) << i;
    EXPECT_EQ(lowbit::encode_nf4(std::nextafter(t, -kInf)), i) << i;
    EXPECT_EQ(lowbit::encode_nf4(f32(double(t) + std::fabs(double(t)) * 1e-6 + 1e-7)), i + 1) << i;
    // the exact midpoint as the nearest fp32 below / above: nearest-value semantics
    const double mid = (double(nf4_f32(i)) + double(nf4_f32(i + 1))) / 2;
    const float mlo = f32(mid) <= mid ? f32(mid) : std::nextafter(f32(mid), -kInf);
    const float mhi = std::nextafter(mlo, kInf);
    EXPECT_EQ(lowbit::encode_nf4(mlo), nf4_code(mlo)) << i;
    EXPECT_EQ(lowbit::encode_nf4(mhi), nf4_code(mhi)) << i;
  }
  EXPECT_EQ(lowbit::encode_nf4(-2.0f), 0);
  EXPECT_EQ(lowbit::encode_nf4(2.0f), 15);
  EXPECT_EQ(lowbit::encode_nf4(std::numeric_limits<float>::quiet_NaN()), 0);
}

// ---------------------------------------------------------------------------------------------
// Random fp32 (all bit patterns, uniformly) for every float encoder.

TEST(Codecs, RandomFp32AllFloatEncoders) {
  std::mt19937 g(1234);
  int fails = 0;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = g();
    if (i & 1) u = (u & 0x8FFFFFFFu) | 0x30000000u;  // half of them in [2^-31, 2^33): the interesting range
    const float x = bitsf(u);
    check8(enc_e4m3(), lb_e4m3, is_nan_code_e4m3, x, &fails);
    check8(enc_e5m2(), lb_e5m2, is_nan_code_e5m2, x, &fails);
    {
      const uint32_t want = enc_f16().encode(x, Sat::kNone), got = lowbit::encode_fp16(x);
      const bool ok = want == Encoder::kNaN ? is_nan_code_f16(got) : want == got;
      if (!ok && ++fails <= 10) ADD_FAILURE() << "fp16 x=" << x << " want " << want << " got " << got;
    }
    {
      const uint32_t want = enc_bf16().encode(x, Sat::kNone), got = lowbit::encode_bf16(x);
      const bool ok = want == Encoder::kNaN ? is_nan_code_bf16(got) : want == got;
      if (!ok && ++fails <= 10) ADD_FAILURE() << "bf16 x=" << x << " want " << want << " got " << got;
    }
    if (!std::isnan(x)) {
      const uint32_t want = enc_e2m1().encode(x, Sat::kFinite), got = lowbit::encode_e2m1(x);
      if (want != got && ++fails <= 10) ADD_FAILURE() << "e2m1 x=" << x << " want " << want << " got " << got;
    }
  }
  EXPECT_EQ(fails, 0);
}

TEST(Codecs, SaturationRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // satfinite: overflow and Inf clamp, NaN stays NaN (canonical 0x7F)
  EXPECT_EQ(lowbit::encode_e4m3(1e6f), 0x7E);
  EXPECT_EQ(lowbit::encode_e4m3(-kInf), 0xFE);
  EXPECT_EQ(lowbit::encode_e4m3(464.0f), 0x7E);     // tie 448 / 480: even 448
  EXPECT_EQ(lowbit::encode_e4m3(464.0001f), 0x7E);  // satfinite
  EXPECT_EQ(lowbit::encode_e4m3(nan), 0x7F);
  EXPECT_EQ(lowbit::encode_e5m2(kInf), 0x7B);
  EXPECT_EQ(lowbit::encode_e5m2(nan), 0x7F);
  // no saturation: E4M3 overflow is NaN, E5M2 / fp16 overflow is Inf
  EXPECT_EQ(lowbit::encode_e4m3(464.0f, Saturate::kNone), 0x7E);
  EXPECT_EQ(lowbit::encode_e4m3(465.0f, Saturate::kNone) & 0x7F, 0x7F);
  EXPECT_EQ(lowbit::encode_e4m3(kInf, Saturate::kNone) & 0x7F, 0x7F);
  EXPECT_EQ(lowbit::encode_e5m2(61440.0f, Saturate::kNone), 0x7C);  // tie 57344 / 65536: even 65536 = Inf
  EXPECT_EQ(lowbit::encode_e5m2(61439.0f, Saturate::kNone), 0x7B);
  EXPECT_EQ(lowbit::encode_e5m2(-kInf, Saturate::kNone), 0xFC);
  EXPECT_EQ(lowbit::encode_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(lowbit::encode_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(lowbit::encode_bf16(3.4028235e38f), 0x7F80);  // FLT_MAX rounds up to Inf
  // smallest subnormals and below half of them
  EXPECT_EQ(lowbit::encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie 0 / 2^-9: even 0
  EXPECT_EQ(lowbit::encode_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(lowbit::encode_e5m2(-std::ldexp(1.0f, -17)), 0x80);
  EXPECT_EQ(lowbit::encode_e4m3(1e-45f), 0x00);
  EXPECT_EQ(lowbit::encode_e4m3(-1e-45f), 0x80);
}

// ---------------------------------------------------------------------------------------------
// UE8M0 RCEIL / FLOOR.

TEST(Codecs, Ue8m0RceilFloorEdges) {
  int fails = 0;
  auto check = [&](float x) {
    const uint8_t rc = lowbit::encode_ue8m0_rceil(x), fl = lowbit::encode_ue8m0_floor(x);
    const uint8_t wrc = ue8m0_ceil(x), wfl = ue8m0_floor(x);
    if ((rc != wrc || fl != wfl) && ++fails <= 10)
      ADD_FAILURE() << "x=" << x << " (0x" << std::hex << fbits(x) << ") rceil 0x" << int(rc) << " want 0x" << int(wrc)
                    << " floor 0x" << int(fl) << " want 0x" << int(wfl) << std::dec;
  };
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    check(p);
    check(std::nextafter(p, kInf));
    check(std::nextafter(p, 0.0f));
    check(p * 1.5f);
  }
  // fp32 subnormals around 2^-127 (mantissa 0x400000)
  for (uint32_t m : {1u, 2u, 0x3FFFFEu, 0x3FFFFFu, 0x400000u, 0x400001u, 0x400002u, 0x7FFFFEu, 0x7FFFFFu}) check(bitsf(m));
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(bitsf(0x400000u)), 0x00);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(bitsf(0x400001u)), 0x01);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(bitsf(0x7FFFFFu)), 0x01);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(bitsf(0x800000u)), 0x01);  // 2^-126
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(bitsf(0x800001u)), 0x02);
  EXPECT_EQ(lowbit::encode_ue8m0_floor(bitsf(0x7FFFFFu)), 0x00);
  // zero, big, Inf, NaN
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(0.0f), 0x00);
  EXPECT_EQ(lowbit::encode_ue8m0_floor(0.0f), 0x00);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(3.4028235e38f), 0xFE);  // above 2^127: satfinite
  EXPECT_EQ(lowbit::encode_ue8m0_floor(3.4028235e38f), 0xFE);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(kInf), 0xFE);
  EXPECT_EQ(lowbit::encode_ue8m0_floor(kInf), 0xFF);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(lowbit::encode_ue8m0_floor(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(1.0f), 127);
  EXPECT_EQ(lowbit::encode_ue8m0_rceil(1.0000001f), 128);
  EXPECT_EQ(lowbit::encode_ue8m0_floor(1.9999999f), 127);
  // random positive finite fp32
  std::mt19937 g(99);
  for (int i = 0; i < 200000; ++i) {
    const float x = bitsf(g() % 0x7F800000u);
    check(x);
  }
  EXPECT_EQ(fails, 0);
}

// MX RCEIL takes amax / max_elem (a division, FORMATS.md section 3); TransformerEngine computes
// amax * (1 / max_elem). Over all 2^23 mantissas of the binade holding max_elem the two give
// the same UE8M0 byte.
TEST(Codecs, RceilDivisionEqualsReciprocalProduct) {
  struct Case { float max; int binade; };
  for (Case c : {Case{448.0f, 8}, Case{57344.0f, 15}, Case{6.0f, 2}}) {
    const volatile float vmax = c.max;  // keep the division a division
    const float maxv = vmax, recip = 1.0f / maxv;
    uint32_t diff = 0, first = 0;
    const uint32_t base = uint32_t(c.binade + 127) << 23;
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const float amax = bitsf(base | m);
      const uint8_t a = lowbit::encode_ue8m0_rceil(amax / maxv), b = lowbit::encode_ue8m0_rceil(amax * recip);
      if (a != b && diff++ == 0) first = m;
    }
    EXPECT_EQ(diff, 0u) << "max " << c.max << " first differing mantissa 0x" << std::hex << first;
    // the binade does straddle a power of two of amax / max
    EXPECT_NE(lowbit::encode_ue8m0_rceil(bitsf(base) / maxv), lowbit::encode_ue8m0_rceil(bitsf(base | 0x7FFFFF) / maxv));
  }
}
