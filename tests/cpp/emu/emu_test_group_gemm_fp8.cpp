// The FP8 tensor-core path of the MXFP4 grouped GEMM (GemmPrecision::kFp8TensorCores:
// group_gemm_mxfp4_fp8 and its kernel group_gemm_fp8_kernel, src/cuda/moe/group_fp8_mainloop.cuh;
// the FP8-path prepack kernel mxfp4_prepack_fp8) runs on the CPU through the host emulation of
// tests/cpp/emu/ (the build rewrites the sources: tests/cpp/CMakeLists.txt; the FP8 wgmma, bulk
// copies, TMA and mbarriers are emulated by emu_sm90.hpp) and is compared with the CPU reference
// ref::group_gemm_mxfp4 on the same bytes (the exact result that CPU tensors compute for either
// precision):
//  - random data: per element |out - ref| <= 1 ulp_out + (2^-7 + (K/32) 2^-24) sum_k |a_k b_k|,
//    the path's documented tolerance (docs/design/moe_grouped_gemm.md, "Tolerance and its
//    derivation"). The emulated MMA sums each k32 block exactly (it does not model the tensor
//    cores' truncating accumulator), which leaves only the promotion's roundings, at most three
//    per block (the partial sum, the slow form's row multiply, the FFMA): the test also holds
//    1 ulp_out + 3 (K/32) 2^-24 sum_k |a_k b_k|, far tighter than the documented bound;
//  - integer data (E2M1 and E4M3 / E5M2 codes of 0, +-1, +-2, +-4, scale bytes in 4-wide windows):
//    every partial sum and total is exact, so the FP8 path gives the reference's bits, and the
//    exact path (group_gemm_mxfp4 on the plain weights, emulated too) the same bits;
//  - NaN exactly where the reference has it (scale byte 255 of a weight row's block or of a
//    token's block), poisoned rows outside the groups untouched.
// Cases cover ragged and empty groups, K tails (K not a multiple of the 128-wide K tile), E4M3 and
// E5M2 activations, blocks in the slow form (weight scale bytes spread by more than 14: checked to
// occur), row-major and 128x4 grouped activation scales, the masked layout with device counts,
// bf16 and fp16 outputs, several work items per CTA (the stage phases running on across items).
// Each case runs in two orderings of the asynchronous operations (copies landing early with the
// MMAs reading late, and the reverse). tests/cpp/gpu_test_group_gemm_fp8.cpp and
// tests/python/test_moe_fp8_gpu.py remain the tests on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/plan_moe.hpp"
#include "cuda/common/device_info.cuh"
#include "cuda/moe/fp8_fold.hpp"
#include "cuda/moe/heuristics.hpp"
#include "cuda/moe/launch_moe.hpp"
#include "emu_sm90.hpp"
#include "emu_test_util.hpp"
#include "lowbit/codecs.hpp"
#include "lowbit/mxfp4_pack.hpp"
#include "lowbit/scale_layout.hpp"
#include "ref/ref_moe.hpp"

using namespace lowbit;

namespace {

enum class Data {
  kRandom,   ///< random E2M1 codes, scale bytes 118..125; finite random E4M3 / E5M2 codes
  kInteger,  ///< codes of 0, +-1, +-2, +-4; weight scale bytes 120..123, activation 124..127
};
struct Case {
  std::string name;
  std::vector<int> sizes;  ///< rows per group
  int64_t N, K;
  bool e5m2;
  Data data;
  bool spread;         ///< weight rows n < 64 get scale bytes 20 lower: the first row block's blocks take the slow form
  bool nan;            ///< scale byte 255 in one block of one weight row and one token
  bool blocked;        ///< 128x4 activation scales with FlashInfer group padding (else row-major)
  int64_t max_tokens;  ///< > 0: the masked layout with device counts
  int sms;             ///< emulated SM count (CTAs of the persistent grid)
  DType out = DType::kBFloat16;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

using emu_test::Mode;

double out_ulp(double v, DType dt) {
  const int e = std::ilogb(std::fabs(v) + 1e-300);
  return dt == DType::kBFloat16 ? std::ldexp(1.0, std::max(e, -126) - 7) : std::ldexp(1.0, std::max(e, -14) - 10);
}
float out_val(uint16_t v, DType dt) { return dt == DType::kBFloat16 ? decode_bf16(v) : decode_fp16(v); }

void run_case(const Case& cs, const Mode& mode) {
  const int64_t G = int64_t(cs.sizes.size()), N = cs.N, K = cs.K, Kb = K / 32;
  const bool masked = cs.max_tokens > 0;
  std::vector<int64_t> ind(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) ind[size_t(g + 1)] = ind[size_t(g)] + cs.sizes[size_t(g)];
  // rows of a / out: the masked layout's G x max_tokens, else the groups' rows and 3 more
  const int64_t M = masked ? G * cs.max_tokens : ind[size_t(G)] + 3;
  auto group_of = [&](int64_t m) {  // group of row m of a, -1 outside the groups
    if (masked) return m % cs.max_tokens < cs.sizes[size_t(m / cs.max_tokens)] ? m / cs.max_tokens : int64_t(-1);
    for (int64_t g = 0; g < G; ++g)
      if (m < ind[size_t(g + 1)]) return g;
    return int64_t(-1);
  };

  std::mt19937 rng(uint32_t(M * 7919 + N * 31 + K + cs.e5m2 * 5 + int(cs.data) * 101 + cs.spread * 3 + cs.nan));
  const bool integer = cs.data == Data::kInteger;
  // weights [G, N, K/2], scales [G, N, K/32]
  const uint8_t e2m1_int[8] = {0, 2, 4, 6, 8, 10, 12, 14};  // 0, 1, 2, 4 and their negatives
  std::vector<uint8_t> b(size_t(G * N * K / 2)), bs(size_t(G * N * Kb));
  for (auto& v : b) v = integer ? uint8_t(e2m1_int[rng() % 8] | (e2m1_int[rng() % 8] << 4)) : uint8_t(rng());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t kb = 0; kb < Kb; ++kb)
        bs[size_t((g * N + n) * Kb + kb)] =
            uint8_t((integer ? 120 + rng() % 4 : 118 + rng() % 8) - (cs.spread && n < 64 ? 20 : 0));
  // activations [M, K] and their scales
  const uint8_t e4m3_int[8] = {0x00, 0x38, 0x40, 0x48, 0x80, 0xB8, 0xC0, 0xC8};
  const uint8_t e5m2_int[8] = {0x00, 0x3C, 0x40, 0x44, 0x80, 0xBC, 0xC0, 0xC4};
  std::vector<uint8_t> a(size_t(M * K)), as_rows(size_t(M * Kb));
  for (auto& v : a) {
    if (integer) {
      v = (cs.e5m2 ? e5m2_int : e4m3_int)[rng() % 8];
    } else {
      v = uint8_t(rng());
      if (cs.e5m2 ? (v & 0x7C) == 0x7C : (v & 0x7F) == 0x7F) v &= 0xBB;  // finite codes
    }
  }
  for (auto& v : as_rows) v = uint8_t(integer ? 124 + rng() % 4 : (cs.e5m2 ? 110 : 118) + rng() % 8);
  int64_t nan_row = -1, nan_token = -1;
  if (cs.nan) {  // weight row 7 of the first non-empty group, block 1; the 2nd row of the last group, block Kb - 1
    for (int64_t g = 0; g < G && nan_row < 0; ++g)
      if (cs.sizes[size_t(g)] > 0) {
        nan_row = 7 % N;
        bs[size_t((g * N + nan_row) * Kb + 1 % Kb)] = 255;
      }
    for (int64_t g = G - 1; g >= 0 && nan_token < 0; --g)
      if (cs.sizes[size_t(g)] > 1) {
        nan_token = masked ? g * cs.max_tokens + 1 : ind[size_t(g)] + 1;
        as_rows[size_t(nan_token * Kb + Kb - 1)] = 255;
      }
    ASSERT_GE(nan_row, 0);
    ASSERT_GE(nan_token, 0);
  }
  // the slow form must occur where the case asks for it (and the fold elsewhere): per (group, row
  // block, K block) the fold's byte rule over the rows < N
  int slow_blocks = 0, fold_blocks = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r0 = 0; r0 < N; r0 += 128)
      for (int64_t kb = 0; kb < Kb; ++kb) {
        uint32_t mn = 255, mx = 0;
        for (int64_t n = r0; n < std::min(N, r0 + 128); ++n) {
          mn = std::min<uint32_t>(mn, bs[size_t((g * N + n) * Kb + kb)]);
          mx = std::max<uint32_t>(mx, bs[size_t((g * N + n) * Kb + kb)]);
        }
        ++(cuda_emu::fp8::block_folds(mn, mx) ? fold_blocks : slow_blocks);
      }
  EXPECT_GT(fold_blocks, 0) << "blocks in the fast form";
  if (cs.spread || cs.nan) EXPECT_GT(slow_blocks, 0) << "blocks in the slow form";

  // FP8-path packed weights: the CPU prepack, and the emulated prepack kernel giving the same bytes
  const int64_t Np = mxfp4_packed_rows(N), Kq = mxfp4_fp8_packed_k(K);
  detail::Mxfp4PackPlan pk;
  pk.G = G;
  pk.N = N;
  pk.K = K;
  pk.b = b.data();
  pk.b_sG = N * K / 2;
  pk.b_sN = K / 2;
  pk.b_scale = bs.data();
  pk.spb.layout = ScaleLayout::row_major();
  pk.spb.rows = pk.spb.rows_pad = N;
  pk.spb.cols = Kb;
  pk.spb.batch_stride = N * Kb;
  std::vector<uint8_t> pb(size_t(G * Np * Kq / 2)), ps(size_t(G * Np * Kq / 32));
  pk.packed_b = pb.data();
  pk.packed_scale = ps.data();
  ref::mxfp4_prepack_fp8(pk);
  std::vector<uint8_t> pb_dev(pb.size(), 0xA5), ps_dev(ps.size(), 0xA5);
  pk.packed_b = pb_dev.data();
  pk.packed_scale = ps_dev.data();
  ASSERT_EQ(cuda_emu::mxfp4_prepack_fp8(pk, nullptr), 0);
  ASSERT_EQ(pb_dev, pb) << "prepack kernel: packed weights";
  ASSERT_EQ(ps_dev, ps) << "prepack kernel: packed scales";

  // the plan
  detail::GroupGemmPlan p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.G = G;
  p.a_dtype = cs.e5m2 ? DType::kE5M2 : DType::kE4M3;
  p.a = a.data();
  p.a_sM = K;
  std::vector<uint8_t> as_st;
  if (cs.blocked) {  // 128x4 with FlashInfer group padding; padding bytes 255 (NaN: must never be read)
    p.spa.layout = ScaleLayout::blocked128x4(GroupPad::kFlashInfer);
    p.spa.groups = G;
    p.spa.m_indptr = ind.data();
    p.spa.indptr64 = true;
    p.spa.rows = M;
    p.spa.cols = Kb;
    p.spa.rows_pad = grouped_rows_alloc(GroupPad::kFlashInfer, M, G);
    p.spa.batch_stride = p.spa.rows_pad * scale_cols_padded(p.spa.layout, Kb);
    as_st.assign(size_t(p.spa.batch_stride), 0xFF);
    for (int64_t m = 0; m < ind[size_t(G)]; ++m)
      for (int64_t kb = 0; kb < Kb; ++kb) as_st[size_t(p.spa.offset(0, m, kb))] = as_rows[size_t(m * Kb + kb)];
  } else {
    p.spa.layout = ScaleLayout::row_major();
    p.spa.rows = p.spa.rows_pad = M;
    p.spa.cols = Kb;
    p.spa.batch_stride = M * Kb;
    as_st = as_rows;
  }
  p.a_scale = as_st.data();
  p.b = pb.data();
  p.b_sG = Np * Kq / 2;
  p.b_sN = Kq / 2;
  p.b_packed = true;
  p.b_scale = ps.data();
  p.fp8 = true;
  p.out_dtype = cs.out;
  p.o_sM = N;

  // reference (host group bounds)
  std::vector<uint16_t> ref(size_t(M * N), 0);
  detail::GroupGemmPlan pr = p;
  pr.m_indptr = ind.data();
  pr.indptr64 = true;
  pr.max_tokens = cs.max_tokens;
  pr.out = ref.data();
  ref::group_gemm_mxfp4(pr);

  // the emulated FP8 path: device bounds (int32) or device counts (masked layout)
  const uint16_t kPoison = 0x7FBB;  // a NaN in both output dtypes
  std::vector<uint16_t> out(size_t(M * N), kPoison);
  std::vector<int32_t> ind32(ind.begin(), ind.end()), counts(cs.sizes.begin(), cs.sizes.end());
  detail::GroupGemmPlan pe = p;
  pe.out = out.data();
  if (masked) {
    pe.counts = counts.data();
    pe.counts64 = false;
    pe.max_tokens = cs.max_tokens;
  } else {
    pe.m_indptr = ind32.data();
    pe.indptr64 = false;
  }
  const emu_test::Launch launch(mode, cs.sms);
  const int rc = cuda_emu::group_gemm_mxfp4_fp8(pe, nullptr);
  ASSERT_EQ(rc, 0);
  int fp8_launches = 0;
  for (const emu::LaunchRecord& l : emu::launch_log)
    if (l.block.x == 384) {
      ++fp8_launches;
      const int64_t items = (N + 127) / 128 * cuda_emu::moe::fp8_token_tiles(M, G, cs.max_tokens);
      EXPECT_EQ(int64_t(l.grid.x), cuda_emu::moe::fp8_grid(items, cs.sms)) << "persistent grid";
    }
  EXPECT_EQ(fp8_launches, 1) << "the FP8 path's kernel";

  // the exact path on the plain weights (integer data: the same bits)
  std::vector<uint16_t> exact;
  if (integer) {
    exact.assign(size_t(M * N), kPoison);
    detail::GroupGemmPlan px = pe;
    px.fp8 = false;
    px.b = b.data();
    px.b_sG = N * K / 2;
    px.b_sN = K / 2;
    px.b_packed = false;
    px.b_scale = bs.data();
    px.spb = pk.spb;
    px.out = exact.data();
    ASSERT_EQ(cuda_emu::group_gemm_mxfp4(px, nullptr), 0);
  }

  auto a_val = [&](int64_t m, int64_t k) {
    const uint8_t c = a[size_t(m * K + k)];
    return double(cs.e5m2 ? decode_e5m2(c) : decode_e4m3(c)) * double(decode_ue8m0(as_rows[size_t(m * Kb + k / 32)]));
  };
  auto b_val = [&](int64_t g, int64_t n, int64_t k) {
    const uint8_t c = (b[size_t((g * N + n) * (K / 2) + k / 2)] >> ((k & 1) * 4)) & 0xF;
    return double(decode_e2m1(c)) * double(decode_ue8m0(bs[size_t((g * N + n) * Kb + k / 32)]));
  };
  int64_t bad = 0, nans = 0;
  double worst = 0.0;  // largest |out - ref| / (documented bound)
  for (int64_t m = 0; m < M; ++m) {
    const int64_t g = group_of(m);
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      if (g < 0) {
        if (out[i] != kPoison && bad++ < 10) ADD_FAILURE() << "row " << m << " outside the groups was written, n " << n;
        continue;
      }
      const double r = out_val(ref[i], cs.out), v = out_val(out[i], cs.out);
      if (std::isnan(r)) {
        ++nans;
        if (!std::isnan(v) && bad++ < 10) ADD_FAILURE() << "out[" << m << ", " << n << "] = " << v << ", reference NaN";
        continue;
      }
      if (integer) {
        if (out[i] != ref[i] && bad++ < 10)
          ADD_FAILURE() << "out[" << m << ", " << n << "] = " << v << ", reference " << r << " (integer data: exact)";
        if (exact[i] != out[i] && bad++ < 10)
          ADD_FAILURE() << "out[" << m << ", " << n << "] = " << v << ", exact path " << out_val(exact[i], cs.out);
        continue;
      }
      double S = 0.0;
      for (int64_t k = 0; k < K; ++k) S += std::fabs(a_val(m, k) * b_val(g, n, k));
      const double ulp = out_ulp(std::max(std::fabs(r), std::fabs(v)), cs.out);
      const double documented = ulp + (std::ldexp(1.0, -7) + double(Kb) * std::ldexp(1.0, -24)) * S;
      const double tight = ulp + 3.0 * double(Kb) * std::ldexp(1.0, -24) * S;
      const double err = std::fabs(v - r);
      if (!(err <= documented) && bad++ < 10)
        ADD_FAILURE() << "out[" << m << ", " << n << "] = " << v << ", reference " << r
                      << ": outside the documented bound " << documented;
      else if (!(err <= tight) && bad++ < 10)
        ADD_FAILURE() << "out[" << m << ", " << n << "] = " << v << ", reference " << r
                      << ": outside the bound of the promotion's roundings " << tight;
      worst = std::max(worst, err / documented);
    }
  }
  EXPECT_EQ(bad, 0) << "elements off";
  if (cs.nan) EXPECT_GT(nans, 0) << "the NaN scale bytes reach outputs";
  if (!integer) EXPECT_LT(worst, 1.0);
}

class EmuGroupGemmFp8 : public ::testing::TestWithParam<Case> {};

TEST_P(EmuGroupGemmFp8, MatchesCpuReference) {
  emu_test::in_both_orders([&](const Mode& mode) { run_case(GetParam(), mode); });
}

// name, group sizes, N, K, e5m2, data, spread, nan, blocked, max_tokens, sms[, out]
INSTANTIATE_TEST_SUITE_P(
    Cases, EmuGroupGemmFp8,
    ::testing::Values(
        // ragged groups with empty ones, a partial row block (N = 264), a K tail (9 blocks: the
        // last K tile holds one), 128x4 grouped activation scales, two CTAs looping over the items
        Case{"e4m3_ragged_ktail_blocked", {5, 0, 130, 0, 61}, 264, 288, false, Data::kRandom, false, false, true, 0,
             2},
        // E5M2 activations, blocks in the slow form, NaN scale bytes of a weight row and a token,
        // a K tail of one block past a full tile (5 blocks), fp16 output
        Case{"e5m2_slow_nan_ktail", {3, 70, 0, 9}, 136, 160, true, Data::kRandom, true, true, false, 0, 3,
             DType::kFloat16},
        // integer data: bit-exact against the reference and the exact path, with folded and slow blocks
        Case{"e4m3_integer_fold_and_slow", {0, 5, 130, 0, 40}, 256, 256, false, Data::kInteger, true, false, false, 0,
             2},
        Case{"e5m2_integer", {3, 0, 150}, 136, 384, true, Data::kInteger, false, false, false, 0, 2},
        // the masked layout with device counts (an empty group, a full one), one CTA for every item
        Case{"e4m3_masked_counts", {24, 0, 7, 40}, 128, 224, false, Data::kRandom, false, false, false, 40, 1}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
