// The element rules of the FP8 V cache (lowbit/vcache.hpp) against their definitions computed
// another way: the scale of every amax that is a float of a sweep (all exponents, subnormals,
// mantissas at and next to the FP8 maxima) is the smallest power of two 2^e, e >= -149, with
// amax <= fmax * 2^e, found by a search in long double; codes and their decode for both formats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "lowbit/vcache.hpp"

using namespace lowbit;

namespace {

/// The definition: the smallest e >= -149 with a <= fmax * 2^e, by linear search.
float naive_scale(float a, float fmax) {
  if (!(a > 0.0f)) return 0.0f;
  for (int e = -149; e <= 127; ++e)
    if (static_cast<long double>(a) <= static_cast<long double>(fmax) * std::ldexp(1.0L, e)) return std::ldexp(1.0f, e);
  return std::numeric_limits<float>::infinity();
}

TEST(Vcache, ScaleIsTheSmallestPowerOfTwoThatHoldsTheAmax) {
  for (const bool e5m2 : {false, true}) {
    const float fmax = vcache_fp8_max(e5m2);
    int64_t n = 0;
    for (uint32_t bits = 0; bits < 0x7F800000u; bits += 0x1357u) {  // a sweep over every exponent
      const float a = bits_float(bits);
      ASSERT_EQ(float_bits(vcache_scale(a, fmax)), float_bits(naive_scale(a, fmax))) << a;
      ++n;
    }
    for (int e = -160; e <= 120; ++e)  // fmax * 2^e exactly and one ulp either side
      for (const float a : {std::ldexp(fmax, e), std::nextafter(std::ldexp(fmax, e), 0.0f),
                            std::nextafter(std::ldexp(fmax, e), INFINITY)})
        if (std::isfinite(a)) ASSERT_EQ(float_bits(vcache_scale(a, fmax)), float_bits(naive_scale(a, fmax))) << a;
    ASSERT_EQ(vcache_scale(std::numeric_limits<float>::max(), fmax), naive_scale(std::numeric_limits<float>::max(), fmax));
    EXPECT_GT(n, 100000);
  }
  EXPECT_EQ(vcache_scale(0.0f, 448.0f), 0.0f);
  EXPECT_EQ(vcache_scale(448.0f, 448.0f), 1.0f);
  EXPECT_EQ(vcache_scale(449.0f, 448.0f), 2.0f);
  EXPECT_EQ(vcache_scale(1.0f, 448.0f), std::ldexp(1.0f, -8));  // 1 <= 448 / 256
}

TEST(Vcache, CodesAndDecode) {
  for (const bool e5m2 : {false, true}) {
    const float fmax = vcache_fp8_max(e5m2);
    const float s = vcache_scale(1000.0f, fmax);
    EXPECT_LE(1000.0f / s, fmax);
    EXPECT_EQ(vcache_decode(vcache_code(112.0f, s, e5m2), s, e5m2), 112.0f);  // 1.75 * 2^6: exact in both formats
    EXPECT_EQ(vcache_decode(vcache_code(113.0f, s, e5m2), s, e5m2), 112.0f);  // rounded to the nearest code
    const uint8_t nan = vcache_code(std::numeric_limits<float>::quiet_NaN(), s, e5m2);
    EXPECT_TRUE(std::isnan(vcache_decode(nan, s, e5m2)));
    const float inf = vcache_decode(vcache_code(INFINITY, s, e5m2), s, e5m2);
    EXPECT_TRUE(e5m2 ? inf == INFINITY : std::isnan(inf));
    EXPECT_EQ(vcache_code(-0.0f, 0.0f, e5m2), 0x80);  // a zero channel: zeros keep their sign
    EXPECT_EQ(vcache_code(0.0f, 0.0f, e5m2), 0x00);
    EXPECT_TRUE(std::isnan(vcache_decode(vcache_code(INFINITY, 0.0f, e5m2), 1.0f, e5m2)));
    EXPECT_FALSE(vcache_outgrows(fmax * s, s, fmax));
    EXPECT_TRUE(vcache_outgrows(std::nextafter(fmax * s, INFINITY), s, fmax));
  }
}

}  // namespace
