// src/cuda/moe/sm90_mxfp4_group_gemm.cu: MXFP4-weight grouped GEMM for MoE on sm_90a, and the
// gpt-oss expert MLPs built on it (routed, and over expert-grouped rows for expert parallelism).
//
//   out[m, n] = sum_k A[m, k] * B[g][n, k]      for the rows m of group g (m_indptr)
//
// Exactness. Weights e2m1 * 2^(s-127) and MXFP8 activations e4m3/e5m2 * 2^(s-127) are exact in
// bf16 (bf16 has fp32's exponent range), bf16 x bf16 products are exact in fp32, so a bf16 wgmma
// with fp32 accumulation rounds only in the accumulation, like the fp32 reference.
//  * Weights are decoded in registers as w * 2^-5 = bf16(e2m1 * 2^-126) * bf16(2^(s-6)): one
//    multiply, exact for every scale byte s in [0, 133]; a warp whose K tile holds a larger scale
//    byte decodes that tile with three (2^(min(s,133)-6), 2^(max(s,133)-128), 2^-5): the product
//    before the last is the weight itself, +-Inf where e2m1 * 2^(s-127) reaches 2^128 (bytes 253,
//    254: the fp32 decode's rule, as the reference), every other value exact (e2m1 * 2^(s-132)
//    spans 2^-133 .. 1.5 * 2^125, inside bf16's range with its subnormals). The epilogue
//    multiplies the fp32 accumulator by 2^5 (exact). Every weight scale byte runs on the tensor cores.
//  * MXFP8 activations: the pre-pass writes each row times 2^ka, ka = max(0, lo - the row's
//    smallest scale byte) (lo = 3 for E4M3, 10 for E5M2), so that every element is a bf16-exact
//    multiple of 2^-133; the epilogue multiplies the row's sums by 2^-ka. Only a row that spans more
//    than bf16's range (a scale byte below lo and values within 2^ka of bf16's top in one row), or
//    whose shifted element leaves fp32's range, sends the CTAs of its rows to an exact fp32
//    CUDA-core recomputation from the original operands.
//  * m_indptr may come from the device and is not validated there: every kernel clamps its bounds
//    to [0, M] (M = activation rows) and stored scale rows to the scale buffer, so a wrong m_indptr
//    gives wrong rows, never an access outside the given buffers.
//  * Activations are dequantized once by a pre-pass into bf16 rows in the kernel's K order.
//
// Design ("swap AB", as the dual GEMM): 128 weight rows per CTA (2 warpgroups x 64, wgmma M),
// kTileN tokens of one group (wgmma N, 16..128). The weights are read in their plain [G, N, K/2]
// layout: within each 64-wide K tile, thread quad t of a wgmma row pair takes the 8 contiguous
// bytes 8t..8t+7 (K elements 16t..16t+15, all in MX block t/2), and the activation pre-pass puts
// K elements in the matching order (act_pos), so no weight prepack is needed. The grid is a host
// upper bound of (row block, token tile, K split); each CTA finds its (group, tile) from m_indptr
// on the device (no host sync) and exits if it has none. Weights prepacked by
// group_gemm_mxfp4_prepack (lowbit/mxfp4_pack.hpp) decode with fewer instructions; with 16 or 32
// tokens per tile they run the warp-specialized kernel (TMA producer warp, mbarrier stages).
//
// Files (src/cuda/moe/): launch_moe.hpp (the launchers' declarations), heuristics.hpp (tile,
// stages, split-K: host-only), group_params.cuh (GroupArgs, constants, act_pos, make_group_params
// from a GroupGemmPlan, make_mlp_params for the MLP's two GEMMs), group_prepass.cuh,
// group_scheduler.cuh (find_tile), group_epilogue.cuh (exact_dot, swiglu, store_pair, finish_tile),
// group_mainloop.cuh (cp.async kernel), group_mainloop_ws.cuh (warp-specialized kernel),
// group_launch.cuh (cp.async kernel launch), group_run.cuh (run_group, split-K finalize),
// mxfp4_prepack.cuh, gpt_oss_mlp.cuh (route, gather, combine), group_layout.cuh (the m_counts
// layouts: group bounds on the device, compact rows; docs/moe_ep.md). This file holds the entry points
// and instantiates every kernel but the cp.async ones of 128 tokens per CTA
// (sm90_mxfp4_group_gemm_t128.cu).
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/moe/gpt_oss_mlp.cuh"
#include "cuda/moe/group_layout.cuh"
#include "cuda/moe/group_run.cuh"
#include "cuda/moe/mxfp4_prepack.cuh"

namespace lowbit::cuda {

namespace {
thread_local int g_tuning_tile = 0, g_tuning_splits = 0;
}  // namespace

void set_group_config_for_tuning(int tile_n, int splits) {
  g_tuning_tile = tile_n == 16 || tile_n == 32 || tile_n == 64 || tile_n == 128 ? tile_n : 0;
  g_tuning_splits = splits > 0 ? splits : 0;
}
int group_tile_for_tuning() { return g_tuning_tile; }
int group_splits_for_tuning() { return g_tuning_splits; }

int group_gemm_mxfp4(const GroupGemmPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.M == 0) return 0;
  GroupArgs a = make_group_params(p);

  uint16_t* act = nullptr;
  // act [M][Kp] bf16, tok_scale [M] fp32, tok_flag [M][Kp/64] bytes (M: compact rows, an upper bound
  // for the m_counts layouts), then the m_counts layouts' group bounds [G+1] int64 (8-byte aligned)
  const size_t b_act = size_t(p.M * a.Kp * 2 + p.M * 4 + p.M * (a.Kp / 64));
  const size_t b_pre = (b_act + 15) / 16 * 16;
  const size_t b_ind = p.counts ? size_t(p.G + 1) * 8 : 0;
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&act), b_pre + b_ind, pool, st);
  if (e != cudaSuccess) return int(e);
  a.act = act;
  if (p.a_scale) {
    a.tok_scale = reinterpret_cast<const float*>(act + p.M * a.Kp);
    a.tok_flag = reinterpret_cast<const uint8_t*>(a.tok_scale + p.M);
  }
  if (p.counts) {  // m_counts layouts: the compact group bounds, on the device (group_layout.cuh)
    int64_t* ind = reinterpret_cast<int64_t*>(reinterpret_cast<uint8_t*>(act) + b_pre);
    counts_to_indptr_kernel<int64_t><<<1, 32, 0, st>>>(p.counts, p.counts64, p.G, p.M, p.max_tokens, ind);
    e = cudaGetLastError();
    a.m_indptr = ind;
    a.indptr64 = true;
  }
  if (e == cudaSuccess) {
    int dev = 0;
    cudaGetDevice(&dev);
    // strips of K blocks per warp and the grid (moe::prepass_grid; masked layout: from the expected rows)
    const moe::PrepassGrid pg = moe::prepass_grid(moe::tile_rows(p.M, p.G, p.max_tokens, p.expected_m), a.Kp, sm_count(dev));
    a.strip = pg.strip;
    act_prepass_kernel<<<unsigned(pg.blocks), 256, 0, st>>>(a);
    e = cudaGetLastError();
    a.pdl = true;  // the GEMM prefetches weights while the pre-pass runs
  }
  if (e == cudaSuccess) e = run_group(a, p.M, pool, st);
  cudaFreeAsync(act, st);
  return int(e);
}

int mxfp4_prepack(const Mxfp4PackPlan& p, void* stream) {
  return launch_prepack<mxfp4_prepack_kernel>(p, mxfp4_packed_rows(p.N), mxfp4_packed_k(p.K), stream);
}

/// What both MLP entries start from: the stream, the workspace pool and the SM count.
struct MlpStart {
  cudaStream_t st = nullptr;
  cudaMemPool_t pool = nullptr;
  int sms = 0;
};

/// Fills *m; returns -1 when the MLP has rows to run, else the entry's result (0: no tokens, or the
/// error of the workspace pool).
static int start_mlp(const MoeMlpPlan& p, void* stream, MlpStart* m) {
  m->st = static_cast<cudaStream_t>(stream);
  if (cudaError_t pe = workspace_pool(&m->pool); pe != cudaSuccess) return int(pe);
  if (p.T == 0) return 0;
  int dev = 0;
  cudaGetDevice(&dev);
  m->sms = sm_count(dev);
  return -1;
}

int gpt_oss_moe_mlp(const MoeMlpPlan& p, void* stream) {
  MlpStart m;
  if (const int r = start_mlp(p, stream, &m); r >= 0) return r;
  const cudaStream_t st = m.st;
  const cudaMemPool_t pool = m.pool;
  const int sms = m.sms;
  const int64_t rows = p.T * p.topk;  // upper bound of routed rows
  int NT = 16, KT = 64;
  pick_tile(rows, p.E, &NT, &KT);  // both GEMMs: same rows and groups
  const int64_t Hp = (p.H + KT - 1) / KT * KT, Ip = (p.I + KT - 1) / KT * KT;
  // workspace: indptr [E+1], pos [rows], src_slot [rows] (int32); act1 [rows][Hp], act2 [rows][Ip]
  // (bf16); y [rows][I] (fp32, MXFP8 mode); o [rows][H] (fp32)
  auto al = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t b_idx = al((p.E + 1 + 2 * rows) * 4), b_a1 = al(rows * Hp * 2), b_a2 = al(rows * Ip * 2);
  const int64_t b_y = p.act_mxfp8 ? al(rows * p.I * 4) : 0, b_o = al(rows * p.H * 4);
  uint8_t* wsp = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&wsp), size_t(b_idx + b_a1 + b_a2 + b_y + b_o), pool, st);
  if (e != cudaSuccess) return int(e);
  int32_t* indptr = reinterpret_cast<int32_t*>(wsp);
  int32_t* pos = indptr + p.E + 1;
  int32_t* src_slot = pos + rows;
  uint16_t* act1 = reinterpret_cast<uint16_t*>(wsp + b_idx);
  uint16_t* act2 = reinterpret_cast<uint16_t*>(wsp + b_idx + b_a1);
  float* y = p.act_mxfp8 ? reinterpret_cast<float*>(wsp + b_idx + b_a1 + b_a2) : nullptr;
  float* o = reinterpret_cast<float*>(wsp + b_idx + b_a1 + b_a2 + b_y);
  const int64_t prep_warps = rows * (Hp > Ip ? Hp : Ip) / 64;
  const unsigned prep_grid = unsigned((prep_warps + 7) / 8 < 16 * int64_t(sms) ? (prep_warps + 7) / 8 : 16 * int64_t(sms));

  route_kernel<<<1, 1024, size_t(2 * p.E * 4), st>>>(p, indptr, pos, src_slot);
  e = cudaGetLastError();
  if (e == cudaSuccess) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)src_slot, (const float*)nullptr, p.H, Hp, KT, act1);
  }
  if (e == cudaSuccess && !p.act_mxfp8 && Ip != p.I) {  // act2's K padding only (the epilogue writes the rest)
    const int64_t n = rows * (Ip - p.I);
    e = launch_pdl(zero_k_tail_kernel, dim3(unsigned(n / 256 + 1 < 8 * int64_t(sms) ? n / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, (const int32_t*)indptr, p.E, p.I, Ip, KT, act2);
  }
  if (e == cudaSuccess) {  // gate_up: [rows, 2I] -> SwiGLU -> y (fp32, MXFP8 activations) or act2
    const GroupArgs up = p.act_mxfp8 ? make_mlp_params(p, MlpGemm::kGateUp, indptr, rows, NT, KT, act1, y, p.I, false)
                                     : make_mlp_params(p, MlpGemm::kGateUp, indptr, rows, NT, KT, act1, act2, Ip, true);
    e = run_group(up, rows, pool, st);
  }
  if (e == cudaSuccess && p.act_mxfp8) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)src_slot, (const float*)y, p.I, Ip, KT, act2);
  }
  if (e == cudaSuccess)  // down: [rows, H] + b2 -> o (fp32)
    e = run_group(make_mlp_params(p, MlpGemm::kDown, indptr, rows, NT, KT, act2, o, p.H, false), rows, pool, st);
  if (e == cudaSuccess) {
    const int64_t n = p.T * p.H;
    e = launch_pdl(combine_kernel, dim3(unsigned(n / 256 + 1 < 8 * int64_t(sms) ? n / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, p, (const int32_t*)pos, (const float*)o);
  }
  cudaFreeAsync(wsp, st);
  return int(e);
}

int gpt_oss_expert_mlp(const MoeMlpPlan& p, void* stream) {
  MlpStart m;
  if (const int r = start_mlp(p, stream, &m); r >= 0) return r;
  const cudaStream_t st = m.st;
  const cudaMemPool_t pool = m.pool;
  const int sms = m.sms;
  const int64_t rows = p.T;  // upper bound of the compact rows (masked: E x max_tokens)
  const moe::GroupTile tile = moe::pick_layout_tile(rows, p.E, p.max_tokens, p.expected_m);  // both GEMMs
  const int NT = tile.tile_n, KT = tile.tile_k;
  const int64_t Hp = (p.H + KT - 1) / KT * KT, Ip = (p.I + KT - 1) / KT * KT;
  // workspace: indptr [E+1] (int32); act1 [rows][Hp], act2 [rows][Ip] (bf16); y [rows][I] (fp32,
  // MXFP8 mode). The down GEMM writes out's rows itself (no weighting, no combine).
  auto al = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t b_idx = al((p.E + 1) * 4), b_a1 = al(rows * Hp * 2), b_a2 = al(rows * Ip * 2);
  const int64_t b_y = p.act_mxfp8 ? al(rows * p.I * 4) : 0;
  uint8_t* wsp = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&wsp), size_t(b_idx + b_a1 + b_a2 + b_y), pool, st);
  if (e != cudaSuccess) return int(e);
  int32_t* indptr = reinterpret_cast<int32_t*>(wsp);
  uint16_t* act1 = reinterpret_cast<uint16_t*>(wsp + b_idx);
  uint16_t* act2 = reinterpret_cast<uint16_t*>(wsp + b_idx + b_a1);
  float* y = p.act_mxfp8 ? reinterpret_cast<float*>(wsp + b_idx + b_a1 + b_a2) : nullptr;
  const int64_t prep_warps = rows * (Hp > Ip ? Hp : Ip) / 64;
  const unsigned prep_grid = unsigned((prep_warps + 7) / 8 < 16 * int64_t(sms) ? (prep_warps + 7) / 8 : 16 * int64_t(sms));
  const bool masked = p.max_tokens > 0;

  counts_to_indptr_kernel<int32_t><<<1, 32, 0, st>>>(p.counts, p.counts64, p.E, rows, p.max_tokens, indptr);
  e = cudaGetLastError();
  if (e == cudaSuccess) {  // gather x's rows of the experts' counts (compact), act() rounding
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)nullptr, (const float*)nullptr, p.H, Hp, KT, act1);
  }
  if (e == cudaSuccess && !p.act_mxfp8 && Ip != p.I) {  // act2's K padding, on the rows of the counts
    const int64_t n = rows * (Ip - p.I);
    e = launch_pdl(zero_k_tail_kernel, dim3(unsigned(n / 256 + 1 < 8 * int64_t(sms) ? n / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, (const int32_t*)indptr, p.E, p.I, Ip, KT, act2);
  }
  if (e == cudaSuccess) {  // gate_up: [rows, 2I] -> SwiGLU -> y (fp32, MXFP8 activations) or act2
    GroupArgs up = p.act_mxfp8 ? make_mlp_params(p, MlpGemm::kGateUp, indptr, rows, NT, KT, act1, y, p.I, false)
                               : make_mlp_params(p, MlpGemm::kGateUp, indptr, rows, NT, KT, act1, act2, Ip, true);
    up.cap_grid = masked;
    e = run_group(up, rows, pool, st);
  }
  if (e == cudaSuccess && p.act_mxfp8) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)nullptr, (const float*)y, p.I, Ip, KT, act2);
  }
  if (e == cudaSuccess) {  // down: [rows, H] + b2 -> out's rows of the experts (out dtype)
    GroupArgs down = make_mlp_params(p, MlpGemm::kDown, indptr, rows, NT, KT, act2, p.out, p.o_sT, false);
    down.out_dtype = p.out_dtype;
    down.o_pitch = p.max_tokens;
    down.cap_grid = masked;
    e = run_group(down, rows, pool, st);
  }
  cudaFreeAsync(wsp, st);
  return int(e);
}

}  // namespace lowbit::cuda
