// tests/cpp/ref_formats.hpp: independent reference formulations for the C++ tests.
//
// Nothing here calls lowbit's codecs: values are built from the bit-field formulas of
// FORMATS.md in double precision, encoders are exhaustive nearest-value searches over those
// tables (comparing 2x against the sum of the two neighbours, which is exact in double), and
// every fp32 operation of a recipe is emulated as "exact double result, then one rounding to
// float" (correct rounding for + - * / since double has more than 2*24+2 bits).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace reftest {

inline uint32_t fbits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bitsf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
/// Correctly rounded fp32 of a double (the hardware conversion, round-to-nearest-even).
inline float f32(double v) { return static_cast<float>(v); }

/// A sign / exponent / mantissa format described by its fields only.
struct Fmt {
  int ebits, mbits, bias;
  uint32_t max_code;  // largest finite magnitude code
  enum Special { kNoSpecial, kIeee, kOnlyAllOnesNaN } special;
  const char* name;

  int nbits() const { return ebits + mbits; }
  uint32_t sign_bit() const { return 1u << nbits(); }
  /// Magnitude of a code's low bits by the normal / subnormal formula (no specials), so
  /// max_code + 1 gives the "next" value an unbounded exponent range would have.
  double formula(uint32_t mag) const {
    const uint32_t e = mag >> mbits, m = mag & ((1u << mbits) - 1u);
    if (e == 0) return std::ldexp(double(m), 1 - bias - mbits);
    return std::ldexp(double((1u << mbits) + m), int(e) - bias - mbits);
  }
  /// Decoded value of a full code (sign included), NaN / Inf as the format defines them.
  double decode(uint32_t code) const {
    const bool neg = (code >> nbits()) & 1u;
    const uint32_t mag = code & (sign_bit() - 1u);
    double v;
    if (special == kIeee && (mag >> mbits) == (1u << ebits) - 1u)
      v = (mag & ((1u << mbits) - 1u)) ? std::numeric_limits<double>::quiet_NaN()
                                       : std::numeric_limits<double>::infinity();
    else if (special == kOnlyAllOnesNaN && mag == sign_bit() - 1u)
      v = std::numeric_limits<double>::quiet_NaN();
    else
      v = formula(mag);
    return neg ? -v : v;
  }
};

inline const Fmt kE4M3{4, 3, 7, 0x7E, Fmt::kOnlyAllOnesNaN, "e4m3"};
inline const Fmt kE5M2{5, 2, 15, 0x7B, Fmt::kIeee, "e5m2"};
inline const Fmt kE2M1{2, 1, 1, 0x7, Fmt::kNoSpecial, "e2m1"};
inline const Fmt kF16{5, 10, 15, 0x7BFF, Fmt::kIeee, "fp16"};
inline const Fmt kBF16{8, 7, 127, 0x7F7F, Fmt::kIeee, "bf16"};

enum class Sat { kFinite, kNone };

/// Nearest-value encoder by search over the magnitude table (ties to the even code, i.e.
/// the even mantissa LSB). Overflow (rounding onto max_code + 1 or beyond) saturates or gives
/// Inf / NaN as FORMATS.md describes; E2M1 always saturates and encodes NaN as +6.
class Encoder {
 public:
  explicit Encoder(const Fmt& f) : f_(f) {
    mags_.resize(f.max_code + 2);
    for (uint32_t k = 0; k <= f.max_code + 1; ++k) mags_[k] = f.formula(k);
  }
  uint32_t encode(double x, Sat sat) const {
    const uint32_t sign = std::signbit(x) ? f_.sign_bit() : 0u;
    if (std::isnan(x)) return f_.special == Fmt::kNoSpecial ? f_.max_code : kNaN;
    const double a = std::fabs(x);
    const uint32_t over = f_.max_code + 1;
    uint32_t k;
    if (a >= mags_[over]) {
      k = over;
    } else {
      // largest k with mags[k] <= a
      uint32_t lo = 0, hi = over;  // mags[lo] <= a < mags[hi]
      while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (mags_[mid] <= a) lo = mid; else hi = mid;
      }
      const double twice = 2.0 * a, sum = mags_[lo] + mags_[hi];
      if (twice < sum) k = lo;
      else if (twice > sum) k = hi;
      else k = (lo & 1u) ? hi : lo;
    }
    if (k >= over) {
      if (sat == Sat::kFinite || f_.special == Fmt::kNoSpecial) return sign | f_.max_code;
      if (f_.special == Fmt::kIeee) return sign | (((1u << f_.ebits) - 1u) << f_.mbits);
      return sign | (f_.sign_bit() - 1u);
    }
    return sign | k;
  }
  const std::vector<double>& mags() const { return mags_; }
  const Fmt& fmt() const { return f_; }
  /// Returned for NaN input by formats that have NaN codes (the caller checks "is a NaN code").
  static constexpr uint32_t kNaN = 0xFFFFFFFFu;

 private:
  Fmt f_;
  std::vector<double> mags_;
};

inline const Encoder& enc_e4m3() { static Encoder e(kE4M3); return e; }
inline const Encoder& enc_e5m2() { static Encoder e(kE5M2); return e; }
inline const Encoder& enc_e2m1() { static Encoder e(kE2M1); return e; }
inline const Encoder& enc_f16() { static Encoder e(kF16); return e; }
inline const Encoder& enc_bf16() { static Encoder e(kBF16); return e; }

/// Round half to even of a double (std::nearbyint under the default rounding mode).
inline double rne(double v) { return std::nearbyint(v); }

/// INT4: two's complement nibble of clamp(rne(x), -8, 7); NaN -> 0.
inline uint8_t int4_code(double x) {
  if (std::isnan(x)) return 0;
  double r = rne(x);
  r = r < -8 ? -8 : (r > 7 ? 7 : r);
  return uint8_t(int(r) & 0xF);
}

/// NF4 codebook as printed in FORMATS.md section 6 (double literals, stored as fp32).
inline const double kNf4Table[16] = {-1.0,
                                     -0.6961928009986877,
                                     -0.5250730514526367,
                                     -0.39491748809814453,
                                     -0.28444138169288635,
                                     -0.18477343022823334,
                                     -0.09105003625154495,
                                     0.0,
                                     0.07958029955625534,
                                     0.16093020141124725,
                                     0.24611230194568634,
                                     0.33791524171829224,
                                     0.44070982933044434,
                                     0.5626170039176941,
                                     0.7229568362236023,
                                     1.0};
inline float nf4_f32(int c) { return f32(kNf4Table[c]); }
/// Decision threshold i as bitsandbytes writes it: the midpoint of the double codebook values
/// i and i+1, printed as the shortest decimal that round-trips the double, compiled as an fp32
/// literal (decimal -> fp32 directly). The codebook values are fp32 numbers, so each midpoint
/// is an exact fp32 tie and the decimal's last digit decides the side: 4 of the 15 thresholds
/// differ by one ulp from the round-to-nearest-even fp32 of the midpoint. An fp32 value equal
/// to a threshold gets the lower code (x > threshold), even where it is nearer the upper one.
inline float nf4_thr(int i) {
  const double mid = (kNf4Table[i] + kNf4Table[i + 1]) / 2.0;
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf) - 1, mid);
  *r.ptr = 0;
  return std::strtof(buf, nullptr);
}
/// NF4 code: number of thresholds x exceeds (exact ties -> lower code; NaN -> 0).
inline uint8_t nf4_code(float x) {
  uint8_t c = 0;
  for (int i = 0; i < 15; ++i) c += x > nf4_thr(i) ? 1 : 0;
  return c;
}
/// NF4 by nearest fp32 codebook value, ties to the lower code, for |x| <= 2 (agrees with
/// nf4_code except at fp32 values equal to a threshold that was rounded up).
inline uint8_t nf4_nearest(double x) {
  int best = 0;
  for (int c = 1; c < 16; ++c) {
    const double d = std::fabs(x - double(nf4_f32(c))), db = std::fabs(x - double(nf4_f32(best)));
    if (d < db) best = c;
  }
  return uint8_t(best);
}

/// UE8M0 byte of the smallest power of two >= x (x > 0 finite), exponent clamped to [-127, 127].
inline uint8_t ue8m0_ceil(double x) {
  if (std::isnan(x)) return 0xFF;
  if (x == 0) return 0;
  if (std::isinf(x)) return 0xFE;
  int e;
  const double fr = std::frexp(x, &e);  // x = fr * 2^e, fr in [0.5, 1)
  int k = fr == 0.5 ? e - 1 : e;
  k = k < -127 ? -127 : (k > 127 ? 127 : k);
  return uint8_t(k + 127);
}
/// UE8M0 byte of the largest power of two <= x, clamped to [-127, 127]; 0 -> 0x00.
inline uint8_t ue8m0_floor(double x) {
  if (std::isnan(x) || std::isinf(x)) return 0xFF;
  if (x == 0) return 0;
  int e;
  std::frexp(x, &e);
  int k = e - 1;
  k = k < -127 ? -127 : (k > 127 ? 127 : k);
  return uint8_t(k + 127);
}

inline double sqnr_db(const std::vector<float>& x, const std::vector<float>& y) {
  double s = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += double(x[i]) * x[i];
    n += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  }
  return 10.0 * std::log10(s / n);
}

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<float> v(n);
  for (auto& e : v) e = float(d(g)) * scale;
  return v;
}

}  // namespace reftest
