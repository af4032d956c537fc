// Dense linears on the GPU: mxfp4_gemm (the grouped MXFP4 kernel with one group) against the CPU
// reference run on the same bytes, every element within 1e-3 + 1e-3 |ref| plus one output ulp
// (the GEMM rule; the ulp covers the final rounding of two fp32 sums that differ in order), outputs
// poisoned (NaN) before the call; and nvfp4_gemm's CUDA kernel refusing partial 128 x 64 tiles with NotSupportedError
// after validation (no kernel yet), its output untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lowbit/gemm.hpp"

using namespace lowbit;
using gputest::Dev;
using gputest::have_gpu;

namespace {

struct Case {
  int64_t M, N, K;
  DType a;  // kBFloat16 (W4A16) or kE4M3 / kE5M2 (W4A8)
  bool blocked, bias, packed, fp16_out;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "M=" << c.M << " N=" << c.N << " K=" << c.K << " a=" << dtype_name(c.a) << (c.blocked ? " blocked" : "")
      << (c.bias ? " bias" : "") << (c.packed ? " packed" : "") << (c.fp16_out ? " fp16" : " bf16");
}

double decode_out(uint16_t v, bool fp16) { return fp16 ? double(decode_fp16(v)) : double(decode_bf16(v)); }

double ulp_at(double r, bool fp16) {
  const int p = fp16 ? 10 : 7, emin = fp16 ? -14 : -126;
  int ex = emin + 1;
  if (r != 0) std::frexp(std::fabs(r), &ex);
  return std::ldexp(1.0, std::max(ex - 1, emin) - p);
}

/// The blocked128x4 bytes of a row-major R x C scale matrix (zero padding).
std::vector<uint8_t> blocked(const std::vector<uint8_t>& rm, int64_t R, int64_t C) {
  const int64_t Rp = (R + 127) / 128 * 128, Cp = (C + 3) / 4 * 4;
  std::vector<uint8_t> out(size_t(Rp * Cp), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[size_t(scale_offset(ScaleLayout::blocked128x4(), Rp, C, r, c))] = rm[size_t(r * C + c)];
  return out;
}

}  // namespace

class Mxfp4GemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(Mxfp4GemmGpu, MatchesCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case t = GetParam();
  const int64_t M = t.M, N = t.N, K = t.K;
  std::mt19937 rng(uint32_t(M * 13 + N + K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> b(size_t(N * K / 2)), bs_rm(size_t(N * K / 32)), a8(size_t(M * K)), as_rm(size_t(M * K / 32));
  std::vector<uint16_t> abf(size_t(M * K));
  std::vector<float> bias(static_cast<size_t>(N));
  for (auto& v : b) v = uint8_t(rng());
  for (auto& v : bs_rm) v = uint8_t(116 + rng() % 7);
  for (auto& v : abf) v = encode_bf16(nd(rng));
  for (auto& v : a8) v = t.a == DType::kE5M2 ? encode_e5m2(4 * nd(rng)) : encode_e4m3(4 * nd(rng));
  for (auto& v : as_rm) v = uint8_t(121 + rng() % 8);
  for (auto& v : bias) v = nd(rng);
  const std::vector<uint8_t> bs = t.blocked ? blocked(bs_rm, N, K / 32) : bs_rm;
  const std::vector<uint8_t> as = t.blocked ? blocked(as_rm, M, K / 32) : as_rm;
  const ScaleLayout layout = t.blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  const int64_t Np = (N + 127) / 128 * 128, Kp = (K + 255) / 256 * 256;
  std::vector<uint8_t> pb(size_t(Np * Kp / 2)), ps(size_t(Np * Kp / 32));
  if (t.packed)
    group_gemm_mxfp4_prepack(TensorView(b.data(), DType::kUInt8, {1, N, K / 2}),
                             TensorView(const_cast<uint8_t*>(bs.data()), DType::kUE8M0, {int64_t(bs.size())}), layout,
                             TensorView(pb.data(), DType::kUInt8, {1, Np, Kp / 2}),
                             TensorView(ps.data(), DType::kUE8M0, {1, Np, Kp / 32}));
  const DType odt = t.fp16_out ? DType::kFloat16 : DType::kBFloat16;

  // args over host buffers or device buffers (same bytes)
  auto make = [&](void* a, void* a_s, void* w, void* w_s, void* bi, void* out, Device dev) {
    Mxfp4GemmArgs x;
    x.a = TensorView(a, t.a, {M, K});
    if (t.a != DType::kBFloat16) {
      x.a_scale = TensorView(a_s, DType::kUE8M0, {int64_t(as.size())});
      x.a_scale_layout = layout;
    }
    if (t.packed) {
      x.b = TensorView(w, DType::kUInt8, {Np, Kp / 2});
      x.b_scale = TensorView(w_s, DType::kUE8M0, {Np, Kp / 32});
      x.b_packed = true;
    } else {
      x.b = TensorView(w, DType::kUInt8, {N, K / 2});
      x.b_scale = TensorView(w_s, DType::kUE8M0, {int64_t(bs.size())});
      x.b_scale_layout = layout;
    }
    if (t.bias) x.bias = TensorView(bi, DType::kFloat32, {N});
    x.out = TensorView(out, odt, {M, N});
    for (TensorView* v : {&x.a, &x.a_scale, &x.b, &x.b_scale, &x.bias, &x.out}) v->device = dev;
    return x;
  };
  void* ah = t.a == DType::kBFloat16 ? static_cast<void*>(abf.data()) : static_cast<void*>(a8.data());
  std::vector<uint8_t>& wh = t.packed ? pb : b;
  std::vector<uint8_t> wsh = t.packed ? ps : bs;
  std::vector<uint16_t> ref(size_t(M * N), 0x7FFF);
  mxfp4_gemm(make(ah, const_cast<uint8_t*>(as.data()), wh.data(), wsh.data(), bias.data(), ref.data(), Device::kCPU));

  Dev<uint16_t> dabf(abf);
  Dev<uint8_t> da8(a8), das(as), dw(wh), dws(wsh);
  Dev<float> dbias(bias);
  Dev<uint16_t> dout(std::vector<uint16_t>(size_t(M * N), 0x7FFF));  // poison (NaN)
  void* ad = t.a == DType::kBFloat16 ? static_cast<void*>(dabf.p) : static_cast<void*>(da8.p);
  mxfp4_gemm(make(ad, das.p, dw.p, dws.p, dbias.p, dout.p, Device::kCUDA));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = dout.get();
  int64_t bad = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    const double r = decode_out(ref[size_t(i)], t.fp16_out), g = decode_out(got[size_t(i)], t.fp16_out);
    if (!(std::fabs(g - r) <= 1e-3 + 1e-3 * std::fabs(r) + ulp_at(r, t.fp16_out))) {
      if (bad++ < 5) ADD_FAILURE() << "m=" << i / N << " n=" << i % N << " got " << g << " ref " << r;
    }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mxfp4GemmGpu,
                         ::testing::Values(Case{1, 256, 512, DType::kBFloat16, false, false, false, false},
                                           Case{7, 264, 544, DType::kE4M3, true, true, false, false},
                                           Case{64, 136, 4096, DType::kBFloat16, true, true, true, true},
                                           Case{256, 512, 256, DType::kE5M2, false, false, true, false},
                                           Case{1000, 2880, 2880, DType::kE4M3, true, true, true, true},
                                           Case{1000, 8, 32, DType::kBFloat16, false, true, false, true}));

TEST(Nvfp4GemmGpu, PartialTilesRaiseNotSupported) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t M = 8, N = 16, K = 64;
  Dev<uint8_t> a(std::vector<uint8_t>(size_t(M * K / 2), 0x22)), sa(std::vector<uint8_t>(size_t(M * K / 16), 0x38)),
      b(std::vector<uint8_t>(size_t(N * K / 2), 0x22)), sb(std::vector<uint8_t>(size_t(N * K / 16), 0x38));
  Dev<uint16_t> out(std::vector<uint16_t>(size_t(M * N), 0x1234));
  Nvfp4GemmArgs x;
  x.a = TensorView(a.p, DType::kUInt8, {M, K / 2});
  x.a_scale = TensorView(sa.p, DType::kE4M3, {M, K / 16});
  x.b = TensorView(b.p, DType::kUInt8, {N, K / 2});
  x.b_scale = TensorView(sb.p, DType::kE4M3, {N, K / 16});
  x.out = TensorView(out.p, DType::kBFloat16, {M, N});
  for (TensorView* v : {&x.a, &x.a_scale, &x.b, &x.b_scale, &x.out}) v->device = Device::kCUDA;
  try {
    nvfp4_gemm(x);
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("nvfp4_gemm: the CUDA kernel needs N a multiple of 128"), std::string::npos)
        << e.what();
  }
  for (uint16_t v : out.get()) ASSERT_EQ(v, 0x1234);
}
