// The fused kernels of src/cuda/attention/sm90_nf4_decode_fused.cu (threshold, split, merge) run on
// the CPU through the host emulation of tests/cpp/emu/ (the build rewrites their launches,
// namespace and dynamic shared memory: tests/cpp/CMakeLists.txt) and are compared with the CPU
// reference. This checks the kernels' indexing, tiling, pipelining of the K / V tiles, pruning
// decisions and split merge on machines without a GPU (CTAs one after the other, the warp
// operations emulated, cp.async landing at issue and, in a second run, at the
// wait that covers it: tests/cpp/emu/cuda/common/cp_async.cuh); tests/python/test_decode_attention_gpu.py
// remains the test of the kernels on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <string>
#include <limits>
#include <random>
#include <sstream>
#include <algorithm>
#include <vector>

#include "core/plan_decode.hpp"
#include "lowbit/codecs.hpp"
#include "ref/ref_decode_attention.hpp"
#include "cuda/common/cp_async.cuh"

namespace lowbit::cuda_emu {
int attn_decode_nf4(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                    int64_t workspace_bytes, void* stream);
}  // namespace lowbit::cuda_emu

using namespace lowbit;

namespace {

struct DecodeCase {
  int64_t b, t, hq, hkv, d, block;
  float delta;
  bool residual, e4m3, high_first, ragged;
  int v8 = 0;  ///< V: 0 bf16, 1 E4M3 codes, 2 E5M2 codes (with per-channel scales)
};

std::ostream& operator<<(std::ostream& os, const DecodeCase& c) {
  return os << "b" << c.b << "_t" << c.t << "_h" << c.hq << "-" << c.hkv << "_d" << c.d << "_bs" << c.block << "_delta"
            << c.delta << (c.residual ? (c.e4m3 ? "_e4m3" : "_e5m2") : "_nores") << (c.high_first ? "_hi" : "_lo")
            << (c.ragged ? "_ragged" : "") << (c.v8 == 1 ? "_ve4m3" : c.v8 == 2 ? "_ve5m2" : "");
}

class EmuDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(EmuDecode, MatchesCpuReference) {
  const DecodeCase s = GetParam();
  const int64_t B = s.b, T = s.t, H = s.hq, HK = s.hkv, D = s.d;
  std::mt19937 rng(uint32_t(B * 131 + T * 7 + H + D + s.block));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint16_t> q(size_t(B * H * D)), v(size_t(B * T * HK * D));
  std::vector<uint8_t> codes(size_t(B * T * HK * D / 2)), res(size_t(B * T * HK * D));
  std::vector<float> scale(size_t(B * HK * D)), vscale(size_t(B * HK * D));
  std::vector<uint8_t> v8(size_t(B * T * HK * D));
  for (auto& x : q) x = encode_bf16(n(rng));
  for (auto& x : v) x = encode_bf16(n(rng));
  for (size_t i = 0; i < v8.size(); ++i)  // FP8 V: the codes of N(0, 1) values, channel scales 2^[-3, 3] or not powers of two
    v8[i] = s.v8 == 2 ? encode_e5m2(n(rng)) : encode_e4m3(n(rng));
  for (size_t i = 0; i < vscale.size(); ++i) vscale[i] = i % 3 == 0 ? 0.37f + 0.01f * float(i % 7) : std::ldexp(1.0f, int(i % 7) - 3);
  for (auto& x : codes) x = uint8_t(byte(rng));
  for (auto& x : scale) x = 0.05f + std::fabs(n(rng)) * 0.2f;
  for (auto& x : res) {  // finite residuals of about a tenth of the scale
    const float r = 0.02f * n(rng);
    x = s.e4m3 ? encode_e4m3(r, Saturate::kFinite) : encode_e5m2(r, Saturate::kFinite);
  }
  // attention sinks and recency: the first and last 8 tokens of every sequence score high
  std::vector<int32_t> lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) lens[size_t(b)] = int32_t(s.ragged ? std::max<int64_t>(1, T - (97 * b) % T) : T);
  // and a warm token (half the channels at nf4 1.0) opening every third block: with delta 1.2
  // the warm blocks are kept and the others skipped
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const bool hot = t < 8 || (t >= lens[size_t(b)] - 8 && t < lens[size_t(b)]);
      const bool warm = t % s.block == 0 && (t / s.block) % 3 == 1;
      if (!hot && !warm) continue;
      for (int64_t g = 0; g < HK; ++g)
        for (int64_t c = 0; c < (hot ? D / 2 : D / 4); ++c) codes[size_t(((b * T + t) * HK + g) * (D / 2) + c)] = 0xFF;
    }
  for (int64_t b = 0; b < B; ++b)  // q positive in every channel: the 0xFF codes (nf4 1.0) score high
    for (int64_t i = 0; i < H * D; ++i) q[size_t(b * H * D + i)] = encode_bf16(std::fabs(decode_bf16(q[size_t(b * H * D + i)])));

  detail::DecodeNf4Plan p;
  p.batch = B;
  p.seqlen = T;
  p.heads = H;
  p.heads_kv = HK;
  p.head_dim = D;
  p.head_dim_v = D;
  p.block_size = s.block;
  p.sub_block_size = 1;
  p.delta = s.delta;
  p.softmax_scale = 1.0f / std::sqrt(float(D));
  p.use_residual = s.residual;
  p.scale_dtype = DType::kFloat32;
  p.residual_dtype = s.e4m3 ? DType::kE4M3 : DType::kE5M2;
  p.nibbles = s.high_first ? NibbleOrder::kHighFirst : NibbleOrder::kLowFirst;
  p.v_dtype = s.v8 == 0 ? DType::kBFloat16 : (s.v8 == 1 ? DType::kE4M3 : DType::kE5M2);
  p.has_seq_lens = true;
  p.has_skip_ratio = true;
  const int64_t q_st[3] = {H * D, H * D, D}, kc_st[3] = {T * HK * D / 2, HK * D / 2, D / 2}, ks_st[2] = {HK * D, D},
                kr_st[3] = {T * HK * D, HK * D, D}, o_st[2] = {H * D, D}, sr_st[2] = {HK, 1};
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q_st[i];
    p.kc_stride[i] = kc_st[i];
    p.kr_stride[i] = kr_st[i];
    p.v_stride[i] = kr_st[i];
  }
  for (int i = 0; i < 2; ++i) {
    p.ks_stride[i] = ks_st[i];
    p.o_stride[i] = o_st[i];
    p.sr_stride[i] = sr_st[i];
    p.vs_stride[i] = ks_st[i];
  }
  std::vector<uint16_t> out_ref(size_t(B * H * D), 0xFFFF), out_emu(size_t(B * H * D), 0xFFFF);
  std::vector<float> sr_ref(size_t(B * HK), -1.f), sr_emu(size_t(B * HK), -1.f);
  detail::DecodeNf4Ptrs x;
  x.q = q.data();
  x.k_nf4 = codes.data();
  x.k_scale = scale.data();
  x.k_residual = s.residual ? res.data() : nullptr;
  x.v = s.v8 ? static_cast<const void*>(v8.data()) : static_cast<const void*>(v.data());
  x.v_scale = s.v8 ? vscale.data() : nullptr;
  x.seq_lens = lens.data();
  x.out = out_ref.data();
  x.skip_ratio = sr_ref.data();
  ref::attn_decode_nf4(p, x);
  double skipped = 0;
  for (const char* stages : {"1", "2"})  // the K buffers of the split kernel (decode_heuristics.hpp)
  for (const emu::CpAsyncMode mode : {emu::CpAsyncMode::kImmediate, emu::CpAsyncMode::kDeferred}) {
    SCOPED_TRACE(std::string(mode == emu::CpAsyncMode::kImmediate ? "cp.async landing at issue" : "cp.async landing at wait") +
                 ", K buffers " + stages);
    setenv("LOWBIT_DECODE_K_STAGES", stages, 1);
    emu::cp_async_mode = mode;
    std::fill(out_emu.begin(), out_emu.end(), uint16_t(0xFFFF));
    std::fill(sr_emu.begin(), sr_emu.end(), -1.f);
    x.out = out_emu.data();
    x.skip_ratio = sr_emu.data();
    ASSERT_EQ(cuda_emu::attn_decode_nf4(p, x, nullptr, 0, nullptr), 0) << "the call must take the fused path";
    emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
    unsetenv("LOWBIT_DECODE_K_STAGES");
    double worst = 0;
    for (size_t i = 0; i < out_ref.size(); ++i) {
      const double a = decode_bf16(out_emu[i]), r = decode_bf16(out_ref[i]);
      ASSERT_TRUE(std::isfinite(a)) << i;
      worst = std::max(worst, std::fabs(a - r));
    }
    EXPECT_LE(worst, 1.0 / 64) << "max |out - ref|";
    skipped = 0;
    for (size_t i = 0; i < sr_ref.size(); ++i) {
      const int64_t nb = (lens[i / size_t(HK)] + s.block - 1) / s.block;
      EXPECT_LE(std::fabs(sr_emu[i] - sr_ref[i]) * double(nb), 2.0) << "skip ratio of (b, g) " << i;
      skipped += sr_ref[i];
    }
  }
  if (std::isfinite(s.delta) && T >= 8 * s.block) EXPECT_GT(skipped, 0.0) << "the case should prune";
}

// A paged cache (block table of distinct pages in random order, page sizes below and above the
// 128-token tile): the CPU reference over the pages equals the dense reference bit for bit, and
// the emulated fused kernels over the pages match it as the dense cases do (one K buffer with
// copies landing at issue, two with copies landing at the wait).
TEST(EmuDecodePaged, MatchesDenseReferenceAndKernels) {
  for (const int64_t page : {int64_t(16), int64_t(256)})
    for (const bool v8 : {false, true}) {
      SCOPED_TRACE("page " + std::to_string(page) + (v8 ? ", FP8 V" : ", bf16 V"));
      const int64_t B = 2, T = 600, H = 8, HK = 2, D = 128, per = (T + page - 1) / page, pages = B * per + 2;
      std::mt19937 rng(uint32_t(page + v8));
      std::normal_distribution<float> n(0.0f, 1.0f);
      std::uniform_int_distribution<int> byte(0, 255);
      std::vector<uint16_t> q(size_t(B * H * D)), v(size_t(B * T * HK * D));
      std::vector<uint8_t> codes(size_t(B * T * HK * D / 2)), res(size_t(B * T * HK * D)), v8c(size_t(B * T * HK * D));
      std::vector<float> scale(size_t(B * HK * D)), vscale(size_t(B * HK * D));
      for (auto& x : q) x = encode_bf16(n(rng));
      for (auto& x : v) x = encode_bf16(n(rng));
      for (auto& x : v8c) x = encode_e4m3(n(rng));
      for (auto& x : codes) x = uint8_t(byte(rng));
      for (auto& x : res) x = encode_e5m2(0.02f * n(rng));
      for (auto& x : scale) x = 0.05f + std::fabs(n(rng)) * 0.2f;
      for (auto& x : vscale) x = 0.5f + std::fabs(n(rng));
      std::vector<int32_t> lens = {int32_t(T), int32_t(T - 211)}, table(size_t(B * per));
      std::vector<int32_t> perm(static_cast<size_t>(pages));
      for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = int32_t(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (size_t i = 0; i < table.size(); ++i) table[i] = perm[i];
      // the pages: token t of sequence b at row t % page of page table[b, t / page]
      const int64_t vb = v8 ? 1 : 2;
      std::vector<uint8_t> pc(size_t(pages * page * HK * D / 2), 0xEE), pr(size_t(pages * page * HK * D), 0xEE),
          pv(size_t(pages * page * HK * D * vb), 0xEE);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = int64_t(table[size_t(b * per + t / page)]) * page + t % page, tok = b * T + t;
          std::memcpy(&pc[size_t(row * HK * D / 2)], &codes[size_t(tok * HK * D / 2)], size_t(HK * D / 2));
          std::memcpy(&pr[size_t(row * HK * D)], &res[size_t(tok * HK * D)], size_t(HK * D));
          if (v8)
            std::memcpy(&pv[size_t(row * HK * D)], &v8c[size_t(tok * HK * D)], size_t(HK * D));
          else
            std::memcpy(&pv[size_t(row * HK * D * 2)], &v[size_t(tok * HK * D)], size_t(HK * D * 2));
        }
      detail::DecodeNf4Plan p;
      p.batch = B; p.seqlen = T; p.heads = H; p.heads_kv = HK; p.head_dim = D; p.head_dim_v = D;
      p.block_size = 32; p.sub_block_size = 16; p.delta = 1.0f;
      p.softmax_scale = 1.0f / std::sqrt(float(D));
      p.use_residual = true;
      p.residual_dtype = DType::kE5M2;
      p.v_dtype = v8 ? DType::kE4M3 : DType::kBFloat16;
      p.has_seq_lens = true;
      p.has_skip_ratio = true;
      const int64_t q_st[3] = {H * D, H * D, D}, ks_st[2] = {HK * D, D}, o_st[2] = {H * D, D}, sr_st[2] = {HK, 1};
      for (int i = 0; i < 2; ++i) {
        p.ks_stride[i] = ks_st[i];
        p.vs_stride[i] = ks_st[i];
        p.o_stride[i] = o_st[i];
        p.sr_stride[i] = sr_st[i];
      }
      for (int i = 0; i < 3; ++i) p.q_stride[i] = q_st[i];
      auto set_dense = [&] {
        const int64_t c3[3] = {T * HK * D / 2, HK * D / 2, D / 2}, r3[3] = {T * HK * D, HK * D, D};
        for (int i = 0; i < 3; ++i) { p.kc_stride[i] = c3[i]; p.kr_stride[i] = r3[i]; p.v_stride[i] = r3[i]; }
        p.pages = {};
      };
      auto set_paged = [&] {
        const int64_t c3[3] = {page * HK * D / 2, HK * D / 2, D / 2}, r3[3] = {page * HK * D, HK * D, D};
        for (int i = 0; i < 3; ++i) { p.kc_stride[i] = c3[i]; p.kr_stride[i] = r3[i]; p.v_stride[i] = r3[i]; }
        p.seqlen = per * page;
        p.pages.table = table.data();
        p.pages.table_stride = per;
        p.pages.pages = pages;
        p.pages.shift = 0;
        while ((int64_t(1) << p.pages.shift) < page) ++p.pages.shift;
      };
      std::vector<uint16_t> o_dense(size_t(B * H * D), 0xFFFF), o_paged = o_dense, o_emu = o_dense;
      std::vector<float> sr_dense(size_t(B * HK), -1.f), sr_paged = sr_dense, sr_emu = sr_dense;
      detail::DecodeNf4Ptrs x;
      x.q = q.data();
      x.k_scale = scale.data();
      x.seq_lens = lens.data();
      x.v_scale = v8 ? vscale.data() : nullptr;
      set_dense();
      x.k_nf4 = codes.data();
      x.k_residual = res.data();
      x.v = v8 ? static_cast<const void*>(v8c.data()) : static_cast<const void*>(v.data());
      x.out = o_dense.data();
      x.skip_ratio = sr_dense.data();
      ref::attn_decode_nf4(p, x);
      set_paged();
      x.k_nf4 = pc.data();
      x.k_residual = pr.data();
      x.v = pv.data();
      x.out = o_paged.data();
      x.skip_ratio = sr_paged.data();
      ref::attn_decode_nf4(p, x);
      ASSERT_EQ(o_paged, o_dense) << "the reference over the pages";
      ASSERT_EQ(sr_paged, sr_dense);
      // one K buffer with copies landing at issue, two with copies landing at the wait
      for (const auto& [stages, mode] :
           {std::pair{"1", emu::CpAsyncMode::kImmediate}, std::pair{"2", emu::CpAsyncMode::kDeferred}}) {
        SCOPED_TRACE(std::string("K buffers ") + stages);
        setenv("LOWBIT_DECODE_K_STAGES", stages, 1);
        emu::cp_async_mode = mode;
        std::fill(o_emu.begin(), o_emu.end(), uint16_t(0xFFFF));
        x.out = o_emu.data();
        x.skip_ratio = sr_emu.data();
        ASSERT_EQ(cuda_emu::attn_decode_nf4(p, x, nullptr, 0, nullptr), 0);
        emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
        unsetenv("LOWBIT_DECODE_K_STAGES");
        double worst = 0;
        for (size_t i = 0; i < o_emu.size(); ++i)
          worst = std::max(worst, std::fabs(double(decode_bf16(o_emu[i])) - double(decode_bf16(o_dense[i]))));
        EXPECT_LE(worst, 1.0 / 64) << "max |out - ref|";
        for (size_t i = 0; i < sr_emu.size(); ++i)  // at most two blocks apart (scores near the threshold)
          EXPECT_LE(std::fabs(sr_emu[i] - sr_dense[i]) * double((lens[i / size_t(HK)] + 31) / 32), 2.0);
      }
    }
}

// fused-path calls: D == Dv, contiguous rows, pruning blocks dividing the tile
INSTANTIATE_TEST_SUITE_P(
    Cases, EmuDecode,
    ::testing::Values(DecodeCase{2, 700, 8, 2, 128, 64, INFINITY, true, false, false, true},
                      DecodeCase{2, 700, 8, 2, 128, 16, 1.2f, true, false, false, true},
                      DecodeCase{1, 900, 8, 1, 128, 32, 1.2f, true, true, true, false},
                      DecodeCase{1, 500, 16, 1, 128, 64, 1.2f, true, false, false, false},
                      DecodeCase{3, 300, 2, 2, 64, 16, 1.2f, false, false, false, true},
                      DecodeCase{1, 400, 4, 1, 256, 16, 1.2f, true, true, false, false},
                      DecodeCase{2, 1, 4, 1, 128, 64, 1.2f, true, false, false, false},
                      DecodeCase{2, 130, 4, 2, 64, 1, 1.2f, true, false, true, true},
                      DecodeCase{2, 700, 8, 2, 128, 16, 1.2f, true, false, false, true, 1},
                      DecodeCase{1, 300, 4, 1, 64, 64, INFINITY, false, false, false, false, 2},
                      DecodeCase{1, 400, 8, 1, 256, 32, 1.2f, true, true, false, true, 1}),
    [](const ::testing::TestParamInfo<DecodeCase>& i) {
      std::ostringstream os;
      os << i.param;
      std::string n = os.str();
      for (auto& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

}  // namespace
