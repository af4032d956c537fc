// bench/dev/gemm_prims_ab.cu: same-process A/B of the two policies for the hand-written Hopper
// primitives of the GEMM kernels (src/cuda/common/sm90_gemm_common.cuh): gemm::LocalPrims (the
// hand-written TMA load without a cache hint and the C++ try_wait loop; the default) against
// gemm::CutlassPrims (cute::SM90_TMA_LOAD_2D::copy with an EVICT_NORMAL L2 cache hint and
// cutlass::arch::ClusterBarrier::wait). Both policies are instantiated in this one binary, run on
// the same operands, checked for bit-identical outputs and timed interleaved (A B A B ...).
//
// Which kernels the policy reaches: only the MXFP4 grouped GEMM's warp-specialized kernel
// (group_mainloop_ws.cuh: TMA producer warp, mbarrier stages; 16 or 32 tokens per CTA with
// prepacked weights). Its cp.async kernel (group_mainloop.cuh) and the NVFP4 dual GEMM
// (dual_mainloop.cuh: cp.async pipeline and __syncthreads) use neither primitive, so they have no
// policy and are not measured here. The run goes through run_group (split-K choice, split-K
// finalize) exactly as the library does, so a shape where the library picks the cp.async kernel
// (T = 4096) runs that kernel for both columns: an A/A row that shows the timing noise. The row
// marked "ws forced" runs the warp-specialized kernel (32 tokens per CTA) at that shape anyway.
//
// Shapes: gpt-oss-20b gate_up, 32 experts, N = 5760 (gate and up rows), K = 2880, top-4 routing
// drawn uniformly at random (4 distinct experts per token), T = 1, 64, 4096 tokens. Weights: random
// E2M1 codes with UE8M0 scale bytes 118..124, prepacked on the device by the library's prepack
// kernel; activations: bf16 N(0, 1), gathered per routed row and laid out in the kernel's K order
// (act_pos). A few hundred outputs are also checked against an fp64 host dot product.
// Times: CUDA events around run_group, median of the reps (default 30), 256 MiB memset before
// every rep to flush L2.
//
// Build on the GPU machine from the repository root (CUTLASS headers from scripts/fetch_cutlass.sh;
// the exact-fp32 flags are the ones CMakeLists.txt gives the moe kernels):
//   nvcc -std=c++17 -arch=sm_90a -O3 --expt-relaxed-constexpr -lineinfo -fmad=false --ftz=false \
//     --prec-div=true -Iinclude -Isrc -isystem .deps/cutlass/include -DLOWBIT_WITH_CUDA=1 \
//     -DLOWBIT_WITH_CUTLASS=1 bench/dev/gemm_prims_ab.cu src/cuda/moe/sm90_mxfp4_group_gemm_t128.cu \
//     src/cuda/common/workspace.cu src/cuda/common/device_info.cu -o gemm_prims_ab
//   ./gemm_prims_ab [reps]
// Exit status 0 when every row is bit-identical and passes the reference check.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/moe/group_run.cuh"
#include "cuda/moe/mxfp4_prepack.cuh"

using namespace lowbit;
using lowbit::cuda::GroupArgs;
using lowbit::cuda::gemm::CutlassPrims;
using lowbit::cuda::gemm::LocalPrims;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

constexpr int64_t kG = 32, kN = 5760, kK = 2880, kTopk = 4;
constexpr size_t kFlushBytes = size_t(256) << 20;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The prepacked weights on the device and the plain ones on the host (for the reference).
struct Weights {
  std::vector<uint8_t> codes;   // [G][N][K/2], element k in the low (k even) / high nibble of byte k/2
  std::vector<uint8_t> scales;  // [G][N][K/32]
  uint8_t* packed_b = nullptr;  // [G][Np][Kp/2]
  uint8_t* packed_s = nullptr;  // [G][Np][Kp/32]
  int64_t Np = 0, Kp = 0;

  double w(int64_t g, int64_t n, int64_t k) const {
    const uint8_t c = (codes[(g * kN + n) * (kK / 2) + k / 2] >> (4 * (k & 1))) & 0xF;
    return double(decode_e2m1(c)) * double(decode_ue8m0(scales[(g * kN + n) * (kK / 32) + k / 32]));
  }
};

Weights make_weights() {
  Weights W;
  W.codes.resize(size_t(kG * kN * kK / 2));
  W.scales.resize(size_t(kG * kN * kK / 32));
  uint64_t s = 12345;
  for (size_t i = 0; i < W.codes.size(); i += 8) {
    const uint64_t r = splitmix(s);
    std::memcpy(&W.codes[i], &r, std::min<size_t>(8, W.codes.size() - i));
  }
  for (auto& b : W.scales) b = uint8_t(118 + splitmix(s) % 7);
  W.Np = mxfp4_packed_rows(kN);
  W.Kp = mxfp4_packed_k(kK);
  uint8_t *db = nullptr, *ds = nullptr;
  CK(cudaMalloc(&db, W.codes.size()));
  CK(cudaMalloc(&ds, W.scales.size()));
  CK(cudaMemcpy(db, W.codes.data(), W.codes.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds, W.scales.data(), W.scales.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&W.packed_b, size_t(kG * W.Np * W.Kp / 2)));
  CK(cudaMalloc(&W.packed_s, size_t(kG * W.Np * W.Kp / 32)));
  detail::Mxfp4PackPlan p;
  p.G = kG;
  p.N = kN;
  p.K = kK;
  p.b = db;
  p.b_sN = kK / 2;
  p.b_sG = kN * (kK / 2);
  p.b_scale = ds;
  p.spb.layout = ScaleLayout::row_major();
  p.spb.rows = p.spb.rows_pad = kN;
  p.spb.cols = kK / 32;
  p.spb.batch_stride = kN * (kK / 32);
  p.packed_b = W.packed_b;
  p.packed_scale = W.packed_s;
  lowbit::cuda::mxfp4_prepack_kernel<<<1024, 256>>>(p, W.Np, W.Kp);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaFree(db));
  CK(cudaFree(ds));
  return W;
}

/// Routed rows of T tokens (top-4 of 32 experts, uniform), sorted by expert.
struct Routing {
  std::vector<int32_t> indptr;  // [G + 1]
  std::vector<int32_t> token;   // token of each routed row
};

Routing route(int64_t T, std::mt19937& rng) {
  std::vector<std::vector<int32_t>> per(kG);
  std::vector<int> e(kG);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < kG; ++i) e[i] = i;
    for (int i = 0; i < kTopk; ++i) {  // partial Fisher-Yates: 4 distinct experts
      std::uniform_int_distribution<int> d(i, int(kG) - 1);
      std::swap(e[i], e[d(rng)]);
      per[e[i]].push_back(int32_t(t));
    }
  }
  Routing r;
  r.indptr.push_back(0);
  for (int g = 0; g < kG; ++g) {
    r.token.insert(r.token.end(), per[g].begin(), per[g].end());
    r.indptr.push_back(int32_t(r.token.size()));
  }
  return r;
}

struct Row {
  double us[2];
  bool identical, ref_ok;
  double ref_err;
};

template <class Prims>
void run(const GroupArgs& a, int64_t rows, cudaMemPool_t pool) {
  CK(lowbit::cuda::run_group<Prims>(a, rows, pool, nullptr));
}

/// One (T, tile) case: both policies, identity, reference spot check and interleaved timing.
Row run_case(const Weights& W, const Routing& R, const std::vector<uint16_t>& x, int NT, int KT, int reps,
             void* flush, cudaMemPool_t pool, std::mt19937& rng) {
  const int64_t rows = int64_t(R.token.size()), Kp = (kK + KT - 1) / KT * KT;
  // the routed rows' activations in act_pos order, zero beyond K
  std::vector<uint16_t> act(size_t(rows * Kp), 0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < kK; ++k)
      act[size_t(m * Kp + lowbit::cuda::act_index(k, KT))] = x[size_t(R.token[size_t(m)] * kK + k)];
  uint16_t* dact = nullptr;
  int32_t* dind = nullptr;
  uint16_t* dout[2] = {nullptr, nullptr};
  CK(cudaMalloc(&dact, act.size() * 2));
  CK(cudaMalloc(&dind, R.indptr.size() * 4));
  CK(cudaMemcpy(dact, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dind, R.indptr.data(), R.indptr.size() * 4, cudaMemcpyHostToDevice));
  const size_t out_bytes = size_t(rows * kN * 2);
  for (auto& o : dout) {
    CK(cudaMalloc(&o, out_bytes));
    CK(cudaMemset(o, 0xFF, out_bytes));
  }

  GroupArgs a;
  a.M = rows;
  a.N = kN;
  a.K = kK;
  a.G = kG;
  a.NT = NT;
  a.KT = KT;
  a.Kp = Kp;
  a.b = W.packed_b;
  a.b_sN = W.Kp / 2;
  a.b_sG = W.Np * a.b_sN;
  a.packed = true;
  a.bs = W.packed_s;
  a.bs_blocked = false;
  a.bs_sN = W.Kp / 32;
  a.bs_sG = W.Np * a.bs_sN;
  a.m_indptr = dind;
  a.indptr64 = false;
  a.act = dact;
  a.mode = lowbit::cuda::kEpiPlain;
  a.out_dtype = DType::kBFloat16;
  a.o_sM = kN;
  a.pdl = true;  // as the library launches it (behind the activation pre-pass)
  GroupArgs al = a, ac = a;
  al.out = dout[0];
  ac.out = dout[1];

  Row r{};
  run<LocalPrims>(al, rows, pool);
  run<CutlassPrims>(ac, rows, pool);
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> o0(size_t(rows * kN)), o1(size_t(rows * kN));
  CK(cudaMemcpy(o0.data(), dout[0], out_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o1.data(), dout[1], out_bytes, cudaMemcpyDeviceToHost));
  r.identical = std::memcmp(o0.data(), o1.data(), out_bytes) == 0;

  // reference: fp64 dot products of sampled (row, n), bf16 output rounding plus fp32 accumulation
  r.ref_ok = true;
  std::uniform_int_distribution<int64_t> dm(0, rows - 1), dn(0, kN - 1);
  for (int i = 0; i < 256; ++i) {
    const int64_t m = dm(rng), n = dn(rng);
    int64_t g = 0;
    while (R.indptr[size_t(g + 1)] <= m) ++g;
    double ref = 0, mag = 0;
    for (int64_t k = 0; k < kK; ++k) {
      const double t = W.w(g, n, k) * double(decode_bf16(x[size_t(R.token[size_t(m)] * kK + k)]));
      ref += t;
      mag += std::fabs(t);
    }
    const double got = double(decode_bf16(o0[size_t(m * kN + n)]));
    const double err = std::fabs(got - ref);
    r.ref_err = std::max(r.ref_err, err / (mag > 0 ? mag : 1.0));
    if (!(err <= std::ldexp(std::fabs(ref), -7) + 1e-4 * mag)) r.ref_ok = false;
  }

  // interleaved timing: A B A B ..., L2 flushed before each
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) {
    run<LocalPrims>(al, rows, pool);
    run<CutlassPrims>(ac, rows, pool);
  }
  std::vector<float> ts[2];
  for (int i = 0; i < 2 * reps; ++i) {
    const int p = i & 1;
    CK(cudaMemsetAsync(flush, i & 0xFF, kFlushBytes));
    CK(cudaEventRecord(e0));
    if (p == 0)
      run<LocalPrims>(al, rows, pool);
    else
      run<CutlassPrims>(ac, rows, pool);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts[p].push_back(ms * 1000.0f);
  }
  for (int p = 0; p < 2; ++p) {
    std::sort(ts[p].begin(), ts[p].end());
    r.us[p] = ts[p][ts[p].size() / 2];
  }
  // the outputs of the last timed runs must still agree
  CK(cudaMemcpy(o0.data(), dout[0], out_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o1.data(), dout[1], out_bytes, cudaMemcpyDeviceToHost));
  r.identical = r.identical && std::memcmp(o0.data(), o1.data(), out_bytes) == 0;
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(dact));
  CK(cudaFree(dind));
  for (auto& o : dout) CK(cudaFree(o));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(20, std::atoi(argv[1])) : 30;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs), reps per policy: %d (median)\n", prop.name, prop.multiProcessorCount, reps);
  std::printf("dual GEMM (16/256/4096 x 4096 x 7168): not measured: its mainloop (cp.async, __syncthreads) uses "
              "neither primitive, so it has no policy\n");
  void* flush = nullptr;
  CK(cudaMalloc(&flush, kFlushBytes));
  cudaMemPool_t pool = nullptr;
  CK(lowbit::cuda::workspace_pool(&pool));
  const Weights W = make_weights();
  std::mt19937 rng(2024);

  struct Case {
    int64_t T;
    bool forced_ws;
  };
  const Case cases[] = {{1, false}, {64, false}, {4096, false}, {4096, true}};
  std::printf("\n%-44s %10s %10s %7s %10s %s\n", "shape (gpt-oss-20b gate_up, E=32 N=5760 K=2880 top-4)",
              "local us", "cutlass us", "ratio", "identical", "ref check (max err / sum|terms|)");
  bool ok = true;
  Routing R;
  std::vector<uint16_t> x;
  int64_t T = -1;
  for (const Case& c : cases) {
    if (c.T != T) {  // the routing and tokens of T (shared by the rows of one T)
      T = c.T;
      R = route(T, rng);
      x.resize(size_t(T * kK));
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& v : x) v = encode_bf16(nd(rng));
    }
    const int64_t rows = int64_t(R.token.size());
    const lowbit::cuda::moe::GroupTile t = lowbit::cuda::moe::pick_tile(rows, kG);
    const int NT = c.forced_ws ? 32 : t.tile_n, KT = c.forced_ws ? 256 : t.tile_k;
    const bool ws = KT == 256 && (NT == 16 || NT == 32);  // the pointers here are aligned (ws_eligible)
    const Row r = run_case(W, R, x, NT, KT, reps, flush, pool, rng);
    char name[128];
    std::snprintf(name, sizeof name, "T=%-5lld rows=%-6lld NT=%-3d %s", (long long)c.T, (long long)rows, NT,
                  ws ? (c.forced_ws ? "ws forced" : "ws") : "cp.async (no policy)");
    std::printf("%-44s %10.1f %10.1f %7.3f %10s %s (%.2e)\n", name, r.us[0], r.us[1], r.us[1] / r.us[0],
                r.identical ? "yes" : "NO", r.ref_ok ? "ok" : "FAILED", r.ref_err);
    ok = ok && r.identical && r.ref_ok;
  }
  std::printf("\nratio = cutlass / local (> 1: CutlassPrims slower)\n");
  CK(cudaFree(flush));
  CK(cudaFree(W.packed_b));
  CK(cudaFree(W.packed_s));
  return ok ? 0 : 1;
}
