// The independent reference quantizer of the recipe tests (test_recipes.cpp,
// test_recipes_nan_policy.cpp), written in double precision (FORMATS.md sections 3, 4, 6, 7),
// and the helpers that run lowbit::quantize / dequantize on CPU tensors and compare.
#pragma once

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

namespace recipes_test {

using namespace lowbit;
using reftest::bitsf;
using reftest::f32;
using reftest::fbits;
using reftest::Sat;

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

inline double qmax_of(Elem e) {
  switch (e) {
    case Elem::kE4M3: return 448;
    case Elem::kE5M2: return 57344;
    case Elem::kE2M1: return 6;
    case Elem::kInt4: return 7;
    default: return 0;
  }
}
inline int emax_of(Elem e) { return e == Elem::kE4M3 ? 8 : e == Elem::kE5M2 ? 15 : 2; }

inline uint8_t code_of(Elem e, float v) {
  switch (e) {
    case Elem::kE4M3: return uint8_t(reftest::enc_e4m3().encode(v, Sat::kFinite));
    case Elem::kE5M2: return uint8_t(reftest::enc_e5m2().encode(v, Sat::kFinite));
    case Elem::kE2M1: return std::isnan(v) ? 0x7 : uint8_t(reftest::enc_e2m1().encode(v, Sat::kFinite));
    case Elem::kInt4: return reftest::int4_code(v);
    case Elem::kNF4: return reftest::nf4_code(v);
    default: return 0;
  }
}
inline double value_of(Elem e, uint8_t c) {
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
inline float ref_s_enc(float gamax) {
  if (gamax == 0 || !std::isfinite(gamax) || gamax < 0) return 1.0f;
  double s = double(f32(2688.0 / double(gamax)));
  if (std::isnan(s) || s > kFltMaxD) s = kFltMaxD;
  if (s == 0) return 1.0f;
  return float(s);
}

inline Ref ref_quantize(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax) {
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

inline DType qdtype(const BlockFormat& f) {
  if (f.elem == Elem::kE4M3) return DType::kE4M3;
  if (f.elem == Elem::kE5M2) return DType::kE5M2;
  return DType::kUInt8;
}
inline DType sdtype(const BlockFormat& f) {
  return f.scale_type == ScaleType::kF32 ? DType::kFloat32 : f.scale_type == ScaleType::kUE8M0 ? DType::kUE8M0 : DType::kE4M3;
}

inline uint8_t code_at(const BlockFormat& f, const std::vector<uint8_t>& q, int64_t K, int64_t m, int64_t k) {
  if (!f.packed()) return q[size_t(m * K + k)];
  const uint8_t b = q[size_t(m * (K / 2) + k / 2)];
  const bool low = (f.nibbles == NibbleOrder::kLowFirst) == ((k & 1) == 0);
  return low ? (b & 0xF) : (b >> 4);
}

// x is [M, K] float32 (or given as bf16 bits when `bf16` is set).
inline Out run(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax, bool compute_gamax = false,
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
inline void expect_matches(const std::vector<float>& x, int64_t M, int64_t K, const BlockFormat& f, const float* gamax,
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
inline std::vector<float> test_matrix(int64_t M, int64_t K, int64_t block, uint64_t seed, bool specials) {
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

inline std::vector<Named> all_formats() {
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

}  // namespace recipes_test
