// src/cuda/moe/sm90_mxfp4_group_gemm_fp8.cu: the opt-in FP8 tensor-core path of the MXFP4 grouped
// GEMM on sm_90a (GemmPrecision::kFp8TensorCores: MXFP8 activations x MXFP4 weights in the
// FP8-path packed layout) and that layout's prepack kernel. Entry points group_gemm_mxfp4_fp8 and
// mxfp4_prepack_fp8 (launch_moe.hpp); the kernel is group_fp8_mainloop.cuh, its arithmetic
// fp8_fold.hpp, its choices heuristics.hpp. Two instantiations (E4M3 and E5M2 activations), in this
// translation unit of their own. Not bit-exact: the bound and its derivation are in
// docs/design/moe_grouped_gemm.md ("FP8 tensor-core path").
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/common/workspace.cuh"
#include "cuda/moe/group_fp8_mainloop.cuh"
#include "cuda/moe/group_layout.cuh"

namespace lowbit::cuda {
namespace {

/// group_gemm_mxfp4_prepack_fp8: one thread per packed word (16 per row and tile) and per scale byte.
__global__ void mxfp4_prepack_fp8_kernel(Mxfp4PackPlan p, int64_t Np, int64_t Kq) {
  const int64_t kts = Kq / kMxfp4Fp8PackK, rts = Np / kMxfp4PackRows, tiles = p.G * rts * kts;
  const int64_t words = tiles * (kMxfp4Fp8TileBytes / 4), scales = tiles * kMxfp4Fp8TileScales;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words + scales;
       i += int64_t(gridDim.x) * blockDim.x) {
    const bool word = i < words;
    const int64_t j = word ? i : i - words;
    const int64_t per = word ? kMxfp4Fp8TileBytes / 4 : kMxfp4Fp8TileScales;  // words / bytes of a tile
    const int64_t tile = j / per, r = (j % per) / (per / kMxfp4PackRows), e = j % (per / kMxfp4PackRows);
    const int64_t kt = tile % kts, g = tile / (kts * rts), n = (tile / kts) % rts * kMxfp4PackRows + r;
    if (word)
      reinterpret_cast<uint32_t*>(p.packed_b)[j] = p.fp8_word(g, n, kt, int(e));
    else
      p.packed_scale[j] = p.scale(g, n, kt * (kMxfp4Fp8PackK / 32) + e);
  }
}

/// The FP8 path's kernel parameters of a validated plan (p.fp8): sizes, the FP8-path packed weights,
/// the original MXFP8 activations and their scales, groups, the row layout and the plain epilogue.
/// The launch fills in the device bounds of m_counts (m_indptr) and max_tiles.
GroupArgs make_group_params_fp8(const GroupGemmPlan& p) {
  GroupArgs a = make_group_params(p);  // sizes, groups, row layout, A, epilogue
  a.NT = moe::kFp8TileN;
  a.KT = moe::kFp8TileK;
  a.Kp = mxfp4_fp8_packed_k(p.K);
  a.packed = true;
  a.bs_blocked = false;
  a.splits = 1;
  a.kt_per_split = int((a.Kp + a.KT - 1) / a.KT);
  a.pdl = true;
  return a;
}

template <bool kE5M2>
cudaError_t launch_group_fp8(const GroupArgs& a, const CUtensorMap& tm, int64_t grid, int device, cudaStream_t st) {
  auto kern = group_gemm_fp8_kernel<kE5M2, moe::kFp8Stages>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, kFp8SmemBytes, device, opted); e != cudaSuccess) return e;
  return launch_pdl(kern, dim3(unsigned(grid)), dim3(kFp8Threads), size_t(kFp8SmemBytes), st, tm, a);
}

}  // namespace

int group_gemm_mxfp4_fp8(const GroupGemmPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.M == 0 || p.G == 0) return 0;
  GroupArgs a = make_group_params_fp8(p);
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  // rows of a as TMA sees them: all of a (masked: G x max_tokens)
  CUtensorMap tm;
  if (cudaError_t e = make_tmap_2d(&tm, p.a, CU_TENSOR_MAP_DATA_TYPE_UINT8, uint64_t(p.K), uint64_t(p.M),
                                   uint64_t(p.a_sM), uint32_t(moe::kFp8TileK), uint32_t(moe::kFp8TileN));
      e != cudaSuccess)
    return int(e);
  a.max_tiles = moe::fp8_token_tiles(p.M, p.G, p.max_tokens);
  const int64_t items = (p.N + kRows - 1) / kRows * a.max_tiles;
  if (items <= 0) return 0;
  // the kernel counts items in 32 bits: unreachable for operands that fit in memory (items <=
  // N M / 16384 + ceil(N / 128) G, both far below 2^31 for any output and weights of < 2^40 bytes)
  if (items >= (int64_t(1) << 31)) return int(cudaErrorInvalidValue);
  int64_t* ind = nullptr;
  cudaError_t e = cudaSuccess;
  if (p.counts) {  // m_counts layouts: the compact group bounds, on the device (group_layout.cuh)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ind), size_t(p.G + 1) * 8, pool, st);
    if (e != cudaSuccess) return int(e);
    counts_to_indptr_kernel<int64_t><<<1, 32, 0, st>>>(p.counts, p.counts64, p.G, p.M, p.max_tokens, ind);
    e = cudaGetLastError();
    a.m_indptr = ind;
    a.indptr64 = true;
  }
  if (e == cudaSuccess) {
    const int64_t grid = moe::fp8_grid(items, sms);
    e = p.a_dtype == DType::kE5M2 ? launch_group_fp8<true>(a, tm, grid, dev, st)
                                  : launch_group_fp8<false>(a, tm, grid, dev, st);
  }
  if (ind) cudaFreeAsync(ind, st);
  return int(e);
}

int mxfp4_prepack_fp8(const Mxfp4PackPlan& p, void* stream) {
  return launch_prepack<mxfp4_prepack_fp8_kernel>(p, mxfp4_packed_rows(p.N), mxfp4_fp8_packed_k(p.K), stream);
}

}  // namespace lowbit::cuda
