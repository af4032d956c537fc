// lowbit::kproj_rope_nf4_encode and lowbit::nf4_kcache_append on the GPU against the CPU
// reference (the same API on host buffers). Encode: the rotated keys equal the reference's (the
// fp64 projection sums and the frequencies are the reference's; the device's fp64 cos / sin may
// move a key by one fp32 ulp, very rarely) and the cache is bit for bit nf4_kcache_quantize of the GPU's keys.
// Append: bit for bit the reference, rescaled channels included. Outputs are poisoned with 0xFF
// bytes first. The full sweep lives in tests/python/test_decode_attention_gpu.py.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_test_util.hpp"
#include "lowbit/decode_attention.hpp"
#include "lowbit/kcache.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;

namespace {

using gputest::Dev;
using gputest::have_gpu;

bool have_kernel() {
  if (!have_gpu()) return false;
  const BuildInfo b = build_info();
  return std::find(b.cuda_ops.begin(), b.cuda_ops.end(), "nf4_kcache_append") != b.cuda_ops.end();
}

TensorView dev_view(void* p, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(p, t, dims, Device::kCUDA, 0);
}

template <typename T>
TensorView hv(std::vector<T>& v, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(v.data(), t, dims);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct EncodeCase {
  int64_t b, t, e, h, d;
  DType r_dtype;
  NibbleOrder order;
};

class GpuKprojEncode : public ::testing::TestWithParam<EncodeCase> {};

TEST_P(GpuKprojEncode, MatchesCpuReference) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a kernels in this build";
  const EncodeCase s = GetParam();
  const int64_t B = s.b, T = s.t, E = s.e, H = s.h, D = s.d;
  std::mt19937 rng(uint32_t(B * 131 + T * 7 + D));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> up(0, 100000);
  std::vector<float> x(size_t(B * T * E)), w(size_t(H * D * E));
  for (auto& v : x) v = n(rng);
  for (auto& v : w) v = n(rng) / std::sqrt(float(E));
  std::vector<int32_t> pos(size_t(B * T));
  for (auto& p : pos) p = up(rng);
  const size_t nk = size_t(B * T * H * D), nc = nk / 2, ns = size_t(B * H * D);
  KprojRopeArgs a;
  a.rope_theta = 500000.0;
  a.nibbles = s.order;
  // the CPU reference
  std::vector<uint8_t> c_ref(nc), r_ref(nk);
  std::vector<float> s_ref(ns), k_ref(nk);
  kproj_rope_nf4_encode(hv(x, DType::kFloat32, {B, T, E}), hv(w, DType::kFloat32, {H * D, E}),
                        hv(pos, DType::kInt32, {B, T}), D, hv(c_ref, DType::kUInt8, {B, T, H, D / 2}),
                        hv(s_ref, DType::kFloat32, {B, H, D}), hv(r_ref, s.r_dtype, {B, T, H, D}),
                        hv(k_ref, DType::kFloat32, {B, T, H, D}), a);
  // the GPU, outputs poisoned
  Dev<float> dx(x), dw(w), dk(nk), ds(ns);
  Dev<int32_t> dp(pos);
  Dev<uint8_t> dc(nc), dr(nk);
  cudaMemset(dk.p, 0xFF, nk * 4);
  cudaMemset(ds.p, 0xFF, ns * 4);
  cudaMemset(dc.p, 0xFF, nc);
  cudaMemset(dr.p, 0xFF, nk);
  kproj_rope_nf4_encode(dev_view(dx.p, DType::kFloat32, {B, T, E}), dev_view(dw.p, DType::kFloat32, {H * D, E}),
                        dev_view(dp.p, DType::kInt32, {B, T}), D, dev_view(dc.p, DType::kUInt8, {B, T, H, D / 2}),
                        dev_view(ds.p, DType::kFloat32, {B, H, D}), dev_view(dr.p, s.r_dtype, {B, T, H, D}),
                        dev_view(dk.p, DType::kFloat32, {B, T, H, D}), a);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> k = dk.get(), sc = ds.get();
  const std::vector<uint8_t> codes = dc.get(), res = dr.get();
  // the keys: equal, or one fp32 ulp apart in a few elements
  size_t differ = 0;
  for (size_t i = 0; i < nk; ++i) {
    const int64_t dist = std::llabs(int64_t(bits(k[i])) - int64_t(bits(k_ref[i])));
    ASSERT_LE(dist, 1) << "key " << i << ": " << k[i] << " vs " << k_ref[i];
    differ += dist != 0;
  }
  EXPECT_LE(differ, std::max<size_t>(2, nk / 100000));
  // the cache: exactly nf4_kcache_quantize of the GPU's keys (the reference's cache when the keys agree)
  std::vector<uint8_t> c_q(nc), r_q(nk);
  std::vector<float> s_q(ns);
  std::vector<float> kk = k;
  nf4_kcache_quantize(hv(kk, DType::kFloat32, {B, T, H, D}), hv(c_q, DType::kUInt8, {B, T, H, D / 2}),
                      hv(s_q, DType::kFloat32, {B, H, D}), hv(r_q, s.r_dtype, {B, T, H, D}),
                      s.order);
  for (size_t i = 0; i < ns; ++i) ASSERT_EQ(bits(sc[i]), bits(s_q[i])) << "scale " << i;
  EXPECT_EQ(codes, c_q);
  EXPECT_EQ(res, r_q);
  if (differ == 0) {
    for (size_t i = 0; i < ns; ++i) ASSERT_EQ(bits(sc[i]), bits(s_ref[i])) << "scale " << i;
    EXPECT_EQ(codes, c_ref);
    EXPECT_EQ(res, r_ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuKprojEncode,
                         ::testing::Values(EncodeCase{1, 1, 64, 1, 64, DType::kE5M2, NibbleOrder::kLowFirst},
                                           EncodeCase{3, 37, 96, 8, 128, DType::kE4M3, NibbleOrder::kHighFirst},
                                           EncodeCase{2, 129, 200, 1, 256, DType::kE5M2, NibbleOrder::kHighFirst},
                                           EncodeCase{4, 1, 72, 8, 256, DType::kE4M3, NibbleOrder::kLowFirst},
                                           EncodeCase{2, 5, 16, 3, 6, DType::kE5M2, NibbleOrder::kLowFirst}));

struct AppendCase {
  int64_t b, t, h, d, n;
  DType r_dtype;
  NibbleOrder order;
};

class GpuKcacheAppend : public ::testing::TestWithParam<AppendCase> {};

TEST_P(GpuKcacheAppend, MatchesCpuReferenceBitForBit) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a kernels in this build";
  const AppendCase s = GetParam();
  const int64_t B = s.b, T = s.t, H = s.h, D = s.d, N = s.n;
  std::mt19937 rng(uint32_t(T * 17 + D + N));
  std::normal_distribution<float> n(0.0f, 1.0f);
  // a cache holding lengths[b] tokens (sequence 0 full, 1 empty), garbage past them
  std::vector<int32_t> lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    lens[size_t(b)] = b == 0 ? int32_t(T - N) : b == 1 ? 0 : int32_t(rng() % uint32_t(T - N + 1));
  std::vector<float> k(size_t(B * T * H * D));
  for (auto& v : k) v = n(rng);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = int64_t(lens[size_t(b)]) * H * D; i < T * H * D; ++i) k[size_t(b * T * H * D + i)] = 0.0f;
  std::vector<uint8_t> codes(size_t(B * T * H * D / 2)), res(size_t(B * T * H * D));
  std::vector<float> scale(size_t(B * H * D));
  nf4_kcache_quantize(hv(k, DType::kFloat32, {B, T, H, D}), hv(codes, DType::kUInt8, {B, T, H, D / 2}),
                      hv(scale, DType::kFloat32, {B, H, D}), hv(res, s.r_dtype, {B, T, H, D}),
                      s.order);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lens[size_t(b)];
    std::fill(codes.begin() + (b * T + L) * H * D / 2, codes.begin() + (b + 1) * T * H * D / 2, uint8_t(0xA5));
    std::fill(res.begin() + (b * T + L) * H * D, res.begin() + (b + 1) * T * H * D, uint8_t(0x3C));
  }
  // new keys: about a quarter of the channels outgrow their scale; one NaN, one Inf
  std::vector<float> kn(size_t(B * N * H * D));
  std::vector<bool> grow(size_t(B * H * D));
  for (size_t i = 0; i < grow.size(); ++i) grow[i] = rng() % 4 == 0;
  for (size_t i = 0; i < kn.size(); ++i) {
    const size_t bh_d = (i / size_t(N * H * D)) * size_t(H * D) + i % size_t(H * D);
    kn[i] = n(rng) * (grow[bh_d] ? 4.0f : 0.5f);
  }
  if (D > 6) {
    kn[3] = std::numeric_limits<float>::quiet_NaN();
    kn[kn.size() - 2] = std::numeric_limits<float>::infinity();
  }
  Dev<float> dkn(kn), ds(scale);
  Dev<uint8_t> dc(codes), dr(res);
  Dev<int32_t> dl(lens);
  nf4_kcache_append(dev_view(dkn.p, DType::kFloat32, {B, N, H, D}), dev_view(dc.p, DType::kUInt8, {B, T, H, D / 2}),
                    dev_view(ds.p, DType::kFloat32, {B, H, D}), dev_view(dr.p, s.r_dtype, {B, T, H, D}),
                    dev_view(dl.p, DType::kInt32, {B}), TensorView(), s.order);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> s_before = scale;
  nf4_kcache_append(hv(kn, DType::kFloat32, {B, N, H, D}), hv(codes, DType::kUInt8, {B, T, H, D / 2}),
                    hv(scale, DType::kFloat32, {B, H, D}), hv(res, s.r_dtype, {B, T, H, D}),
                    hv(lens, DType::kInt32, {B}), TensorView(), s.order);
  bool rescaled = false;
  for (size_t i = 0; i < scale.size(); ++i) rescaled |= scale[i] > s_before[i];
  EXPECT_TRUE(rescaled);
  const std::vector<float> sg = ds.get();
  for (size_t i = 0; i < scale.size(); ++i) ASSERT_EQ(bits(sg[i]), bits(scale[i])) << "scale " << i;
  EXPECT_EQ(dc.get(), codes);
  EXPECT_EQ(dr.get(), res);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuKcacheAppend,
                         ::testing::Values(AppendCase{1, 1, 1, 64, 1, DType::kE5M2, NibbleOrder::kLowFirst},
                                           AppendCase{4, 300, 8, 128, 1, DType::kE4M3, NibbleOrder::kHighFirst},
                                           AppendCase{3, 77, 8, 256, 5, DType::kE5M2, NibbleOrder::kHighFirst},
                                           AppendCase{2, 1000, 1, 128, 16, DType::kE4M3, NibbleOrder::kLowFirst},
                                           AppendCase{2, 9, 3, 6, 2, DType::kE5M2, NibbleOrder::kLowFirst}));

}  // namespace
