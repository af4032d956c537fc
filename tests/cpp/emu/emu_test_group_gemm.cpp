// The MXFP4 grouped GEMM of src/cuda/moe/ (group_gemm_mxfp4: the activation pre-pass, the
// warp-specialized TMA kernel group_gemm_ws_kernel, the cp.async kernel group_gemm_kernel, the
// split-K finalize, the weight prepack kernel; and the dense mxfp4_gemm, one group with a bias) runs on the CPU through the host emulation of
// tests/cpp/emu/ (the build rewrites the sources: tests/cpp/CMakeLists.txt; wgmma, TMA, mbarriers
// and cp.async are emulated by emu_sm90.hpp) and is compared with the CPU reference
// ref::group_gemm_mxfp4: |out - ref| <= 1e-3 + 1e-3 |ref| per element (fp32 output), NaN exactly
// where the reference is NaN, equal infinities; outputs are poisoned before each call and rows
// outside the groups must keep the poison. Each case checks that the host path launched the
// kernel it is meant to exercise (tile, warp-specialized or not, split-K). Every case runs in
// two orderings of the asynchronous operations: copies landing as early as allowed with the
// MMAs reading shared memory as late as allowed, and the reverse (emu_sm90.hpp).
// tests/cpp/gpu_test_group_gemm.cpp remains the test on the device.
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

enum class Act { kBF16, kE4M3, kE5M2 };
/// Scale bytes written into the operands:
///   kWide: weight scale bytes 134..200 in one K tile of a third of the rows (the two-multiply
///     decode), and 252 in one MX block of a quarter of the rows, whose bf16 activations are
///     scaled by 2^-110 (finite products). (252 is the largest byte whose weights are finite in
///     fp32 for every E2M1 code: the reference decodes 6 * 2^(253-127) to Inf, the kernels keep
///     the exact product.)
///   kNaN: weight scale 255 in one block of one row of every non-empty group (and in the whole
///     expert of an empty group, which no output reads); MXFP8: activation scale 255 in one block
///     of one row;
///   kActShift: MXFP8 E4M3 activations with scale bytes 0 and 250 in one row and a byte 1 in
///     another: the pre-pass shifts those rows by 2^3 and 2^2 into bf16's range (exactly), the
///     epilogue back;
///   kWeightTop: weight scale bytes 253 / 254 (elements of 2^128 or more: +-Inf); kActOverflow: an
///     MXFP8 row whose pre-pass shift leaves fp32's range (the exact recomputation).
enum class Special { kNone, kWide, kNaN, kActShift, kWeightTop, kActOverflow };

struct Case {
  std::string name;
  std::vector<int> sizes;  ///< rows per group (masked layout: the device counts)
  int64_t N, K;
  Act act;
  bool packed;
  bool b_blocked;      ///< 128x4 weight scales (plain weights)
  int64_t max_tokens;  ///< > 0: the masked layout with device counts
  int sms;             ///< emulated SM count (steers split-K and the capped grid)
  Special special;
  // what the host path must launch
  int nt;       ///< tokens per tile
  bool ws;      ///< the warp-specialized kernel
  int splits;   ///< split-K
  /// packed weights whose experts lie 128 rows apart beyond their padded rows (a plan the API does
  /// not make: such weights are not TMA-eligible, so 16 / 32 tokens run the cp.async kernel)
  bool gap = false;
  /// the dense mxfp4_gemm (one group, a bias of this dtype; kFloat32 or kBFloat16)
  bool dense = false;
  DType bias_dtype = DType::kFloat32;
};

/// gtest (and ctest) print a case by its name.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

using emu_test::Mode;

bool close(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(double(got) - double(want)) <= 1e-3 + 1e-3 * std::fabs(double(want));
}

void run_case(const Case& cs, const Mode& mode) {
  const int64_t G = int64_t(cs.sizes.size()), N = cs.N, K = cs.K, Kb = K / 32;
  const bool masked = cs.max_tokens > 0, fp8 = cs.act != Act::kBF16;
  // group bounds (compact rows) and the rows of a / out
  std::vector<int64_t> ind(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) ind[size_t(g + 1)] = ind[size_t(g)] + cs.sizes[size_t(g)];
  // contiguous layout: 3 rows past the groups (not the dense linear: its one group is all M rows)
  const int64_t M = masked ? G * cs.max_tokens : ind[size_t(G)] + (cs.dense ? 0 : 3);
  std::vector<int32_t> counts(cs.sizes.begin(), cs.sizes.end());
  std::vector<int32_t> ind32(ind.begin(), ind.end());
  auto row_used = [&](int64_t m) {
    if (!masked) return m < ind[size_t(G)];
    return m % cs.max_tokens < cs.sizes[size_t(m / cs.max_tokens)];
  };

  std::mt19937 rng(uint32_t(M * 7919 + N * 31 + K + int(cs.special) * 101 + int(cs.act)));
  // weights [G, N, K/2] (random E2M1 codes), scales [G, N, K/32] in 120..130
  std::vector<uint8_t> b(size_t(G * N * K / 2)), bs(size_t(G * N * Kb));
  for (auto& v : b) v = uint8_t(rng());
  for (auto& v : bs) v = uint8_t(120 + rng() % 11);
  auto bs_at = [&](int64_t g, int64_t n, int64_t kb) -> uint8_t& { return bs[size_t((g * N + n) * Kb + kb)]; };
  // activations [M, K]: bf16 ~ N(0, 1), or MXFP8 codes of N(0, 1) values with scales in 122..130
  // (operands of moderate range: the fp32 sums stay well within the tolerance of their value)
  const DType adt = cs.act == Act::kBF16 ? DType::kBFloat16 : cs.act == Act::kE4M3 ? DType::kE4M3 : DType::kE5M2;
  std::vector<uint16_t> a16(size_t(M * K));
  std::vector<uint8_t> a8(size_t(M * K)), as(size_t(M * Kb));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : a16) v = encode_bf16(nd(rng));
  for (auto& v : a8) v = cs.act == Act::kE5M2 ? encode_e5m2(nd(rng)) : encode_e4m3(nd(rng));
  for (auto& v : as) v = uint8_t(122 + rng() % 9);

  if (cs.special == Special::kWeightTop) {  // bytes 253 / 254 in block 11 of a quarter of the rows
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 1; n < N; n += 4) bs_at(g, n, 11) = uint8_t(253 + (n / 4) % 2);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 11 * 32; k < 12 * 32; ++k)
        a16[size_t(m * K + k)] = encode_bf16(std::ldexp(decode_bf16(a16[size_t(m * K + k)]), -110));
  } else if (cs.special == Special::kWide) {
    const int64_t t1 = std::min<int64_t>(1, (K - 1) / 256);  // a K tile of 256 (the warp-specialized kernel's)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t kb = t1 * 8; kb < std::min(Kb, t1 * 8 + 8); ++kb)
          if (n % 3 == 0) bs_at(g, n, kb) = uint8_t(134 + (n * 7 + kb * 13) % 67);
    const int64_t kb_top = std::min<int64_t>(Kb - 1, 11);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 1; n < N; n += 4) bs_at(g, n, kb_top) = 252;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = kb_top * 32; k < kb_top * 32 + 32; ++k)
        a16[size_t(m * K + k)] = encode_bf16(std::ldexp(decode_bf16(a16[size_t(m * K + k)]), -110));
  } else if (cs.special == Special::kNaN) {
    for (int64_t g = 0; g < G; ++g) {
      if (cs.sizes[size_t(g)] > 0) {
        bs_at(g, 7 % N, std::min<int64_t>(Kb - 1, 9)) = 255;
      } else {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t kb = 0; kb < Kb; ++kb) bs_at(g, n, kb) = 255;
      }
    }
    if (fp8) as[size_t(1 * Kb + 1)] = 255;
  } else if (cs.special == Special::kActShift) {
    as[size_t(2 * Kb + 0)] = 0;  // row 2: bytes 0 and 250 (beyond bf16's range together)
    as[size_t(2 * Kb + 1)] = 250;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) bs_at(g, n, 1) = 27;  // products of block 1 stay finite
    as[size_t(4 * Kb + 0)] = 1;  // row 4: shifted into bf16's range by 2^2, exactly
  } else if (cs.special == Special::kActOverflow) {
    as[size_t(2 * Kb + 0)] = 0;    // row 2: shifted by 2^3 (E4M3's lo = 3)
    as[size_t(2 * Kb + 1)] = 250;  // 4 * 2^123 = 2^125: finite; shifted, 2^128
    a8[size_t(2 * K + 32)] = encode_e4m3(4.0f);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) bs_at(g, n, 1) = 27;
  }

  // the plan (host pointers: the emulated device memory is host memory)
  detail::GroupGemmPlan p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.G = G;
  p.a_dtype = adt;
  p.a = fp8 ? static_cast<const void*>(a8.data()) : static_cast<const void*>(a16.data());
  p.a_sM = K;
  if (fp8) {
    p.a_scale = as.data();
    p.spa.layout = ScaleLayout::row_major();
    p.spa.rows = p.spa.rows_pad = M;
    p.spa.cols = Kb;
    p.spa.batch_stride = M * Kb;
  }
  // weights as the kernels take them: plain (row-major or 128x4 scales) or prepacked
  std::vector<uint8_t> b_st, bs_st;
  detail::ScalePlan spb_plain;
  spb_plain.layout = ScaleLayout::row_major();
  spb_plain.rows = spb_plain.rows_pad = N;
  spb_plain.cols = Kb;
  spb_plain.batch_stride = N * Kb;
  if (cs.packed) {
    const int64_t Np = mxfp4_packed_rows(N), Kp = mxfp4_packed_k(K);
    detail::Mxfp4PackPlan pk;
    pk.G = G;
    pk.N = N;
    pk.K = K;
    pk.b = b.data();
    pk.b_sG = N * K / 2;
    pk.b_sN = K / 2;
    pk.b_scale = bs.data();
    pk.spb = spb_plain;
    std::vector<uint8_t> rb(size_t(G * Np * Kp / 2)), rs(size_t(G * Np * Kp / 32));
    b_st.assign(rb.size(), 0xA5);
    bs_st.assign(rs.size(), 0xA5);
    pk.packed_b = rb.data();
    pk.packed_scale = rs.data();
    ref::mxfp4_prepack(pk);
    pk.packed_b = b_st.data();
    pk.packed_scale = bs_st.data();
    ASSERT_EQ(cuda_emu::mxfp4_prepack(pk, nullptr), 0);
    ASSERT_EQ(b_st, rb) << "prepack kernel: packed weights";
    ASSERT_EQ(bs_st, rs) << "prepack kernel: packed scales";
    p.b = b_st.data();
    p.b_sG = Np * Kp / 2;
    p.b_sN = Kp / 2;
    if (cs.gap) {  // expert g at (Np + 128) g rows, the gap poisoned
      std::vector<uint8_t> gapped(size_t(G * (Np + 128) * Kp / 2), 0x5A);
      for (int64_t g = 0; g < G; ++g)
        std::copy(b_st.begin() + g * Np * Kp / 2, b_st.begin() + (g + 1) * Np * Kp / 2,
                  gapped.begin() + g * (Np + 128) * Kp / 2);
      b_st.swap(gapped);
      p.b = b_st.data();
      p.b_sG = (Np + 128) * Kp / 2;
    }
    p.b_packed = true;
    p.b_scale = bs_st.data();
    p.spb.layout = ScaleLayout::row_major();
    p.spb.rows = p.spb.rows_pad = Np;
    p.spb.cols = Kp / 32;
    p.spb.batch_stride = Np * Kp / 32;
  } else {
    p.b = b.data();
    p.b_sG = N * K / 2;
    p.b_sN = K / 2;
    if (cs.b_blocked) {  // 128x4 blocked scales, padding bytes 0xFF (NaN scales: must never be read)
      const ScaleLayout l = ScaleLayout::blocked128x4();
      const int64_t Rp = scale_rows_padded(l, N), per = scale_size_rows(l, Rp, Kb);
      bs_st.assign(size_t(G * per), 0xFF);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t kb = 0; kb < Kb; ++kb) bs_st[size_t(g * per + scale_offset(l, Rp, Kb, n, kb))] = bs_at(g, n, kb);
      p.b_scale = bs_st.data();
      p.spb.layout = l;
      p.spb.rows = N;
      p.spb.rows_pad = Rp;
      p.spb.cols = Kb;
      p.spb.batch_stride = per;
    } else {
      p.b_scale = bs.data();
      p.spb = spb_plain;
    }
  }
  p.out_dtype = DType::kFloat32;
  p.o_sM = N;
  // the dense linear's bias (fp32 or bf16 values of N(0, 4))
  std::vector<float> bias32(static_cast<size_t>(N));
  std::vector<uint16_t> bias16(static_cast<size_t>(N));
  if (cs.dense) {
    for (int64_t n = 0; n < N; ++n) {
      bias16[size_t(n)] = encode_bf16(2.0f * nd(rng));
      bias32[size_t(n)] = decode_bf16(bias16[size_t(n)]) + 0.001f * float(n % 7);
    }
    p.bias = cs.bias_dtype == DType::kFloat32 ? static_cast<const void*>(bias32.data()) : bias16.data();
    p.bias_dtype = cs.bias_dtype;
  }

  // reference (host group bounds)
  std::vector<float> ref(size_t(M * N), 0.0f);
  detail::GroupGemmPlan pr = p;  // the same operands (packed ones too)
  pr.m_indptr = ind.data();
  pr.indptr64 = true;
  pr.max_tokens = cs.max_tokens;
  pr.out = ref.data();
  ref::group_gemm_mxfp4(pr);

  // the emulated kernels: device bounds (int32) or device counts (masked layout)
  const uint32_t kPoison = 0x7FBADBADu;
  std::vector<float> out(size_t(M * N));
  for (auto& v : out) std::memcpy(&v, &kPoison, 4);
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
  const int rc = cs.dense ? cuda_emu::mxfp4_gemm(pe, nullptr) : cuda_emu::group_gemm_mxfp4(pe, nullptr);
  ASSERT_EQ(rc, 0);

  // the kernels the host path launched
  const bool one_group = cs.max_tokens == 0 && pe.counts == nullptr;
  const cuda_emu::moe::GroupTile tile = cuda_emu::moe::call_tile(M, G, K, cs.max_tokens, 0, one_group);
  EXPECT_EQ(tile.tile_n, cs.nt) << "tile of the case";
  const int64_t rows_bound = M;
  const cuda_emu::moe::GroupSplit sp = cuda_emu::moe::call_split(rows_bound, G, N, K, tile, one_group, cs.sms);
  EXPECT_EQ(sp.splits, cs.splits) << "split-K of the case";
  int ws_launches = 0, gemm_launches = 0;
  for (const emu::LaunchRecord& l : emu::launch_log) {
    if (l.block.x == 288) ++ws_launches;
    if (l.block.x == 288 || (l.block.x == 256 && l.smem > 0)) {
      ++gemm_launches;
      EXPECT_EQ(int(l.grid.z), cs.splits) << "grid.z of the GEMM launch";
    }
  }
  EXPECT_EQ(gemm_launches, 1);
  EXPECT_EQ(ws_launches, cs.ws ? 1 : 0) << "warp-specialized kernel";

  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float got = out[size_t(m * N + n)];
      if (!row_used(m)) {
        uint32_t u;
        std::memcpy(&u, &got, 4);
        if (u != kPoison && bad++ < 10) ADD_FAILURE() << "row " << m << " outside the groups was written, n " << n;
        continue;
      }
      const float want = ref[size_t(m * N + n)];
      if (!close(got, want) && bad++ < 10)
        ADD_FAILURE() << "out[" << m << ", " << n << "] = " << got << ", reference " << want;
    }
  EXPECT_EQ(bad, 0) << "elements off";
}

class EmuGroupGemm : public ::testing::TestWithParam<Case> {};

TEST_P(EmuGroupGemm, MatchesCpuReference) {
  emu_test::in_both_orders([&](const Mode& mode) { run_case(GetParam(), mode); });
}

// name, group sizes, N, K, act, packed, b_blocked, max_tokens, sms, special, nt, ws, splits
INSTANTIATE_TEST_SUITE_P(
    Cases, EmuGroupGemm,
    ::testing::Values(
        // the warp-specialized kernel (packed weights, 16 / 32 tokens)
        // weight scale bytes 253 / 254 with every code: elements of 2^128 or more are +-Inf in the
        // reference's fp32 decode (docs/formats.md), and the kernels' three-multiply decode of the
        // tile gives the same +-Inf / NaN sums (the two-multiply form before it kept them finite)
        Case{"ws16_weight_top", {5, 0, 23, 1, 0, 40}, 256, 1024, Act::kBF16, true, false, 0, 2, Special::kWeightTop, 16, true, 1},
        Case{"ws16_ragged_wide", {5, 0, 23, 1, 0, 40}, 256, 1024, Act::kBF16, true, false, 0, 2, Special::kWide, 16, true, 1},
        Case{"ws32_e4m3_nan", {40, 0, 17, 33, 3}, 192, 1536, Act::kE4M3, true, false, 0, 2, Special::kNaN, 32, true, 1},
        Case{"ws16_splitk", {3, 0, 9}, 128, 1024, Act::kE5M2, true, false, 0, 16, Special::kNone, 16, true, 2},
        // masked layout (device counts, capped grid): CTAs loop over 2 work items, the stages'
        // phases running on across them
        Case{"ws32_masked_items", {24, 24, 24, 24, 20, 7}, 256, 768, Act::kBF16, true, false, 24, 2, Special::kNone, 32, true, 1},
        // the cp.async kernel: plain weights (row-major or 128x4 scales) and packed ones, 16..128 tokens
        Case{"cp16_plain_blocked_wide", {5, 0, 23, 1, 0, 40}, 256, 1024, Act::kBF16, false, true, 0, 2, Special::kWide, 16, false, 1},
        Case{"cp32_plain_e5m2_ktail", {40, 0, 17, 33, 3}, 192, 544, Act::kE5M2, false, false, 0, 2, Special::kNone, 32, false, 1},
        Case{"cp32_plain_splitk", {20, 30}, 128, 2048, Act::kE4M3, false, false, 0, 16, Special::kNone, 32, false, 4},
        Case{"cp32_plain_masked_items", {24, 24, 24, 24, 20, 7}, 128, 512, Act::kE4M3, false, false, 24, 2, Special::kNaN, 32, false, 1},
        Case{"cp16_packed_gapped", {5, 0, 23, 1, 0, 40}, 128, 512, Act::kE4M3, true, false, 0, 2, Special::kNone, 16, false, 1, true},
        Case{"cp64_packed_e4m3", {50, 0, 70, 33}, 128, 640, Act::kE4M3, true, false, 0, 2, Special::kNone, 64, false, 1},
        Case{"cp64_plain_blocked_nan", {50, 0, 70, 33}, 192, 512, Act::kBF16, false, true, 0, 2, Special::kNaN, 64, false, 1},
        Case{"cp128_packed_nan", {130, 200}, 128, 512, Act::kE5M2, true, false, 0, 2, Special::kNaN, 128, false, 2},
        // the dense mxfp4_gemm (one group, bias epilogue)
        Case{"dense_ws32_bias", {20}, 256, 512, Act::kE4M3, true, false, 0, 2, Special::kNone, 32, true, 1, false, true},
        Case{"dense_cp64_bf16bias", {77}, 192, 512, Act::kBF16, false, false, 0, 2, Special::kNone, 64, false, 1, false,
             true, DType::kBFloat16},  // 64 < M < 4096: 64-token tiles (moe::dense_mid_rows)
        Case{"dense_cp128_bf16bias", {4096}, 128, 64, Act::kBF16, false, false, 0, 2, Special::kNone, 128, false, 1, false,
             true, DType::kBFloat16},
        Case{"cp16_plain_weight_top", {5, 0, 23, 1, 0, 40}, 256, 1024, Act::kBF16, false, false, 0, 2, Special::kWeightTop, 16, false, 1},
        // an MXFP8 row that the pre-pass's shift by 2^3 pushes past fp32's range (4 * 2^123, times
        // 2^3): the row's CTAs take the exact recomputation (before that check: +-Inf / NaN outputs
        // where the reference's are finite)
        Case{"cp128_plain_act_overflow", {150, 140}, 128, 384, Act::kE4M3, false, false, 0, 2, Special::kActOverflow, 128, false, 2},
        Case{"cp128_plain_actshift", {150, 140}, 128, 384, Act::kE4M3, false, false, 0, 2, Special::kActShift, 128, false, 2}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
