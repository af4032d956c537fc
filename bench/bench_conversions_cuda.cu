// bench/bench_conversions_cuda.cu: timing of the conversion ops (public C++ API on device
// tensors) against a device-to-device copy measured in the same run.
//
// Large inputs (256 MiB class): L2 flushed (a 256 MiB memset) before every timed call, CUDA
// events around the call, median of 25 after 3 warm-ups. Small inputs (1 x 7168, 16 x 7168):
// median over 25 batches of 100 back-to-back calls (host validation included), no flush.
// TB/s counts bytes read + written (codes, scales, zero points included); "copy" is the
// fraction of cudaMemcpyDeviceToDevice bandwidth (2 x 256 MiB moved) of this run.
//
//   ./build/bench/bench_conversions_cuda [filter-substring]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lowbit/ops.hpp"

using namespace lowbit;

namespace {

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // bf16 with exponent in [2^-8, 2^7], random sign and mantissa
    const uint32_t e = 119u + (h >> 24) % 16u;
    p[i] = uint16_t(((h & 1u) << 15) | (e << 7) | ((h >> 8) & 0x7Fu));
  }
}

struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

void fill_bf16(void* p, int64_t n, uint32_t seed) {
  fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(p), n, seed);
  CK(cudaGetLastError());
}

TensorView tv(void* p, DType t, std::vector<int64_t> shape) {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.ndim = int(shape.size());
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[size_t(i)];
    v.strides[i] = s;
    s *= shape[size_t(i)];
  }
  v.device = Device::kCUDA;
  return v;
}

Dev* g_flush = nullptr;
double g_copy_tbs = 0;
std::string g_filter;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median microseconds of fn over 25 calls, L2 flushed before each.
double time_large(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ts;
  for (int i = 0; i < 25; ++i) {
    CK(cudaMemsetAsync(g_flush->p, i, g_flush->n));
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ts);
}

/// Median per-call microseconds over batches of 100 back-to-back calls (no flush).
double time_small(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 10; ++i) fn();
  std::vector<double> ts;
  for (int r = 0; r < 25; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < 100; ++i) fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3 / 100);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ts);
}

void report(const std::string& op, const std::string& shape, double bytes, bool large, const std::function<void()>& fn) {
  if (!g_filter.empty() && (op + " " + shape).find(g_filter) == std::string::npos) return;
  const double us = large ? time_large(fn) : time_small(fn);
  const double tbs = bytes / (us * 1e-6) / 1e12;
  std::printf("%-34s %-22s %10.2f %8.3f %7.3f\n", op.c_str(), shape.c_str(), us, tbs, tbs / g_copy_tbs);
  std::fflush(stdout);
}

std::string shp(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_filter = argv[1];
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  Dev flush{size_t(256) << 20};
  g_flush = &flush;

  const int64_t big = int64_t(256) << 20;  // bytes
  {
    Dev a{size_t(big)}, b{size_t(big)};
    CK(cudaMemset(a.p, 1, size_t(big)));
    const std::string f = g_filter;
    g_filter.clear();
    g_copy_tbs = 1;  // placeholder for the first report
    const double us = time_large([&] { CK(cudaMemcpyAsync(b.p, a.p, size_t(big), cudaMemcpyDeviceToDevice)); });
    g_copy_tbs = 2.0 * double(big) / (us * 1e-6) / 1e12;
    g_filter = f;
    std::printf("%-34s %-22s %10s %8s %7s\n", "op", "shape", "us", "TB/s", "copy");
    std::printf("%-34s %-22s %10.2f %8.3f %7.3f\n", "memcpy D2D", "256 MiB", us, g_copy_tbs, 1.0);
  }

  // ---------------- large: bf16 [M, K] = 256 MiB ----------------
  const int64_t M = 16384, K = 8192, n = M * K;
  Dev x{size_t(n) * 2}, q{size_t(n)}, sc{size_t(n / 16) * 4 + (1 << 20)}, zp{size_t(n / 32) + (1 << 20)}, ga{4};
  Dev out{size_t(n) * 4};
  Dev ind{64};
  fill_bf16(x.p, n, 1);
  CK(cudaDeviceSynchronize());
  const TensorView X = tv(x.p, DType::kBFloat16, {M, K});
  const std::string S = shp(M, K);
  struct QCase {
    const char* name;
    BlockFormat f;
    ScaleLayout l;
    int amax;  // 0 none, 1 given, 2 compute
  };
  const QCase qcases[] = {
      {"q mxfp8_e4m3 rceil row", BlockFormat::mxfp8(), ScaleLayout::row_major(), 0},
      {"q mxfp8_e4m3 rceil 128x4", BlockFormat::mxfp8(), ScaleLayout::blocked128x4(), 0},
      {"q mxfp8_e5m2 floor 128x4", BlockFormat::mxfp8(Elem::kE5M2, true), ScaleLayout::blocked128x4(), 0},
      {"q mxfp4 rceil 128x4", BlockFormat::mxfp4(), ScaleLayout::blocked128x4(), 0},
      {"q nvfp4 128x4", BlockFormat::nvfp4(), ScaleLayout::blocked128x4(), 1},
      {"q nvfp4 128x4 +amax", BlockFormat::nvfp4(), ScaleLayout::blocked128x4(), 2},
      {"q fp8 g128 f32 col4", BlockFormat::fp8_group(128), ScaleLayout::col_major(4), 0},
      {"q fp8 g128 ue8m0 row", BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kUE8M0), ScaleLayout::row_major(), 0},
      {"q int4 g128 f32 row", BlockFormat::int4_group(128), ScaleLayout::row_major(), 0},
      {"q uint4 g128 zp row", BlockFormat::int4_group(128, true), ScaleLayout::row_major(), 0},
      {"q nf4 b64 row", BlockFormat::nf4(64), ScaleLayout::row_major(), 0},
  };
  auto scale_dt = [](const BlockFormat& f) {
    return f.scale_type == ScaleType::kF32 ? DType::kFloat32 : (f.scale_type == ScaleType::kUE8M0 ? DType::kUE8M0 : DType::kE4M3);
  };
  auto code_dt = [](const BlockFormat& f) {
    return f.elem == Elem::kE4M3 ? DType::kE4M3 : (f.elem == Elem::kE5M2 ? DType::kE5M2 : DType::kUInt8);
  };
  const float one_k = 8.0f;
  CK(cudaMemcpy(ga.p, &one_k, 4, cudaMemcpyHostToDevice));
  for (const QCase& c : qcases) {
    const BlockFormat& f = c.f;
    const auto ss = scale_shape(f, c.l, 1, M, K);
    const int64_t sn = ss[0] * ss[1] * ss[2];
    const int64_t qk = f.packed() ? K / 2 : K;
    QuantArgs a;
    if (f.has_zero_point()) a.zeros = tv(zp.p, DType::kUInt8, ss);
    if (c.amax) {
      a.global_amax = tv(ga.p, DType::kFloat32, {1});
      a.compute_global_amax = c.amax == 2;
    }
    const TensorView Q = tv(q.p, code_dt(f), {M, qk}), SC = tv(sc.p, scale_dt(f), ss);
    const double bytes = double(n) * 2 + double(M * qk) + double(sn) * f.scale_bytes() + (f.has_zero_point() ? sn : 0);
    report(c.name, S + " bf16", bytes, true, [&] { quantize(X, f, c.l, Q, SC, a); });
    // the matching dequantize to bf16
    QuantArgs d = a;
    d.compute_global_amax = false;
    const TensorView O = tv(out.p, DType::kBFloat16, {M, K});
    std::string dn = std::string("dq") + (c.name + 1);
    if (c.amax != 2) report(dn, S + " ->bf16", bytes, true, [&] { dequantize(Q, SC, f, c.l, O, d); });
  }
  {  // fp32 input
    const int64_t Mf = 8192;  // 256 MiB of fp32
    Dev xf{size_t(Mf * K) * 4};
    cast(tv(x.p, DType::kBFloat16, {Mf, K}), tv(xf.p, DType::kFloat32, {Mf, K}));
    const BlockFormat f = BlockFormat::mxfp8();
    const auto ss = scale_shape(f, ScaleLayout::blocked128x4(), 1, Mf, K);
    const double bytes = double(Mf * K) * 5 + double(ss[1] * ss[2]);
    report("q mxfp8_e4m3 128x4 (f32 in)", shp(Mf, K) + " f32", bytes, true, [&] {
      quantize(tv(xf.p, DType::kFloat32, {Mf, K}), f, ScaleLayout::blocked128x4(), tv(q.p, DType::kE4M3, {Mf, K}),
               tv(sc.p, DType::kUE8M0, ss));
    });
    report("dq mxfp8_e4m3 128x4 ->f32", shp(Mf, K), bytes, true, [&] {
      dequantize(tv(q.p, DType::kE4M3, {Mf, K}), tv(sc.p, DType::kUE8M0, ss), f, ScaleLayout::blocked128x4(),
                 tv(xf.p, DType::kFloat32, {Mf, K}));
    });
  }
  {  // grouped MoE layout (8 groups, device m_indptr)
    const BlockFormat f = BlockFormat::mxfp8();
    std::vector<int32_t> h = {0, 1000, 3000, 3001, 7000, 9000, 12000, 12001, int32_t(M)};
    CK(cudaMemcpy(ind.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    const auto ss = scale_shape(f, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), 1, M, K, 8);
    QuantArgs a;
    a.m_indptr = tv(ind.p, DType::kInt32, {9});
    const double bytes = double(n) * 3 + double(ss[1] * ss[2]);
    report("q mxfp8 grouped(flashinfer)", S + " bf16 G8", bytes, true, [&] {
      quantize(X, f, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), tv(q.p, DType::kE4M3, {M, K}),
               tv(sc.p, DType::kUE8M0, {ss[1], ss[2]}), a);
    });
  }
  // transcode, cast, amax
  report("transcode mxfp4->e4m3", S, double(n) * 1.5, true, [&] {
    transcode(tv(q.p, DType::kUInt8, {M, K / 2}), BlockFormat::mxfp4(), tv(out.p, DType::kE4M3, {M, K}));
  });
  report("cast bf16->e4m3", S, double(n) * 3, true,
         [&] { cast(X, tv(q.p, DType::kE4M3, {M, K})); });
  report("cast e4m3->bf16", S, double(n) * 3, true,
         [&] { cast(tv(q.p, DType::kE4M3, {M, K}), tv(out.p, DType::kBFloat16, {M, K})); });
  report("cast bf16->f32", S, double(n) * 6, true,
         [&] { cast(X, tv(out.p, DType::kFloat32, {M, K})); });
  report("tensor_amax bf16", S, double(n) * 2, true, [&] { tensor_amax(X, tv(ga.p, DType::kFloat32, {1})); });
  {  // scale layout: row -> 128x4 of a [M, K/16] u8 scale matrix x 16 (128 MiB)
    const int64_t R = 65536, C = 2048;
    const auto sb = scale_shape(BlockFormat::fp8_group(1), ScaleLayout::blocked128x4(), 1, R, C);
    report("scale layout row->128x4 u8", shp(R, C), double(R * C) * 2, true, [&] {
      convert_scale_layout(tv(q.p, DType::kUInt8, {R, C}), ScaleLayout::row_major(), tv(out.p, DType::kUInt8, sb),
                           ScaleLayout::blocked128x4(), R, C);
    });
  }
  {  // NF4 K cache, bf16 [B, T, H, D]
    const int64_t B = 16, T = 4096, H = 8, D = 128, kn = B * T * H * D;  // 128 MiB
    const double qbytes = double(kn) * 2 + double(kn) / 2 + double(kn) + double(B * H * D) * 4;
    Dev res{size_t(kn)};
    report("kcache quantize", "16x4096x8x128 bf16", qbytes, true, [&] {
      nf4_kcache_quantize(tv(x.p, DType::kBFloat16, {B, T, H, D}), tv(q.p, DType::kUInt8, {B, T, H, D / 2}),
                          tv(sc.p, DType::kFloat32, {B, H, D}), tv(res.p, DType::kE5M2, {B, T, H, D}));
    });
    report("kcache dequantize", "16x4096x8x128 bf16", qbytes, true, [&] {
      nf4_kcache_dequantize(tv(q.p, DType::kUInt8, {B, T, H, D / 2}), tv(sc.p, DType::kFloat32, {B, H, D}),
                            tv(res.p, DType::kE5M2, {B, T, H, D}), tv(out.p, DType::kBFloat16, {B, T, H, D}));
    });
  }

  // ---------------- small ----------------
  for (int64_t m : {int64_t(1), int64_t(16)}) {
    const int64_t k = 7168;
    const std::string s = shp(m, k);
    const TensorView xs = tv(x.p, DType::kBFloat16, {m, k});
    const BlockFormat f8 = BlockFormat::mxfp8(), f4 = BlockFormat::nvfp4(), g = BlockFormat::fp8_group(128);
    const auto s8 = scale_shape(f8, ScaleLayout::blocked128x4(), 1, m, k);
    const auto s4 = scale_shape(f4, ScaleLayout::blocked128x4(), 1, m, k);
    const auto sg = scale_shape(g, ScaleLayout::row_major(), 1, m, k);
    report("q mxfp8 128x4", s, double(m * k) * 3, false, [&] {
      quantize(xs, f8, ScaleLayout::blocked128x4(), tv(q.p, DType::kE4M3, {m, k}), tv(sc.p, DType::kUE8M0, s8));
    });
    QuantArgs a;
    a.global_amax = tv(ga.p, DType::kFloat32, {1});
    a.compute_global_amax = true;
    report("q nvfp4 128x4 +amax", s, double(m * k) * 2.5, false, [&] {
      quantize(xs, f4, ScaleLayout::blocked128x4(), tv(q.p, DType::kUInt8, {m, k / 2}), tv(sc.p, DType::kE4M3, s4), a);
    });
    report("q fp8 g128 row", s, double(m * k) * 3, false, [&] {
      quantize(xs, g, ScaleLayout::row_major(), tv(q.p, DType::kE4M3, {m, k}), tv(sc.p, DType::kFloat32, sg));
    });
    report("dq mxfp8 128x4 ->bf16", s, double(m * k) * 3, false, [&] {
      dequantize(tv(q.p, DType::kE4M3, {m, k}), tv(sc.p, DType::kUE8M0, s8), f8, ScaleLayout::blocked128x4(),
                 tv(out.p, DType::kBFloat16, {m, k}));
    });
    report("cast bf16->e4m3", s, double(m * k) * 3, false,
           [&] { cast(xs, tv(q.p, DType::kE4M3, {m, k})); });
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
