// The NVFP4 dual GEMM + SiLU of src/cuda/gemm/ (nvfp4_dual_gemm: the weight prepack, the
// activation pre-pass, the cp.async / wgmma mainloop, the split-K finalize) runs on the CPU through
// the host emulation of tests/cpp/emu/ (emu_sm90.hpp; the build rewrites the sources:
// tests/cpp/CMakeLists.txt) and is compared with the CPU reference ref::nvfp4_dual_gemm_silu:
// |out - ref| <= 1e-3 + 1e-3 |ref| per element (fp32 output), NaN exactly where the reference is
// NaN; outputs poisoned first. Each case checks the tile and split-K the host path launched, in two
// orderings of the asynchronous operations (emu_test_group_gemm.cpp). tests/cpp/gpu_test_dual_gemm.cpp
// remains the test on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/plan_gemm.hpp"
#include "cuda/common/device_info.cuh"
#include "cuda/gemm/heuristics.hpp"
#include "cuda/gemm/launch_gemm.hpp"
#include "emu_sm90.hpp"
#include "emu_test_util.hpp"
#include "lowbit/codecs.hpp"
#include "lowbit/scale_layout.hpp"
#include "ref/ref_gemm.hpp"

using namespace lowbit;

namespace {

struct Case {
  std::string name;
  int64_t M, N, K, L;
  int sms;         ///< emulated SM count (steers split-K)
  bool blocked;    ///< 128x4 blocked scales instead of row-major
  bool global;     ///< per-tensor amaxes
  bool nan;        ///< an E4M3 NaN scale (0x7F) in a weight block and an activation block
  int nt, splits;  ///< what the host path must launch
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
  const int64_t M = cs.M, N = cs.N, K = cs.K, L = cs.L, Kb = K / 16;
  std::mt19937 rng(uint32_t(M * 131 + N * 7 + K + L));
  // operands [L][rows][K/2] (random E2M1 codes), scales [L][rows][K/16] (E4M3 of 2^-6 .. 2)
  auto fp4 = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& b : v) b = uint8_t(rng());
    return v;
  };
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto scales = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& s : v) s = encode_e4m3(std::ldexp(1.0f + u(rng), int(rng() % 7) - 6));
    v[0] = 0x00;  // a zero and the smallest subnormal scale
    v[2] = 0x01;
    return v;
  };
  auto a = fp4(L * M * K / 2), b1 = fp4(L * N * K / 2), b2 = fp4(L * N * K / 2);
  auto sa = scales(L * M * Kb), sb1 = scales(L * N * Kb), sb2 = scales(L * N * Kb);
  if (cs.nan) {
    sb1[size_t(5 * Kb + 3)] = 0x7F;  // gate row 5, block 3
    sa[size_t(2 * Kb + 1)] = 0x7F;   // token row 2, block 1
  }
  // stored scales: row-major [L][R][K/16], or 128x4 blocked per batch (padding 0x7F: never read)
  const ScaleLayout lay = cs.blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  auto store = [&](const std::vector<uint8_t>& rm, int64_t R, detail::ScalePlan* sp) {
    sp->layout = lay;
    sp->rows = R;
    sp->cols = Kb;
    sp->rows_pad = scale_rows_padded(lay, R);
    sp->batch_stride = scale_size_rows(lay, sp->rows_pad, Kb);
    std::vector<uint8_t> st(size_t(L * sp->batch_stride), 0x7F);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < Kb; ++c) st[size_t(sp->offset(l, r, c))] = rm[size_t((l * R + r) * Kb + c)];
    return st;
  };
  detail::DualGemmPlan p;
  const auto sa_st = store(sa, M, &p.spa);
  detail::ScalePlan spb;
  const auto sb1_st = store(sb1, N, &spb), sb2_st = store(sb2, N, &p.spb);
  p.M = M;
  p.N = N;
  p.K = K;
  p.L = L;
  p.a = a.data();
  p.b1 = b1.data();
  p.b2 = b2.data();
  p.a_sM = K / 2;
  p.a_sL = M * K / 2;
  p.b1_sN = p.b2_sN = K / 2;
  p.b1_sL = p.b2_sL = N * K / 2;
  p.sfa = sa_st.data();
  p.sfb1 = sb1_st.data();
  p.sfb2 = sb2_st.data();
  const float amax[3] = {448.0f * 6.0f * 2.0f, 448.0f * 6.0f * 0.25f, 448.0f * 6.0f};
  if (cs.global) {
    p.amax_a = &amax[0];
    p.amax_b1 = &amax[1];
    p.amax_b2 = &amax[2];
  }
  p.c_dtype = DType::kFloat32;
  p.c_sM = N;
  p.c_sL = M * N;

  std::vector<float> ref(size_t(L * M * N), 0.0f);
  detail::DualGemmPlan pr = p;
  pr.c = ref.data();
  ref::nvfp4_dual_gemm_silu(pr);

  const uint32_t kPoison = 0x7FBADBADu;
  std::vector<float> out(size_t(L * M * N));
  for (auto& v : out) std::memcpy(&v, &kPoison, 4);
  detail::DualGemmPlan pe = p;
  pe.c = out.data();
  const emu_test::Launch launch(mode, cs.sms);
  const int rc = cuda_emu::nvfp4_dual_gemm(pe, nullptr, nullptr);
  ASSERT_EQ(rc, 0);

  const cuda_emu::gemm::DualConfig cfg = cuda_emu::gemm::dual_config(M, N, K, L, cs.sms);
  EXPECT_EQ(cfg.tile_n, cs.nt) << "tile of the case";
  EXPECT_EQ(cfg.splits, cs.splits) << "split-K of the case";
  int mains = 0;
  for (const emu::LaunchRecord& l : emu::launch_log)
    if (l.block.x == 256 && l.smem > 0) {
      ++mains;
      EXPECT_EQ(int64_t(l.grid.y), (M + cs.nt - 1) / cs.nt) << "token tiles of the mainloop launch";
      EXPECT_EQ(int64_t(l.grid.z), L * cs.splits) << "grid.z of the mainloop launch";
    }
  EXPECT_EQ(mains, 1);

  int64_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (!close(out[i], ref[i]) && bad++ < 10)
      ADD_FAILURE() << "c[l " << int64_t(i) / (M * N) << ", m " << int64_t(i) / N % M << ", n " << int64_t(i) % N
                    << "] = " << out[i] << ", reference " << ref[i];
  EXPECT_EQ(bad, 0) << "elements off";
}

class EmuDualGemm : public ::testing::TestWithParam<Case> {};

TEST_P(EmuDualGemm, MatchesCpuReference) {
  emu_test::in_both_orders([&](const Mode& mode) { run_case(GetParam(), mode); });
}

// name, M, N, K, L, sms, blocked, global, nan, nt, splits
INSTANTIATE_TEST_SUITE_P(
    Cases, EmuDualGemm,
    ::testing::Values(Case{"t16_nan_splitk", 13, 128, 768, 1, 2, false, false, true, 16, 2},
                      Case{"t32_l2_global", 29, 128, 512, 2, 2, false, true, false, 32, 1},
                      Case{"t64_splitk_blocked", 50, 128, 1024, 1, 4, true, false, false, 64, 4},
                      Case{"t128_blocked_global", 100, 128, 384, 1, 1, true, true, false, 128, 1},
                      // 34 CTA columns: the launch order in groups of 32 (dual_tile_coords)
                      Case{"t32_raster_groups", 70, 2176, 256, 1, 16, false, false, false, 32, 1}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
