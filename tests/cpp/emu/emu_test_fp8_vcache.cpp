// The kernels of src/cuda/attention/sm90_fp8_vcache.cu (fp8_vcache_quantize, fp8_vcache_append) run
// on the CPU through the host emulation of tests/cpp/emu/ (the build rewrites their launches and
// namespace: tests/cpp/CMakeLists.txt), compared bit for bit with the CPU reference
// (src/ref/ref_vcache.cpp): indexing, strides, the amax folding and the rescale of the append on
// machines without a GPU; tests/python/test_decode_attention_gpu.py remains the test on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/plan_decode.hpp"
#include "lowbit/codecs.hpp"
#include "ref/ref_decode_attention.hpp"

namespace lowbit::cuda_emu {
int fp8_vcache_quantize(const detail::VCachePlan& plan, void* stream);
int fp8_vcache_append(const detail::VCacheAppendPlan& plan, void* stream);
}  // namespace lowbit::cuda_emu

using namespace lowbit;

namespace {

struct VCase {
  int64_t b, t, h, d;
  bool e5m2, strided;
};

/// Values [B, T, H, D] (strided: token-major storage of twice the heads, every other head used)
/// with channel magnitudes 2^-20 .. 2^20, a subnormal channel and non-finite values.
struct Values {
  std::vector<float> buf;
  detail::VCachePlan plan;
};

Values make_values(const VCase& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t hs = s.strided ? 2 * s.h : s.h;
  Values v;
  v.buf.resize(size_t(s.b * s.t * hs * s.d));
  for (size_t i = 0; i < v.buf.size(); ++i) {
    const int64_t d = int64_t(i) % s.d;
    v.buf[i] = n(rng) * std::ldexp(1.0f, int(d % 41) - 20);
    if (d == 3) v.buf[i] *= 1e-38f;  // subnormal values
  }
  v.buf[5] = std::numeric_limits<float>::quiet_NaN();
  v.buf[v.buf.size() / 2] = -std::numeric_limits<float>::infinity();
  detail::VCachePlan& p = v.plan;
  p.B = s.b; p.T = s.t; p.H = s.h; p.D = s.d;
  p.v = v.buf.data();
  p.v_dtype = DType::kFloat32;
  const int64_t st[4] = {s.t * hs * s.d, hs * s.d, s.strided ? 2 * s.d : s.d, 1};
  for (int i = 0; i < 4; ++i) p.v_s[i] = st[i];
  p.e5m2 = s.e5m2;
  return v;
}

void set_cache(detail::VCachePlan& p, int64_t T, std::vector<uint8_t>& codes, std::vector<float>& scale) {
  p.codes = codes.data();
  p.scale = scale.data();
  const int64_t cs[4] = {T * p.H * p.D, p.H * p.D, p.D, 1}, ss[3] = {p.H * p.D, p.D, 1};
  for (int i = 0; i < 4; ++i) p.c_s[i] = cs[i];
  for (int i = 0; i < 3; ++i) p.s_s[i] = ss[i];
}

class EmuVcache : public ::testing::TestWithParam<VCase> {};

TEST_P(EmuVcache, QuantizeAndAppendMatchCpuReferenceBitForBit) {
  const VCase s = GetParam();
  Values v = make_values(s, uint32_t(s.t * 13 + s.d));
  const size_t nc = size_t(s.b * s.t * s.h * s.d), ns = size_t(s.b * s.h * s.d);
  std::vector<uint8_t> c_ref(nc, 0xAA), c_emu(nc, 0x55);
  std::vector<float> s_ref(ns, -1.f), s_emu(ns, -2.f);
  detail::VCachePlan p = v.plan;
  set_cache(p, s.t, c_ref, s_ref);
  ref::fp8_vcache_quantize(p);
  set_cache(p, s.t, c_emu, s_emu);
  ASSERT_EQ(cuda_emu::fp8_vcache_quantize(p, nullptr), 0);
  EXPECT_EQ(c_emu, c_ref) << "quantize codes";
  for (size_t i = 0; i < ns; ++i) ASSERT_EQ(float_bits(s_emu[i]), float_bits(s_ref[i])) << "quantize scale " << i;

  // append in three steps into a cache of T + 8 tokens: the first into an empty cache, the last
  // outgrowing some channels (x 1000); ragged lengths. The emulated kernels write a dense cache and
  // a paged copy (pages of 4 tokens in random order), both compared with the reference.
  const int64_t T = s.t + 8, P = 4, per = (T + P - 1) / P, pages = s.b * per + 1, tok = s.h * s.d;
  std::vector<uint8_t> a_ref(size_t(s.b * T * tok), 0x11), a_emu = a_ref, a_pag(size_t(pages * P * tok), 0x11);
  std::vector<float> as_ref(ns, 0.f), as_emu(ns, 0.f), as_pag(ns, 0.f);
  std::vector<int32_t> perm(static_cast<size_t>(pages)), table(static_cast<size_t>(s.b * per));
  for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = int32_t(i);
  std::mt19937 shuf{uint32_t(T)};
  std::shuffle(perm.begin(), perm.end(), shuf);
  std::copy(perm.begin(), perm.begin() + s.b * per, table.begin());
  auto row = [&](int64_t b, int64_t t) { return int64_t(table[size_t(b * per + t / P)]) * P + t % P; };
  std::vector<int32_t> lens(size_t(s.b));
  const int64_t steps[3] = {s.t / 2, s.t - s.t / 2, 8};
  int64_t done = 0;
  for (int k = 0; k < 3; ++k) {
    if (steps[k] == 0) continue;
    std::vector<float> grow;
    detail::VCacheAppendPlan a;
    a.cache = v.plan;
    a.cache.T = steps[k];
    if (k < 2) {
      a.cache.v = v.buf.data() + done * v.plan.v_s[1];
    } else {  // up to 8 new tokens: copies of the first ones, a third of the channels x 1000
      grow = v.buf;
      for (size_t i = 0; i < grow.size(); ++i)
        if (int64_t(i) % s.d % 3 == 0) grow[i] *= 1000.f;
      a.cache.v = grow.data();
      a.cache.T = std::min<int64_t>(8, s.t);
    }
    for (int64_t b = 0; b < s.b; ++b) lens[size_t(b)] = int32_t(std::max<int64_t>(0, done - b % 2));
    a.cache_T = T;
    a.lengths = lens.data();
    a.lengths_device = lens.data();
    set_cache(a.cache, T, a_ref, as_ref);
    ref::fp8_vcache_append(a);
    set_cache(a.cache, T, a_emu, as_emu);
    ASSERT_EQ(cuda_emu::fp8_vcache_append(a, nullptr), 0);
    ASSERT_EQ(a_emu, a_ref) << "append step " << k;
    for (size_t i = 0; i < ns; ++i) ASSERT_EQ(float_bits(as_emu[i]), float_bits(as_ref[i])) << "append scale " << i;
    set_cache(a.cache, P, a_pag, as_pag);  // codes [pages, P, H, D]
    a.cache_T = per * P;
    a.pages.table = table.data();
    a.pages.table_stride = per;
    a.pages.pages = pages;
    a.pages.shift = 2;
    ASSERT_EQ(cuda_emu::fp8_vcache_append(a, nullptr), 0);
    for (size_t i = 0; i < ns; ++i) ASSERT_EQ(float_bits(as_pag[i]), float_bits(as_ref[i])) << "paged scale " << i;
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < T; ++t)
        ASSERT_TRUE(std::equal(a_pag.begin() + row(b, t) * tok, a_pag.begin() + (row(b, t) + 1) * tok,
                               a_ref.begin() + (b * T + t) * tok))
            << "paged append step " << k << ", token (" << b << ", " << t << ")";
    done += a.cache.T;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, EmuVcache,
                         ::testing::Values(VCase{2, 70, 2, 64, false, false}, VCase{1, 130, 3, 128, true, true},
                                           VCase{3, 5, 1, 64, false, true}, VCase{1, 1, 2, 256, true, false}),
                         [](const ::testing::TestParamInfo<VCase>& i) {
                           const VCase& c = i.param;
                           return "b" + std::to_string(c.b) + "_t" + std::to_string(c.t) + "_h" + std::to_string(c.h) +
                                  "_d" + std::to_string(c.d) + (c.e5m2 ? "_e5m2" : "_e4m3") +
                                  (c.strided ? "_strided" : "");
                         });

}  // namespace
