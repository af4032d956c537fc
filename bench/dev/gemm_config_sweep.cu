// bench/dev/gemm_config_sweep.cu: measures every tile / split-K choice of the NVFP4 dual GEMM
// mainloop (tokens per CTA 16 / 32 / 64 / 128 x split counts) for the two ops built on it, the
// dual GEMM + SiLU (nvfp4_dual_gemm_silu) and the dense linear (nvfp4_gemm), both with prepacked
// weights and bf16 / NVFP4 activations as the benchmarks run them, against the choice of
// gemm::dual_config and cuBLAS bf16 in the same process. Data for the heuristic
// (src/cuda/gemm/heuristics.hpp); the library's own choice is the "heur" column. Also ("mxfp4"):
// the dense mxfp4_gemm W4A16 on prepacked weights (one group of the grouped kernel) with every
// split count and tile (cuda::set_group_config_for_tuning), against moe::pick_tile's and
// moe::group_split's choice.
//
// Each choice goes through the public API with cuda::set_dual_config_for_tuning set; every call is
// captured once in a CUDA graph and the graph replayed (CUDA events, median of the reps, 256 MiB
// memset before each replay to flush L2). Each choice's output is compared with the heuristic
// choice's: split counts add in another order, so the check is |difference| <= 2^-7 |heuristic| +
// 1e-2 rms(output) (one bf16 / fp16 rounding of a reordered sum; the GPU tests hold every choice
// the heuristic makes to the fp64 reference). Where the grid has more CTA columns than a launch-
// order group (gemm::dual_tile_coords), the heuristic's choice also runs in the plain order
// ("plain_us"), which must give the same bits.
//
// Build on the GPU machine after the Python package (pip install ... -Cbuild-dir=build-gpu-py):
//   nvcc -std=c++17 -arch=sm_90a -O2 -Iinclude -Isrc bench/dev/gemm_config_sweep.cu \
//     build-gpu-py/liblowbit.a -lcublas -o gemm_config_sweep
//   ./gemm_config_sweep [--reps N] [--csv FILE] [--quick] [--ops dual,linear,mxfp4]
// Prints one row per (op, shape): the heuristic's choice and time, the best choice and time,
// cuBLAS bf16; the CSV holds every choice (column heuristic: 1 the heuristic's, 2 the same in the
// plain launch order). Exit status 1 when a choice's output is out of tolerance.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm/launch_gemm.hpp"
#include "cuda/moe/heuristics.hpp"
#include "cuda/moe/launch_moe.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/linear.hpp"
#include "lowbit/moe.hpp"

using namespace lowbit;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

namespace {

void* g_flush = nullptr;
const size_t kFlushBytes = size_t(256) << 20;
int g_reps = 20;
cudaStream_t g_st = nullptr;

/// Median time of `reps` replays of fn captured in a CUDA graph, L2 flushed before each.
template <typename F>
double graph_us(F&& fn) {
  fn();  // warm: pool growth, smem opt-in
  CK(cudaStreamSynchronize(g_st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
  fn();
  CK(cudaStreamEndCapture(g_st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(ge, g_st));
  std::vector<float> ts;
  for (int i = 0; i < g_reps; ++i) {
    CK(cudaMemsetAsync(g_flush, i & 0xFF, kFlushBytes, g_st));
    cudaEventRecord(a, g_st);
    CK(cudaGraphLaunch(ge, g_st));
    cudaEventRecord(b, g_st);
    CK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

float half_or_bf16(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return __half2float(__ushort_as_half(h));
}

/// Largest |got - ref| / (2^-7 |ref| + 1e-2 rms(ref)): a sum in another order, rounded once to
/// bf16 / fp16, moves by about 2^-8 relative, and by a little of the row's scale where it cancels.
double max_err(const std::vector<uint16_t>& ref, const std::vector<uint16_t>& got, bool bf16) {
  double ss = 0;
  size_t n = 0;
  for (uint16_t r : ref) {
    const double x = half_or_bf16(r, bf16);
    if (std::isfinite(x)) {
      ss += x * x;
      ++n;
    }
  }
  const double rms = n ? std::sqrt(ss / double(n)) : 0.0;
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = half_or_bf16(ref[i], bf16), y = half_or_bf16(got[i], bf16);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!(x == y)) err = 1e30;  // the same infinity passes; any NaN or a lone infinity fails
      continue;
    }
    err = std::max(err, std::fabs(x - y) / (0x1p-7 * std::fabs(x) + 1e-2 * rms + 1e-30));
  }
  return err;
}

struct Row {
  std::string op;
  int64_t M, N, K;
  cuda::gemm::DualConfig heur, best;
  double t_heur, t_best, t_cublas, t_plain;  // t_plain: the heuristic's choice in the plain launch order
};


/// cuBLAS bf16 C[M, rows] = A[M, K] W[rows, K]^T as graph replays: the anchor of every row.
double cublas_us(cublasHandle_t h, const __nv_bfloat16* W, const uint16_t* A, __nv_bfloat16* C, int64_t rows,
                 int64_t M, int64_t K) {
  const float one = 1, zero = 0;
  return graph_us([&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(M), int(K), &one, W, CUDA_R_16BF, int(K), A, CUDA_R_16BF,
                 int(K), &zero, C, CUDA_R_16BF, int(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

/// One tuned choice: `call` timed with the choice that `set` makes (and `unset` undoes) on a poisoned
/// output, checked against the heuristic choice's output `ref`, its CSV row written; returns the
/// time and counts an out-of-tolerance output in `bad`.
template <class Call, class Set, class Unset>
double measure_choice(const char* op, int64_t M, int64_t N, int64_t K, int tile, int splits, int kt, Call&& call,
                      Set&& set, Unset&& unset, uint16_t* c, const std::vector<uint16_t>& ref, std::vector<uint16_t>& got,
                      bool bf16, FILE* csv, int& bad) {
  set();
  CK(cudaMemsetAsync(c, 0xFF, size_t(M * N * 2), g_st));
  const double t = graph_us(call);
  unset();
  CK(cudaMemcpy(got.data(), c, got.size() * 2, cudaMemcpyDeviceToHost));
  const double err = max_err(ref, got, bf16);
  if (err > 1.0) {
    ++bad;
    std::fprintf(stderr, "out of tolerance: %s M=%lld N=%lld K=%lld tile %d splits %d: %.3g\n", op, (long long)M,
                 (long long)N, (long long)K, tile, splits, err);
  }
  if (csv)
    std::fprintf(csv, "%s,%lld,%lld,%lld,%d,%d,%d,%.2f,0,%.3g\n", op, (long long)M, (long long)N, (long long)K, tile,
                 splits, kt, t, err);
  return t;
}
}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* csv_path = nullptr;
  std::string ops = "dual,linear,mxfp4";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--ops") && i + 1 < argc) ops = argv[++i];
  }
  CK(cudaMalloc(&g_flush, kFlushBytes));
  CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, g_st);
  int dev = 0, sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv) std::fprintf(csv, "op,M,N,K,tile_n,splits,kt_per_split,us,heuristic,err_vs_heuristic\n");
  std::mt19937 rng(7);
  const Device D = Device::kCUDA;
  const Stream S{g_st};

  struct Case {
    const char* op;
    int64_t N, K;
  };
  // dual: N outputs (2N weight rows); linear: N x K of the Llama-style layers
  std::vector<Case> cases = {{"dual", 4096, 7168}, {"dual", 3072, 4096}, {"dual", 3072, 7168},
                             {"linear", 4096, 4096}, {"linear", 6144, 4096}, {"linear", 28672, 4096},
                             {"linear", 4096, 14336}, {"linear", 8192, 8192}};
  std::vector<int64_t> Ms = {1, 16, 32, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096};
  if (quick) {
    cases.resize(4);
    Ms = {16, 256};
  }
  const int tiles[] = {16, 32, 64, 128};
  const int split_set[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
  std::vector<Row> rows;
  int bad = 0;
  for (const Case& cs : cases) {
    if (ops.find(cs.op) == std::string::npos) continue;
    const bool dual = !std::strcmp(cs.op, "dual");
    const int64_t N = cs.N, K = cs.K, Wrows = dual ? 2 * N : N;
    const int64_t Mmax = Ms.back();
    // weights: E2M1 codes and E4M3 scales in [2^-5, 2^-3) (the dual GEMM's fp16 silu(g) * u of
    // K-long sums stays finite)
    std::vector<uint8_t> hb(size_t(Wrows * K / 2)), hs(size_t(Wrows * K / 16));
    for (auto& v : hb) v = uint8_t(rng() & 0xFF);
    for (auto& v : hs) v = uint8_t(0x10 + rng() % 0x10);
    uint8_t *b, *sb, *packed, *a4, *sa;
    uint16_t *a16, *c, *c_ref;
    CK(cudaMalloc(&b, hb.size()));
    CK(cudaMalloc(&sb, hs.size()));
    cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(sb, hs.data(), hs.size(), cudaMemcpyHostToDevice);
    const int64_t pbytes = dual ? nvfp4_dual_gemm_packed_bytes(N, K) : nvfp4_gemm_packed_bytes(N, K);
    CK(cudaMalloc(&packed, size_t(pbytes)));
    // activations: bf16 N(0, 1) for the linear; NVFP4 codes + E4M3 scales for the dual GEMM
    std::vector<uint16_t> ha(size_t(Mmax * K));
    std::normal_distribution<float> nd;
    for (auto& v : ha) v = bf16_bits(nd(rng));
    std::vector<uint8_t> ha4(size_t(Mmax * K / 2)), hsa(size_t(Mmax * K / 16));
    for (auto& v : ha4) v = uint8_t(rng() & 0xFF);
    for (auto& v : hsa) v = uint8_t(0x10 + rng() % 0x10);
    CK(cudaMalloc(&a16, ha.size() * 2));
    CK(cudaMalloc(&a4, ha4.size()));
    CK(cudaMalloc(&sa, hsa.size()));
    cudaMemcpy(a16, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(a4, ha4.data(), ha4.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(sa, hsa.data(), hsa.size(), cudaMemcpyHostToDevice);
    CK(cudaMalloc(&c, size_t(Mmax * N * 2)));
    CK(cudaMalloc(&c_ref, size_t(Mmax * N * 2)));
    if (dual) {
      DualGemmArgs x;
      x.b1 = TensorView(b, DType::kUInt8, {N, K / 2}, D);
      x.b2 = TensorView(b + N * K / 2, DType::kUInt8, {N, K / 2}, D);
      x.sfb1 = TensorView(sb, DType::kE4M3, {N, K / 16}, D);
      x.sfb2 = TensorView(sb + N * K / 16, DType::kE4M3, {N, K / 16}, D);
      nvfp4_dual_gemm_prepack(x, TensorView(packed, DType::kUInt8, {pbytes}, D), S);
    } else {
      nvfp4_gemm_prepack(TensorView(b, DType::kUInt8, {N, K / 2}, D), TensorView(sb, DType::kE4M3, {N, K / 16}, D),
                         ScaleLayout::row_major(), TensorView(packed, DType::kUInt8, {pbytes}, D), S);
    }
    // cuBLAS anchor operands (bf16 weights [Wrows, K], values irrelevant to the time)
    __nv_bfloat16 *W16, *C16;
    CK(cudaMalloc(&W16, size_t(Wrows * K * 2)));
    CK(cudaMalloc(&C16, size_t(Mmax * Wrows * 2)));
    cudaMemset(W16, 0x3c, size_t(Wrows * K * 2));
    CK(cudaStreamSynchronize(g_st));
    for (const int64_t M : Ms) {
      auto call = [&] {
        if (dual) {
          DualGemmArgs y;
          y.a = TensorView(a4, DType::kUInt8, {M, K / 2}, D);
          y.sfa = TensorView(sa, DType::kE4M3, {M, K / 16}, D);
          y.packed_b = TensorView(packed, DType::kUInt8, {pbytes}, D);
          y.c = TensorView(c, DType::kFloat16, {M, N}, D);
          nvfp4_dual_gemm_silu(y, S);
        } else {
          Nvfp4GemmArgs y;
          y.a = TensorView(a16, DType::kBFloat16, {M, K}, D);
          y.b = TensorView(packed, DType::kUInt8, {pbytes}, D);
          y.b_packed = true;
          y.out = TensorView(c, DType::kBFloat16, {M, N}, D);
          nvfp4_gemm(y, S);
        }
      };
      const bool out_bf16 = !dual;
      std::vector<uint16_t> ref(size_t(M * N)), got(size_t(M * N));
      cuda::set_dual_config_for_tuning(nullptr);
      const cuda::gemm::DualConfig heur = cuda::choose_dual_config(M, dual ? N : N / 2, K, 1, sms);
      const double t_heur = graph_us(call);
      CK(cudaMemcpy(ref.data(), c, ref.size() * 2, cudaMemcpyDeviceToHost));
      Row r{cs.op, M, N, K, heur, heur, t_heur, t_heur, 0, 0};
      const int64_t columns = dual ? N / 64 : N / 128;
      if (columns > heur.raster_group) {  // the grouped launch order changes this grid: time the plain one
        cuda::gemm::DualConfig plain = heur;
        plain.raster_group = 0;
        cuda::set_dual_config_for_tuning(&plain);
        r.t_plain = graph_us(call);
        cuda::set_dual_config_for_tuning(nullptr);
        CK(cudaMemcpy(got.data(), c, got.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < got.size(); ++i)
          if (got[i] != ref[i]) {  // the order of the CTAs changes no sum
            ++bad;
            std::fprintf(stderr, "plain launch order changed the bits: %s M=%lld\n", cs.op, (long long)M);
            break;
          }
        if (csv) std::fprintf(csv, "%s,%lld,%lld,%lld,%d,%d,%d,%.2f,2,0\n", cs.op, (long long)M, (long long)N,
                              (long long)K, heur.tile_n, heur.splits, heur.kt_per_split, r.t_plain);
      }
      if (csv) std::fprintf(csv, "%s,%lld,%lld,%lld,%d,%d,%d,%.2f,1,0\n", cs.op, (long long)M, (long long)N, (long long)K,
                            heur.tile_n, heur.splits, heur.kt_per_split, t_heur);
      std::vector<std::pair<int, int>> seen;
      for (int tn : tiles) {
        if (tn > 16 && tn / 2 >= M) continue;  // a tile of twice the tokens or more: never faster
        for (int sp : split_set) {
          const cuda::gemm::DualConfig cfg = cuda::gemm::dual_config_for(tn, sp, K);
          if (std::find(seen.begin(), seen.end(), std::make_pair(cfg.tile_n, cfg.splits)) != seen.end()) continue;
          seen.push_back({cfg.tile_n, cfg.splits});
          const int64_t ctas = (dual ? N / 64 : N / 128) * ((M + cfg.tile_n - 1) / cfg.tile_n) * cfg.splits;
          if (ctas > 64 * sms) continue;  // far past a few waves: split-K only adds reduction traffic
          const double t = measure_choice(
              cs.op, M, N, K, cfg.tile_n, cfg.splits, cfg.kt_per_split, call,
              [&] { cuda::set_dual_config_for_tuning(&cfg); }, [] { cuda::set_dual_config_for_tuning(nullptr); }, c,
              ref, got, out_bf16, csv, bad);
          if (t < r.t_best) {
            r.t_best = t;
            r.best = cfg;
          }
        }
      }
      r.t_cublas = cublas_us(h, W16, a16, C16, Wrows, M, K);
      rows.push_back(r);
      if (csv) std::fflush(csv);
      std::fprintf(stderr, "%s %lldx%lldx%lld heur %d/%d %.1f (plain order %.1f) best %d/%d %.1f cublas %.1f\n",
                   cs.op, (long long)M, (long long)N, (long long)K, heur.tile_n, heur.splits, t_heur, r.t_plain,
                   r.best.tile_n, r.best.splits, r.t_best, r.t_cublas);
    }
    cudaFree(b); cudaFree(sb); cudaFree(packed); cudaFree(a16); cudaFree(a4); cudaFree(sa);
    cudaFree(c); cudaFree(c_ref); cudaFree(W16); cudaFree(C16);
  }

  // mxfp4_gemm (dense MXFP4 W4A16 on prepacked weights: one group of the grouped kernel): the
  // kernel's tile is moe::pick_tile's; every split count against moe::group_split's.
  if (ops.find("mxfp4") != std::string::npos) {
    const int64_t nks[][2] = {{4096, 4096}, {6144, 4096}, {28672, 4096}, {4096, 14336}, {8192, 8192}};
    const int split_set_g[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16};
    for (const auto& nk : nks) {
      if (quick && nk[0] != 4096) continue;
      const int64_t N = nk[0], K = nk[1], Np = mxfp4_packed_rows(N), Kp = mxfp4_packed_k(K);
      const int64_t Mmax = Ms.back();
      std::vector<uint8_t> hb(size_t(N * K / 2)), hs(size_t(N * K / 32));
      for (auto& v : hb) v = uint8_t(rng() & 0xFF);
      for (auto& v : hs) v = uint8_t(118 + rng() % 10);
      std::vector<uint16_t> ha(size_t(Mmax * K));
      std::normal_distribution<float> nd;
      for (auto& v : ha) v = bf16_bits(nd(rng));
      uint8_t *b, *sb, *pb, *ps;
      uint16_t *a16, *c;
      CK(cudaMalloc(&b, hb.size()));
      CK(cudaMalloc(&sb, hs.size()));
      CK(cudaMalloc(&pb, size_t(Np * Kp / 2)));
      CK(cudaMalloc(&ps, size_t(Np * Kp / 32)));
      CK(cudaMalloc(&a16, ha.size() * 2));
      CK(cudaMalloc(&c, size_t(Mmax * N * 2)));
      cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(sb, hs.data(), hs.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(a16, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice);
      group_gemm_mxfp4_prepack(TensorView(b, DType::kUInt8, {1, N, K / 2}, D), TensorView(sb, DType::kUInt8, {1, N, K / 32}, D),
                               ScaleLayout::row_major(), TensorView(pb, DType::kUInt8, {1, Np, Kp / 2}, D),
                               TensorView(ps, DType::kUInt8, {1, Np, Kp / 32}, D), S);
      __nv_bfloat16 *W16, *C16;
      CK(cudaMalloc(&W16, size_t(N * K * 2)));
      CK(cudaMalloc(&C16, size_t(Mmax * N * 2)));
      cudaMemset(W16, 0x3c, size_t(N * K * 2));
      CK(cudaStreamSynchronize(g_st));
      for (const int64_t M : Ms) {
        auto call = [&] {
          Mxfp4GemmArgs y;
          y.a = TensorView(a16, DType::kBFloat16, {M, K}, D);
          y.b = TensorView(pb, DType::kUInt8, {1, Np, Kp / 2}, D);
          y.b_scale = TensorView(ps, DType::kUInt8, {1, Np, Kp / 32}, D);
          y.b_packed = true;
          y.out = TensorView(c, DType::kBFloat16, {M, N}, D);
          mxfp4_gemm(y, S);
        };
        // the library's choice (make_group_params / run_group for one group of M rows)
        const cuda::moe::GroupTile tile = cuda::moe::call_tile(M, 1, K, 0, 0, true);
        const cuda::moe::GroupSplit hs_ = cuda::moe::call_split(M, 1, N, K, tile, true, sms);
        std::vector<uint16_t> ref(size_t(M * N)), got(size_t(M * N));
        cuda::set_group_config_for_tuning(0, 0);
        const double t_heur = graph_us(call);
        CK(cudaMemcpy(ref.data(), c, ref.size() * 2, cudaMemcpyDeviceToHost));
        Row r{"mxfp4", M, N, K, {}, {}, t_heur, t_heur, 0, 0};
        r.heur.tile_n = r.best.tile_n = tile.tile_n;
        r.heur.splits = r.best.splits = hs_.splits;
        if (csv) std::fprintf(csv, "mxfp4,%lld,%lld,%lld,%d,%d,%d,%.2f,1,0\n", (long long)M, (long long)N, (long long)K,
                              tile.tile_n, hs_.splits, hs_.kt_per_split, t_heur);
        const int tiles_g[] = {16, 32, 64, 128};
        for (int tn : tiles_g) {
          if (tn > 16 && tn / 2 >= M) continue;
          const cuda::moe::GroupTile tt = cuda::moe::pick_tile(tn, 1);
          const cuda::moe::GroupSplit base = cuda::moe::group_split(M, 1, N, K, tt.tile_n, tt.tile_k, sms);
          std::vector<int> seen;
          for (int sp : split_set_g) {
            const cuda::moe::GroupSplit g = cuda::moe::group_split_for(base.max_tiles, K, tt.tile_k, sp);
            if (std::find(seen.begin(), seen.end(), g.splits) != seen.end()) continue;
            seen.push_back(g.splits);
            if ((N + 127) / 128 * base.max_tiles * g.splits > 64 * sms) continue;  // far past a few waves
            const double t = measure_choice(
                "mxfp4", M, N, K, tn, g.splits, g.kt_per_split, call,
                [&] { cuda::set_group_config_for_tuning(tn, g.splits); }, [] { cuda::set_group_config_for_tuning(0, 0); },
                c, ref, got, true, csv, bad);
            if (t < r.t_best) {
              r.t_best = t;
              r.best.tile_n = tn;
              r.best.splits = g.splits;
            }
          }
        }
        r.t_cublas = cublas_us(h, W16, a16, C16, N, M, K);
        rows.push_back(r);
        if (csv) std::fflush(csv);
        std::fprintf(stderr, "mxfp4 %lldx%lldx%lld heur %d/%d %.1f best %d/%d %.1f cublas %.1f\n", (long long)M,
                     (long long)N, (long long)K, tile.tile_n, hs_.splits, t_heur, r.best.tile_n, r.best.splits, r.t_best,
                     r.t_cublas);
      }
      cudaFree(b); cudaFree(sb); cudaFree(pb); cudaFree(ps); cudaFree(a16); cudaFree(c); cudaFree(W16); cudaFree(C16);
    }
  }
  if (csv) std::fclose(csv);
  std::printf("%-7s %-16s %10s %9s %9s %10s %9s %7s %9s %7s %7s\n", "op", "MxNxK", "heur", "heur_us", "plain_us", "best",
              "best_us", "gain", "cublas_us", "x_heur", "x_best");
  for (const Row& r : rows) {
    char sh[40], hc[16], bc[16];
    std::snprintf(sh, sizeof sh, "%lldx%lldx%lld", (long long)r.M, (long long)r.N, (long long)r.K);
    std::snprintf(hc, sizeof hc, "%d/%d", r.heur.tile_n, r.heur.splits);
    std::snprintf(bc, sizeof bc, "%d/%d", r.best.tile_n, r.best.splits);
    std::printf("%-7s %-16s %10s %9.1f %9.1f %10s %9.1f %7.3f %9.1f %7.2f %7.2f\n", r.op.c_str(), sh, hc, r.t_heur,
                r.t_plain, bc, r.t_best, r.t_heur / r.t_best, r.t_cublas, r.t_cublas / r.t_heur, r.t_cublas / r.t_best);
  }
  std::printf("heur / best = tile_n / splits; plain_us = the heuristic's choice in the plain launch order (0: the "
              "grid has no more columns than a group); gain = heur_us / best_us; x_heur / x_best = cublas_us / "
              "heur_us / best_us (cuBLAS bf16 on the 2N or N weight rows, M x rows x K)\n");
  cublasDestroy(h);
  return bad ? 1 : 0;
}
