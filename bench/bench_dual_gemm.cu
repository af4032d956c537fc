// bench/bench_dual_gemm.cu: NVFP4 dual GEMM + SiLU against cuBLAS bf16 in the same process.
//
//   bench_dual_gemm [--quick] [--shape M N K]     (--shape: that shape only, e.g. under a profiler)
//
// Anchor (what a user would otherwise run): cuBLAS bf16 GEMM of A[M,K] against the two weight
// matrices concatenated [2N, K] (one GEMM, fp32 accumulation, bf16 out), then silu(g) * u.
// Ceilings measured here: cuBLAS bf16 8192^3 (TFLOP/s) and a device-to-device copy (TB/s).
// Times: CUDA events, median of >= 20 runs, L2 flushed (256 MiB write) before each run.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/gemm.hpp"

using namespace lowbit;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

void* g_flush = nullptr;
const size_t kFlushBytes = size_t(256) << 20;

template <typename F>
double time_us(F&& fn, int iters = 30) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ts;
  for (int i = 0; i < iters; ++i) {
    CK(cudaMemsetAsync(g_flush, i & 0xFF, kFlushBytes));
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.0f);
  }
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[ts.size() / 2];
}

__global__ void silu_mul_kernel(const __nv_bfloat16* gu, __nv_bfloat16* out, int64_t M, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    const float g = __bfloat162float(gu[m * 2 * N + n]), u = __bfloat162float(gu[m * 2 * N + N + n]);
    out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

double bf16_peak_tflops(cublasHandle_t h) {
  const int n = 8192;
  __nv_bfloat16 *a, *b, *c;
  CK(cudaMalloc(&a, size_t(n) * n * 2));
  CK(cudaMalloc(&b, size_t(n) * n * 2));
  CK(cudaMalloc(&c, size_t(n) * n * 2));
  cudaMemset(a, 0x3c, size_t(n) * n * 2);
  cudaMemset(b, 0x3c, size_t(n) * n * 2);
  const float one = 1, zero = 0;
  const double us = time_us([&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, b, CUDA_R_16BF, n, a, CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }, 10);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * double(n) * n / us * 1e-6;
}

double copy_tbps() {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  const double us = time_us([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / us * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int64_t only[3] = {0, 0, 0};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--shape") == 0 && i + 3 < argc)
      for (int j = 0; j < 3; ++j) only[j] = std::atoll(argv[++i]);
  }
  CK(cudaMalloc(&g_flush, kFlushBytes));
  cublasHandle_t h;
  cublasCreate(&h);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double peak = bf16_peak_tflops(h), bw = copy_tbps();
  std::printf("device: %s | ceilings: cuBLAS bf16 8192^3 %.0f TFLOP/s, D2D copy %.2f TB/s\n", prop.name, peak, bw);
  struct Shape {
    int64_t M, N, K;
  };
  std::vector<Shape> shapes = {{256, 4096, 7168}, {512, 4096, 7168}, {256, 3072, 4096}, {512, 3072, 7168},
                               {1, 4096, 7168},   {16, 4096, 7168},  {64, 4096, 7168},  {4096, 4096, 7168}};
  if (quick) shapes.resize(6);
  if (only[0] > 0) shapes = {{only[0], only[1], only[2]}};
  std::printf("%-18s %10s %10s %10s %9s %9s %8s %8s %8s\n", "MxNxK", "lowbit_us", "prepack+", "cublas_us", "x_cublas",
              "TFLOP/s", "f_peak", "mem_us", "f_mem");
  std::mt19937 rng(1);
  for (const auto& s : shapes) {
    const int64_t M = s.M, N = s.N, K = s.K;
    std::vector<uint8_t> ha(size_t(M * K / 2)), hb(size_t(2 * N * K / 2)), hsa(size_t(M * K / 16)), hsb(size_t(2 * N * K / 16));
    for (auto& v : ha) v = uint8_t(rng() & 0xBB);
    for (auto& v : hb) v = uint8_t(rng() & 0xBB);
    for (auto& v : hsa) v = encode_e4m3(float(rng() % 1000) / 1000.0f);
    for (auto& v : hsb) v = encode_e4m3(float(rng() % 1000) / 1000.0f);
    uint8_t *a, *b, *sa, *sb, *packed;
    uint16_t* c;
    CK(cudaMalloc(&a, ha.size()));
    CK(cudaMalloc(&b, hb.size()));
    CK(cudaMalloc(&sa, hsa.size()));
    CK(cudaMalloc(&sb, hsb.size()));
    CK(cudaMalloc(&c, size_t(M * N * 2)));
    const int64_t pbytes = nvfp4_dual_gemm_packed_bytes(N, K);
    CK(cudaMalloc(&packed, size_t(pbytes)));
    cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(sa, hsa.data(), hsa.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(sb, hsb.data(), hsb.size(), cudaMemcpyHostToDevice);
    const Device D = Device::kCUDA;
    DualGemmArgs x;
    x.a = TensorView(a, DType::kUInt8, {M, K / 2}, D);
    x.b1 = TensorView(b, DType::kUInt8, {N, K / 2}, D);
    x.b2 = TensorView(b + N * K / 2, DType::kUInt8, {N, K / 2}, D);
    x.sfa = TensorView(sa, DType::kE4M3, {M, K / 16}, D);
    x.sfb1 = TensorView(sb, DType::kE4M3, {N, K / 16}, D);
    x.sfb2 = TensorView(sb + N * K / 16, DType::kE4M3, {N, K / 16}, D);
    x.c = TensorView(c, DType::kFloat16, {M, N}, D);
    const double t_full = time_us([&] { nvfp4_dual_gemm_silu(x); });
    nvfp4_dual_gemm_prepack(x, TensorView(packed, DType::kUInt8, {pbytes}, D));
    DualGemmArgs y = x;
    y.b1 = y.b2 = y.sfb1 = y.sfb2 = TensorView();
    y.packed_b = TensorView(packed, DType::kUInt8, {pbytes}, D);
    const double t_pre = time_us([&] { nvfp4_dual_gemm_silu(y); });
    // anchor: bf16 cuBLAS on concatenated weights, then silu * up
    __nv_bfloat16 *A16, *W16, *GU, *O;
    CK(cudaMalloc(&A16, size_t(M * K * 2)));
    CK(cudaMalloc(&W16, size_t(2 * N * K * 2)));
    CK(cudaMalloc(&GU, size_t(M * 2 * N * 2)));
    CK(cudaMalloc(&O, size_t(M * N * 2)));
    cudaMemset(A16, 0x3c, size_t(M * K * 2));
    cudaMemset(W16, 0x3c, size_t(2 * N * K * 2));
    const float one = 1, zero = 0;
    const double t_cb = time_us([&] {
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(2 * N), int(M), int(K), &one, W16, CUDA_R_16BF, int(K), A16, CUDA_R_16BF,
                   int(K), &zero, GU, CUDA_R_16BF, int(2 * N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      silu_mul_kernel<<<1024, 256>>>(GU, O, M, N);
    });
    CK(cudaDeviceSynchronize());
    const double flops = 4.0 * M * N * K;
    const double bytes = double(M * K / 2 + M * K / 16 + 2 * N * K / 2 + 2 * N * K / 16 + M * N * 2);
    const double mem_us = bytes / (bw * 1e6);
    char sh[32];
    std::snprintf(sh, sizeof sh, "%lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    std::printf("%-18s %10.1f %10.1f %10.1f %9.2f %9.0f %8.2f %8.1f %8.2f\n", sh, t_pre, t_full, t_cb, t_cb / t_pre,
                flops / t_pre * 1e-6, flops / t_pre * 1e-6 / peak, mem_us, mem_us / t_pre);
    cudaFree(a); cudaFree(b); cudaFree(sa); cudaFree(sb); cudaFree(c); cudaFree(packed);
    cudaFree(A16); cudaFree(W16); cudaFree(GU); cudaFree(O);
  }
  std::printf("columns: lowbit_us = prepacked weights; prepack+ = one call on the plain GPU MODE layout (prepack "
              "included); x_cublas = cublas_us / lowbit_us; f_peak = fraction of cuBLAS bf16 8192^3; mem_us = packed bytes / copy BW\n");
  cublasDestroy(h);
  return 0;
}
