// The CPU reference of lowbit::attn_forward_decode_nf4 against a naive fp64 attention
// (decode_attention_util.hpp): unpruned (delta = +inf) with and without the residual, GQA, ragged
// seq_lens, T = 1, T not a multiple of block_size; and the pruning rule on crafted caches whose
// skipped blocks are known (the naive attention then runs over the kept tokens only).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "decode_attention_util.hpp"
#include "lowbit/decode_attention.hpp"

using namespace lowbit;
using namespace dectest;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Result {
  std::vector<uint16_t> out;
  std::vector<float> skip;
};

Result run(Data& x, DecodeNf4Args a, const std::vector<int32_t>* lens = nullptr, const std::vector<float>* thr = nullptr,
        bool pass_residual = true) {
  Result r;
  r.out.assign(size_t(x.s.b * x.s.h * x.s.dv), 0xFFFF);  // poisoned (NaN)
  r.skip.assign(size_t(x.s.b * x.s.hk), -1.0f);
  TensorView sl = lens ? TensorView(const_cast<int32_t*>(lens->data()), DType::kInt32, {x.s.b}) : TensorView();
  TensorView th = thr ? TensorView(const_cast<float*>(thr->data()), DType::kFloat32, {x.s.b, x.s.h}) : TensorView();
  attn_forward_decode_nf4(x.qv(), x.codes_v(), x.scale_v(), pass_residual ? x.res_v() : TensorView(), x.vv(), TensorView(), sl, TensorView(), th,
                          TensorView(r.out.data(), DType::kBFloat16, {x.s.b, x.s.h, x.s.dv}),
                          TensorView(r.skip.data(), DType::kFloat32, {x.s.b, x.s.hk}), a);
  return r;
}

void expect_matches(const Data& x, const Result& r, const std::vector<int32_t>* lens, double scale, bool residual) {
  for (int64_t b = 0; b < x.s.b; ++b)
    for (int64_t h = 0; h < x.s.h; ++h) {
      const int64_t L = lens ? (*lens)[size_t(b)] : x.s.t;
      const auto want = naive(x, b, h, L, scale, residual, [](int64_t) { return true; });
      for (int64_t c = 0; c < x.s.dv; ++c)
        ASSERT_TRUE(bf16_close(r.out[size_t((b * x.s.h + h) * x.s.dv + c)], want[size_t(c)]))
            << "b " << b << " h " << h << " c " << c << " want " << want[size_t(c)];
    }
}

struct Case {
  Shape s;
  int64_t bs, sbs;
};

TEST(DecodeAttentionRef, UnprunedMatchesNaiveAttention) {
  const Case cases[] = {
      {{1, 1, 4, 1, 64, 64}, 64, 16},      // T = 1
      {{2, 100, 8, 2, 128, 64}, 64, 16},   // T not a multiple of block_size, GQA 4
      {{1, 37, 2, 2, 64, 128}, 16, 4},     // MHA, Dv != D
      {{1, 20, 4, 1, 256, 256}, 8, 8},     // MQA, d 256
  };
  for (const Case& cs : cases)
    for (bool residual : {true, false}) {
      Data x = make_data(cs.s, 11 + uint64_t(cs.s.t));
      DecodeNf4Args a;
      a.block_size = cs.bs;
      a.sub_block_size = cs.sbs;
      a.delta = kInf;
      a.use_fp8_residual = residual;
      const Result r = run(x, a, nullptr, nullptr, residual);
      expect_matches(x, r, nullptr, 1.0 / std::sqrt(double(cs.s.d)), residual);
      for (float sr : r.skip) EXPECT_EQ(sr, 0.0f);
    }
}

TEST(DecodeAttentionRef, ResidualIgnoredWhenOff) {
  // use_fp8_residual = false with the residual passed: the same result as without it
  Data x = make_data({1, 30, 2, 1, 64, 64}, 5);
  DecodeNf4Args a;
  a.delta = kInf;
  a.use_fp8_residual = false;
  const Result with = run(x, a), without = run(x, a, nullptr, nullptr, false);
  EXPECT_EQ(with.out, without.out);
}

TEST(DecodeAttentionRef, RaggedSeqLensIgnoreTheTail) {
  Data x = make_data({3, 64, 4, 2, 64, 64}, 7);
  const std::vector<int32_t> lens = {1, 37, 64};
  // poison everything beyond each sequence's length: never read
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = lens[size_t(b)]; t < 64; ++t)
      for (int64_t g = 0; g < 2; ++g)
        for (int64_t c = 0; c < 64; ++c) {
          x.k_res[x.ik(b, t, g, c)] = 0x7F;                 // E5M2 NaN
          x.v[x.iv(b, t, g, c)] = 0x7FC0;                   // bf16 NaN
        }
  DecodeNf4Args a;
  a.block_size = 16;
  a.sub_block_size = 4;
  a.delta = kInf;
  const Result r = run(x, a, &lens);
  expect_matches(x, r, &lens, 0.125, true);
  a.softmax_scale = 0.3f;
  expect_matches(x, run(x, a, &lens), &lens, double(0.3f), true);
}

/// A cache where only channel 0 (head 0's query) and channel 1 (head 1's) matter: 5 blocks of
/// 16 tokens; scores are the channel values times 1 (q = 1 on its channel, softmax_scale 1).
Data crafted(int64_t heads) {
  Data x = make_data({1, 80, heads, 1, 64, 64}, 3);
  for (auto& e : x.q) e = 0;
  x.q[x.iq(0, 0, 0)] = bf16(1.0f);
  if (heads == 2) x.q[x.iq(0, 1, 1)] = bf16(1.0f);
  for (int64_t t = 0; t < 80; ++t) {
    x.k[x.ik(0, t, 0, 0)] = 0.5f;
    x.k[x.ik(0, t, 0, 1)] = 0.5f;
  }
  x.k[x.ik(0, 3, 0, 0)] = 10.0f;   // block 0
  x.k[x.ik(0, 79, 0, 0)] = 10.0f;  // block 4 (last)
  x.k[x.ik(0, 40, 0, 0)] = 8.0f;   // block 2: above 10 - 4
  x.k[x.ik(0, 2, 0, 1)] = 10.0f;   // head 1: blocks 0 and 4 high, block 1 above its threshold
  x.k[x.ik(0, 70, 0, 1)] = 10.0f;
  x.k[x.ik(0, 20, 0, 1)] = 9.0f;
  x.encode();
  return x;
}

void expect_kept(const Data& x, const Result& r, int64_t h, const std::vector<int>& kept_blocks) {
  auto keep = [&](int64_t t) {
    for (int j : kept_blocks)
      if (t / 16 == j) return true;
    return false;
  };
  const auto want = naive(x, 0, h, 80, 1.0, true, keep);
  for (int64_t c = 0; c < 64; ++c)
    ASSERT_TRUE(bf16_close(r.out[size_t(h * 64 + c)], want[size_t(c)])) << "h " << h << " c " << c;
}

TEST(DecodeAttentionRef, PruningSkipsTheKnownBlocks) {
  Data x = crafted(1);
  DecodeNf4Args a;
  a.block_size = 16;
  a.sub_block_size = 4;
  a.softmax_scale = 1.0f;
  a.delta = 4.0f;  // threshold 10 - 4 = 6: blocks 1 and 3 (max 0.5) skipped, block 2 (8) kept
  Result r = run(x, a);
  EXPECT_FLOAT_EQ(r.skip[0], 2.0f / 5.0f);
  expect_kept(x, r, 0, {0, 2, 4});
  a.delta = 1.0f;  // threshold 9: block 2 skipped too; the first and last blocks always stay
  r = run(x, a);
  EXPECT_FLOAT_EQ(r.skip[0], 3.0f / 5.0f);
  expect_kept(x, r, 0, {0, 4});
  // a skipped block is not read: NaN values there change nothing
  x.v[x.iv(0, 50, 0, 7)] = 0x7FC0;
  const Result r2 = run(x, a);
  EXPECT_EQ(r2.out, r.out);
  // ... but a NaN in a kept block reaches the output channel
  x.v[x.iv(0, 5, 0, 7)] = 0x7FC0;
  const Result r3 = run(x, a);
  EXPECT_TRUE(std::isnan(decode_bf16(r3.out[7])));
  EXPECT_FALSE(std::isnan(decode_bf16(r3.out[8])));
}

TEST(DecodeAttentionRef, GqaSkipsOnlyWhenEveryHeadIsBelow) {
  Data x = crafted(2);
  DecodeNf4Args a;
  a.block_size = 16;
  a.sub_block_size = 16;
  a.softmax_scale = 1.0f;
  a.delta = 4.0f;  // head 0 keeps block 2, head 1 keeps block 1 (9 > 6); block 3 is below for both
  const Result r = run(x, a);
  EXPECT_FLOAT_EQ(r.skip[0], 1.0f / 5.0f);
  expect_kept(x, r, 0, {0, 1, 2, 4});
  expect_kept(x, r, 1, {0, 1, 2, 4});
}

TEST(DecodeAttentionRef, PrecomputedThresholdAndEdgeBlocks) {
  Data x = crafted(1);
  DecodeNf4Args a;
  a.block_size = 16;
  a.sub_block_size = 8;
  a.softmax_scale = 1.0f;
  a.delta = 0.0f;  // ignored with a precomputed threshold
  std::vector<float> thr = {100.0f};  // above everything: only the first and last blocks stay
  Result r = run(x, a, nullptr, &thr);
  EXPECT_FLOAT_EQ(r.skip[0], 3.0f / 5.0f);
  expect_kept(x, r, 0, {0, 4});
  thr[0] = -kInf;  // nothing below: plain attention
  r = run(x, a, nullptr, &thr);
  EXPECT_EQ(r.skip[0], 0.0f);
  thr[0] = std::numeric_limits<float>::quiet_NaN();  // NaN compares below nothing
  EXPECT_EQ(run(x, a, nullptr, &thr).skip[0], 0.0f);
  // the last block is that of each sequence's own length
  const std::vector<int32_t> lens = {45};  // blocks 0, 1, 2 (tokens 32..44); block 2 holds the 8
  thr[0] = 7.0f;
  r = run(x, a, &lens, &thr);
  EXPECT_FLOAT_EQ(r.skip[0], 1.0f / 3.0f);
  const auto want = naive(x, 0, 0, 45, 1.0, true, [](int64_t t) { return t < 16 || t >= 32; });
  for (int64_t c = 0; c < 64; ++c) ASSERT_TRUE(bf16_close(r.out[size_t(c)], want[size_t(c)]));
}

TEST(DecodeAttentionRef, NaNQueryOrKey) {
  Data x = make_data({1, 40, 2, 1, 64, 64}, 9);
  DecodeNf4Args a;
  a.block_size = 16;
  a.sub_block_size = 4;
  a.delta = 0.0f;  // aggressive pruning: a NaN block max still keeps its block
  x.q[x.iq(0, 1, 5)] = 0x7FC0;
  Result r = run(x, a);
  for (int64_t c = 0; c < 64; ++c) {
    EXPECT_FALSE(std::isnan(decode_bf16(r.out[size_t(c)])));
    EXPECT_TRUE(std::isnan(decode_bf16(r.out[size_t(64 + c)])));
  }
  x = make_data({1, 40, 2, 1, 64, 64}, 9);
  x.k_res[x.ik(0, 20, 0, 3)] = 0x7F;  // a NaN key element in the middle block: every head sees it
  r = run(x, a);
  EXPECT_EQ(r.skip[0], 0.0f);
  for (uint16_t o : r.out) EXPECT_TRUE(std::isnan(decode_bf16(o)));
}

}  // namespace
