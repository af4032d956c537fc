// The FP8 tensor-core path of the grouped MXFP4 GEMM (GemmPrecision::kFp8TensorCores) on the CPU:
// the kernel's arithmetic (src/cuda/moe/fp8_fold.hpp) exhaustively against the exact decoders, the
// FP8-path packed layout (lowbit/mxfp4_pack.hpp) and its prepack, a model of the kernel's sums
// (decode, per-block partial sums, promotion) against the exact sum, and the API: refusals, the
// default precision, the CPU result (the exact reference) for every row layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/moe/fp8_fold.hpp"
#include "cuda/moe/heuristics.hpp"
#include "lowbit/codecs.hpp"
#include "lowbit/error.hpp"
#include "lowbit/moe.hpp"
#include "lowbit/mxfp4_pack.hpp"

using namespace lowbit;
namespace fp8 = lowbit::cuda::fp8;

namespace {

float bits_f(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// ---- the fold --------------------------------------------------------------------------------

TEST(Fp8Fold, TableIsExactOverTheWholeWindow) {
  for (int D = -2; D <= 12; ++D) {
    const uint64_t tab = uint64_t(fp8::fold_lo(D)) | (uint64_t(fp8::fold_hi(D)) << 32);
    for (int i = 0; i < 8; ++i) {
      const uint8_t byte = uint8_t(tab >> (8 * i));
      ASSERT_EQ(byte & 0x80, 0) << "D=" << D << " i=" << i;
      ASSERT_EQ(decode_e4m3(byte), std::ldexp(kE2M1[i], D - 6)) << "D=" << D << " i=" << i;
    }
  }
}

TEST(Fp8Fold, WindowEndsAreTight) {
  // one step beyond either end some E2M1 value is not an E4M3 value any more: 6 * 2^7 = 768 > 448,
  // 0.5 * 2^-9 = 2^-10 below the smallest subnormal 2^-9
  EXPECT_NE(decode_e4m3(encode_e4m3(std::ldexp(6.0f, 13 - 6))), std::ldexp(6.0f, 13 - 6));
  EXPECT_NE(decode_e4m3(encode_e4m3(std::ldexp(0.5f, -3 - 6))), std::ldexp(0.5f, -3 - 6));
  EXPECT_EQ(fp8::kFoldSpread, 14u);
}

TEST(Fp8Fold, DecodeOfEveryCodeInEveryPosition) {
  std::mt19937 rng(5);
  for (int D = -2; D <= 12; ++D) {
    const uint32_t lo = fp8::fold_lo(D), hi = fp8::fold_hi(D);
    for (int trial = 0; trial < 200; ++trial) {
      uint32_t nib = rng();
      if (trial < 16) nib = 0x11111111u * uint32_t(trial);  // every code in every position
      const uint32_t x = mxfp4_fp8_pack_word(nib);
      const uint32_t A = fp8::decode_a(x, lo, hi), B = fp8::decode_b(x, lo, hi);
      for (int e = 0; e < 8; ++e) {
        const uint32_t code = (nib >> (4 * e)) & 0xFu;
        const uint8_t byte = uint8_t((e < 4 ? A : B) >> (8 * (e & 3)));
        const float want = (code & 8u ? -1.0f : 1.0f) * std::ldexp(kE2M1[code & 7u], D - 6);
        ASSERT_EQ(decode_e4m3(byte), want) << "D=" << D << " nibbles=" << std::hex << nib << " e=" << e;
        ASSERT_EQ(byte >> 7, code >> 3) << "sign of element " << e;  // -0 stays a signed zero
      }
    }
  }
}

TEST(Fp8Fold, EveryByteRangeFoldsExactlyOrTakesTheSlowForm) {
  for (uint32_t smin = 0; smin < 256; ++smin)
    for (uint32_t smax = smin; smax < 256; ++smax) {
      const bool folds = fp8::block_folds(smin, smax);
      ASSERT_EQ(folds, smax - smin <= 14 && smax <= 252) << smin << " " << smax;
      if (!folds) {
        ASSERT_EQ(fp8::fold_d(smin, false, smax), 6);
        continue;
      }
      for (uint32_t s : {smin, (smin + smax) / 2, smax}) {
        const int D = fp8::fold_d(s, true, smax);
        ASSERT_GE(D, -2);
        ASSERT_LE(D, 12);
        // e2m1 * 2^(D - 6) * 2^(smax - 133) == e2m1 * 2^(s - 127)
        ASSERT_EQ(D - 6 + int(smax) - 133, int(s) - 127);
      }
    }
}

TEST(Fp8Fold, Multipliers) {
  for (int e = -160; e <= 140; ++e) {
    const float v = bits_f(fp8::pow2_bits(e));
    if (e < -149) ASSERT_EQ(v, 0.0f) << e;
    else if (e > 127) ASSERT_EQ(v, std::ldexp(1.0f, 127)) << e;
    else ASSERT_EQ(v, std::ldexp(1.0f, e)) << e;
  }
  for (uint32_t sa = 0; sa < 256; ++sa) {
    if (sa == 255) {
      EXPECT_TRUE(std::isnan(bits_f(fp8::col_mult_bits(sa, true, 130))));
      EXPECT_TRUE(std::isnan(bits_f(fp8::col_mult_bits(sa, false, 130))));
      continue;
    }
    EXPECT_EQ(bits_f(fp8::col_mult_bits(sa, false, 7)), decode_ue8m0(uint8_t(sa)));
    const int e = int(sa) + 120 - 260;
    if (e >= -149) {
      EXPECT_EQ(double(bits_f(fp8::col_mult_bits(sa, true, 120))), std::ldexp(1.0, e));
    }
  }
  for (uint32_t smax = 0; smax < 256; ++smax)
    for (uint32_t sa = 0; sa < 256; ++sa) {
      const uint32_t m = fp8::col_mult_bits(sa, true, smax);
      const bool normal = sa == 255 || ((m & 0x7F800000u) != 0 && (m & 0x7F800000u) != 0x7F800000u &&
                                        int(smax) + int(sa) - 260 <= 127);
      ASSERT_EQ(fp8::col_mult_normal(sa, smax), normal) << smax << " " << sa;
    }
  for (uint32_t s = 0; s < 256; ++s) {
    const float r = bits_f(fp8::row_mult_bits(s)), want = decode_ue8m0(uint8_t(s));
    if (s == 255) EXPECT_TRUE(std::isnan(r));
    else EXPECT_EQ(r, want) << s;
  }
}

// ---- the packed layout ------------------------------------------------------------------------

TEST(Fp8Layout, WordRoundTripAndFragmentPositions) {
  std::mt19937 rng(9);
  for (int i = 0; i < 2000; ++i) {
    const uint32_t nib = rng();
    const uint32_t x = mxfp4_fp8_pack_word(nib);
    for (int e = 0; e < 8; ++e) ASSERT_EQ(mxfp4_fp8_packed_code(x, e), (nib >> (4 * e)) & 0xFu);
  }
  // every K position of a tile maps to one (word, element), and word 4t + b element i / 4 + i is
  // K = 32b + 4t + i / 32b + 16 + 4t + i: what lane quad t's A fragment registers 0 and 2 hold
  std::vector<int> seen(16 * 8, 0);
  for (int kk = 0; kk < 128; ++kk) {
    const int w = mxfp4_fp8_word_of(kk), e = mxfp4_fp8_elem_of(kk);
    ++seen[size_t(w * 8 + e)];
    const int t = w >> 2, b = w & 3;
    ASSERT_EQ(kk, 32 * b + (e < 4 ? 0 : 16) + 4 * t + (e & 3)) << kk;
  }
  for (int v : seen) ASSERT_EQ(v, 1);
}

// MXFP4 weights of G x N x K with the given scale bytes (row-major [G, N, K/32]).
struct Weights {
  int64_t G, N, K;
  std::vector<uint8_t> b, s;
  Weights(int64_t G_, int64_t N_, int64_t K_, uint32_t seed) : G(G_), N(N_), K(K_) {
    std::mt19937 rng(seed);
    b.resize(size_t(G * N * K / 2));
    s.resize(size_t(G * N * K / 32));
    for (auto& v : b) v = uint8_t(rng());
    for (auto& v : s) v = uint8_t(118 + rng() % 12);
  }
  TensorView bv() { return TensorView(b.data(), DType::kUInt8, {G, N, K / 2}); }
  TensorView sv() { return TensorView(s.data(), DType::kUE8M0, {G, N, K / 32}); }
  uint32_t code(int64_t g, int64_t n, int64_t k) const { return (b[size_t((g * N + n) * (K / 2) + k / 2)] >> (4 * (k & 1))) & 0xFu; }
};
struct Fp8Packed {
  int64_t Np, Kq;
  std::vector<uint8_t> b, s;
  Fp8Packed(int64_t G, int64_t N, int64_t K) : Np(mxfp4_packed_rows(N)), Kq(mxfp4_fp8_packed_k(K)) {
    b.assign(size_t(G * Np * Kq / 2), 0xCC);
    s.assign(size_t(G * Np * Kq / 32), 0xCC);
  }
  TensorView bv(int64_t G) { return TensorView(b.data(), DType::kUInt8, {G, Np / 128, Kq / 128, 128, 64}); }
  TensorView sv(int64_t G) { return TensorView(s.data(), DType::kUInt8, {G, Np / 128, Kq / 128, 128, 4}); }
};

TEST(Fp8Layout, PrepackIsLosslessWithPadding) {
  for (auto [G, N, K] : {std::tuple<int64_t, int64_t, int64_t>{2, 136, 160}, {1, 128, 128}, {3, 8, 32}, {1, 264, 2880 / 10}}) {
    Weights w(G, N, K, uint32_t(G * 1000 + N + K));
    Fp8Packed p(G, N, K);
    group_gemm_mxfp4_prepack_fp8(w.bv(), w.sv(), ScaleLayout::row_major(), p.bv(G), p.sv(G));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < p.Np; ++n)
        for (int64_t k = 0; k < p.Kq; ++k) {
          const bool in = n < N && k < K;
          ASSERT_EQ(mxfp4_fp8_code(p.b.data(), g, n, k, p.Np, p.Kq), in ? w.code(g, n, k) : 0u)
              << "g=" << g << " n=" << n << " k=" << k;
          if (k % 32 == 0)
            ASSERT_EQ(p.s[size_t(mxfp4_fp8_scale_offset(g, n, k, p.Np, p.Kq))],
                      in ? w.s[size_t((g * N + n) * (K / 32) + k / 32)] : kMxfp4PackPadScale);
        }
  }
}

TEST(Fp8Layout, PrepackRefusesWrongOutputs) {
  Weights w(1, 128, 256, 3);
  Fp8Packed p(1, 128, 256);
  // the exact path's packed shape [G, Np, Kp/2] is not the FP8 layout
  EXPECT_THROW(group_gemm_mxfp4_prepack_fp8(w.bv(), w.sv(), ScaleLayout::row_major(),
                                            TensorView(p.b.data(), DType::kUInt8, {1, 128, 128}), p.sv(1)),
               ArgumentError);
  try {
    group_gemm_mxfp4_prepack_fp8(w.bv(), w.sv(), ScaleLayout::row_major(), p.bv(1),
                                 TensorView(p.s.data(), DType::kUInt8, {1, 1, 2, 128, 2}));
    FAIL() << "no error";
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.arg(), "packed_scale");
  }
}

// ---- a model of the kernel's arithmetic ----------------------------------------------------------

// One output element through the FP8 path's steps, block by block (in fp64, so that only the fold
// and the multipliers are checked: every product and every block's sum is exact there): the partial
// sum of E4M3 weight bytes (decoded from the packed word with the row's table) times the activation
// codes, times the block's multipliers, against the block's exact terms.
TEST(Fp8Model, FoldAndMultipliersGiveTheExactSum) {
  std::mt19937 rng(11);
  int slow_blocks = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int rows = 1 + int(rng() % 128);
    // the block's scale bytes of `rows` rows; some blocks spread beyond the window (slow form)
    std::vector<uint32_t> s(static_cast<size_t>(rows), 0u);
    const uint32_t base = rng() % 256, spread = trial % 4 == 0 ? 15 + rng() % 100 : rng() % 15;
    for (auto& v : s) v = std::min<uint32_t>(255, base + rng() % (spread + 1));
    const uint32_t smin = *std::min_element(s.begin(), s.end()), smax = *std::max_element(s.begin(), s.end());
    const uint32_t sa = trial % 50 == 0 ? 255 : trial % 7 == 0 ? rng() % 255 : 90 + rng() % 80;
    // the kernel's choice (fp8_convert): the fold, and a normal column multiplier
    const bool folds = fp8::block_folds(smin, smax) && fp8::col_mult_normal(sa, smax);
    slow_blocks += folds ? 0 : 1;
    const uint32_t sr = s[rng() % uint32_t(rows)];
    const int D = fp8::fold_d(sr, folds, smax);
    const uint32_t lo = fp8::fold_lo(D), hi = fp8::fold_hi(D);
    double partial = 0.0, want = 0.0;
    for (int t = 0; t < 4; ++t) {
      const uint32_t nib = rng();
      const uint32_t x = mxfp4_fp8_pack_word(nib);
      const uint32_t A = fp8::decode_a(x, lo, hi), B = fp8::decode_b(x, lo, hi);
      for (int e = 0; e < 8; ++e) {
        uint8_t act = uint8_t(rng());
        if ((act & 0x7F) == 0x7F) act ^= 1;  // finite E4M3
        const uint8_t wb = uint8_t((e < 4 ? A : B) >> (8 * (e & 3)));
        partial += double(decode_e4m3(wb)) * double(decode_e4m3(act));
        const uint32_t code = (nib >> (4 * e)) & 0xFu;
        want += double(decode_e2m1(uint8_t(code))) * double(decode_ue8m0(uint8_t(sr))) * double(decode_e4m3(act)) *
                double(decode_ue8m0(uint8_t(sa)));
      }
    }
    const double m = double(bits_f(fp8::col_mult_bits(sa, folds, smax)));
    const double got = folds ? partial * m : partial * double(bits_f(fp8::row_mult_bits(sr))) * m;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "trial " << trial;
      continue;
    }
    // every multiplier is an exact fp32 power of two (fp64 has room for the products)
    ASSERT_EQ(got, want) << "trial " << trial << " smin " << smin << " smax " << smax << " s " << sr << " sa " << sa;
  }
  EXPECT_GT(slow_blocks, 100);
}

// ---- heuristics ----------------------------------------------------------------------------------

TEST(Fp8Heuristics, TokenTilesBoundTheItems) {
  namespace moe = lowbit::cuda::moe;
  EXPECT_EQ(moe::fp8_token_tiles(16384, 32, 0), 16384 / 128 + 32);
  EXPECT_EQ(moe::fp8_token_tiles(5, 32, 0), 5);                // every tile holds a row
  EXPECT_EQ(moe::fp8_token_tiles(8 * 300, 8, 300), 8 * 3);     // masked: ceil(300 / 128) per group
  EXPECT_EQ(moe::fp8_grid(7200, 132), 132);
  EXPECT_EQ(moe::fp8_grid(20, 132), 20);
}

// ---- the API ----------------------------------------------------------------------------------

// A small grouped GEMM on the CPU: MXFP8 activations (random codes and scales) and MXFP4 weights.
struct Problem {
  int64_t G, N, K;
  std::vector<int64_t> sizes;
  int64_t M = 0;
  std::vector<uint8_t> a, as;
  std::vector<uint16_t> abf;
  std::vector<int64_t> ind;
  Weights w;
  Fp8Packed p;
  Problem(std::vector<int64_t> sz, int64_t N_, int64_t K_, uint32_t seed)
      : G(int64_t(sz.size())), N(N_), K(K_), sizes(sz), w(int64_t(sz.size()), N_, K_, seed), p(int64_t(sz.size()), N_, K_) {
    ind.assign(1, 0);
    for (int64_t v : sizes) ind.push_back(ind.back() + v);
    M = ind.back();
    std::mt19937 rng(seed + 1);
    a.resize(size_t(M * K));
    for (auto& v : a) v = uint8_t(rng() % 2 ? rng() & 0x7E : (rng() & 0x7E) | 0x80);  // finite E4M3
    as.resize(size_t(M * K / 32));
    for (auto& v : as) v = uint8_t(120 + rng() % 10);
    abf.assign(size_t(M * K), 0x3F80);
    group_gemm_mxfp4_prepack_fp8(w.bv(), w.sv(), ScaleLayout::row_major(), p.bv(G), p.sv(G));
  }
  GroupGemmArgs exact_args(std::vector<uint16_t>& out) {
    GroupGemmArgs x;
    x.a = TensorView(a.data(), DType::kE4M3, {M, K});
    x.a_scale = TensorView(as.data(), DType::kUE8M0, {M, K / 32});
    x.a_scale_layout = ScaleLayout::row_major();
    x.b = w.bv();
    x.b_scale = w.sv();
    x.b_scale_layout = ScaleLayout::row_major();
    x.m_indptr = TensorView(ind.data(), DType::kInt64, {G + 1});
    out.assign(size_t(M * N), 0x7FFF);
    x.out = TensorView(out.data(), DType::kBFloat16, {M, N});
    return x;
  }
  GroupGemmArgs fp8_args(std::vector<uint16_t>& out) {
    GroupGemmArgs x = exact_args(out);
    x.precision = GemmPrecision::kFp8TensorCores;
    x.b = p.bv(G);
    x.b_scale = p.sv(G);
    x.b_packed = true;
    return x;
  }
};

TEST(Fp8Api, DefaultIsExact) {
  EXPECT_EQ(GroupGemmArgs{}.precision, GemmPrecision::kExact);
}

TEST(Fp8Api, CpuComputesTheExactReference) {
  Problem pr({0, 3, 130, 0, 17}, 136, 160, 21);
  std::vector<uint16_t> want, got;
  group_gemm_mxfp4_nt_groupwise(pr.exact_args(want));
  group_gemm_mxfp4_nt_groupwise(pr.fp8_args(got));
  EXPECT_EQ(got, want);
  // E5M2 activations as well
  GroupGemmArgs xe = pr.exact_args(want), xf = pr.fp8_args(got);
  xe.a.dtype = xf.a.dtype = DType::kE5M2;
  group_gemm_mxfp4_nt_groupwise(xe);
  group_gemm_mxfp4_nt_groupwise(xf);
  EXPECT_EQ(got, want);
}

TEST(Fp8Api, CpuRowLayouts) {
  Problem pr({5, 0, 40}, 128, 128, 23);
  std::vector<uint16_t> want, got;
  group_gemm_mxfp4_nt_groupwise(pr.exact_args(want));
  // contiguous counts
  std::vector<int32_t> counts = {5, 0, 40};
  GroupGemmArgs x = pr.fp8_args(got);
  x.m_indptr = TensorView();
  x.m_counts = TensorView(counts.data(), DType::kInt32, {3});
  group_gemm_mxfp4_nt_groupwise(x);
  EXPECT_EQ(got, want);
}

void expect_arg(const std::function<void()>& fn, const std::string& arg, const std::string& also) {
  try {
    fn();
    FAIL() << "no error";
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.arg(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(also), std::string::npos) << e.what();
  }
}

TEST(Fp8Api, Refusals) {
  Problem pr({4, 4}, 128, 128, 25);
  std::vector<uint16_t> out;
  // bf16 activations: refused naming `precision`
  std::vector<uint16_t> abf(size_t(pr.M * pr.K), 0x3F80);
  expect_arg(
      [&] {
        GroupGemmArgs x = pr.fp8_args(out);
        x.a = TensorView(abf.data(), DType::kBFloat16, {pr.M, pr.K});
        x.a_scale = TensorView();
        group_gemm_mxfp4_nt_groupwise(x);
      },
      "precision", "MXFP8");
  // plain weights: NotSupportedError naming the constraint
  try {
    GroupGemmArgs x = pr.exact_args(out);
    x.precision = GemmPrecision::kFp8TensorCores;
    group_gemm_mxfp4_nt_groupwise(x);
    FAIL() << "no error";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("group_gemm_mxfp4_prepack_fp8"), std::string::npos) << e.what();
  }
  // the exact path's packed layout (3-D): refused naming b
  std::vector<uint8_t> pb(size_t(2 * 128 * 128), 0), ps(size_t(2 * 128 * 8), 127);
  expect_arg(
      [&] {
        GroupGemmArgs x = pr.fp8_args(out);
        x.b = TensorView(pb.data(), DType::kUInt8, {2, 128, 128});
        x.b_scale = TensorView(ps.data(), DType::kUInt8, {2, 128, 8});
        group_gemm_mxfp4_nt_groupwise(x);
      },
      "b", "group_gemm_mxfp4_prepack_fp8");
  // FP8-path packed scales of the wrong shape
  expect_arg(
      [&] {
        GroupGemmArgs x = pr.fp8_args(out);
        x.b_scale = TensorView(pr.p.s.data(), DType::kUInt8, {2, 1, 1, 128, 2});
        group_gemm_mxfp4_nt_groupwise(x);
      },
      "b_scale", "shape");
  // not an enumerator
  expect_arg(
      [&] {
        GroupGemmArgs x = pr.exact_args(out);
        x.precision = static_cast<GemmPrecision>(7);
        group_gemm_mxfp4_nt_groupwise(x);
      },
      "precision", "kExact");
  // outputs untouched by a refused call
  for (uint16_t v : out) ASSERT_EQ(v, 0x7FFF);
}

#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
// The CUDA kernel's constraints are refused before any device work (the tensors below are never
// touched: host memory labelled as CUDA, so a launch would fail loudly instead).
TEST(Fp8Api, CudaConstraintsAreRefusedWithNotSupported) {
  Problem pr({4, 4}, 128, 128, 27);
  std::vector<uint16_t> out;
  std::vector<uint8_t> wide(size_t(pr.M * (pr.K + 8)), 0);
  GroupGemmArgs x = pr.fp8_args(out);
  x.a = TensorView(wide.data(), DType::kE4M3, {pr.M, pr.K}, {pr.K + 8, 1}, Device::kCUDA);  // row stride K + 8
  for (TensorView* v : {&x.a_scale, &x.b, &x.b_scale, &x.m_indptr, &x.out}) v->device = Device::kCUDA;
  try {
    group_gemm_mxfp4_nt_groupwise(x);
    FAIL() << "no error";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16 bytes"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
