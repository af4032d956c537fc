// The grouped GEMM's m_counts layouts and gpt_oss_expert_mlp on the GPU against the CPU reference on
// the same bytes, counts on the device: GEMM outputs within one bf16 ulp of the reference, MLP
// outputs within the GPU MODE rule |out - ref| <= 1e-3 + 1e-3 |ref| (bf16 activations); outputs
// poisoned first, and every row outside the counts must still hold the poison. Device counts out of
// range are clamped (negative -> 0, masked: above max_tokens -> max_tokens), which the reference
// gets as the clamped counts. The masked case with max_tokens far above the counts runs the capped
// grid (CTAs looping over work items).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lowbit/moe.hpp"
#include "ref_formats.hpp"

using namespace lowbit;

namespace {

using gputest::Dev;
using gputest::have_gpu;

constexpr uint16_t kPoison = 0xFFFF;  // the bytes cudaMemset(0xFF) writes (a bf16 NaN)

struct LayoutCase {
  const char* name;
  int64_t G, rows, N, K;  // rows: M (contiguous) or max_tokens (masked)
  std::vector<int64_t> counts;
  bool masked, packed;
  int64_t expected_m;
};

std::vector<int64_t> clamped(const std::vector<int64_t>& c, int64_t M, int64_t max_tokens) {
  std::vector<int64_t> r(c.size());
  int64_t used = 0;
  for (size_t g = 0; g < c.size(); ++g) {
    int64_t v = c[g] < 0 ? 0 : c[g];
    if (max_tokens) v = v < max_tokens ? v : max_tokens;
    if (!max_tokens) v = v < M - used ? v : M - used;
    r[g] = v;
    used += v;
  }
  return r;
}

double ulp_bf16(double r) {
  int e = -126;
  if (r != 0) {
    int ex;
    std::frexp(std::fabs(r), &ex);
    e = ex - 1 > -126 ? ex - 1 : -126;
  }
  return std::ldexp(1.0, e - 7);
}

}  // namespace

class MoeLayoutsGpu : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(MoeLayoutsGpu, GroupGemmMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const LayoutCase& c = GetParam();
  const int64_t G = c.G, N = c.N, K = c.K, M = c.masked ? c.G * c.rows : c.rows;
  auto xb = reftest::randn(size_t(G * N * K), uint64_t(M + N), 1.0f / std::sqrt(float(K)));
  std::vector<uint8_t> b(size_t(G * N * K / 2)), bs(size_t(G * N * K / 32));
  quantize(TensorView(xb.data(), DType::kFloat32, {G, N, K}), BlockFormat::mxfp4(true), ScaleLayout::row_major(),
           TensorView(b.data(), DType::kUInt8, {G, N, K / 2}), TensorView(bs.data(), DType::kUE8M0, {G, N, K / 32}));
  auto xa = reftest::randn(size_t(M * K), uint64_t(M + 7), 1.0f);
  std::vector<uint16_t> a(xa.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = encode_bf16(xa[i]);
  const std::vector<int64_t> ok = clamped(c.counts, M, c.masked ? c.rows : 0);

  auto args = [&](void* ap, void* bp, void* bsp, void* cp, void* op, Device dev, bool packed) {
    GroupGemmArgs x;
    x.a = c.masked ? TensorView(ap, DType::kBFloat16, {G, c.rows, K}, dev) : TensorView(ap, DType::kBFloat16, {M, K}, dev);
    if (packed) {
      const int64_t Np = (N + 127) / 128 * 128, Kp = (K + 255) / 256 * 256;
      x.b = TensorView(bp, DType::kUInt8, {G, Np, Kp / 2}, dev);
      x.b_scale = TensorView(bsp, DType::kUE8M0, {G, Np, Kp / 32}, dev);
      x.b_packed = true;
    } else {
      x.b = TensorView(bp, DType::kUInt8, {G, N, K / 2}, dev);
      x.b_scale = TensorView(bsp, DType::kUE8M0, {G, N, K / 32}, dev);
      x.b_scale_layout = ScaleLayout::row_major();
    }
    x.m_counts = TensorView(cp, DType::kInt64, {G}, dev);
    x.expected_m = c.expected_m;
    x.out = c.masked ? TensorView(op, DType::kBFloat16, {G, c.rows, N}, dev) : TensorView(op, DType::kBFloat16, {M, N}, dev);
    return x;
  };
  std::vector<uint16_t> ref(size_t(M * N), 0);
  std::vector<int64_t> okc(ok);
  group_gemm_mxfp4_nt_groupwise(args(a.data(), b.data(), bs.data(), okc.data(), ref.data(), Device::kCPU, false));

  Dev<uint16_t> da(a), dout(size_t(M * N));
  Dev<uint8_t> db(b), dbs(bs);
  Dev<int64_t> dc(c.counts);
  void* bp = db.p;
  void* bsp = dbs.p;
  const int64_t Np = (N + 127) / 128 * 128, Kp = (K + 255) / 256 * 256;
  Dev<uint8_t> pb(size_t(G * Np * Kp / 2)), ps(size_t(G * Np * Kp / 32));
  if (c.packed) {
    group_gemm_mxfp4_prepack(TensorView(db.p, DType::kUInt8, {G, N, K / 2}, Device::kCUDA),
                             TensorView(dbs.p, DType::kUE8M0, {G, N, K / 32}, Device::kCUDA), ScaleLayout::row_major(),
                             TensorView(pb.p, DType::kUInt8, {G, Np, Kp / 2}, Device::kCUDA),
                             TensorView(ps.p, DType::kUInt8, {G, Np, Kp / 32}, Device::kCUDA));
    bp = pb.p;
    bsp = ps.p;
  }
  cudaMemset(dout.p, 0xFF, dout.n * 2);
  group_gemm_mxfp4_nt_groupwise(args(da.p, bp, bsp, dc.p, dout.p, Device::kCUDA, c.packed));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = dout.get();
  std::vector<bool> inside(size_t(M), false);
  for (int64_t g = 0, r = 0; g < G; ++g)
    for (int64_t i = 0; i < ok[size_t(g)]; ++i) inside[size_t(c.masked ? g * c.rows + i : r++)] = true;
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t v = got[size_t(m * N + n)];
      if (!inside[size_t(m)]) {
        if (v != kPoison && bad++ < 5) ADD_FAILURE() << c.name << ": row " << m << " outside the counts written";
        continue;
      }
      const double r = decode_bf16(ref[size_t(m * N + n)]), g = decode_bf16(v);
      if (!(std::fabs(g - r) <= ulp_bf16(r)) && bad++ < 5)
        ADD_FAILURE() << c.name << ": row " << m << " n " << n << ": got " << g << " want " << r;
    }
  EXPECT_EQ(bad, 0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeLayoutsGpu,
    ::testing::Values(LayoutCase{"contig", 5, 300, 256, 512, {0, 37, 0, 200, 1}, false, false, 0},
                      LayoutCase{"contig-clamped-packed", 3, 100, 128, 256, {60, 70, -5}, false, true, 0},
                      LayoutCase{"masked", 4, 64, 256, 512, {64, 0, 17, -2}, true, false, 0},
                      LayoutCase{"masked-capped-packed", 8, 1024, 256, 512, {1024, 3, 0, 17, 2, 0, 9, 2000}, true, true, 4},
                      LayoutCase{"masked-capped-plain", 8, 1024, 256, 512, {5, 1024, 0, 1, 33, 2, 0, 7}, true, false, 8}),
    [](const auto& info) {
      std::string s = info.param.name;
      for (auto& ch : s)
        if (ch == '-') ch = '_';
      return s;
    });

TEST(MoeLayoutsGpu, ExpertMlpMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (bool masked : {false, true}) {
    const int64_t E = 4, H = 256, I = 256, T = masked ? 96 : 200;
    const int64_t M = masked ? E * T : T;
    const std::vector<int64_t> counts = masked ? std::vector<int64_t>{96, 0, 5, 40} : std::vector<int64_t>{50, 0, 3, 100};
    auto f1 = reftest::randn(size_t(E * 2 * I * H), 61, 0.25f), f2 = reftest::randn(size_t(E * H * I), 62, 0.1f);
    std::vector<uint8_t> w1(size_t(E * 2 * I * H / 2)), s1(size_t(E * 2 * I * H / 32)), w2(size_t(E * H * I / 2)),
        s2(size_t(E * H * I / 32));
    quantize(TensorView(f1.data(), DType::kFloat32, {E, 2 * I, H}), BlockFormat::mxfp4(), ScaleLayout::row_major(),
             TensorView(w1.data(), DType::kUInt8, {E, 2 * I, H / 2}), TensorView(s1.data(), DType::kUE8M0, {E, 2 * I, H / 32}));
    quantize(TensorView(f2.data(), DType::kFloat32, {E, H, I}), BlockFormat::mxfp4(), ScaleLayout::row_major(),
             TensorView(w2.data(), DType::kUInt8, {E, H, I / 2}), TensorView(s2.data(), DType::kUE8M0, {E, H, I / 32}));
    auto b1 = reftest::randn(size_t(E * 2 * I), 63, 0.5f), b2 = reftest::randn(size_t(E * H), 64, 0.5f);
    auto xf = reftest::randn(size_t(M * H), 65, 1.0f);
    std::vector<uint16_t> x(xf.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = encode_bf16(xf[i]);
    auto args = [&](void* xp, void* cp, void* w1p, void* s1p, void* b1p, void* w2p, void* s2p, void* b2p, void* op,
                    Device dev) {
      ExpertMlpArgs a;
      a.x = masked ? TensorView(xp, DType::kBFloat16, {E, T, H}, dev) : TensorView(xp, DType::kBFloat16, {M, H}, dev);
      a.m_counts = TensorView(cp, DType::kInt64, {E}, dev);
      a.w1 = TensorView(w1p, DType::kUInt8, {E, 2 * I, H / 2}, dev);
      a.w1_scale = TensorView(s1p, DType::kUE8M0, {E, 2 * I, H / 32}, dev);
      a.b1 = TensorView(b1p, DType::kFloat32, {E, 2 * I}, dev);
      a.w2 = TensorView(w2p, DType::kUInt8, {E, H, I / 2}, dev);
      a.w2_scale = TensorView(s2p, DType::kUE8M0, {E, H, I / 32}, dev);
      a.b2 = TensorView(b2p, DType::kFloat32, {E, H}, dev);
      a.expected_m = 8;
      a.out = masked ? TensorView(op, DType::kFloat32, {E, T, H}, dev) : TensorView(op, DType::kFloat32, {M, H}, dev);
      return a;
    };
    std::vector<float> ref(size_t(M * H), 0.0f);
    std::vector<int64_t> hc(counts);
    gpt_oss_expert_mlp(args(x.data(), hc.data(), w1.data(), s1.data(), b1.data(), w2.data(), s2.data(), b2.data(),
                            ref.data(), Device::kCPU));
    Dev<uint16_t> dx(x);
    Dev<int64_t> dc(counts);
    Dev<uint8_t> dw1(w1), ds1(s1), dw2(w2), ds2(s2);
    Dev<float> db1(b1), db2(b2), dout(size_t(M * H));
    cudaMemset(dout.p, 0xFF, dout.n * 4);
    gpt_oss_expert_mlp(args(dx.p, dc.p, dw1.p, ds1.p, db1.p, dw2.p, ds2.p, db2.p, dout.p, Device::kCUDA));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dout.get();
    int64_t bad = 0;
    for (int64_t e = 0, r = 0; e < E; ++e)
      for (int64_t t = 0; t < (masked ? T : counts[size_t(e)]); ++t) {
        const int64_t row = masked ? e * T + t : r++;
        const bool in = t < counts[size_t(e)];
        for (int64_t h = 0; h < H; ++h) {
          const float v = got[size_t(row * H + h)], w = ref[size_t(row * H + h)];
          const bool fine = in ? std::fabs(double(v) - w) <= 1e-3 + 1e-3 * std::fabs(double(w)) : std::isnan(v);
          if (!fine && bad++ < 5)
            ADD_FAILURE() << (masked ? "masked" : "contig") << ": row " << row << " h " << h << " got " << v
                          << " want " << (in ? w : NAN);
        }
      }
    const int64_t used = counts[0] + counts[1] + counts[2] + counts[3];
    if (!masked)
      for (int64_t i = used * H; i < M * H; ++i)
        if (!std::isnan(got[size_t(i)]) && bad++ < 5) ADD_FAILURE() << "row beyond the counts written";
    EXPECT_EQ(bad, 0);
  }
}
