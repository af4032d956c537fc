// tests/cpp/gpu_test_conversions_ops.cpp: the sm_90a scale layout conversion, tensor amax, NF4
// K cache, NaN policy and huge-tensor kernels against the CPU reference, byte for byte, through
// the public API (the conventions of gpu_test_conversions.cpp: poisoned outputs compared whole
// with the same call on CPU copies). Skipped without a usable sm_90 device.
//
//   ./build/tests/cpp/lowbit_gpu_tests            (ctest -L gpu)
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_conversions_util.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;
using namespace convtest;

// ---------------------------------------------------------------------------------------------

TEST(GpuConversions, ConvertScaleLayoutAllPairs) {
  SKIP_WITHOUT_GPU();
  size_t bad = 0;
  int cases = 0;
  const auto lays = layouts();
  for (int eb : {1, 4})
    for (const Lay& a : lays)
      for (const Lay& b : lays)
        for (auto rc : {std::pair<int64_t, int64_t>{1, 7}, {130, 22}, {257, 8}, {37, 1}, {300, 150}, {200, 160}}) {
          const bool ga = a.l.group_pad != GroupPad::kNone, gb = b.l.group_pad != GroupPad::kNone;
          const int64_t R = rc.first, C = rc.second;
          const int64_t L = (ga || gb) ? 1 : 2;
          SCOPED_TRACE(std::string(a.name) + "->" + b.name + " eb" + std::to_string(eb) + " R" + std::to_string(R));
          std::vector<int32_t> ind = {0};
          const int64_t G = 3;
          if (ga || gb) ind = {0, int32_t(R / 3), int32_t(R / 3), int32_t(R)};
          Buf ib(ind.size() * 4);
          std::memcpy(ib.h.data(), ind.data(), ind.size() * 4);
          ib.upload();
          BlockFormat f = BlockFormat::fp8_group(1);  // only for the shapes: K = C
          auto shp = [&](const ScaleLayout& l) {
            std::vector<int64_t> s = scale_shape(f, l, L, R, C, l.group_pad != GroupPad::kNone ? G : 0);
            return s;
          };
          const auto sa = shp(a.l), sb = shp(b.l);
          int64_t na = 1, nb = 1;
          for (auto d : sa) na *= d;
          for (auto d : sb) nb *= d;
          const DType t = eb == 1 ? DType::kUInt8 : DType::kFloat32;
          Buf in{size_t(na * eb)}, out{size_t(nb * eb)};
          for (auto& v : in.h) v = uint8_t(rng()());
          in.upload();
          out.poison();
          const TensorView mi_c = (ga || gb) ? dense(ib.h.data(), DType::kInt32, {G + 1}, false) : TensorView();
          const TensorView mi_g = (ga || gb) ? dense(ib.d, DType::kInt32, {G + 1}, true) : TensorView();
          convert_scale_layout(dense(in.h.data(), t, sa, false), a.l, dense(out.h.data(), t, sb, false), b.l, R, C, mi_c);
          convert_scale_layout(dense(in.d, t, sa, true), a.l, dense(out.d, t, sb, true), b.l, R, C, mi_g);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
          bad += compare(out.h, out.download(), "layout out");
          ++cases;
        }
  std::printf("  scale layout sub-cases: %d, differing bytes: %zu\n", cases, bad);
  EXPECT_EQ(0u, bad);
}

TEST(GpuConversions, TensorAmax) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " variant " + std::to_string(variant));
      const int64_t L = 2, M = 33, K = variant == 3 ? 100 : 512, sM = K + 16, sL = M * sM;
      std::vector<float> v = make_values(L * M * sM / sM * 1, sM, 16);
      v.resize(size_t(L * sL));
      if (variant == 1) v[size_t(sL + 3 * sM + 77)] = NAN;
      if (variant == 2) v[size_t(5 * sM + 1)] = -INFINITY;
      if (variant == 0)
        for (auto& e : v) e = std::isfinite(e) ? e : 1.0f;
      Buf x{v.size() * size_t(dtype_bytes(t))}, o{4};
      store_as(t, v, x.h.data());
      x.upload();
      o.poison();
      const TensorView xc = view(x.h.data(), t, {L, M, K}, {sL, sM, 1}, false);
      const TensorView xg = view(x.d, t, {L, M, K}, {sL, sM, 1}, true);
      tensor_amax(xc, dense(o.h.data(), DType::kFloat32, {1}, false));
      tensor_amax(xg, dense(o.d, DType::kFloat32, {1}, true));
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      EXPECT_EQ(0u, compare(o.h, o.download(), "amax"));
    }
}

TEST(GpuConversions, NF4KCache) {
  SKIP_WITHOUT_GPU();
  size_t bad = 0;
  int cases = 0;
  for (DType kt : {DType::kBFloat16, DType::kFloat32, DType::kFloat16})
    for (DType rt : {DType::kE5M2, DType::kE4M3})
      for (NibbleOrder ord : {NibbleOrder::kLowFirst, NibbleOrder::kHighFirst})
        for (int strided = 0; strided < 2; ++strided) {
          SCOPED_TRACE(std::string(dtype_name(kt)) + " res " + dtype_name(rt) + (strided ? " strided" : ""));
          const int64_t B = 2, T = 203, H = 3, D = 64;
          // strided: k is a [B, T, H, D] view of [B, H, T, D] storage (non-unit last-but stride);
          // channel stride 1 either way; the codes/residual keep contiguous layouts
          std::vector<int64_t> ksh = {B, T, H, D}, kst;
          if (strided) kst = {H * T * D, D, T * D, 1};
          else kst = {T * H * D, H * D, D, 1};
          std::vector<float> v = make_values(B * T * H, D, 16);
          for (int64_t d = 0; d < D; ++d) v[size_t(5 * D + d)] = d == 3 ? NAN : v[size_t(5 * D + d)];
          // +-Inf tokens in channels with finite tokens, and a channel (b=0, h=1, d=11) without any
          v[size_t((7 * H) * D + 9)] = INFINITY;
          v[size_t((8 * H) * D + 10)] = -INFINITY;
          for (int64_t t = 0; t < T; ++t) v[size_t((t * H + 1) * D + 11)] = t % 3 ? (t % 2 ? NAN : -INFINITY) : INFINITY;
          // channel 7 of (b=0, h=0) all zero over T
          for (int64_t t = 0; t < T; ++t) v[size_t((t * H) * D + 7)] = 0.0f;
          Buf k(v.size() * size_t(dtype_bytes(kt)));
          store_as(kt, v, k.h.data());
          k.upload();
          Buf codes{size_t(B * T * H * D / 2)}, scale{size_t(B * H * D * 4)}, res{size_t(B * T * H * D)};
          codes.poison();
          scale.poison();
          res.poison();
          auto kv = [&](bool g, void* p, DType t) { return view(p, t, ksh, kst, g); };
          nf4_kcache_quantize(kv(false, k.h.data(), kt), dense(codes.h.data(), DType::kUInt8, {B, T, H, D / 2}, false),
                              dense(scale.h.data(), DType::kFloat32, {B, H, D}, false),
                              dense(res.h.data(), rt, {B, T, H, D}, false), ord);
          nf4_kcache_quantize(kv(true, k.d, kt), dense(codes.d, DType::kUInt8, {B, T, H, D / 2}, true),
                              dense(scale.d, DType::kFloat32, {B, H, D}, true), dense(res.d, rt, {B, T, H, D}, true), ord);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
          bad += compare(codes.h, codes.download(), "codes") + compare(scale.h, scale.download(), "scale") +
                 compare(res.h, res.download(), "residual");
          ++cases;
          // dequantize with and without residual, random residual bytes included
          for (int with_res = 0; with_res < 2; ++with_res) {
            if (with_res) {
              for (auto& b : res.h) b = uint8_t(rng()());
              res.upload();
            }
            Buf out(v.size() * size_t(dtype_bytes(kt)));
            out.poison();
            const TensorView rc = with_res ? dense(res.h.data(), rt, {B, T, H, D}, false) : TensorView();
            const TensorView rg = with_res ? dense(res.d, rt, {B, T, H, D}, true) : TensorView();
            nf4_kcache_dequantize(dense(codes.h.data(), DType::kUInt8, {B, T, H, D / 2}, false),
                                  dense(scale.h.data(), DType::kFloat32, {B, H, D}, false), rc,
                                  kv(false, out.h.data(), kt), ord);
            nf4_kcache_dequantize(dense(codes.d, DType::kUInt8, {B, T, H, D / 2}, true),
                                  dense(scale.d, DType::kFloat32, {B, H, D}, true), rg, kv(true, out.d, kt), ord);
            ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
            bad += compare(out.h, out.download(), "kcache dequant out");
            ++cases;
          }
        }
  std::printf("  kcache sub-cases: %d, differing bytes: %zu\n", cases, bad);
  EXPECT_EQ(0u, bad);
}

// NaN / Inf policy (docs/formats.md): the inputs of the CPU tests NanPolicy.* (NaN / +-Inf blocks
// next to finite ones, NVFP4 with a computed global amax, UINT4 blocks wider than FLT_MAX,
// blocks at +-FLT_MAX), GPU against CPU byte for byte: q, scales, zero points, global amax and
// the dequantized fp32 / bf16 values; tensor_amax too.
TEST(GpuConversions, NanPolicyAllFormats) {
  SKIP_WITHOUT_GPU();
  size_t bad = 0;
  int cases = 0;
  const float fm = 3.40282346638528859812e+38f;
  for (const Fmt& fm_ : formats())
    for (DType xt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const BlockFormat& f = fm_.f;
      SCOPED_TRACE(std::string(fm_.name) + " " + dtype_name(xt));
      const int64_t B = f.block, M = 8, K = 4 * B, C = 4;
      std::vector<float> v(size_t(M * K));
      std::mt19937 g(7);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      for (auto& e : v) e = nd(g);
      v[size_t(1 * K + 3)] = NAN;
      v[size_t(2 * K + B + 5)] = INFINITY;
      v[size_t(3 * K + 2 * B)] = -INFINITY;
      v[size_t(4 * K + 1)] = -NAN;
      v[size_t(4 * K + 2)] = INFINITY;
      for (int64_t k = 0; k < B; ++k) {
        v[size_t(5 * K + k)] = float(-2e38 + 4e38 * double(k) / double(B - 1));  // spans +-2e38 (UINT4 regression)
        v[size_t(5 * K + B + k)] = (k & 1) ? -fm : fm;
        v[size_t(6 * K + k)] = fm * (1.0f - float(k) / float(2 * B));
        v[size_t(6 * K + B + k)] = -3.3e38f + 1e37f * float(k % 7);
      }
      for (int64_t k = 0; k < K; ++k) v[size_t(7 * K + k)] = (k % B == 0) ? 1e-40f : 0.0f;  // NF4: 1/absmax overflows
      Buf x(v.size() * size_t(dtype_bytes(xt)));
      store_as(xt, v, x.h.data());
      x.upload();
      const int64_t Kq = f.packed() ? K / 2 : K;
      const DType qt = f.elem == Elem::kE4M3 ? DType::kE4M3 : (f.elem == Elem::kE5M2 ? DType::kE5M2 : DType::kUInt8);
      const DType st = f.scale_type == ScaleType::kF32 ? DType::kFloat32
                                                       : (f.scale_type == ScaleType::kUE8M0 ? DType::kUE8M0 : DType::kE4M3);
      Buf q{size_t(M * Kq)}, sc{size_t(M * C * f.scale_bytes())}, zp{size_t(M * C)}, ga{4};
      q.poison();
      sc.poison();
      zp.poison();
      ga.poison();
      const bool nv = f.rule == ScaleRule::kNvfp4;
      auto args = [&](bool gpu, bool compute) {
        QuantArgs a;
        if (f.has_zero_point()) a.zeros = dense(gpu ? zp.d : zp.h.data(), DType::kUInt8, {M, C}, gpu);
        if (nv) {
          a.global_amax = dense(gpu ? ga.d : ga.h.data(), DType::kFloat32, {1}, gpu);
          a.compute_global_amax = compute;
        }
        return a;
      };
      for (bool gpu : {false, true})
        quantize(dense(gpu ? x.d : x.h.data(), xt, {M, K}, gpu), f, ScaleLayout::row_major(),
                 dense(gpu ? q.d : q.h.data(), qt, {M, Kq}, gpu), dense(gpu ? sc.d : sc.h.data(), st, {M, C}, gpu),
                 args(gpu, true));
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      bad += compare(q.h, q.download(), "q") + compare(sc.h, sc.download(), "scales");
      if (f.has_zero_point()) bad += compare(zp.h, zp.download(), "zeros");
      if (nv) {
        bad += compare(ga.h, ga.download(), "global_amax");
        float gam;
        std::memcpy(&gam, ga.h.data(), 4);
        EXPECT_TRUE(std::isfinite(gam));
      }
      ++cases;
      q.upload();
      sc.upload();
      zp.upload();
      ga.upload();
      for (DType ot : {DType::kFloat32, DType::kBFloat16}) {
        Buf out{size_t(M * K * dtype_bytes(ot))};
        out.poison();
        for (bool gpu : {false, true})
          dequantize(dense(gpu ? q.d : q.h.data(), qt, {M, Kq}, gpu), dense(gpu ? sc.d : sc.h.data(), st, {M, C}, gpu), f,
                     ScaleLayout::row_major(), dense(gpu ? out.d : out.h.data(), ot, {M, K}, gpu), args(gpu, false));
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        bad += compare(out.h, out.download(), std::string("dequantize to ") + dtype_name(ot));
        ++cases;
      }
      Buf am{4};
      am.poison();
      for (bool gpu : {false, true})
        tensor_amax(dense(gpu ? x.d : x.h.data(), xt, {M, K}, gpu), dense(gpu ? am.d : am.h.data(), DType::kFloat32, {1}, gpu));
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      bad += compare(am.h, am.download(), "tensor_amax");
    }
  std::printf("  NaN/Inf policy sub-cases: %d, differing bytes: %zu\n", cases, bad);
  EXPECT_EQ(0u, bad);
}

// More than 2^31 elements: 64-bit indexing in dequantize (mxfp8 -> bf16) and cast (bf16 -> e4m3).
TEST(GpuConversions, HugeTensorsBeyond2Pow31) {
  SKIP_WITHOUT_GPU();
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t K = 4096, M = (int64_t(1) << 31) / K + 2;  // 2^31 + 8192 elements
  const int64_t n = M * K;
  if (free_b < size_t(n) * 3 + (size_t(1) << 30)) GTEST_SKIP() << "not enough device memory";
  const BlockFormat f = BlockFormat::mxfp8();
  const int64_t C = K / 32;
  uint8_t *q = nullptr, *sc = nullptr;
  uint16_t* out = nullptr;
  CUDA_OK(cudaMalloc(&q, size_t(n)));
  CUDA_OK(cudaMalloc(&sc, size_t(M * C)));
  CUDA_OK(cudaMalloc(&out, size_t(n) * 2));
  CUDA_OK(cudaMemset(q, 0x3C, size_t(n)));
  CUDA_OK(cudaMemset(sc, 0x7F, size_t(M * C)));
  CUDA_OK(cudaMemset(out, kPoison, size_t(n) * 2));
  // random codes and scales in the first and the last 3 rows
  const int64_t rows[] = {0, 1, 2, M - 3, M - 2, M - 1};
  std::vector<uint8_t> hq(static_cast<size_t>(K)), hs(static_cast<size_t>(C));
  std::vector<std::vector<uint8_t>> keep_q, keep_s;
  for (int64_t r : rows) {
    for (auto& b : hq) b = uint8_t(rng()());
    for (auto& b : hs) b = uint8_t(100 + rng()() % 50);
    CUDA_OK(cudaMemcpy(q + r * K, hq.data(), size_t(K), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sc + r * C, hs.data(), size_t(C), cudaMemcpyHostToDevice));
    keep_q.push_back(hq);
    keep_s.push_back(hs);
  }
  dequantize(dense(q, DType::kE4M3, {M, K}, true), dense(sc, DType::kUE8M0, {M, C}, true), f, ScaleLayout::row_major(),
             dense(out, DType::kBFloat16, {M, K}, true));
  CUDA_OK(cudaDeviceSynchronize());
  for (size_t i = 0; i < 6; ++i) {
    std::vector<uint16_t> ref(static_cast<size_t>(K)), got(static_cast<size_t>(K));
    dequantize(dense(keep_q[i].data(), DType::kE4M3, {1, K}, false), dense(keep_s[i].data(), DType::kUE8M0, {1, C}, false),
               f, ScaleLayout::row_major(), dense(ref.data(), DType::kBFloat16, {1, K}, false));
    CUDA_OK(cudaMemcpy(got.data(), out + rows[i] * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), size_t(K) * 2)) << "row " << rows[i];
  }
  // cast the bf16 output back to e4m3 over n + 5 elements (flat, with a scalar tail)
  CUDA_OK(cudaFree(q));
  uint8_t* c8 = nullptr;
  CUDA_OK(cudaMalloc(&c8, size_t(n)));
  CUDA_OK(cudaMemset(c8, kPoison, size_t(n)));
  cast(dense(out, DType::kBFloat16, {n - 3}, true), dense(c8, DType::kE4M3, {n - 3}, true));
  CUDA_OK(cudaDeviceSynchronize());
  for (size_t i = 0; i < 6; ++i) {
    std::vector<uint16_t> src(static_cast<size_t>(K));
    std::vector<uint8_t> ref(static_cast<size_t>(K)), got(static_cast<size_t>(K));
    CUDA_OK(cudaMemcpy(src.data(), out + rows[i] * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got.data(), c8 + rows[i] * K, size_t(K), cudaMemcpyDeviceToHost));
    cast(dense(src.data(), DType::kBFloat16, {K}, false), dense(ref.data(), DType::kE4M3, {K}, false));
    const int64_t valid = rows[i] == M - 1 ? K - 3 : K;
    EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), size_t(valid))) << "row " << rows[i];
    if (valid < K) EXPECT_EQ(kPoison, got[size_t(K - 1)]);
  }
  cudaFree(c8);
  cudaFree(sc);
  cudaFree(out);
}
