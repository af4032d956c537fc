// tests/cpp/gpu_test_conversions.cpp: the sm_90a conversion kernels against the CPU reference,
// byte for byte, through the public API.
//
// Every GPU output buffer (codes, scales with their padding, zero points, global amax, outputs
// with row-pitch gaps) is poisoned with 0xAB before the call and compared whole with the same
// call on CPU copies (also poisoned). Skipped without a usable sm_90 device.
//
//   ./build/tests/cpp/lowbit_gpu_tests            (ctest -L gpu)//
// The shared helpers are in gpu_conversions_util.hpp; scale layout conversion, tensor amax, the
// NF4 K cache, the NaN policy and huge tensors are in gpu_test_conversions_ops.cpp.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/selftest.hpp"
#include "gpu_conversions_util.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;
using namespace convtest;

namespace {

struct Shape {
  int64_t L, M, K, pitch_extra;  // pitch_extra: extra elements per row of x (row-pitched input)
};

enum class Amax { kNone, kGiven, kCompute };

struct Counters {
  int cases = 0;
  size_t bad_bytes = 0;
};

/// One quantize case on CPU and GPU, then dequantize (and transcode) of the result.
void run_case(const Fmt& fm, const Lay& ly, const Shape& sh, DType xt, Amax am, Counters& cnt) {
  const BlockFormat& f = fm.f;
  if (sh.K % f.block != 0) return;
  const bool grouped = ly.l.group_pad != GroupPad::kNone;
  if (grouped && sh.L != 1) return;
  const std::string tag = std::string(fm.name) + "/" + ly.name + "/" + dtype_name(xt) + "/L" + std::to_string(sh.L) +
                          "M" + std::to_string(sh.M) + "K" + std::to_string(sh.K) + "/amax" + std::to_string(int(am));
  SCOPED_TRACE(tag);
  const int64_t L = sh.L, M = sh.M, K = sh.K;
  const int esz = dtype_bytes(xt);
  const int64_t xsM = K + sh.pitch_extra, xsL = M * xsM + 16;
  const int64_t Kq = f.packed() ? K / 2 : K;
  const int64_t qsM = Kq + 32, qsL = M * qsM + 64;

  // groups: random sizes (some empty) summing to M
  std::vector<int32_t> ind;
  int64_t G = 0;
  if (grouped) {
    G = 1 + int64_t(rng()() % 6);
    ind.assign(size_t(G + 1), 0);
    for (int64_t g = 1; g < G; ++g) ind[size_t(g)] = int32_t(rng()() % uint64_t(M + 1));
    ind[size_t(G)] = int32_t(M);
    std::sort(ind.begin(), ind.end());
    if (G >= 3) ind[2] = ind[1];  // an empty group
  }
  std::vector<int64_t> ss = scale_shape(f, ly.l, L, M, K, G);
  if (grouped) ss[1] += 128;  // more rows than needed: those must be zero padding too
  int64_t sn = 1;
  for (auto d : ss) sn *= d;
  const int sbytes = f.scale_bytes();

  const int64_t xn = (L - 1) * xsL + (M - 1) * xsM + K;
  Buf x(size_t(xn * esz));
  {
    std::vector<float> all(size_t(xn), 1e30f);  // gaps: values that would change any result
    const std::vector<float> v = make_values(L * M, K, f.block);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(&all[size_t(l * xsL + m * xsM)], &v[size_t((l * M + m) * K)], size_t(K) * 4);
    store_as(xt, all, x.h.data());
    x.upload();
  }
  const DType qt = f.elem == Elem::kE4M3 ? DType::kE4M3 : (f.elem == Elem::kE5M2 ? DType::kE5M2 : DType::kUInt8);
  const DType st = f.scale_type == ScaleType::kF32 ? DType::kFloat32
                                                   : (f.scale_type == ScaleType::kUE8M0 ? DType::kUE8M0 : DType::kE4M3);
  const int64_t qn = (L - 1) * qsL + (M - 1) * qsM + Kq;
  Buf q{size_t(qn)}, sc{size_t(sn * sbytes)}, zp{size_t(sn)}, ga{4};
  Buf ind_b(size_t(ind.size() * 8));
  const bool ind64 = grouped && (rng()() & 1);
  if (grouped) {
    if (ind64) {
      for (size_t i = 0; i < ind.size(); ++i) {
        const int64_t v = ind[i];
        std::memcpy(ind_b.h.data() + 8 * i, &v, 8);
      }
    } else {
      std::memcpy(ind_b.h.data(), ind.data(), ind.size() * 4);
    }
    ind_b.upload();
  }
  auto xv = [&](bool g) {
    return L == 1 && (sh.L == 1) && (M % 2 == 1)  // exercise the 2-D form too
               ? view(g ? x.d : x.h.data(), xt, {M, K}, {xsM, 1}, g)
               : view(g ? x.d : x.h.data(), xt, {L, M, K}, {xsL, xsM, 1}, g);
  };
  const bool two_d = L == 1 && (M % 2 == 1);
  auto qv = [&](bool g, void* p) {
    return two_d ? view(p, qt, {M, Kq}, {qsM, 1}, g) : view(p, qt, {L, M, Kq}, {qsL, qsM, 1}, g);
  };
  auto args = [&](bool g) {
    QuantArgs a;
    if (f.has_zero_point()) a.zeros = dense(g ? zp.d : zp.h.data(), DType::kUInt8, ss, g);
    if (am != Amax::kNone) {
      a.global_amax = dense(g ? ga.d : ga.h.data(), DType::kFloat32, {1}, g);
      a.compute_global_amax = am == Amax::kCompute;
    }
    if (grouped)
      a.m_indptr = dense(g ? ind_b.d : ind_b.h.data(), ind64 ? DType::kInt64 : DType::kInt32, {G + 1}, g);
    return a;
  };
  q.poison();
  sc.poison();
  zp.poison();
  ga.poison();
  if (am == Amax::kGiven) {
    const float given = (rng()() & 1) ? 1000.0f : 3.5e-3f;
    std::memcpy(ga.h.data(), &given, 4);
    ga.upload();
  }
  quantize(xv(false), f, ly.l, qv(false, q.h.data()), dense(sc.h.data(), st, ss, false), args(false));
  quantize(xv(true), f, ly.l, qv(true, q.d), dense(sc.d, st, ss, true), args(true));
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  size_t bad = compare(q.h, q.download(), "q") + compare(sc.h, sc.download(), "scales");
  if (f.has_zero_point()) bad += compare(zp.h, zp.download(), "zeros");
  if (am != Amax::kNone) bad += compare(ga.h, ga.download(), "global_amax");
  ++cnt.cases;
  cnt.bad_bytes += bad;
  if (bad) return;

  // dequantize the codes just produced, and random codes, to two output dtypes
  const DType outs[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kE4M3, DType::kE5M2};
  for (int variant = 0; variant < 2; ++variant) {
    const DType ot = outs[(cnt.cases + variant * 2) % 5];
    SCOPED_TRACE(std::string("dequantize to ") + dtype_name(ot) + (variant ? " (random codes)" : ""));
    if (variant == 1) {
      for (auto& b : q.h) b = uint8_t(rng()());
      q.upload();
    } else {
      q.upload();  // the CPU codes (identical)
    }
    sc.upload();
    zp.upload();
    const int osz = dtype_bytes(ot);
    const int64_t osM = K + sh.pitch_extra, osL = M * osM + 16;
    Buf out(size_t(((L - 1) * osL + (M - 1) * osM + K) * osz));
    out.poison();
    auto ov = [&](bool g) {
      return two_d ? view(g ? out.d : out.h.data(), ot, {M, K}, {osM, 1}, g)
                   : view(g ? out.d : out.h.data(), ot, {L, M, K}, {osL, osM, 1}, g);
    };
    QuantArgs ca = args(false), gaa = args(true);
    ca.compute_global_amax = gaa.compute_global_amax = false;
    dequantize(qv(false, q.h.data()), dense(sc.h.data(), st, ss, false), f, ly.l, ov(false), ca);
    dequantize(qv(true, q.d), dense(sc.d, st, ss, true), f, ly.l, ov(true), gaa);
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    const size_t b2 = compare(out.h, out.download(), "dequantize out");
    ++cnt.cases;
    cnt.bad_bytes += b2;
  }

  // transcode (4-bit codes -> fp8), row layout only (zero points as transcode stores them)
  if ((f.elem == Elem::kInt4 || f.elem == Elem::kUInt4 || f.elem == Elem::kE2M1) && ly.l.kind == ScaleLayoutKind::kRowMajor) {
    for (DType ot : {DType::kE4M3, DType::kE5M2}) {
      if (f.elem == Elem::kUInt4 && ot == DType::kE5M2) continue;
      SCOPED_TRACE(std::string("transcode to ") + dtype_name(ot));
      const int64_t osM = K + sh.pitch_extra, osL = M * osM + 16;
      Buf out(size_t((L - 1) * osL + (M - 1) * osM + K));
      out.poison();
      auto ov = [&](bool g) {
        return two_d ? view(g ? out.d : out.h.data(), ot, {M, K}, {osM, 1}, g)
                     : view(g ? out.d : out.h.data(), ot, {L, M, K}, {osL, osM, 1}, g);
      };
      QuantArgs ca, gaa;
      if (f.has_zero_point()) {
        const std::vector<int64_t> zs = {L, M, K / f.block};
        ca.zeros = dense(zp.h.data(), DType::kUInt8, zs, false);
        gaa.zeros = dense(zp.d, DType::kUInt8, zs, true);
      }
      transcode(qv(false, q.h.data()), f, ov(false), ca);
      transcode(qv(true, q.d), f, ov(true), gaa);
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      const size_t b3 = compare(out.h, out.download(), "transcode out");
      ++cnt.cases;
      cnt.bad_bytes += b3;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(GpuCodecs, ExhaustiveFastEncodersMatchSoftware) {
  SKIP_WITHOUT_GPU();
  uint64_t mism[cuda::kSelftestCount];
  uint32_t first[cuda::kSelftestCount];
  ASSERT_EQ(0, cuda::selftest_encoders(mism, first));
  const char* names[] = {"e4m3_finite", "e4m3_none", "e5m2_finite", "e5m2_none", "e2m1", "nf4", "int4",
                         "f16", "bf16", "dec_f16", "dec_e4m3", "dec_e5m2", "raw_hw_e4m3", "raw_hw_e5m2"};
  for (int c = 0; c < cuda::kSelftestCount; ++c) {
    std::printf("  selftest %-12s mismatches %llu (first input 0x%08x)\n", names[c], (unsigned long long)mism[c], first[c]);
    if (c < cuda::kCheckRawE4M3NaN) EXPECT_EQ(0u, mism[c]) << names[c] << " first 0x" << std::hex << first[c];
  }
}

TEST(GpuConversions, QuantizeDequantizeTranscodeAllFormatsLayouts) {
  SKIP_WITHOUT_GPU();
  const std::vector<Shape> shapes = {{1, 1, 7168, 0}, {1, 130, 768, 0}, {3, 37, 768, 16}, {1, 257, 384, 8}, {2, 5, 192, 3}};
  const DType xts[] = {DType::kBFloat16, DType::kFloat32, DType::kFloat16};
  Counters cnt;
  int idx = 0;
  for (const Fmt& fm : formats())
    for (const Lay& ly : layouts())
      for (size_t si = 0; si < shapes.size(); ++si) {
        const DType xt = xts[(idx++) % 3];
        if (fm.f.rule == ScaleRule::kNvfp4) {
          for (Amax am : {Amax::kNone, Amax::kGiven, Amax::kCompute}) run_case(fm, ly, shapes[si], xt, am, cnt);
        } else {
          run_case(fm, ly, shapes[si], xt, Amax::kNone, cnt);
        }
      }
  std::printf("  quantize/dequantize/transcode sub-cases: %d, differing bytes: %zu\n", cnt.cases, cnt.bad_bytes);
  EXPECT_EQ(0u, cnt.bad_bytes);
  EXPECT_GT(cnt.cases, 1000);
}

TEST(GpuConversions, CastExhaustiveBf16ToFp8) {
  SKIP_WITHOUT_GPU();
  Buf x(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    std::memcpy(x.h.data() + 2 * i, &h, 2);
  }
  x.upload();
  for (DType ot : {DType::kE4M3, DType::kE5M2})
    for (Saturate sat : {Saturate::kFinite, Saturate::kNone}) {
      Buf o(65536);
      o.poison();
      cast(dense(x.h.data(), DType::kBFloat16, {65536}, false), dense(o.h.data(), ot, {65536}, false), sat);
      cast(dense(x.d, DType::kBFloat16, {65536}, true), dense(o.d, ot, {65536}, true), sat);
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      EXPECT_EQ(0u, compare(o.h, o.download(), std::string("bf16->") + dtype_name(ot) + (sat == Saturate::kNone ? " none" : " finite")));
    }
}

TEST(GpuConversions, CastAllPairsShapesStrides) {
  SKIP_WITHOUT_GPU();
  const DType ts[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kE4M3, DType::kE5M2};
  size_t bad = 0;
  int cases = 0;
  for (DType it : ts)
    for (DType ot : ts)
      for (Saturate sat : {Saturate::kFinite, Saturate::kNone})
        for (int shp = 0; shp < 4; ++shp) {
          SCOPED_TRACE(std::string(dtype_name(it)) + "->" + dtype_name(ot) + " shape " + std::to_string(shp));
          // 0: 1-D odd length (vector body + scalar tail); 1: [3, 37, 160] row-pitched;
          // 2: transposed output (scalar kernel); 3: [5, 7168] contiguous
          std::vector<int64_t> shape, xst, ost;
          int64_t xn, on;
          if (shp == 0) { shape = {1000003}; xst = {1}; ost = {1}; xn = on = 1000003; }
          else if (shp == 1) { shape = {3, 37, 160}; xst = {37 * 176, 176, 1}; ost = {37 * 192, 192, 1}; xn = 3 * 37 * 176; on = 3 * 37 * 192; }
          else if (shp == 2) { shape = {33, 65}; xst = {65, 1}; ost = {1, 33}; xn = on = 33 * 65; }
          else { shape = {5, 7168}; xst = {7168, 1}; ost = {7168, 1}; xn = on = 5 * 7168; }
          Buf x{size_t(xn * dtype_bytes(it))}, o{size_t(on * dtype_bytes(ot))};
          for (auto& b : x.h) b = uint8_t(rng()());
          if (it == DType::kFloat32)  // mostly finite fp32 of moderate range, some raw patterns
            for (int64_t i = 0; i < xn; ++i)
              if (i % 7) {
                const float v = std::ldexp(float(int64_t(rng()() % 2000001) - 1000000) / 1e6f, int(rng()() % 40) - 20);
                std::memcpy(x.h.data() + 4 * i, &v, 4);
              }
          x.upload();
          o.poison();
          cast(view(x.h.data(), it, shape, xst, false), view(o.h.data(), ot, shape, ost, false), sat);
          cast(view(x.d, it, shape, xst, true), view(o.d, ot, shape, ost, true), sat);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
          bad += compare(o.h, o.download(), "cast out");
          ++cases;
        }
  std::printf("  cast sub-cases: %d, differing bytes: %zu\n", cases, bad);
  EXPECT_EQ(0u, bad);
}
