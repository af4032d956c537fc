// Block recipes through the public API (lowbit::quantize / dequantize on CPU tensors) against
// an independent reference quantizer written here in double precision (FORMATS.md sections
// 3, 4, 6, 7): MXFP8 / MXFP4 (RCEIL, FLOOR), NVFP4 (with / without per-tensor scale, every
// ZeroScale), per-token-group FP8 and INT4 / UINT4, NF4 blocks and the NF4 K cache. Odd shapes,
// batched and strided inputs, the GPU MODE layouts, and the SQNR of every format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lowbit/block_quant.hpp"
#include "lowbit/ops.hpp"
#include "ref_formats.hpp"

using namespace lowbit;
using reftest::bitsf;
using reftest::f32;
using reftest::fbits;
using reftest::Sat;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kFltMaxD = 3.40282346638528859812e+38;

// ---------------------------------------------------------------------------------------------
// Independent reference quantizer (row-major scales [M, C], one code per element).

struct Ref {
  std::vector<uint8_t> codes;
  std::vector<uint32_t> scales;
  std::vector<uint8_t> zeros;
  std::vector<float> deq;  // fp32 dequantized values
};

double qmax_of(Elem e) {
  switch (e) {
    case Elem::kE4M3: return 448;
    case Elem::kE5M2: return 57344;
    case Elem::kE2M1: return 6;
    case Elem::kInt4: return 7;
    default: return 0;
  }
}
int emax_of(Elem e) { return e == Elem::kE4M3 ? 8 : e == Elem::kE5M2 ? 15 : 2; }

uint8_t code_of(Elem e, float v) {
  switch (e) {
    case Elem::kE4M3: return uint8_t(reftest::enc_e4m3().encode(v, Sat::kFinite));
    case Elem::kE5M2: return uint8_t(reftest::enc_e5m2().encode(v, Sat::kFinite));
    case Elem::kE2M1: return std::isnan(v) ? 0x7 : uint8_t(reftest::enc_e2m1().encode(v, Sat::kFinite));
    case Elem::kInt4: return reftest::int4_code(v);
    case Elem::kNF4: return reftest::nf4_code(v);
    default: return 0;
  }
}
double value_of(Elem e, uint8_t c) {
  switch (e) {
    case Elem::kE4M3: return reftest::kE4M3.decode(c);
    case Elem::kE5M2: return reftest::kE5M2.decode(c);
    case Elem::kE2M1: return reftest::kE2M1.decode(c);
    case Elem::kInt4: return c < 8 ? c : int(c) - 16;
    case Elem::kUInt4: return c;
    case Elem::kNF4: return reftest::nf4_f32(c);
  }
  return 0;
}

/// S_enc of NVFP4 (TransformerEngine): fp32(2688 / amax), FLT_MAX cap, 1 for amax 0; 1 for an
/// amax that is NaN, +-Inf or negative (lowbit's rule: no per-tensor scale).
float ref_s_enc(float gamax) {
  if (gamax == 0 || !std::isfinite(gamax) || gamax < 0) return 1.0f;
  double s = double(f32(2688.0 / double(gamax)));
  if (std::isnan(s) || s > kFltMaxD) s = kFltMaxD;
  if (s == 0) return 1.0f;
  return float(s);
}

Ref ref_quantize(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax) {
  const int64_t B = f.block, C = K / B;
  Ref r;
  r.codes.assign(size_t(M * K), 0);
  r.scales.assign(size_t(M * C), 0);
  r.zeros.assign(size_t(M * C), 0);
  r.deq.assign(size_t(M * K), 0);
  const float s_enc = (f.rule == ScaleRule::kNvfp4 && gamax) ? ref_s_enc(*gamax) : 1.0f;
  const float s_dec = f32(1.0 / double(s_enc));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const float* xb = &x[size_t(m * K + c * B)];
      double amax = 0, mn = xb[0], mx = xb[0];
      bool finite = true;
      for (int64_t k = 0; k < B; ++k) {
        if (!std::isfinite(xb[k])) finite = false;
        amax = std::max(amax, std::fabs(double(xb[k])));
        mn = std::min(mn, double(xb[k]));
        mx = std::max(mx, double(xb[k]));
      }
      uint8_t* cb = &r.codes[size_t(m * K + c * B)];
      float* db = &r.deq[size_t(m * K + c * B)];
      uint32_t& sc = r.scales[size_t(m * C + c)];
      uint8_t& zp = r.zeros[size_t(m * C + c)];
      if (!finite) {
        sc = f.scale_type == ScaleType::kF32 ? 0x7FC00000u : f.scale_type == ScaleType::kUE8M0 ? 0xFFu : 0x7Fu;
        for (int64_t k = 0; k < B; ++k) {
          cb[k] = f.elem == Elem::kNF4 ? 7 : 0;
          db[k] = kNaN;
        }
        continue;
      }
      double scale = 1;  // decoded scale
      switch (f.rule) {
        case ScaleRule::kMxRceil: {
          const float q = f32(amax / qmax_of(f.elem));  // fp32 division (FORMATS section 3)
          const uint8_t b = reftest::ue8m0_ceil(q);
          sc = b;
          scale = std::ldexp(1.0, int(b) - 127);
          for (int64_t k = 0; k < B; ++k) cb[k] = code_of(f.elem, f32(double(xb[k]) / scale));
          break;
        }
        case ScaleRule::kMxFloor: {
          int e = -127;
          if (amax > 0) {
            int ex;
            std::frexp(amax, &ex);
            e = (ex - 1) - emax_of(f.elem);
            e = e < -127 ? -127 : (e > 127 ? 127 : e);
          }
          sc = uint32_t(e + 127);
          scale = std::ldexp(1.0, e);
          for (int64_t k = 0; k < B; ++k) cb[k] = code_of(f.elem, f32(double(xb[k]) / scale));
          break;
        }
        case ScaleRule::kNvfp4: {
          const float k16 = f32(double(s_enc) * double(f32(1.0 / 6.0)));
          uint8_t sb = uint8_t(reftest::enc_e4m3().encode(f32(amax * double(k16)), Sat::kFinite));
          if (sb == 0) sb = f.zero_scale == ZeroScale::kMinSubnormal ? 0x01 : f.zero_scale == ZeroScale::kOne ? 0x38 : 0x00;
          sc = sb;
          const double sbv = reftest::kE4M3.decode(sb);
          double mult = double(f32(1.0 / double(f32(sbv * double(s_dec)))));
          if (mult > kFltMaxD) mult = kFltMaxD;
          for (int64_t k = 0; k < B; ++k) cb[k] = code_of(Elem::kE2M1, f32(double(xb[k]) * mult));
          for (int64_t k = 0; k < B; ++k) db[k] = f32(double(f32(value_of(Elem::kE2M1, cb[k]) * sbv)) * double(s_dec));
          continue;
        }
        case ScaleRule::kAmax: {
          float s = f32(std::max(amax, double(f.eps)) / qmax_of(f.elem));
          if (f.scale_type == ScaleType::kUE8M0) {
            const uint8_t b = reftest::ue8m0_ceil(s);
            sc = b;
            s = float(std::ldexp(1.0, int(b) - 127));
          } else {
            sc = fbits(s);
          }
          scale = s;
          for (int64_t k = 0; k < B; ++k) cb[k] = code_of(f.elem, f32(double(xb[k]) / double(s)));
          break;
        }
        case ScaleRule::kMinMax: {
          // fp32 (max - min) / 15; where max - min overflows fp32: fp32(max / 15) - fp32(min / 15)
          const float range = f32(mx - mn);
          float s = std::isfinite(range) ? f32(double(range) / 15.0) : f32(double(f32(mx / 15.0)) - double(f32(mn / 15.0)));
          s = std::max(s, f.eps);
          double z = reftest::rne(double(f32(-mn / double(s))));
          z = z < 0 ? 0 : (z > 15 ? 15 : z);
          sc = fbits(s);
          zp = uint8_t(z);
          // codes q with fp32((q - zp) * s) finite only
          int n = 15;
          while (n > 0 && !std::isfinite(f32(double(n) * double(s)))) --n;
          const double qlo = std::max(0.0, z - n), qhi = std::min(15.0, z + n);
          for (int64_t k = 0; k < B; ++k) {
            double q = reftest::rne(double(f32(double(xb[k]) / double(s)))) + z;
            cb[k] = uint8_t(q < qlo ? qlo : (q > qhi ? qhi : q));
            db[k] = f32((double(cb[k]) - z) * double(s));
          }
          continue;
        }
        case ScaleRule::kAbsmax: {
          sc = fbits(float(amax));
          const double inv = double(f32(1.0 / amax));  // bitsandbytes multiplies by 1/absmax
          // where fp32 1/absmax overflows (absmax < 2^-128), lowbit divides by absmax
          const bool div = amax > 0 && std::isinf(inv);
          for (int64_t k = 0; k < B; ++k)
            cb[k] = reftest::nf4_code(div ? f32(double(xb[k]) / amax) : f32(double(xb[k]) * inv));
          scale = amax;
          break;
        }
      }
      for (int64_t k = 0; k < B; ++k) db[k] = f32(value_of(f.elem, cb[k]) * scale);
    }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Running lowbit

struct Out {
  std::vector<uint8_t> q, zeros;
  std::vector<uint32_t> scales;  // row-major, one element per scale
  std::vector<float> deq;
  float gamax_written = 0;
};

DType qdtype(const BlockFormat& f) {
  if (f.elem == Elem::kE4M3) return DType::kE4M3;
  if (f.elem == Elem::kE5M2) return DType::kE5M2;
  return DType::kUInt8;
}
DType sdtype(const BlockFormat& f) {
  return f.scale_type == ScaleType::kF32 ? DType::kFloat32 : f.scale_type == ScaleType::kUE8M0 ? DType::kUE8M0 : DType::kE4M3;
}

uint8_t code_at(const BlockFormat& f, const std::vector<uint8_t>& q, int64_t K, int64_t m, int64_t k) {
  if (!f.packed()) return q[size_t(m * K + k)];
  const uint8_t b = q[size_t(m * (K / 2) + k / 2)];
  const bool low = (f.nibbles == NibbleOrder::kLowFirst) == ((k & 1) == 0);
  return low ? (b & 0xF) : (b >> 4);
}

// x is [M, K] float32 (or given as bf16 bits when `bf16` is set).
Out run(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax, bool compute_gamax = false,
        const std::vector<uint16_t>* bf16 = nullptr) {
  const int64_t C = K / f.block, qK = f.packed() ? K / 2 : K;
  Out o;
  o.q.assign(size_t(M * qK), 0xA5);
  std::vector<uint8_t> sbuf(size_t(M * C * f.scale_bytes()), 0xA5);
  o.zeros.assign(size_t(M * C), 0xA5);
  QuantArgs a;
  float g = gamax ? *gamax : 0.0f;
  if (gamax || compute_gamax) a.global_amax = TensorView(&g, DType::kFloat32, {1});
  a.compute_global_amax = compute_gamax;
  if (f.has_zero_point()) a.zeros = TensorView(o.zeros.data(), DType::kUInt8, {M, C});
  const TensorView xv = bf16 ? TensorView(const_cast<uint16_t*>(bf16->data()), DType::kBFloat16, {M, K})
                             : TensorView(const_cast<float*>(x.data()), DType::kFloat32, {M, K});
  const TensorView qv(o.q.data(), qdtype(f), {M, qK}), sv(sbuf.data(), sdtype(f), {M, C});
  quantize(xv, f, ScaleLayout::row_major(), qv, sv, a);
  o.gamax_written = g;
  o.scales.resize(size_t(M * C));
  for (size_t i = 0; i < o.scales.size(); ++i) {
    if (f.scale_bytes() == 4) std::memcpy(&o.scales[i], &sbuf[i * 4], 4);
    else o.scales[i] = sbuf[i];
  }
  o.deq.assign(size_t(M * K), -123.0f);
  QuantArgs d = a;
  d.compute_global_amax = false;
  dequantize(qv, sv, f, ScaleLayout::row_major(), TensorView(o.deq.data(), DType::kFloat32, {M, K}), d);
  return o;
}

// Compares lowbit with the reference: every code, scale, zero point and dequantized value.
void expect_matches(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax,
                    const std::string& what) {
  const Ref r = ref_quantize(x, M, K, f, gamax);
  const Out o = run(x, M, K, f, gamax);
  const int64_t C = K / f.block;
  int fails = 0;
  for (int64_t m = 0; m < M && fails < 10; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const size_t si = size_t(m * C + c);
      if (o.scales[si] != r.scales[si] && ++fails)
        ADD_FAILURE() << what << " scale m=" << m << " c=" << c << " got 0x" << std::hex << o.scales[si] << " want 0x" << r.scales[si];
      if (f.has_zero_point() && o.zeros[si] != r.zeros[si] && ++fails)
        ADD_FAILURE() << what << " zero m=" << m << " c=" << c << " got " << int(o.zeros[si]) << " want " << int(r.zeros[si]);
    }
  for (int64_t m = 0; m < M && fails < 10; ++m)
    for (int64_t k = 0; k < K && fails < 10; ++k) {
      const size_t i = size_t(m * K + k);
      const uint8_t got = code_at(f, o.q, K, m, k);
      if (got != r.codes[i] && ++fails)
        ADD_FAILURE() << what << " code m=" << m << " k=" << k << " x=" << x[i] << " got 0x" << std::hex << int(got) << " want 0x"
                      << int(r.codes[i]);
      const bool same = (std::isnan(o.deq[i]) && std::isnan(r.deq[i])) || fbits(o.deq[i]) == fbits(r.deq[i]);
      if (!same && ++fails)
        ADD_FAILURE() << what << " dequant m=" << m << " k=" << k << " got " << o.deq[i] << " want " << r.deq[i];
    }
  EXPECT_EQ(fails, 0) << what;
}

// Random rows with per-row magnitudes from 2^-40 to 2^40 and a few hand-made blocks.
std::vector<float> test_matrix(int64_t M, int64_t K, int64_t block, uint64_t seed, bool specials) {
  std::vector<float> x = reftest::randn(size_t(M * K), seed);
  std::mt19937 g{uint32_t(seed)};
  for (int64_t m = 0; m < M; ++m) {
    const float s = std::ldexp(1.0f, int(g() % 81) - 40);
    for (int64_t k = 0; k < K; ++k) x[size_t(m * K + k)] *= s;
  }
  if (!specials) return x;
  auto blk = [&](int64_t m, int64_t c) { return &x[size_t(m * K + c * block)]; };
  const int64_t C = K / block;
  // exercise both rows and blocks: (row, block) positions modulo the shape
  auto at = [&](int64_t i) { return blk(i % M, (i / M) % C); };
  if (M * C >= 1) { float* b = at(0); for (int64_t k = 0; k < block; ++k) b[k] = 0.0f; }                       // zero block
  if (M * C >= 2) { float* b = at(1); for (int64_t k = 0; k < block; ++k) b[k] = bitsf(uint32_t(k * 9973 % 0x7FFFFF)) * (k & 1 ? -1 : 1); }  // subnormal amax
  if (M * C >= 3) { float* b = at(2); b[block / 2] = kNaN; }                                                     // NaN block
  if (M * C >= 4) { float* b = at(3); b[1] = -kInf; }                                                            // Inf block
  if (M * C >= 5) { float* b = at(4); for (int64_t k = 0; k < block; ++k) b[k] = 1.99f * float(k % 7 - 3) / 3.0f; }  // clips under FLOOR
  if (M * C >= 6) { float* b = at(5); for (int64_t k = 0; k < block; ++k) b[k] = 3e38f * (k & 1 ? -1.0f : 1.0f) * float(k + 1) / float(block); }  // near FLT_MAX
  if (M * C >= 7) { float* b = at(6); for (int64_t k = 0; k < block; ++k) b[k] = 448.0f * std::ldexp(1.0f, int(k % 5) - 2); }  // powers of two
  if (M * C >= 8) { float* b = at(7); for (int64_t k = 0; k < block; ++k) b[k] = 1e-30f * float(k); }  // tiny normals
  return x;
}

struct Named {
  BlockFormat f;
  const char* name;
};

std::vector<Named> all_formats() {
  BlockFormat nf4h = BlockFormat::nf4(64, NibbleOrder::kHighFirst);
  BlockFormat fp8e5 = BlockFormat::fp8_group(64, Elem::kE5M2);
  BlockFormat mx4h = BlockFormat::mxfp4();
  mx4h.nibbles = NibbleOrder::kHighFirst;
  return {
      {BlockFormat::mxfp8(Elem::kE4M3, false), "mxfp8_e4m3 rceil"},
      {BlockFormat::mxfp8(Elem::kE4M3, true), "mxfp8_e4m3 floor"},
      {BlockFormat::mxfp8(Elem::kE5M2, false), "mxfp8_e5m2 rceil"},
      {BlockFormat::mxfp8(Elem::kE5M2, true), "mxfp8_e5m2 floor"},
      {BlockFormat::mxfp4(false), "mxfp4 rceil"},
      {BlockFormat::mxfp4(true), "mxfp4 floor"},
      {mx4h, "mxfp4 rceil high-first"},
      {BlockFormat::nvfp4(ZeroScale::kZero), "nvfp4 zero"},
      {BlockFormat::nvfp4(ZeroScale::kMinSubnormal), "nvfp4 minsub"},
      {BlockFormat::nvfp4(ZeroScale::kOne), "nvfp4 one"},
      {BlockFormat::fp8_group(128), "fp8 g128 f32"},
      {BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kUE8M0), "fp8 g128 ue8m0"},
      {fp8e5, "fp8 e5m2 g64 f32"},
      {BlockFormat::int4_group(128), "int4 g128 f32"},
      {BlockFormat::int4_group(32, false, ScaleType::kUE8M0), "int4 g32 ue8m0"},
      {BlockFormat::int4_group(64, true), "uint4 zp g64"},
      {BlockFormat::nf4(64), "nf4 b64"},
      {nf4h, "nf4 b64 high-first"},
  };
}

}  // namespace

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
