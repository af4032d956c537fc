// The kernels of src/cuda/attention/sm90_nf4_encode.cu (kproj_rope_nf4_encode, nf4_kcache_append)
// run on the CPU through the host emulation of tests/cpp/emu/ (the build rewrites their launches
// and namespace: tests/cpp/CMakeLists.txt), compared bit for bit with the CPU reference. This
// checks the kernels' indexing, tiling, grid-stride loops and arithmetic on machines without a
// GPU (CTAs run one after the other, the device math library is the host's, the hardware codecs
// are their software definitions); the GPU tests (gpu_test_kcache_encode.cpp,
// tests/python/test_decode_attention_gpu.py) remain the test of the kernels on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/plan_decode.hpp"
#include "lowbit/decode_attention.hpp"
#include "lowbit/ops.hpp"

namespace lowbit::cuda_emu {
int kproj_rope_nf4_encode(const detail::KprojRopePlan& plan, void* stream);
int nf4_kcache_append(const detail::KCacheAppendPlan& plan, void* stream);
}  // namespace lowbit::cuda_emu

using namespace lowbit;

namespace {

template <typename T>
TensorView tv(std::vector<T>& v, DType t, std::initializer_list<int64_t> d) {
  return TensorView(v.data(), t, d);
}

size_t count_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}
size_t count_diff(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += float_bits(a[i]) != float_bits(b[i]);
  return n;
}

// The plan src/api/decode_attention.cpp fills for contiguous x [B, T, E], w [H*D, E] (both of
// x_dtype), positions [B, T], k_out [B, T, H, D] (or none) and the cache's codes / scales / residuals.
detail::KprojRopePlan contiguous_plan(int64_t B, int64_t T, int64_t E, int64_t H, int64_t D, const void* x,
                                      DType x_dtype, const void* w, const void* pos, bool pos64, float* k_out,
                                      uint8_t* codes, float* scale, uint8_t* residual, DType r_dtype) {
  detail::KprojRopePlan p;
  p.batch = B;
  p.seqlen = T;
  p.hidden = E;
  p.heads_kv = H;
  p.head_dim = D;
  p.x = x;
  p.x_dtype = x_dtype;
  p.x_stride[0] = T * E;
  p.x_stride[1] = E;
  p.x_stride[2] = 1;
  p.w = w;
  p.w_dtype = x_dtype;
  p.w_stride[0] = E;
  p.w_stride[1] = 1;
  p.positions = pos;
  p.positions64 = pos64;
  p.p_stride[0] = T;
  p.p_stride[1] = 1;
  if (k_out) {
    p.k_out = k_out;
    p.ko_stride[0] = T * H * D;
    p.ko_stride[1] = H * D;
    p.ko_stride[2] = D;
  }
  detail::KCachePlan& kc = p.cache;
  kc.B = B;
  kc.T = T;
  kc.H = H;
  kc.D = D;
  kc.codes = codes;
  kc.scale = scale;
  kc.residual = residual;
  kc.r_dtype = r_dtype;
  const int64_t cs[4] = {T * H * D / 2, H * D / 2, D / 2, 1}, rs[4] = {T * H * D, H * D, D, 1};
  for (int i = 0; i < 4; ++i) {
    kc.c_s[i] = cs[i];
    kc.r_s[i] = rs[i];
  }
  kc.s_s[0] = H * D;
  kc.s_s[1] = D;
  kc.s_s[2] = 1;
  return p;
}

struct EncodeCase {
  int64_t b, t, e, h, d;
  DType r_dtype;
  NibbleOrder order;
  bool k_out, pos64;
};

class EmuKprojEncode : public ::testing::TestWithParam<EncodeCase> {};

TEST_P(EmuKprojEncode, MatchesCpuReferenceBitForBit) {
  const EncodeCase s = GetParam();
  const int64_t B = s.b, T = s.t, E = s.e, H = s.h, D = s.d;
  std::mt19937 rng(uint32_t(B * 7 + T * 3 + D + E));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(B * T * E)), w(size_t(H * D * E));
  for (auto& v : x) v = n(rng);
  for (auto& v : w) v = n(rng) / std::sqrt(float(E));
  std::vector<int64_t> pos(size_t(B * T));
  for (auto& p : pos) p = int64_t(rng() % 100000);
  std::vector<int32_t> pos32(pos.begin(), pos.end());
  const size_t nk = size_t(B * T * H * D), nc = nk / 2, ns = size_t(B * H * D);
  std::vector<uint8_t> c_ref(nc), r_ref(nk), c(nc, 0xFF), r(nk, 0xFF);
  std::vector<float> s_ref(ns), k_ref(nk), sc(ns, -1.0f), k(nk, -7.0f);
  KprojRopeArgs a;
  a.rope_theta = 500000.0;
  a.nibbles = s.order;
  const TensorView pv = s.pos64 ? tv(pos, DType::kInt64, {B, T}) : tv(pos32, DType::kInt32, {B, T});
  kproj_rope_nf4_encode(tv(x, DType::kFloat32, {B, T, E}), tv(w, DType::kFloat32, {H * D, E}), pv, D,
                        tv(c_ref, DType::kUInt8, {B, T, H, D / 2}), tv(s_ref, DType::kFloat32, {B, H, D}),
                        tv(r_ref, s.r_dtype, {B, T, H, D}), tv(k_ref, DType::kFloat32, {B, T, H, D}), a);
  detail::KprojRopePlan p = contiguous_plan(B, T, E, H, D, x.data(), DType::kFloat32, w.data(),
                                             s.pos64 ? static_cast<const void*>(pos.data()) : pos32.data(),
                                             s.pos64, s.k_out ? k.data() : nullptr, c.data(), sc.data(), r.data(),
                                             s.r_dtype);
  p.rope_theta = a.rope_theta;
  p.cache.order = s.order;
  ASSERT_EQ(cuda_emu::kproj_rope_nf4_encode(p, nullptr), 0);
  if (s.k_out) EXPECT_EQ(count_diff(k, k_ref), 0u);
  EXPECT_EQ(count_diff(sc, s_ref), 0u);
  EXPECT_EQ(count_diff(c, c_ref), 0u);
  EXPECT_EQ(count_diff(r, r_ref), 0u);
}

// several token-row tiles with sequence boundaries inside them, pair tiles across heads, D = 6
// (the per-pair encode), keys in k_out or in scratch
INSTANTIATE_TEST_SUITE_P(
    Shapes, EmuKprojEncode,
    ::testing::Values(EncodeCase{1, 1, 64, 1, 64, DType::kE5M2, NibbleOrder::kLowFirst, true, false},
                      EncodeCase{3, 37, 96, 8, 128, DType::kE4M3, NibbleOrder::kHighFirst, true, true},
                      EncodeCase{2, 129, 40, 1, 256, DType::kE5M2, NibbleOrder::kHighFirst, false, false},
                      EncodeCase{4, 1, 72, 8, 256, DType::kE4M3, NibbleOrder::kLowFirst, true, false},
                      EncodeCase{2, 5, 16, 3, 6, DType::kE5M2, NibbleOrder::kLowFirst, true, true},
                      EncodeCase{2, 70, 33, 2, 64, DType::kE5M2, NibbleOrder::kLowFirst, false, true}));

// The tensor-core projection (bf16 / fp16 x and w_k): mma.sync fragments emulated with fp32 sums in
// k order, so the keys differ from the reference's fp64-summed ones by fp32 accumulation error:
// |k - k_ref| <= E 2^-24 (S(c) + S(c + D/2)) + 2^-23 |k_ref| with S = sum |x_i w_i| of the
// channel's two projections; the cache is exactly nf4_kcache_quantize of the kernel's keys.
struct TcCase {
  int64_t b, t, e, h, d;
  bool fp16;
};

class EmuKprojEncodeTc : public ::testing::TestWithParam<TcCase> {};

TEST_P(EmuKprojEncodeTc, KeysWithinFp32SumsAndCacheOfThem) {
  const TcCase s = GetParam();
  const int64_t B = s.b, T = s.t, E = s.e, H = s.h, D = s.d;
  const DType dt = s.fp16 ? DType::kFloat16 : DType::kBFloat16;
  std::mt19937 rng(uint32_t(B * 11 + T * 5 + D + E));
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto enc = [&](float v) { return s.fp16 ? encode_fp16(v) : encode_bf16(v); };
  auto dec = [&](uint16_t v) { return double(s.fp16 ? decode_fp16(v) : decode_bf16(v)); };
  std::vector<uint16_t> x(size_t(B * T * E)), w(size_t(H * D * E));
  for (auto& v : x) v = enc(n(rng));
  for (auto& v : w) v = enc(n(rng) / std::sqrt(float(E)));
  std::vector<int32_t> pos(size_t(B * T));
  for (auto& v : pos) v = int32_t(rng() % 100000);
  const size_t nk = size_t(B * T * H * D), nc = nk / 2, ns = size_t(B * H * D);
  std::vector<uint8_t> c_ref(nc), r_ref(nk), c(nc, 0xFF), r(nk, 0xFF);
  std::vector<float> s_ref(ns), k_ref(nk), sc(ns, -1.0f), k(nk, -7.0f);
  KprojRopeArgs a;
  kproj_rope_nf4_encode(TensorView(x.data(), dt, {B, T, E}), TensorView(w.data(), dt, {H * D, E}),
                        tv(pos, DType::kInt32, {B, T}), D, tv(c_ref, DType::kUInt8, {B, T, H, D / 2}),
                        tv(s_ref, DType::kFloat32, {B, H, D}), tv(r_ref, DType::kE5M2, {B, T, H, D}),
                        tv(k_ref, DType::kFloat32, {B, T, H, D}), a);
  detail::KprojRopePlan p = contiguous_plan(B, T, E, H, D, x.data(), dt, w.data(), pos.data(), false, k.data(),
                                             c.data(), sc.data(), r.data(), DType::kE5M2);
  p.rope_theta = a.rope_theta;
  ASSERT_EQ(cuda_emu::kproj_rope_nf4_encode(p, nullptr), 0);
  size_t exact = 0;
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t ch = 0; ch < D; ++ch) {
        double S = 0;  // sum |x_i w_i| of the channel's two projections (c and its rotation partner)
        for (const int64_t cc : {ch % (D / 2), ch % (D / 2) + D / 2})
          for (int64_t i = 0; i < E; ++i) S += std::fabs(dec(x[size_t(bt * E + i)]) * dec(w[size_t((h * D + cc) * E + i)]));
        const size_t at = size_t((bt * H + h) * D + ch);
        const double bound = double(E) * std::ldexp(S, -24) + std::ldexp(std::fabs(double(k_ref[at])), -23);
        ASSERT_LE(std::fabs(double(k[at]) - double(k_ref[at])), bound) << "key " << at;
        exact += float_bits(k[at]) == float_bits(k_ref[at]);
      }
  EXPECT_GT(exact, nk / 4) << "most keys should still be the reference's";
  std::vector<uint8_t> c_q(nc), r_q(nk);
  std::vector<float> s_q(ns);
  nf4_kcache_quantize(tv(k, DType::kFloat32, {B, T, H, D}), tv(c_q, DType::kUInt8, {B, T, H, D / 2}),
                      tv(s_q, DType::kFloat32, {B, H, D}), tv(r_q, DType::kE5M2, {B, T, H, D}));
  EXPECT_EQ(count_diff(sc, s_q), 0u);
  EXPECT_EQ(count_diff(c, c_q), 0u);
  EXPECT_EQ(count_diff(r, r_q), 0u);
}

// tiles of token rows with sequence boundaries inside, hidden tails (not a multiple of 32), both
// operand dtypes, pair tiles across heads
INSTANTIATE_TEST_SUITE_P(Shapes, EmuKprojEncodeTc,
                         ::testing::Values(TcCase{2, 77, 72, 2, 128, false}, TcCase{1, 130, 40, 3, 64, true},
                                           TcCase{3, 5, 256, 1, 64, false}, TcCase{1, 1, 8, 1, 256, true}));

struct AppendCase {
  int64_t b, t, h, d, n;
  DType r_dtype;
  NibbleOrder order;
  DType k_dtype;
};

class EmuKcacheAppend : public ::testing::TestWithParam<AppendCase> {};

TEST_P(EmuKcacheAppend, MatchesCpuReferenceBitForBit) {
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
  nf4_kcache_quantize(tv(k, DType::kFloat32, {B, T, H, D}), tv(codes, DType::kUInt8, {B, T, H, D / 2}),
                      tv(scale, DType::kFloat32, {B, H, D}), tv(res, s.r_dtype, {B, T, H, D}), s.order);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lens[size_t(b)];
    std::fill(codes.begin() + (b * T + L) * H * D / 2, codes.begin() + (b + 1) * T * H * D / 2, uint8_t(0xA5));
    std::fill(res.begin() + (b * T + L) * H * D, res.begin() + (b + 1) * T * H * D, uint8_t(0x3C));
  }
  // new keys: about a quarter of the channels outgrow their scale; NaN and +-Inf among them
  std::vector<float> kn(size_t(B * N * H * D));
  std::vector<char> grow(size_t(B * H * D));
  for (auto& g : grow) g = rng() % 4 == 0;
  for (size_t i = 0; i < kn.size(); ++i)
    kn[i] = n(rng) * (grow[(i / size_t(N * H * D)) * size_t(H * D) + i % size_t(H * D)] ? 4.0f : 0.5f);
  if (D > 6) {
    kn[3] = std::numeric_limits<float>::quiet_NaN();
    kn[kn.size() - 2] = std::numeric_limits<float>::infinity();
    kn[kn.size() - 5] = -std::numeric_limits<float>::infinity();
  }
  std::vector<uint16_t> knb(kn.size());
  for (size_t i = 0; i < kn.size(); ++i) knb[i] = encode_bf16(kn[i]);
  void* kp = s.k_dtype == DType::kFloat32 ? static_cast<void*>(kn.data()) : static_cast<void*>(knb.data());
  std::vector<uint8_t> c2 = codes, r2 = res;
  std::vector<float> s2 = scale;
  const std::vector<uint8_t> c_before = codes, r_before = res;  // for the paged run below
  const std::vector<float> s_before = scale;
  nf4_kcache_append(TensorView(kp, s.k_dtype, {B, N, H, D}), tv(codes, DType::kUInt8, {B, T, H, D / 2}),
                    tv(scale, DType::kFloat32, {B, H, D}), tv(res, s.r_dtype, {B, T, H, D}),
                    tv(lens, DType::kInt32, {B}), TensorView(), s.order);
  detail::KCacheAppendPlan p;  // as src/api/decode_attention.cpp fills it for contiguous tensors
  detail::KCachePlan& kc = p.cache;
  kc.B = B;
  kc.T = N;
  kc.H = H;
  kc.D = D;
  kc.k = kp;
  kc.k_dtype = s.k_dtype;
  const int64_t ks[4] = {N * H * D, H * D, D, 1}, cs[4] = {T * H * D / 2, H * D / 2, D / 2, 1},
                rs[4] = {T * H * D, H * D, D, 1};
  for (int i = 0; i < 4; ++i) {
    kc.k_s[i] = ks[i];
    kc.c_s[i] = cs[i];
    kc.r_s[i] = rs[i];
  }
  kc.codes = c2.data();
  kc.scale = s2.data();
  kc.residual = r2.data();
  kc.r_dtype = s.r_dtype;
  kc.order = s.order;
  kc.s_s[0] = H * D;
  kc.s_s[1] = D;
  kc.s_s[2] = 1;
  p.cache_T = T;
  p.lengths = lens.data();
  p.lengths_device = lens.data();
  ASSERT_EQ(cuda_emu::nf4_kcache_append(p, nullptr), 0);
  EXPECT_EQ(count_diff(s2, scale), 0u);
  EXPECT_EQ(count_diff(c2, codes), 0u);
  EXPECT_EQ(count_diff(r2, res), 0u);

  // the same append into a paged copy of the cache (pages of 8 tokens in random order): the bytes
  // of every token a sequence holds afterwards, gathered back, are the dense call's
  const int64_t P = 8, per = (T + P - 1) / P, pages = B * per + 1;
  std::vector<int32_t> perm(static_cast<size_t>(pages)), table(static_cast<size_t>(B * per));
  for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::copy(perm.begin(), perm.begin() + B * per, table.begin());
  const int64_t crow = H * D / 2, rrow = H * D;  // bytes of one token's codes / residuals
  std::vector<uint8_t> pc(size_t(pages * P * crow), 0xEE), pr(size_t(pages * P * rrow), 0xEE);
  auto row = [&](int64_t b, int64_t t) { return int64_t(table[size_t(b * per + t / P)]) * P + t % P; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(c_before.begin() + (b * T + t) * crow, crow, pc.begin() + row(b, t) * crow);
      std::copy_n(r_before.begin() + (b * T + t) * rrow, rrow, pr.begin() + row(b, t) * rrow);
    }
  std::vector<float> ps = s_before;
  const int64_t pcs[4] = {P * crow, crow, D / 2, 1}, prs[4] = {P * rrow, rrow, D, 1};
  for (int i = 0; i < 4; ++i) {
    kc.c_s[i] = pcs[i];
    kc.r_s[i] = prs[i];
  }
  kc.codes = pc.data();
  kc.residual = pr.data();
  kc.scale = ps.data();
  p.cache_T = per * P;
  p.pages.table = table.data();
  p.pages.table_stride = per;
  p.pages.pages = pages;
  p.pages.shift = 3;
  ASSERT_EQ(cuda_emu::nf4_kcache_append(p, nullptr), 0);
  EXPECT_EQ(count_diff(ps, scale), 0u);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < lens[size_t(b)] + N; ++t) {
      ASSERT_TRUE(std::equal(pc.begin() + row(b, t) * crow, pc.begin() + (row(b, t) + 1) * crow,
                             codes.begin() + (b * T + t) * crow)) << "codes of (" << b << ", " << t << ")";
      ASSERT_TRUE(std::equal(pr.begin() + row(b, t) * rrow, pr.begin() + (row(b, t) + 1) * rrow,
                             res.begin() + (b * T + t) * rrow)) << "residuals of (" << b << ", " << t << ")";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmuKcacheAppend,
    ::testing::Values(AppendCase{1, 1, 1, 64, 1, DType::kE5M2, NibbleOrder::kLowFirst, DType::kFloat32},
                      AppendCase{4, 300, 8, 128, 1, DType::kE4M3, NibbleOrder::kHighFirst, DType::kBFloat16},
                      AppendCase{3, 77, 8, 256, 5, DType::kE5M2, NibbleOrder::kHighFirst, DType::kFloat32},
                      AppendCase{2, 1000, 1, 128, 16, DType::kE4M3, NibbleOrder::kLowFirst, DType::kBFloat16},
                      AppendCase{2, 9, 3, 6, 2, DType::kE5M2, NibbleOrder::kLowFirst, DType::kFloat32}));

}  // namespace
