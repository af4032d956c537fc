// tests/cpp/gpu_test_conversions.cpp: the sm_90a conversion kernels against the CPU reference,
// byte for byte, through the public API.
//
// Every GPU output buffer (codes, scales with their padding, zero points, global amax, outputs
// with row-pitch gaps) is poisoned with 0xAB before the call and compared whole with the same
// call on CPU copies (also poisoned). Skipped without a usable sm_90 device.
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

#include "cuda/common/selftest.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;

namespace {

bool gpu_ok() {
  static int ok = -1;
  if (ok < 0) {
    const BuildInfo b = build_info();
    ok = b.cuda_built && b.device_count > 0 && b.sm >= 90;
  }
  return ok == 1;
}

#define SKIP_WITHOUT_GPU() \
  do {                     \
    if (!gpu_ok()) GTEST_SKIP() << "no sm_90 CUDA device"; \
  } while (0)

#define CUDA_OK(x) ASSERT_EQ(cudaSuccess, (x)) << #x

constexpr uint8_t kPoison = 0xAB;

/// A host buffer and its device twin.
struct Buf {
  std::vector<uint8_t> h;
  void* d = nullptr;
  size_t n = 0;
  Buf() = default;
  explicit Buf(size_t bytes) : h(bytes, kPoison), n(bytes) {
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) d = nullptr;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : h(std::move(o.h)), d(o.d), n(o.n) { o.d = nullptr; }
  ~Buf() {
    if (d) cudaFree(d);
  }
  void upload() { cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice); }
  void poison() {
    std::fill(h.begin(), h.end(), kPoison);
    cudaMemset(d, kPoison, n);
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> r(n);
    cudaMemcpy(r.data(), d, n, cudaMemcpyDeviceToHost);
    return r;
  }
};

TensorView view(void* p, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides, bool gpu) {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  v.device = gpu ? Device::kCUDA : Device::kCPU;
  return v;
}
TensorView dense(void* p, DType t, std::vector<int64_t> shape, bool gpu) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = s;
    s *= shape[size_t(i)];
  }
  return view(p, t, shape, st, gpu);
}

/// Compares whole buffers; returns the number of differing bytes (reports the first few).
size_t compare(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      if (bad < 4) ADD_FAILURE() << what << ": byte " << i << " cpu 0x" << std::hex << int(cpu[i]) << " gpu 0x" << int(gpu[i]);
      ++bad;
    }
  }
  return bad;
}

// ---------------------------------------------------------------------------------------------
// data

std::mt19937_64& rng() {
  static std::mt19937_64 r(12345);
  return r;
}

/// Row-wise varied test data with specials (fp32 values).
std::vector<float> make_values(int64_t rows, int64_t K, int block) {
  std::vector<float> v(size_t(rows * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ui(0, 1 << 30);
  const float ties[] = {1.0625f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 464.0f, 61440.0f, 0.5f, 6.0f, 7.0f,
                        448.0f, 1.5f, 0.125f, 3.0f, 240.0f, 57344.0f, 0.0f};
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = int(r % 10);
    const int e = int(ui(rng()) % 41) - 20;
    for (int64_t k = 0; k < K; ++k) {
      float x = nd(rng()) * std::ldexp(1.0f, e);
      const int64_t blk = k / block;
      switch (kind) {
        case 4: {  // exact ties on a power-of-two grid, block max fixed
          const float t = ties[ui(rng()) % 20];
          x = (ui(rng()) & 1 ? -t : t) * std::ldexp(1.0f, (int(blk) % 7) - 3);
          if (k % block == 0) x = std::ldexp(1.0f, 9 + int(blk % 5));
          break;
        }
        case 5:  // zero blocks, subnormal-amax blocks, -0
          if (blk % 3 == 0) x = (k & 1) ? -0.0f : 0.0f;
          else if (blk % 3 == 1) x = nd(rng()) * 1e-40f;
          break;
        case 6:  // NaN / Inf in some blocks
          if (blk % 4 == 1 && k % block == 3) x = NAN;
          if (blk % 4 == 2 && k % block == 5) x = (k & 2) ? INFINITY : -INFINITY;
          if (blk % 4 == 3 && k % block == 7) x = -NAN;
          break;
        case 7:  // saturating magnitudes and tiny mixed
          x = (ui(rng()) % 3 == 0) ? nd(rng()) * 3e38f : nd(rng()) * 1e-30f;
          break;
        case 8:  // one big outlier per block (FLOOR clipping, large dynamic range)
          if (k % block == 1) x *= 1e6f;
          break;
        case 9:  // finite blocks wider than FLT_MAX (UINT4: max - min overflows), up to +-FLT_MAX
          x = float(std::ldexp(double(ui(rng()) % 1024 + 1) / 1024.0 * ((k & 1) ? -1.0 : 1.0), 128) *
                    (1.0 - std::ldexp(1.0, -24)));
          if (k % block == 2) x = (blk & 1) ? 2e38f : -2e38f;
          break;
        default: break;
      }
      v[size_t(r * K + k)] = x;
    }
  }
  return v;
}

void store_as(DType t, const std::vector<float>& v, uint8_t* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kFloat32) std::memcpy(out + 4 * i, &v[i], 4);
    else {
      const uint16_t h = t == DType::kFloat16 ? encode_fp16(v[i]) : encode_bf16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

struct Fmt {
  const char* name;
  BlockFormat f;
};
std::vector<Fmt> formats() {
  std::vector<Fmt> r = {
      {"mxfp8_e4m3_rceil", BlockFormat::mxfp8(Elem::kE4M3, false)},
      {"mxfp8_e4m3_floor", BlockFormat::mxfp8(Elem::kE4M3, true)},
      {"mxfp8_e5m2_rceil", BlockFormat::mxfp8(Elem::kE5M2, false)},
      {"mxfp8_e5m2_floor", BlockFormat::mxfp8(Elem::kE5M2, true)},
      {"mxfp4_rceil", BlockFormat::mxfp4(false)},
      {"mxfp4_floor", BlockFormat::mxfp4(true)},
      {"nvfp4_zero", BlockFormat::nvfp4(ZeroScale::kZero)},
      {"nvfp4_minsub", BlockFormat::nvfp4(ZeroScale::kMinSubnormal)},
      {"nvfp4_one", BlockFormat::nvfp4(ZeroScale::kOne)},
      {"fp8_g128_f32", BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kF32)},
      {"fp8_g128_ue8m0", BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kUE8M0)},
      {"fp8e5_g64_f32", BlockFormat::fp8_group(64, Elem::kE5M2, ScaleType::kF32)},
      {"fp8_g256_f32", BlockFormat::fp8_group(256, Elem::kE4M3, ScaleType::kF32)},
      {"fp8_g48_f32", BlockFormat::fp8_group(48, Elem::kE4M3, ScaleType::kF32)},
      {"int4_g128_f32", BlockFormat::int4_group(128, false, ScaleType::kF32)},
      {"int4_g32_ue8m0", BlockFormat::int4_group(32, false, ScaleType::kUE8M0)},
      {"uint4_g128_zp", BlockFormat::int4_group(128, true)},
      {"uint4_g8_zp", BlockFormat::int4_group(8, true)},
      {"nf4_b64", BlockFormat::nf4(64)},
      {"nf4_b64_hi", BlockFormat::nf4(64, NibbleOrder::kHighFirst)},
      {"nf4_b32", BlockFormat::nf4(32)},
      {"mxfp4_hi", BlockFormat{Elem::kE2M1, 32, ScaleType::kUE8M0, ScaleRule::kMxRceil, NibbleOrder::kHighFirst}},
  };
  return r;
}

struct Lay {
  const char* name;
  ScaleLayout l;
};
std::vector<Lay> layouts() {
  return {{"row", ScaleLayout::row_major()},         {"col", ScaleLayout::col_major(1)},
          {"col4", ScaleLayout::col_major(4)},       {"col16", ScaleLayout::col_major(16)},
          {"b128x4", ScaleLayout::blocked128x4()},   {"b8x4", ScaleLayout::blocked8x4()},
          {"grp_fi", ScaleLayout::blocked128x4(GroupPad::kFlashInfer)},
          {"grp_cs", ScaleLayout::blocked128x4(GroupPad::kCumsum)}};
}

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
