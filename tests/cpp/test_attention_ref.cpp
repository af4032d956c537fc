// The CPU reference of the MXFP8 flash-attention forward (lowbit::flash_attn_mxfp8 and
// flash_attn_mxfp8_varlen on CPU tensors) against the naive fp64 attention of
// attention_util.hpp: outputs within one bf16 ulp of the naive value, lse within float rounding;
// odd shapes, causal with s_q != s_k (bottom-right aligned, fully masked rows), GQA / MQA,
// strided views, varlen batches with empty sequences, and the NaN rules of docs/attention.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "lowbit/attention.hpp"
#include "ref/ref_attention.hpp"

using namespace lowbit;
using attntest::Data;
using attntest::Shape;

namespace {

constexpr uint16_t kPoisonNaN = 0x7FFF;  // bf16 NaN
constexpr uint16_t kPoisonOne = 0x3F80;  // bf16 1.0

struct Out {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

Out run_fixed(Data& x, AttnArgs a = {}, uint16_t poison = kPoisonNaN) {
  const Shape& s = x.s;
  a.causal = s.causal;
  Out r;
  r.o.assign(size_t(s.b * s.sq * s.h * s.d), poison);
  r.lse.assign(size_t(s.b * s.h * s.sq), 12345.f);
  flash_attn_mxfp8(TensorView(x.q.data(), DType::kE4M3, {s.b, s.sq, s.h, s.d}),
                   TensorView(x.k.data(), DType::kE4M3, {s.b, s.sk, s.hk, s.d}),
                   TensorView(x.v.data(), DType::kUInt8, {s.b, s.sk, s.hk, s.d}),
                   TensorView(x.qs.data(), DType::kUE8M0, {s.b, s.h, s.sq, s.d / 32}),
                   TensorView(x.ks.data(), DType::kUInt8, {s.b, s.hk, s.sk, s.d / 32}),
                   TensorView(x.vs.data(), DType::kUE8M0, {s.b, s.hk, s.sk, s.d / 32}),
                   TensorView(r.o.data(), DType::kBFloat16, {s.b, s.sq, s.h, s.d}),
                   TensorView(r.lse.data(), DType::kFloat32, {s.b, s.h, s.sq}), a);
  return r;
}

double ulp_bf16(double v) {
  v = std::fabs(v);
  int e = -126;
  if (v >= std::ldexp(1.0, -126)) {
    int ex;
    std::frexp(v, &ex);
    e = ex - 1;
  }
  return std::ldexp(1.0, e - 7);
}

/// out within one bf16 ulp of the naive value (NaN where it is NaN), lse within 1e-6 relative
/// (+inf where the naive value is beyond FLT_MAX).
void expect_close(const Data& x, const Out& r, const attntest::Result& want, const std::string& what) {
  int bad = 0;
  for (size_t e = 0; e < want.out.size() && bad < 5; ++e) {
    const double got = decode_bf16(r.o[e]), w = want.out[e];
    const bool ok = std::isnan(w) ? std::isnan(got) : std::fabs(got - w) <= ulp_bf16(w);
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << ": out[" << e << "] = " << got << ", naive " << w;
    }
  }
  for (size_t e = 0; e < want.lse.size() && bad < 10; ++e) {
    const double got = r.lse[e], w = want.lse[e];
    const bool ok = std::isnan(w) ? std::isnan(got)
                    : std::isinf(float(w)) ? got == double(float(w))  // beyond FLT_MAX: +-inf
                                    : std::fabs(got - w) <= 1e-6 * std::max(1.0, std::fabs(w));
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << ": lse[" << e << "] = " << got << ", naive " << w;
    }
  }
  (void)x;
}

std::string name(const Shape& s, int spread) {
  return "b" + std::to_string(s.b) + " sq" + std::to_string(s.sq) + " sk" + std::to_string(s.sk) + " h" +
         std::to_string(s.h) + "/" + std::to_string(s.hk) + " d" + std::to_string(s.d) + (s.causal ? " causal" : "") +
         " spread" + std::to_string(spread);
}

const Shape kShapes[] = {
    {1, 1, 5, 1, 1, 64, false},  {2, 3, 7, 4, 2, 64, true},   {1, 7, 3, 2, 1, 128, true},
    {1, 5, 5, 8, 8, 256, true},  {1, 4, 9, 4, 1, 64, false},  {1, 13, 29, 2, 2, 64, true},
    {2, 9, 4, 8, 1, 128, false}, {1, 17, 17, 1, 1, 256, false}, {1, 1, 1, 1, 1, 64, true},
};

TEST(AttentionRef, MatchesNaive) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes)
    for (int spread : {0, 40}) {
      Data x = attntest::make_data(s, seed++, spread);
      const Out r = run_fixed(x);
      expect_close(x, r, attntest::naive(x, 1.0 / std::sqrt(double(s.d))), name(s, spread));
    }
}

TEST(AttentionRef, SoftmaxScale) {
  Data x = attntest::make_data({1, 6, 11, 2, 1, 64, true}, 77, 3);
  AttnArgs a;
  a.softmax_scale = 0.3f;
  expect_close(x, run_fixed(x, a), attntest::naive(x, double(0.3f)), "softmax_scale 0.3");
}

TEST(AttentionRef, ExtremeScaleBytes) {
  // scale bytes 0 and 254 (values 2^-127 .. 448 * 2^127: finite in fp64, scores up to ~1e81)
  Data x = attntest::make_data({1, 5, 7, 1, 1, 64, false}, 5, 0);
  for (size_t i = 0; i < x.qs.size(); ++i) x.qs[i] = i % 2 ? 254 : 0;
  for (size_t i = 0; i < x.ks.size(); ++i) x.ks[i] = i % 3 ? 0 : 254;
  for (size_t i = 0; i < x.vs.size(); ++i) x.vs[i] = i % 2 ? 0 : 200;
  expect_close(x, run_fixed(x), attntest::naive(x, 0.125), "scale bytes 0 / 254");
}

TEST(AttentionRef, FullyMaskedRows) {
  // causal, s_q = 7 > s_k = 3: rows 0..3 see no key (bottom-right alignment): out +0, lse -inf
  Data x = attntest::make_data({1, 7, 3, 2, 1, 64, true}, 9, 0);
  const Out r = run_fixed(x);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 7; ++i) {
      const float lse = r.lse[size_t(h * 7 + i)];
      if (i < 4) {
        EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << "row " << i;
        for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(r.o[x.iq(0, i, h, c)], 0) << "row " << i;
      } else {
        EXPECT_TRUE(std::isfinite(lse)) << "row " << i;
      }
    }
  // row 4 sees key 0 only: out = v[0] exactly (rounded to bf16), lse = its score
  for (int64_t c = 0; c < 64; ++c)
    EXPECT_EQ(decode_bf16(r.o[x.iq(0, 4, 0, c)]), float(attntest::vval(x, 0, 0, 0, c)));
}

TEST(AttentionRef, StridedViews) {
  // q with a padded head stride, k / v rows of a wider buffer, out with padded rows, scales with a
  // padded sequence stride: every stride but the last is free
  const Shape s{2, 5, 3, 4, 2, 64, true};
  Data x = attntest::make_data(s, 21, 5);
  const Out want = run_fixed(x);
  const int64_t hp = 96, kp = 3 * 64, sp = 3;  // padded head, KV row, scale row
  std::vector<uint8_t> q(size_t(s.b * s.sq * s.h * hp), 0x7F), k(size_t(s.b * s.sk * kp), 0x7F),
      v(size_t(s.b * s.sk * kp), 0x7F), qs(size_t(s.b * s.h * s.sq * sp), 255);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < s.h; ++h) {
        std::memcpy(&q[size_t(((b * s.sq + i) * s.h + h) * hp)], &x.q[x.iq(b, i, h, 0)], 64);
        std::memcpy(&qs[size_t(((b * s.h + h) * s.sq + i) * sp)], &x.qs[x.iqs(b, h, i, 0)], 2);
      }
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t j = 0; j < s.sk; ++j)
      for (int64_t h = 0; h < s.hk; ++h) {
        std::memcpy(&k[size_t((b * s.sk + j) * kp + h * 64)], &x.k[x.ik(b, j, h, 0)], 64);
        std::memcpy(&v[size_t((b * s.sk + j) * kp + h * 64)], &x.v[x.ik(b, j, h, 0)], 64);
      }
  const int64_t op = s.h * 64 + 8;  // padded out row (elements)
  std::vector<uint16_t> o(size_t(s.b * s.sq * op), kPoisonNaN);
  std::vector<float> lse(size_t(s.b * s.h * s.sq), 7.f);
  AttnArgs a;
  a.causal = true;
  flash_attn_mxfp8(TensorView(q.data(), DType::kE4M3, {2, 5, 4, 64}, {5 * 4 * hp, 4 * hp, hp, 1}),
                   TensorView(k.data(), DType::kE4M3, {2, 3, 2, 64}, {3 * kp, kp, 64, 1}),
                   TensorView(v.data(), DType::kE4M3, {2, 3, 2, 64}, {3 * kp, kp, 64, 1}),
                   TensorView(qs.data(), DType::kUE8M0, {2, 4, 5, 2}, {4 * 5 * sp, 5 * sp, sp, 1}),
                   TensorView(x.ks.data(), DType::kUE8M0, {2, 2, 3, 2}),
                   TensorView(x.vs.data(), DType::kUE8M0, {2, 2, 3, 2}),
                   TensorView(o.data(), DType::kBFloat16, {2, 5, 4, 64}, {5 * op, op, 64, 1}),
                   TensorView(lse.data(), DType::kFloat32, {2, 4, 5}), a);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.sq; ++i) {
      EXPECT_EQ(0, std::memcmp(&o[size_t((b * s.sq + i) * op)], &want.o[x.iq(b, i, 0, 0)], size_t(s.h * 64) * 2));
      for (int64_t p = s.h * 64; p < op; ++p) EXPECT_EQ(o[size_t((b * s.sq + i) * op + p)], kPoisonNaN);  // padding untouched
    }
  EXPECT_EQ(0, std::memcmp(lse.data(), want.lse.data(), lse.size() * 4));
}

// ---------------------------------------------------------------------------------------------
// varlen: the packed batch equals the fixed-length runs of each sequence, bit for bit

TEST(AttentionRef, VarlenEqualsPerSequence) {
  const int64_t h = 4, hk = 2, d = 64;
  const std::vector<int64_t> lq = {3, 0, 5, 1, 7}, lk = {4, 2, 0, 6, 3};
  for (bool causal : {false, true}) {
    std::vector<Data> seqs;
    std::vector<int32_t> cq = {0}, ck = {0};
    for (size_t b = 0; b < lq.size(); ++b) {
      // a sequence of zero rows is made with one row and not packed
      seqs.push_back(attntest::make_data({1, std::max<int64_t>(1, lq[b]), std::max<int64_t>(1, lk[b]), h, hk, d, causal},
                                         100 + b, 10));
      cq.push_back(cq.back() + int32_t(lq[b]));
      ck.push_back(ck.back() + int32_t(lk[b]));
    }
    const int64_t TQ = cq.back(), TK = ck.back();
    std::vector<uint8_t> q(size_t(TQ * h * d)), k(size_t(TK * hk * d)), v(k.size()), qs(size_t(h * TQ * 2)),
        ks(size_t(hk * TK * 2)), vs(ks.size());
    for (size_t b = 0; b < lq.size(); ++b) {
      const Data& x = seqs[b];
      for (int64_t i = 0; i < lq[b]; ++i) {
        std::memcpy(&q[size_t((cq[b] + i) * h * d)], &x.q[x.iq(0, i, 0, 0)], size_t(h * d));
        for (int64_t hh = 0; hh < h; ++hh) std::memcpy(&qs[size_t((hh * TQ + cq[b] + i) * 2)], &x.qs[x.iqs(0, hh, i, 0)], 2);
      }
      for (int64_t j = 0; j < lk[b]; ++j) {
        std::memcpy(&k[size_t((ck[b] + j) * hk * d)], &x.k[x.ik(0, j, 0, 0)], size_t(hk * d));
        std::memcpy(&v[size_t((ck[b] + j) * hk * d)], &x.v[x.ik(0, j, 0, 0)], size_t(hk * d));
        for (int64_t hh = 0; hh < hk; ++hh) {
          std::memcpy(&ks[size_t((hh * TK + ck[b] + j) * 2)], &x.ks[x.iks(0, hh, j, 0)], 2);
          std::memcpy(&vs[size_t((hh * TK + ck[b] + j) * 2)], &x.vs[x.iks(0, hh, j, 0)], 2);
        }
      }
    }
    std::vector<uint16_t> o(size_t(TQ * h * d), kPoisonNaN);
    std::vector<float> lse(size_t(h * TQ), 5.f);
    AttnArgs a;
    a.causal = causal;
    flash_attn_mxfp8_varlen(TensorView(q.data(), DType::kE4M3, {TQ, h, d}), TensorView(k.data(), DType::kE4M3, {TK, hk, d}),
                            TensorView(v.data(), DType::kE4M3, {TK, hk, d}),
                            TensorView(qs.data(), DType::kUE8M0, {h, TQ, 2}),
                            TensorView(ks.data(), DType::kUE8M0, {hk, TK, 2}),
                            TensorView(vs.data(), DType::kUE8M0, {hk, TK, 2}),
                            TensorView(cq.data(), DType::kInt32, {int64_t(cq.size())}),
                            TensorView(ck.data(), DType::kInt32, {int64_t(ck.size())}), 7, 6,
                            TensorView(o.data(), DType::kBFloat16, {TQ, h, d}),
                            TensorView(lse.data(), DType::kFloat32, {h, TQ}), a);
    for (size_t b = 0; b < lq.size(); ++b) {
      if (lq[b] == 0) continue;
      Data x = seqs[b];
      Out want;
      if (lk[b] == 0) {  // no key at all: every row out 0, lse -inf
        want.o.assign(size_t(lq[b] * h * d), 0);
        want.lse.assign(size_t(h * lq[b]), -std::numeric_limits<float>::infinity());
      } else {
        want = run_fixed(x);
        expect_close(x, want, attntest::naive(x, 0.125), "varlen sequence " + std::to_string(b));
      }
      for (int64_t i = 0; i < lq[b]; ++i) {
        EXPECT_EQ(0, std::memcmp(&o[size_t((cq[b] + i) * h * d)], &want.o[size_t(i * h * d)], size_t(h * d) * 2))
            << "causal " << causal << " sequence " << b << " row " << i;
        for (int64_t hh = 0; hh < h; ++hh)
          EXPECT_EQ(lse[size_t(hh * TQ + cq[b] + i)], want.lse[size_t(hh * lq[b] + i)])
              << "causal " << causal << " sequence " << b << " row " << i << " head " << hh;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// NaN rules (docs/attention.md): written into outputs poisoned with 1.0

TEST(AttentionRef, NaNInQueryOrKeySpoilsTheRowsThatSeeIt) {
  const Shape s{1, 6, 6, 2, 1, 64, true};
  Data x = attntest::make_data(s, 31, 0);
  x.qs[x.iqs(0, 1, 2, 40)] = 255;  // q row 2 of head 1: NaN scale in block 1
  x.k[x.ik(0, 3, 0, 5)] = 0x7F;    // key 3: a NaN code (seen by rows 3.. under causal masking)
  const Out r = run_fixed(x, {}, kPoisonOne);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      const bool nan_row = i >= 3 || (h == 1 && i == 2);
      EXPECT_EQ(std::isnan(r.lse[size_t(h * 6 + i)]), nan_row) << "h " << h << " row " << i;
      for (int64_t c = 0; c < 64; ++c)
        EXPECT_EQ(std::isnan(decode_bf16(r.o[x.iq(0, i, h, c)])), nan_row) << "h " << h << " row " << i << " c " << c;
    }
  expect_close(x, r, attntest::naive(x, 0.125), "NaN q / k");
}

TEST(AttentionRef, NaNInValueSpoilsItsChannelOnly) {
  const Shape s{1, 5, 5, 1, 1, 128, true};
  Data x = attntest::make_data(s, 32, 0);
  x.v[x.ik(0, 2, 0, 7)] = 0xFF;        // v[2, 7]: NaN code
  x.vs[x.iks(0, 0, 4, 64)] = 255;      // v[4, 64..95]: NaN scale
  const Out r = run_fixed(x, {}, kPoisonOne);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::isfinite(r.lse[size_t(i)])) << "row " << i;
    for (int64_t c = 0; c < 128; ++c) {
      const bool nan = (i >= 2 && c == 7) || (i >= 4 && c >= 64 && c < 96);
      EXPECT_EQ(std::isnan(decode_bf16(r.o[x.iq(0, i, 0, c)])), nan) << "row " << i << " c " << c;
    }
  }
  expect_close(x, r, attntest::naive(x, 1.0 / std::sqrt(128.0)), "NaN v");
}

TEST(AttentionRef, NaNQueryOfAFullyMaskedRowStaysMasked) {
  Data x = attntest::make_data({1, 4, 2, 1, 1, 64, true}, 33, 0);
  x.q[x.iq(0, 0, 0, 0)] = 0x7F;  // row 0 sees no key (s_q - s_k = 2)
  const Out r = run_fixed(x);
  EXPECT_EQ(r.lse[0], -std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(r.o[x.iq(0, 0, 0, c)], 0);
}

TEST(AttentionRef, Bf16FromDoubleRoundsOnce) {
  // 1 + 2^-8 + 2^-30: above the bf16 tie 1 + 2^-8, which a cast through fp32 would hit (and
  // round to even, 1.0); rounded once it goes up to 1 + 2^-7
  EXPECT_EQ(ref::bf16_from_double(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)), 0x3F81);
  EXPECT_EQ(ref::bf16_from_double(1.0 + std::ldexp(1.0, -8)), 0x3F80);                            // tie: even
  EXPECT_EQ(ref::bf16_from_double(1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);                        // tie: even (up)
  EXPECT_EQ(ref::bf16_from_double(-(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))), 0xBF81);
  EXPECT_EQ(ref::bf16_from_double(1e300), 0x7F80);
  EXPECT_EQ(ref::bf16_from_double(-1e39), 0xFF80);
  EXPECT_EQ(ref::bf16_from_double(3.3e38), encode_bf16(3.3e38f));
  EXPECT_EQ(ref::bf16_from_double(1e-300), 0x0000);
  EXPECT_EQ(ref::bf16_from_double(-1e-300), 0x8000);
  EXPECT_EQ(ref::bf16_from_double(0.0), 0x0000);
  EXPECT_TRUE(std::isnan(decode_bf16(ref::bf16_from_double(std::nan("")))));
  for (double v : {0.1, -2.75, 1e-38, 6.1e-5, 448.0 * 448.0})
    EXPECT_EQ(ref::bf16_from_double(v), encode_bf16(float(v))) << v;  // no tie: same as through fp32
}

}  // namespace
