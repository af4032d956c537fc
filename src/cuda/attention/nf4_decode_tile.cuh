// src/cuda/attention/nf4_decode_tile.cuh: the pieces of the fused NF4 K-cache decode attention
// (sm90_nf4_decode_fused.cu): its parameters, the shared-memory layout of a CTA, the cp.async
// helpers and the scoring of one 128-token tile of the cache on CUDA cores.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/attention/decode_heuristics.hpp"
#include "cuda/common/cp_async.cuh"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda::decode_fused {

using detail::DecodeNf4Plan;
using detail::DecodeNf4Ptrs;

constexpr int kTile = 128;    ///< tokens per tile
constexpr int kThreads = 256; ///< 8 warps: 2 lanes per token when scoring, 16 tokens per warp in P @ V
constexpr int kMaxHeads = 8;  ///< query heads per CTA in P @ V (o in registers)
constexpr int kThrSub = 16;   ///< threshold CTAs per pruning block (8 tokens each: block_size <= 128)
constexpr int kMaxSmem = int(heuristics::decode::kSmemPerCta);  ///< sm_90 opt-in shared memory per block

struct Params {
  DecodeNf4Plan p;
  DecodeNf4Ptrs x;
  const float* thr;    ///< [B, H_q] given thresholds (x.threshold), or null
  float* bmax;         ///< [2 kThrSub, B, H_q] partial first / last block maxima (threshold kernel)
  float* part;         ///< [B, H_q, n_splits, 2 + Dv]: m, l, o
  int* skipped;        ///< [B, H_kv, n_splits]
  int n_splits;        ///< splits of the longest sequence
  int split_tiles;     ///< tiles per split
  int head_chunks;     ///< ceil(G / kHG)
  int qk_heads;        ///< query heads scored per CTA: G when pruning across several head chunks, else kHG
  int k_stages;        ///< K buffers: 1 (K of tile i + 1 issued once tile i is scored) or 2 (issued
                       ///< before tile i is scored, a whole iteration ahead)
  bool prune;
};

__device__ __forceinline__ int64_t seq_len(const DecodeNf4Plan& p, const DecodeNf4Ptrs& x, int64_t b) {
  if (!p.has_seq_lens) return p.seqlen;
  const int64_t L = x.seq_lens[b];
  return L < 0 ? 0 : (L > p.seqlen ? p.seqlen : L);
}
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7FC00000) : fmaxf(a, b);
}
/// The reference's non-finite rule: a score that is not finite makes the head's output NaN.
__device__ __forceinline__ float finite_or_nan(float s) { return isfinite(s) ? s : __int_as_float(0x7FC00000); }

/// Two FP8 residuals (low byte first) as floats.
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t pair, bool e4m3) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair & 0xFFFFu), e4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(__half2(h));
}

/// Shared-memory pitches (bytes) of one token's codes and residuals: conflict-free 64-bit code and
/// 128-bit residual reads by the two lanes of 8 (4) consecutive tokens.
template <int kD> constexpr int code_pitch() { return kD / 2 + 16; }
template <int kD> constexpr int res_pitch() { return kD + 32; }

template <int kD, bool kRes>
struct Smem {
  static constexpr int kCodes = kTile * code_pitch<kD>();          // the codes of one K buffer
  static constexpr int kResid = kRes ? kTile * res_pitch<kD>() : 0;
  static constexpr int kKStage = kCodes + kResid;                   // one K buffer: codes | resid
  /// One V buffer (Dv == D): bf16, or FP8 codes (v8).
  static constexpr int v_bytes(bool v8) { return kTile * kD * (v8 ? 1 : 2); }
  // layout: K[k_stages] | v[2] | q[qk_heads][D] | scale[D] | vscale[D] | S[2][qk_heads][kTile] |
  // P[kTile][8] | lut[16] | alpha, m, l [8 each] | thr[64] | ballots[64][8] | keep[2][kTile] | misc[8]
  // (the two V buffers also hold the end's reduction of o: 8 * 8 * D floats = 2 * kTile * D bytes)
  static size_t bytes(int qk_heads, bool v8, int k_stages) {
    return size_t(k_stages) * kKStage + 2 * size_t(v_bytes(v8)) + size_t(qk_heads) * kD * 4 + 2 * kD * 4 +
           2 * size_t(qk_heads) * kTile * 4 + kTile * kMaxHeads * 4 + (16 + 3 * kMaxHeads + 64 + 64 * 8 + 2 * kTile + 8) * 4;
  }
};

/// Scores of the tile's tokens for query heads [h_first, h_first + n) of the CTA's list (q_s rows),
/// into S[h][t] (softmax-scaled, non-finite -> NaN, tokens at or past t_valid -> -inf).
template <int kD, int kHG, bool kRes>
__device__ __forceinline__ void score_tile(const Params& P, const uint8_t* codes, const uint8_t* resid, const float* q_s,
                                           const float* scale_s, const float* lut, float* S, int h_first, int n,
                                           int t_valid) {
  const int t = threadIdx.x / 2, j = threadIdx.x % 2;
  const bool e4m3 = P.p.residual_dtype == DType::kE4M3;
  const int nib_xor = P.p.nibbles == NibbleOrder::kLowFirst ? 0 : 4;
  float acc[kHG];
#pragma unroll
  for (int h = 0; h < kHG; ++h) acc[h] = 0.f;
  const uint8_t* crow = codes + t * code_pitch<kD>();
  const uint8_t* rrow = resid + t * res_pitch<kD>();
#pragma unroll 1
  for (int i = 0; i < kD / 32; ++i) {
    const int k = 2 * i + j;  // 16-channel chunk of this lane
    const uint2 cw = *reinterpret_cast<const uint2*>(crow + 8 * k);
    float kv[16];
    const float4* sc4 = reinterpret_cast<const float4*>(scale_s + 16 * k);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float4 sc = sc4[u];
      const float scv[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
      for (int e4 = 0; e4 < 4; ++e4) {
        const int e = 4 * u + e4;
        const uint32_t w = e < 8 ? cw.x : cw.y;
        const uint32_t code = (w >> ((4 * (e % 8)) ^ nib_xor)) & 15u;
        kv[e] = __fmul_rn(lut[code], scv[e4]);
      }
    }
    if constexpr (kRes) {
      const uint4 rw = *reinterpret_cast<const uint4*>(rrow + 16 * k);
      const uint32_t r4[4] = {rw.x, rw.y, rw.z, rw.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float2 lo = fp8x2_to_float2(r4[u], e4m3), hi = fp8x2_to_float2(r4[u] >> 16, e4m3);
        kv[4 * u + 0] = __fadd_rn(kv[4 * u + 0], lo.x);
        kv[4 * u + 1] = __fadd_rn(kv[4 * u + 1], lo.y);
        kv[4 * u + 2] = __fadd_rn(kv[4 * u + 2], hi.x);
        kv[4 * u + 3] = __fadd_rn(kv[4 * u + 3], hi.y);
      }
    }
#pragma unroll
    for (int h = 0; h < kHG; ++h) {
      const float4* qh = reinterpret_cast<const float4*>(q_s + (h_first + h) * kD + 16 * k);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 qq = qh[u];
        acc[h] = fmaf(qq.x, kv[4 * u + 0], acc[h]);
        acc[h] = fmaf(qq.y, kv[4 * u + 1], acc[h]);
        acc[h] = fmaf(qq.z, kv[4 * u + 2], acc[h]);
        acc[h] = fmaf(qq.w, kv[4 * u + 3], acc[h]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < kHG; ++h) {
    const float s = acc[h] + __shfl_xor_sync(0xffffffffu, acc[h], 1);
    if (j == 0 && h < n) S[(h_first + h) * kTile + t] = t < t_valid ? finite_or_nan(P.p.softmax_scale * s) : -INFINITY;
  }
}

}  // namespace lowbit::cuda::decode_fused
