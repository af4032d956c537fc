// src/cuda/gemm/sm90_mxfp4_group_gemm.cu: MXFP4-weight grouped GEMM for MoE on sm_90a, and the
// gpt-oss expert MLP built on it.
//
//   out[m, n] = sum_k A[m, k] * B[g][n, k]      for the rows m of group g (m_indptr)
//
// Exactness. Weights e2m1 * 2^(s-127) and MXFP8 activations e4m3/e5m2 * 2^(s-127) are exact in
// bf16 (bf16 has fp32's exponent range), bf16 x bf16 products are exact in fp32, so a bf16 wgmma
// with fp32 accumulation rounds only in the accumulation, like the fp32 reference.
//  * Weights are decoded in registers as bf16(e2m1 * 2^-126) * bf16(2^(s-1)): one multiply, exact
//    for every scale byte s in [0, 128] (block amax < 12). A tile that meets any other weight scale
//    byte (or an activation scale the bf16 pre-pass cannot represent exactly: E4M3 s < 3, E5M2 s <
//    10) is recomputed by its CTA on the CUDA cores in fp32 from the original operands: exact, slow,
//    and never taken by real checkpoints (their scale bytes sit near 127 - 20).
//  * Activations are dequantized once by a pre-pass into bf16 rows in the kernel's K order.
//
// Design ("swap AB", as the dual GEMM): 128 weight rows per CTA (2 warpgroups x 64, wgmma M),
// NT tokens of one group (wgmma N, 16..128). The weights are read in their plain [G, N, K/2]
// layout: within each 64-wide K tile, thread quad t of a wgmma row pair takes the 8 contiguous
// bytes 8t..8t+7 (K elements 16t..16t+15, all in MX block t/2), and the activation pre-pass puts
// K elements in the matching order (act_pos), so no weight prepack is needed. The grid is a host
// upper bound of (row block, token tile, K split); each CTA finds its (group, tile) from m_indptr
// on the device (no host sync) and exits if it has none.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "cuda/gemm/launch_gemm.hpp"
#include "cuda/gemm/sm90_gemm_common.cuh"
#include "cuda/gemm/workspace.cuh"
#include "lowbit/block_quant.hpp"
#include "lowbit/gemm.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;
using namespace lowbit::cuda::gemm;

namespace {

constexpr int kTileK = 64;   // K per pipeline stage (4 wgmma k16 steps)
constexpr int kRows = 128;   // weight rows per CTA
constexpr int kWBytes = kRows * 32;       // FP4 bytes of a stage
constexpr int kSBytes = kRows * 8;        // two 4-byte scale words per row
constexpr int kWSBytes = kWBytes + kSBytes;  // 5120 = 5 x 1024

/// Position, within its 64-wide block of a kernel activation row, of K element k of the block:
/// wgmma k16 step j, lane quad t reads the elements 16t + 4j .. 16t + 4j + 3.
__host__ __device__ constexpr int act_pos(int k) {
  return 16 * ((k & 15) >> 2) + ((k & 3) < 2 ? 2 * (k >> 4) + (k & 3) : 8 + 2 * (k >> 4) + (k & 3) - 2);
}

enum EpiMode : int {
  kEpiPlain = 0,   ///< out[m, n] = acc (out dtype)
  kEpiSwiglu = 1,  ///< gpt-oss: rows 2f / 2f+1 are gate / up of feature f; bias, clamped SwiGLU
  kEpiBias = 2,    ///< out[m, n] = acc + bias[g, n] (fp32)
};

struct GroupArgs {
  int64_t M = 0, N = 0, K = 0, G = 0, Kp = 0;  ///< N: weight rows; Kp: act row pitch (K rounded to 64)
  const uint8_t* b = nullptr;
  int64_t b_sG = 0, b_sN = 0;
  const uint8_t* bs = nullptr;  ///< weight scales
  bool bs_blocked = false;      ///< 128x4 (spb) or row-major (bs_sG, bs_sN)
  int64_t bs_sG = 0, bs_sN = 0;
  ScalePlan spb;
  const void* m_indptr = nullptr;
  bool indptr64 = false;
  const uint16_t* act = nullptr;      ///< [M][Kp] bf16 in act_pos order
  const uint8_t* tok_flag = nullptr;  ///< [M][Kp/64]: 1 = a block the bf16 pre-pass could not hold exactly
  // Exact fallback sources: the original A (MXFP8 codes + scales or bf16); null: read `act`.
  const void* a = nullptr;
  DType a_dtype = DType::kBFloat16;
  int64_t a_sM = 0;
  const uint8_t* a_scale = nullptr;
  ScalePlan spa;
  // Epilogue
  int mode = kEpiPlain;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sM = 0;
  bool out_act_layout = false;  ///< kEpiSwiglu: write bf16 in act_pos order (the next GEMM's A)
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  int64_t bias_sG = 0;
  float alpha = 1.702f, limit = 7.0f;
  bool pdl = false;  ///< launched behind the activation pre-pass: weights are fetched before waiting for it
  float* ws = nullptr;  ///< split-K partials [splits][M][N]
  int splits = 1;
  int kt_per_split = 0;

  __device__ int64_t bound(int64_t g) const {
    return indptr64 ? static_cast<const int64_t*>(m_indptr)[g] : int64_t(static_cast<const int32_t*>(m_indptr)[g]);
  }
  /// Stored weight row of kernel row R (kEpiSwiglu: rows R, R+8 of each 16 are gate/up of one feature).
  __host__ __device__ int64_t wrow(int64_t R) const {
    if (mode != kEpiSwiglu) return R;
    const int64_t i = R & 15;
    return (R & ~int64_t(15)) + (i < 8 ? 2 * i : 2 * (i - 8) + 1);
  }
  __device__ const uint8_t* wscale_ptr(int64_t g, int64_t n, int64_t c) const {
    return bs_blocked ? bs + spb.offset(g, n, c) : bs + g * bs_sG + n * bs_sN + c;
  }
  __device__ float weight(int64_t g, int64_t n, int64_t k) const {
    const uint8_t code = (b[g * b_sG + n * b_sN + (k >> 1)] >> ((k & 1) * 4)) & 0xF;
    return decode_e2m1(code) * decode_ue8m0(*wscale_ptr(g, n, k >> 5));
  }
};

// ------------------------------------------------------------------------------------------
// Activation pre-pass: A (MXFP8 or bf16) -> bf16 [M][Kp] in act_pos order, zero beyond K.

__device__ __forceinline__ uint32_t act_pair_bf16(float v0, float v1) {
  return uint32_t(encode_bf16(v0)) | (uint32_t(encode_bf16(v1)) << 16);
}

/// One warp per (row, 64-wide K block); lane l handles K elements 2l, 2l+1 of the block.
__global__ void act_prepass_kernel(GroupArgs A) {
  griddep_launch_dependents();  // the GEMM may start fetching weights meanwhile
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int64_t kblocks = A.Kp / 64;
  const int lo = A.a_dtype == DType::kE4M3 ? 3 : 10;  // bf16 holds e4m3 / e5m2 * 2^(s-127) exactly for s >= lo
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < A.M * kblocks; item += warps) {
    const int64_t m = item / kblocks, k0 = (item % kblocks) * 64, k = k0 + 2 * lane;
    float v0 = 0.0f, v1 = 0.0f;
    bool inexact = false;
    if (k < A.K) {
      if (A.a_scale) {
        const uint8_t* src = static_cast<const uint8_t*>(A.a) + m * A.a_sM + k;
        const uint8_t s = A.a_scale[A.spa.offset(0, m, k >> 5)];
        const float sc = decode_ue8m0(s);
        const bool e4 = A.a_dtype == DType::kE4M3;
        v0 = (e4 ? decode_e4m3(src[0]) : decode_e5m2(src[0])) * sc;
        v1 = (e4 ? decode_e4m3(src[1]) : decode_e5m2(src[1])) * sc;
        inexact = s < lo;
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(A.a) + m * A.a_sM + k;
        v0 = decode_bf16(src[0]);
        v1 = decode_bf16(src[1]);
      }
    }
    reinterpret_cast<uint32_t*>(const_cast<uint16_t*>(A.act) + m * A.Kp)[(k0 + act_pos(2 * lane)) >> 1] =
        act_pair_bf16(v0, v1);
    // one flag byte per (row, K block): the GEMM checks the blocks of its rows
    inexact = __any_sync(0xFFFFFFFFu, inexact);
    if (A.tok_flag && lane == 0) const_cast<uint8_t*>(A.tok_flag)[item] = inexact ? 1 : 0;
  }
}

// ------------------------------------------------------------------------------------------
// Main kernel

/// Warp-wide: the (group, token tile) of work item y, from m_indptr. False: no such item.
__device__ bool find_tile(const GroupArgs& A, int NT, int64_t y, int64_t* grp, int64_t* tile) {
  const int lane = threadIdx.x & 31;
  int64_t base = 0;
  for (int64_t c = 0; c < A.G; c += 32) {
    const int64_t gi = c + lane;
    const int64_t cnt = gi < A.G ? A.bound(gi + 1) - A.bound(gi) : 0;
    const int64_t tiles = cnt > 0 ? (cnt + NT - 1) / NT : 0;
    int64_t inc = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, o);
      if (lane >= o) inc += v;
    }
    const int64_t total = __shfl_sync(0xFFFFFFFFu, inc, 31);
    if (y < base + total) {
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, y < base + inc);
      const int L = __ffs(hit) - 1;
      const int64_t excl = __shfl_sync(0xFFFFFFFFu, inc - tiles, L);
      *grp = c + L;
      *tile = y - base - excl;
      return true;
    }
    base += total;
  }
  return false;
}

/// Exact fp32 recomputation of one accumulator entry (row R, token m) over K elements [k0, k1).
__device__ float exact_dot(const GroupArgs& A, int64_t g, int64_t R, int64_t m, int64_t k0, int64_t k1) {
  const int64_t n = A.wrow(R);
  const int64_t srow = (A.a && A.a_scale) ? A.spa.stored_row(m) : 0;
  float acc = 0.0f, sa = 1.0f;
  for (int64_t k = k0; k < k1; ++k) {
    float av;
    if (A.a) {
      if (A.a_scale) {
        if ((k & 31) == 0 || k == k0)
          sa = decode_ue8m0(A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, k >> 5)]);
        const uint8_t c = static_cast<const uint8_t*>(A.a)[m * A.a_sM + k];
        av = (A.a_dtype == DType::kE4M3 ? decode_e4m3(c) : decode_e5m2(c)) * sa;
      } else {
        av = decode_bf16(static_cast<const uint16_t*>(A.a)[m * A.a_sM + k]);
      }
    } else {
      av = decode_bf16(A.act[m * A.Kp + (k & ~int64_t(63)) + act_pos(int(k & 63))]);
    }
    acc = fmaf(A.weight(g, n, k), av, acc);
  }
  return acc;
}

__device__ __forceinline__ float load_bias(const GroupArgs& A, int64_t g, int64_t n) {
  return load_float(A.bias, A.bias_dtype, g * A.bias_sG + n);
}

/// gpt-oss clamped SwiGLU of one feature (FORMATS.md section 8), as the reference computes it.
__device__ __forceinline__ float swiglu(const GroupArgs& A, float hg, float hu) {
  const float g = hg < A.limit ? hg : A.limit;
  const float u = hu < -A.limit ? -A.limit : (hu > A.limit ? A.limit : hu);
  return g * (1.0f / (1.0f + expf(-A.alpha * g))) * (u + 1.0f);
}

/// Final store of kernel rows (R, R + 8) for token m, group g.
__device__ __forceinline__ void store_pair(const GroupArgs& A, int64_t g, int64_t m, int64_t R, float v0, float v1) {
  if (A.mode == kEpiSwiglu) {
    const int64_t f = (R >> 4) * 8 + (R & 7);  // feature: stored rows 2f (gate) and 2f + 1 (up)
    if (2 * f + 1 >= A.N) return;
    const float y = swiglu(A, v0 + load_bias(A, g, 2 * f), v1 + load_bias(A, g, 2 * f + 1));
    if (A.out_act_layout)
      static_cast<uint16_t*>(A.out)[m * A.o_sM + (f & ~int64_t(63)) + act_pos(int(f & 63))] = encode_bf16(y);
    else
      static_cast<float*>(A.out)[m * A.o_sM + f] = y;
    return;
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = R + 8 * h;
    if (n >= A.N) continue;
    const float v = h ? v1 : v0;
    if (A.mode == kEpiBias)
      static_cast<float*>(A.out)[m * A.o_sM + n] = v + load_bias(A, g, n);
    else
      store_float(A.out, A.out_dtype, m * A.o_sM + n, v);
  }
}

template <int NT, int S>
__global__ void __launch_bounds__(256, 2) group_gemm_kernel(GroupArgs A) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kActBytes = NT * 128;
  constexpr int kStageBytes = kActBytes + kWSBytes;
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ int64_t s_work[2];

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  if (!A.pdl) griddep_wait();  // m_indptr / weights may come from the previous kernel
  if (tid < 32) {
    int64_t grp = -1, tile = 0;
    if (!find_tile(A, NT, blockIdx.y, &grp, &tile)) grp = -1;
    if (lane == 0) {
      s_work[0] = grp;
      s_work[1] = tile;
    }
  }
  __syncthreads();
  const int64_t grp = s_work[0];
  if (grp < 0) return;
  const int64_t m0 = A.bound(grp) + s_work[1] * NT;
  const int64_t gend = A.bound(grp + 1);
  const int64_t m1 = m0 + NT < gend ? m0 + NT : gend;
  const int64_t R0 = int64_t(blockIdx.x) * kRows;
  const int split = int(blockIdx.z);
  const int64_t kTiles = (A.K + kTileK - 1) / kTileK;
  const int64_t KG = A.K / 32;  // MX blocks per row
  const int64_t kt0 = int64_t(split) * A.kt_per_split;
  const int64_t kt1 = kt0 + A.kt_per_split < kTiles ? kt0 + A.kt_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;

  // Producer roles of this thread in each stage: weight row piece, scale word, activation pieces.
  const int prow = tid >> 1, ph = tid & 1;
  const int64_t pR = R0 + prow;
  const bool prow_ok = pR < A.N;
  const int64_t pn = prow_ok ? A.wrow(pR) : 0;
  const uint8_t* wsrc = A.b + grp * A.b_sG + pn * A.b_sN + ph * 16;
  const uint8_t* srow_ptr = A.wscale_ptr(grp, pn, 0);  // scale byte of MX block 0 of the row
  constexpr int kAIters = (NT * 8 + 255) / 256;
  const uint16_t* aptr[kAIters];
  uint32_t adst[kAIters];
  bool aok[kAIters], aload[kAIters];
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int i = tid + 256 * j, r = i >> 3, c = i & 7;
    const int64_t m = m0 + r;
    aload[j] = i < NT * 8;
    aok[j] = m < m1;
    aptr[j] = A.act + (aok[j] ? m : 0) * A.Kp + c * 8;
    adst[j] = uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
  }
  const uint32_t smem_base = smem_u32(smem);
  auto load_weights = [&](int64_t it) {
    const int64_t kt = kt0 + it;
    const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes);
    // weights: rows x 2 pieces of 16 bytes (K elements 0..31, 32..63 of the tile)
    cp_async16(st + kActBytes + prow * 32 + ph * 16, wsrc + kt * 32, prow_ok && kt * kTileK + ph * 32 < A.K);
    // scales: the aligned words holding this row's MX blocks 2kt and 2kt + 1
    const uint8_t* s0;
    if (A.bs_blocked) {
      s0 = srow_ptr + (kt >> 1) * 512;  // 4 blocks of one row are one aligned word
    } else {
      const uint8_t* a = srow_ptr + 2 * kt + (ph && 2 * kt + 1 < KG ? 1 : 0);
      s0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(a) & ~uintptr_t(3));
    }
    cp_async4(st + kActBytes + kWBytes + prow * 8 + ph * 4, s0, prow_ok);
  };
  auto load_acts = [&](int64_t it) {
    const int64_t kt = kt0 + it;
    const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kAIters; ++j)
      if (aload[j]) cp_async16(st + adst[j], aptr[j] + kt * kTileK, aok[j]);
  };
  auto load_stage = [&](int64_t it) {
    load_weights(it);
    load_acts(it);
  };

  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;

  // Prologue: the first stages' weights and scales, then (behind the pre-pass) their activations.
  // Group s holds the activations of stage s (group 0 also every prologue weight).
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < nkt) load_weights(s);
  griddep_wait();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nkt) load_acts(s);
    cp_async_commit();
  }

  // Consumer: rows rl and rl + 8 of this CTA, K bytes 8t..8t+7 of each tile.
  const int g = lane >> 2, t = lane & 3;
  const int rl = 64 * wg + 16 * warp + g;
  const uintptr_t sc_addr0 = reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl < A.N ? A.wrow(R0 + rl) : 0, 0));
  const uintptr_t sc_addr1 =
      reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl + 8 < A.N ? A.wrow(R0 + rl + 8) : 0, 0));
  bool bad = false;
  for (int64_t it = 0; it < nkt; ++it) {
    cp_async_wait<S - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (it + S - 1 < nkt) load_stage(it + S - 1);
    cp_async_commit();

    const int64_t kt = kt0 + it;
    const uint8_t* st = smem + (it % S) * kStageBytes;
    const uint8_t* wt = st + kActBytes;
    const uint2 q0 = *reinterpret_cast<const uint2*>(wt + rl * 32 + 8 * t);
    const uint2 q1 = *reinterpret_cast<const uint2*>(wt + (rl + 8) * 32 + 8 * t);
    const uint2 w0 = *reinterpret_cast<const uint2*>(wt + kWBytes + rl * 8);
    const uint2 w1 = *reinterpret_cast<const uint2*>(wt + kWBytes + (rl + 8) * 8);
    const int64_t blk = 2 * kt + (t >> 1);  // this thread's MX block
    uint32_t sel0, sel1;
    if (A.bs_blocked) {
      sel0 = sel1 = uint32_t(2 * (kt & 1) + (t >> 1));
    } else {
      // word 0 holds block 2kt at byte (addr & 3); block 2kt + 1 follows (maybe in word 1)
      // words [floor4(a), floor4(a + 1)] of block 2kt's byte a: block 2kt + 1 is byte (a & 3) + 1 of
      // word 0, or byte 0 of word 1 (selector 4) when a & 3 == 3
      sel0 = uint32_t((sc_addr0 + 2 * kt) & 3) + (t >> 1);
      sel1 = uint32_t((sc_addr1 + 2 * kt) & 3) + (t >> 1);
    }
    uint32_t sb0 = __byte_perm(w0.x, w0.y, sel0) & 0xFFu;
    uint32_t sb1 = __byte_perm(w1.x, w1.y, sel1) & 0xFFu;
    if (blk >= KG) sb0 = sb1 = 0;  // K tail: zero weights, any finite scale
    bad |= (sb0 > 128u) | (sb1 > 128u);
    const uint32_t S0 = ((sb0 + 126u) << 7) * 0x10001u;  // bf16x2 of 2^(s-1)
    const uint32_t S1 = ((sb1 + 126u) << 7) * 0x10001u;

    uint32_t a[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x0 = (j < 2) ? q0.x : q0.y, x1 = (j < 2) ? q1.x : q1.y;
      const uint32_t b = 2 * (j & 1);  // byte of K elements 16t+4j, +1; byte b + 1: +2, +3
      const uint32_t lo_sel = b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12);
      const uint32_t hi_sel = lo_sel + 0x1111u;
      a[j][0] = bmul2(e2m1x2_to_bf16x2_tiny(__byte_perm(x0, x0 >> 4, lo_sel)), S0);
      a[j][1] = bmul2(e2m1x2_to_bf16x2_tiny(__byte_perm(x1, x1 >> 4, lo_sel)), S1);
      a[j][2] = bmul2(e2m1x2_to_bf16x2_tiny(__byte_perm(x0, x0 >> 4, hi_sel)), S0);
      a[j][3] = bmul2(e2m1x2_to_bf16x2_tiny(__byte_perm(x1, x1 >> 4, hi_sel)), S1);
    }
    const uint32_t abase = smem_u32(st);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wgmma_call<NT>(a[j], desc_sw128(abase + j * 32), acc, std::make_index_sequence<NT / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cp_async_wait<0>();

  if (A.tok_flag && tid < NT && m0 + tid < m1)
    for (int64_t kt = kt0; kt < kt1; ++kt) bad |= A.tok_flag[(m0 + tid) * (A.Kp / 64) + kt] != 0;
  bad = __syncthreads_or(bad);
  const int64_t kb = kt0 * kTileK, ke = kt1 * kTileK < A.K ? kt1 * kTileK : A.K;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + 8 * j + 2 * t + h;
      const int64_t R = R0 + rl;
      if (m >= m1 || R >= A.N) continue;
      float v0 = acc[4 * j + h], v1 = acc[4 * j + 2 + h];
      if (bad) {
        v0 = exact_dot(A, grp, R, m, kb, ke);
        v1 = R + 8 < A.N ? exact_dot(A, grp, R + 8, m, kb, ke) : 0.0f;
      }
      if (A.splits == 1) {
        store_pair(A, grp, m, R, v0, v1);
      } else {
        float* w = A.ws + (int64_t(split) * A.M + m) * A.N;
        w[R] = v0;
        if (R + 8 < A.N) w[R + 8] = v1;
      }
    }
  }
}

/// Split-K: sums the partials in split order and runs the epilogue (rows of m_indptr[G].. skipped).
__global__ void group_finalize_kernel(GroupArgs A) {
  griddep_wait();
  const int64_t M = A.bound(A.G);
  const int64_t n16 = (A.N + 15) / 16;
  const int64_t items = M * n16 * 8;  // (m, 16-row block, row pair r / r + 8)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / (n16 * 8), R = (i % (n16 * 8)) / 8 * 16 + (i & 7);
    if (R >= A.N) continue;
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < A.splits; ++s) {
      const float* w = A.ws + (int64_t(s) * A.M + m) * A.N;
      v0 += w[R];
      if (R + 8 < A.N) v1 += w[R + 8];
    }
    int64_t grp;
    if (A.indptr64)
      grp = group_of_row(static_cast<const int64_t*>(A.m_indptr), A.G, m);
    else
      grp = group_of_row(static_cast<const int32_t*>(A.m_indptr), A.G, m);
    store_pair(A, grp, m, R, v0, v1);
  }
}

template <int NT, int S>
cudaError_t launch_group(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  constexpr int kStageBytes = NT * 128 + kWSBytes;
  constexpr int smem = S * kStageBytes + 1024;
  auto kern = group_gemm_kernel<NT, S>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  dim3 grid(unsigned((a.N + kRows - 1) / kRows), unsigned(max_tiles), unsigned(a.splits));
  return launch_pdl(kern, grid, dim3(256), size_t(smem), st, a);
}

/// Runs the grouped GEMM of `a` (act already in place): NT, split-K and the finalize.
cudaError_t run_group(GroupArgs a, int64_t rows_bound, cudaMemPool_t pool, cudaStream_t st) {
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  const int64_t used = rows_bound < a.G ? rows_bound : a.G;  // non-empty groups at most
  const int64_t avg = used > 0 ? (rows_bound + used - 1) / used : 1;
  const int NT = avg <= 16 ? 16 : avg <= 32 ? 32 : avg <= 64 ? 64 : 128;
  int64_t max_tiles = (rows_bound + NT - 1) / NT + a.G;  // sum over groups of ceil(rows / NT)
  if (rows_bound < max_tiles) max_tiles = rows_bound;      // and each tile holds a row
  const int64_t tiles_est = max_tiles * ((a.N + kRows - 1) / kRows);
  const int64_t kTiles = (a.K + kTileK - 1) / kTileK;
  int splits = 1;
  if (tiles_est < 2 * sms) {
    splits = int((2 * sms + tiles_est - 1) / (tiles_est > 0 ? tiles_est : 1));
    const int max_splits = int(kTiles / 4 > 0 ? kTiles / 4 : 1);
    splits = splits < max_splits ? splits : max_splits;
    if (splits < 1) splits = 1;
  }
  const int per = int((kTiles + splits - 1) / splits);
  splits = int((kTiles + per - 1) / per);
  a.splits = splits;
  a.kt_per_split = per;
  if (max_tiles <= 0 || a.M == 0) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  if (splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a.ws), size_t(splits) * a.M * a.N * sizeof(float), pool, st);
  if (e == cudaSuccess) {
    switch (NT) {
      case 16: e = launch_group<16, 8>(a, max_tiles, dev, st); break;
      case 32: e = launch_group<32, 6>(a, max_tiles, dev, st); break;
      case 64: e = launch_group<64, 5>(a, max_tiles, dev, st); break;
      default: e = launch_group<128, 4>(a, max_tiles, dev, st); break;
    }
  }
  if (e == cudaSuccess && splits > 1) {
    const int64_t items = a.M * ((a.N + 15) / 16) * 8;
    a.pdl = false;
    e = launch_pdl(group_finalize_kernel, dim3(unsigned(items / 256 + 1 < 8 * int64_t(sms) ? items / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, a);
  }
  if (a.ws) cudaFreeAsync(a.ws, st);
  return e;
}

}  // namespace

int group_gemm_mxfp4(const GroupGemmPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.M == 0) return 0;
  GroupArgs a;
  a.M = p.M; a.N = p.N; a.K = p.K; a.G = p.G; a.Kp = (p.K + 63) / 64 * 64;
  a.b = p.b; a.b_sG = p.b_sG; a.b_sN = p.b_sN;
  a.bs = p.b_scale;
  a.bs_blocked = p.spb.layout.kind == ScaleLayoutKind::kBlocked128x4;
  a.bs_sG = p.spb.batch_stride;
  a.bs_sN = p.spb.cols;
  a.spb = p.spb;
  a.m_indptr = p.m_indptr; a.indptr64 = p.indptr64;
  a.a = p.a; a.a_dtype = p.a_dtype; a.a_sM = p.a_sM; a.a_scale = p.a_scale; a.spa = p.spa;
  a.mode = kEpiPlain; a.out = p.out; a.out_dtype = p.out_dtype; a.o_sM = p.o_sM;

  uint16_t* act = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&act), size_t(p.M * a.Kp * 2 + p.M * (a.Kp / 64)), pool, st);
  if (e != cudaSuccess) return int(e);
  a.act = act;
  if (p.a_scale) a.tok_flag = reinterpret_cast<const uint8_t*>(act + p.M * a.Kp);
  {
    int dev = 0;
    cudaGetDevice(&dev);
    const int64_t blocks = (p.M * (a.Kp / 64) + 7) / 8;
    const int64_t cap = 16 * int64_t(sm_count(dev));
    act_prepass_kernel<<<unsigned(blocks < cap ? blocks : cap), 256, 0, st>>>(a);
    e = cudaGetLastError();
    a.pdl = true;  // the GEMM prefetches weights while the pre-pass runs
  }
  if (e == cudaSuccess) e = run_group(a, p.M, pool, st);
  cudaFreeAsync(act, st);
  return int(e);
}

namespace {

// ------------------------------------------------------------------------------------------
// gpt-oss MLP: route -> gather (+ activation rounding) -> gate_up GEMM with bias and SwiGLU ->
// (MXFP8 rounding of y) -> down GEMM with bias -> weighted sum per token.

/// One CTA: expert counts, m_indptr, and each routed slot's row in the expert-sorted order. The
/// order of rows inside an expert is not deterministic; nothing downstream depends on it (each
/// row's GEMM result does not depend on its position, the final sum runs in slot order).
__global__ void route_kernel(MoeMlpPlan p, int32_t* indptr, int32_t* pos, int32_t* src_slot) {
  extern __shared__ int32_t s_cnt[];  // [E] counts, then [E] cursors
  const int64_t slots = p.T * p.topk;
  for (int64_t e = threadIdx.x; e < p.E; e += blockDim.x) s_cnt[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t e = p.ids[(s / p.topk) * p.ids_sT + s % p.topk];
    if (e >= 0 && e < p.E) atomicAdd(&s_cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t e = 0; e < p.E; ++e) {
      indptr[e] = run;
      const int32_t c = s_cnt[e];
      s_cnt[p.E + e] = run;
      run += c;
    }
    indptr[p.E] = run;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t e = p.ids[(s / p.topk) * p.ids_sT + s % p.topk];
    int32_t r = -1;
    if (e >= 0 && e < p.E) {
      r = atomicAdd(&s_cnt[p.E + e], 1);
      src_slot[r] = int32_t(s);
    }
    pos[s] = r;
  }
}

/// Kernel activation rows [rows][Kp] (act_pos order, zero beyond K) of the sorted rows r <
/// indptr[E]: from x[token of src_slot[r]] (gather) or from y[r] (fp32 [rows][K]), rounded to bf16
/// or through MXFP8 E4M3 (RCEIL) as the reference's act() does. One warp per (row, 64-wide block).
__global__ void prep_rows_kernel(MoeMlpPlan p, const int32_t* indptr, const int32_t* src_slot, const float* y,
                                 int64_t K, int64_t Kp, uint16_t* act) {
  griddep_wait();
  const int lane = threadIdx.x & 31;
  const int64_t kblocks = Kp / 64;
  const int64_t items = int64_t(indptr[p.E]) * kblocks;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const BlockFormat f = BlockFormat::mxfp8();
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < items; item += warps) {
    const int64_t r = item / kblocks, k0 = (item % kblocks) * 64, k = k0 + 2 * lane;
    const int64_t t = y ? 0 : src_slot[r] / p.topk;
    float v[2] = {0.0f, 0.0f};
    if (k < K) {
      for (int h = 0; h < 2; ++h) v[h] = y ? y[r * K + k + h] : load_float(p.x, p.x_dtype, t * p.x_sT + k + h);
    }
    if (p.act_mxfp8) {
      // MX block of 32 = 16 lanes: amax over them (bits of |v|, NaN above Inf as the reference)
      const uint32_t m0 = float_bits(v[0]) & 0x7FFFFFFFu, m1 = float_bits(v[1]) & 0x7FFFFFFFu;
      uint32_t am = m0 > m1 ? m0 : m1;
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) {
        const uint32_t u = __shfl_xor_sync(0xFFFFFFFFu, am, o);
        am = u > am ? u : am;
      }
      BlockStats st;
      st.amax_bits = am;
      const BlockScale bs = compute_block_scale(f, st, QuantContext{});
      for (int h = 0; h < 2; ++h) v[h] = decode_element(f, encode_element(f, bs, v[h]), bs.code, 0);
    }
    reinterpret_cast<uint32_t*>(act + r * Kp)[(k0 + act_pos(2 * lane)) >> 1] = act_pair_bf16(v[0], v[1]);
  }
}

/// out[t] = sum_j w[t, j] * o[pos[t, j]] over the routed slots, in slot order (the reference's).
__global__ void combine_kernel(MoeMlpPlan p, const int32_t* pos, const float* o) {
  griddep_wait();
  const int64_t n = p.T * p.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.H, h = i % p.H;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.topk; ++j) {
      const int32_t r = pos[t * p.topk + j];
      if (r < 0) continue;
      acc += p.weights[t * p.w_sT + j] * o[int64_t(r) * p.H + h];
    }
    store_float(p.out, p.out_dtype, t * p.o_sT + h, acc);
  }
}

}  // namespace

int gpt_oss_moe_mlp(const MoeMlpPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.T == 0) return 0;
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  const int64_t rows = p.T * p.topk;  // upper bound of routed rows
  const int64_t Hp = (p.H + 63) / 64 * 64, Ip = (p.I + 63) / 64 * 64;
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
                   (const int32_t*)src_slot, (const float*)nullptr, p.H, Hp, act1);
  }
  if (e == cudaSuccess && !p.act_mxfp8 && Ip != p.I) e = cudaMemsetAsync(act2, 0, size_t(rows * Ip * 2), st);
  GroupArgs a;
  a.m_indptr = indptr;
  a.indptr64 = false;
  a.G = p.E;
  a.M = rows;
  a.bs_blocked = false;
  if (e == cudaSuccess) {  // gate_up: [rows, 2I] -> SwiGLU -> y
    a.N = 2 * p.I; a.K = p.H; a.Kp = Hp;
    a.b = p.w1; a.b_sG = p.w1_sE; a.b_sN = p.w1_sR;
    a.bs = p.w1s; a.bs_sG = p.w1s_sE; a.bs_sN = p.w1s_sR;
    a.act = act1;
    a.mode = kEpiSwiglu;
    a.bias = p.b1; a.bias_dtype = p.b1_dtype; a.bias_sG = p.b1_sE;
    a.alpha = p.alpha; a.limit = p.limit;
    if (p.act_mxfp8) {
      a.out = y; a.o_sM = p.I; a.out_act_layout = false;
    } else {
      a.out = act2; a.o_sM = Ip; a.out_act_layout = true;
    }
    e = run_group(a, rows, pool, st);
  }
  if (e == cudaSuccess && p.act_mxfp8) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)src_slot, (const float*)y, p.I, Ip, act2);
  }
  if (e == cudaSuccess) {  // down: [rows, H] + b2 -> o (fp32)
    a.N = p.H; a.K = p.I; a.Kp = Ip;
    a.b = p.w2; a.b_sG = p.w2_sE; a.b_sN = p.w2_sR;
    a.bs = p.w2s; a.bs_sG = p.w2s_sE; a.bs_sN = p.w2s_sR;
    a.act = act2;
    a.mode = kEpiBias;
    a.bias = p.b2; a.bias_dtype = p.b2_dtype; a.bias_sG = p.b2_sE;
    a.out = o; a.o_sM = p.H; a.out_act_layout = false;
    e = run_group(a, rows, pool, st);
  }
  if (e == cudaSuccess) {
    const int64_t n = p.T * p.H;
    e = launch_pdl(combine_kernel, dim3(unsigned(n / 256 + 1 < 8 * int64_t(sms) ? n / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, p, (const int32_t*)pos, (const float*)o);
  }
  cudaFreeAsync(wsp, st);
  return int(e);
}

}  // namespace lowbit::cuda
