// src/cuda/attention/nf4_decode_ws.cuh: the warp-specialized split kernel of the fused decode
// attention (sm90_nf4_decode_fused.cu; docs/design/decode_kernel.md, "Next design step"). It
// computes what split_kernel computes, bit for bit (the same arithmetic in the same order, on the
// same thread mapping), with another pipeline:
//   * a producer warp (warp 8) fills two rings through cp.async copies that mbarriers count
//     (cp.async.mbarrier.arrive.noinc): K stages (codes and residuals of one 128-token tile, 2 to 4
//     stages) and V stages (half a tile: the 64 tokens that one warpgroup multiplies, 2 to 8
//     stages, the heuristic taking at most 4); it issues the V rows of a tile once the tile's keep
//     decisions are published (pruning) and only for the kept blocks, then K of the tile SK ahead;
//   * 8 consumer warps (256 threads, split_kernel's mapping: scoring two lanes per token, softmax a
//     warp per head, P @ V a warp per 16 tokens) never wait on a copy they issued: they wait on the
//     rings' "full" barriers and release stages through their "empty" barriers (one arrival per
//     warp); P @ V runs one tile behind the scoring, so V of tile i lands while tile i + 1 is scored;
//   * per tile two named barriers among the consumer warps only (the scores of the tile, then its
//     softmax weights; one more in the last iteration, which scores nothing), against four or five
//     CTA barriers in split_kernel; the keep decisions go to the producer through shared memory
//     and an mbarrier (one arrival per consumer warp).
// The K stage is not padded: its rows are XOR-swizzled (code_swz / res_swz of nf4_decode_tile.cuh).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/attention/nf4_decode_tile.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/mbarrier.cuh"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda::decode_fused {

constexpr int kWsConsumers = 256;              ///< the 8 consumer warps (split_kernel's threads)
constexpr int kWsThreads = kWsConsumers + 32;  ///< and the producer warp
constexpr uint32_t kWsBarrier = 0;             ///< named barrier of the consumer warps (mbarrier.cuh's ids)
constexpr int kWsMaxK = 4, kWsMaxV = 8;        ///< ring depths the barrier block holds

/// CTAs per SM the instantiation is compiled for: two where split_kernel fits two in 128 registers
/// without spilling. Two CTAs of 288 threads leave ptxas 96 registers per thread (sm_90a), against
/// split_kernel's 128 at 256 threads: the D <= 128, kHG <= 4 instances compile to 96 with a few
/// spilled scalars (docs/design/decode_kernel.md, "Next design step").
constexpr int ws_min_blocks(int d, int hg) { return d <= 128 && hg <= 4 ? 2 : 1; }

/// Dynamic shared memory of the warp-specialized split kernel:
///   mbarriers [32] (kfull[4], kempty[4], vfull[8], vempty[8], keep[2]) | scale[D] | vscale[D] |
///   P[kTile][8] | lut[16] | alpha, m, l [8 each] | thr[64] | ballots[2][64][4] | misc[4] |
///   K ring [ks] | V ring [vh] | q[qk_heads][D] | S[2][qk_heads][kTile]
/// The arrays of fixed size come first, at offsets known at compile time (no registers hold their
/// addresses); the rings also hold the end's reduction of o over the 8 warps (8 * kHG * D floats).
template <int kD, bool kRes>
struct SmemWs {
  static constexpr int kBarBytes = 32 * 8;
  /// Offsets (bytes) of the arrays of fixed size, and their end: the K ring (16-byte aligned).
  static constexpr int kScale = kBarBytes, kVscale = kScale + kD * 4, kP = kVscale + kD * 4;
  static constexpr int kLut = kP + kTile * kMaxHeads * 4, kAlpha = kLut + 16 * 4, kM = kAlpha + kMaxHeads * 4;
  static constexpr int kL = kM + kMaxHeads * 4, kThr = kL + kMaxHeads * 4, kAllb = kThr + 64 * 4;
  static constexpr int kMisc = kAllb + 2 * 64 * 4 * 4, kRing = kMisc + 4 * 4;
  static_assert(kRing % 16 == 0, "the K ring's cp.async destinations are 16-byte aligned");
  static constexpr int kCodes = kTile * kD / 2;                      // codes of one K stage
  static constexpr int kKStage = kCodes + (kRes ? kTile * kD : 0);  // one K stage: codes | resid
  /// One V stage: half a tile (64 tokens) of bf16 rows, or of FP8 codes (v8).
  static constexpr int v_half(bool v8) { return kTile / 2 * kD * (v8 ? 1 : 2); }
  static constexpr size_t ring(int ks, int vh, bool v8, int hg) {
    const size_t r = size_t(ks) * kKStage + size_t(vh) * v_half(v8), red = size_t(8) * hg * kD * 4;
    return r > red ? r : red;
  }
  static constexpr size_t bytes(int qk_heads, bool v8, int ks, int vh, int hg) {
    return kRing + ring(ks, vh, v8, hg) + size_t(qk_heads) * kD * 4 + 2 * size_t(qk_heads) * kTile * 4;
  }
};

/// Word w of four, by a run-time index (selects: no local-memory array).
__device__ __forceinline__ uint32_t word4(const uint32_t (&x)[4], int w) {
  return w == 0 ? x[0] : (w == 1 ? x[1] : (w == 2 ? x[2] : x[3]));
}

/// The keep flags of one tile's tokens as four words (bit t % 32 of word t / 32: token t is one of
/// the tile's nt tokens and its pruning block is kept), from the ballots of the tile's scored heads
/// (`rows`: 4 words per head in split_kernel's encoding of all_heads_below: bs >= 4: word 0, bit
/// kb * bs / 4; bs < 4: word u / bs, bit l for the block starting at token 4 l + u). The sequence's
/// first and last blocks are always kept, the others unless every scored head is below its
/// threshold; without pruning every token < nt. Warp-collective; returns the number of the tile's
/// blocks that are skipped.
__device__ __forceinline__ int tile_keep_words(uint32_t (&km)[4], bool prune, const int* rows, int nq, int64_t t0, int nt,
                                               int64_t n_blocks, int bsi, int bs_shift) {
  const int lane = threadIdx.x % 32;
  uint32_t below[4] = {0u, 0u, 0u, 0u};
  if (prune) {
    const int nw = bsi >= 4 ? 1 : 4 / bsi;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t x = ~0u;
      if (w < nw)
        for (int h = 0; h < nq; ++h) x &= uint32_t(rows[h * 4 + w]);
      below[w] = w < nw ? x : 0u;
    }
  }
  const int64_t jb0 = prune ? t0 >> bs_shift : 0;
  int skipped = 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int t = 32 * r + lane, kb = t >> bs_shift;
    bool kept = t < nt;
    if (prune) {
      bool b;
      if (bsi >= 4) {
        b = (below[0] >> (kb * bsi / 4)) & 1u;
      } else {
        const int st = kb * bsi;
        b = (word4(below, (st % 4) / bsi) >> (st / 4)) & 1u;
      }
      const int64_t j = jb0 + kb;
      kept = kept && !(j > 0 && j + 1 < n_blocks && b);
      skipped += __popc(__ballot_sync(0xffffffffu, t < nt && (t & (bsi - 1)) == 0 && !kept));
    }
    km[r] = __ballot_sync(0xffffffffu, kept);
  }
  return skipped;
}

/// Stage 1, warp-specialized: grid (n_splits, H_kv * head_chunks, B), kWsThreads threads,
/// SmemWs<kD, kRes>::bytes(...) bytes; P.k_stages K stages, P.v_halves V stages.
template <int kD, int kHG, bool kRes>
__global__ void __launch_bounds__(kWsThreads, ws_min_blocks(kD, kHG)) split_kernel_ws(const __grid_constant__ Params P) {
  griddep_launch_dependents();
  using Sm = SmemWs<kD, kRes>;
  constexpr int kDv = kD, kCV = kDv / 32;
  const DecodeNf4Plan& p = P.p;
  const int split = blockIdx.x, b = blockIdx.z;
  const int g = blockIdx.y / P.head_chunks, hc = blockIdx.y % P.head_chunks;
  const int G = int(p.heads / p.heads_kv);
  const int h_own = hc * kHG, n_own = min(kHG, G - h_own);  // the CTA's heads g * G + h_own + [0, n_own)
  const int nq = P.qk_heads;                                 // scored heads: [q_first, q_first + nq) of the group
  const int q_first = nq == G ? 0 : h_own;
  const int own_in_q = h_own - q_first;                      // row of the first own head in q_s / S
  const int nq_real = min(nq, G - q_first);                  // scored heads that exist (the rest: q = 0)
  const int64_t L = seq_len(p, P.x, b);
  const int64_t t_begin = int64_t(split) * P.split_tiles * kTile;
  if (t_begin >= L) return;  // nothing of this sequence here: the merge reads only splits with tokens
  const int64_t t_end = min(L, t_begin + int64_t(P.split_tiles) * kTile);
  const int n_tiles = int((t_end - t_begin + kTile - 1) / kTile);
  const int64_t bs = p.block_size, n_blocks = p.blocks(L);
  const int bs_shift = P.prune ? __ffs(int(bs)) - 1 : 0;  // bs divides kTile = 128: a power of two

  const bool v8 = p.v_dtype != DType::kBFloat16;  // FP8 V codes (the channel scales applied at the end)
  const bool v_e4m3 = p.v_dtype == DType::kE4M3;
  const int v_es = v8 ? 1 : 2;                    // bytes per V element
  const int vhalf = Sm::v_half(v8);               // bytes of one V stage
  const int SK = P.k_stages, VH = P.v_halves;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t bars = smem_u32(smem_raw);
  auto kfull = [&](int s) { return bars + 8u * uint32_t(s); };
  auto kempty = [&](int s) { return bars + 8u * uint32_t(kWsMaxK + s); };
  auto vfull = [&](int s) { return bars + 8u * uint32_t(2 * kWsMaxK + s); };
  auto vempty = [&](int s) { return bars + 8u * uint32_t(2 * kWsMaxK + kWsMaxV + s); };
  auto keepb = [&](int s) { return bars + 8u * uint32_t(2 * kWsMaxK + 2 * kWsMaxV + s); };
  float* scale_s = reinterpret_cast<float*>(smem_raw + Sm::kScale);
  float* vscale_s = reinterpret_cast<float*>(smem_raw + Sm::kVscale);  // [Dv]: 1 for bf16 V
  float* Pm = reinterpret_cast<float*>(smem_raw + Sm::kP);              // P[t][kMaxHeads]
  float* lut = reinterpret_cast<float*>(smem_raw + Sm::kLut);           // 16
  float* alpha_s = reinterpret_cast<float*>(smem_raw + Sm::kAlpha);     // [kMaxHeads]
  float* m_run = reinterpret_cast<float*>(smem_raw + Sm::kM);
  float* l_run = reinterpret_cast<float*>(smem_raw + Sm::kL);
  float* thr_s = reinterpret_cast<float*>(smem_raw + Sm::kThr);         // [64] (nq <= 64 when pruning)
  int* allb = reinterpret_cast<int*>(smem_raw + Sm::kAllb);  // [2][64][4]: per tile parity, head: ballots of blocks below
  int* misc = reinterpret_cast<int*>(smem_raw + Sm::kMisc);  // [0]: skipped blocks
  uint8_t* k_ring = smem_raw + Sm::kRing;         // [SK] stages of Sm::kKStage bytes: codes | resid
  uint8_t* v_ring = k_ring + SK * Sm::kKStage;    // [VH] stages of vhalf bytes
  float* q_s = reinterpret_cast<float*>(k_ring + Sm::ring(SK, VH, v8, kHG));  // [nq][kD]
  float* S = q_s + nq * kD;                       // [2][nq][kTile]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  auto tile_start = [&](int tile) { return t_begin + int64_t(tile) * kTile; };
  auto tile_len = [&](int tile) { return int(t_end - tile_start(tile) < kTile ? t_end - tile_start(tile) : kTile); };

  if (warp == kWsConsumers / 32) {
    // ---- producer warp ----
    if (lane == 0) {
      for (int s = 0; s < SK; ++s) {
        mbar_init(kfull(s), 32);  // the 32 lanes' cp.async arrivals
        mbar_init(kempty(s), 8);  // one per consumer warp
      }
      for (int s = 0; s < VH; ++s) {
        mbar_init(vfull(s), 33);  // the 32 lanes' cp.async arrivals and lane 0's, after the keep flags were read
        mbar_init(vempty(s), 4);  // the 4 warps that multiply that half
      }
      for (int s = 0; s < 2; ++s) mbar_init(keepb(s), 8);  // one per consumer warp, ballots written
      misc[0] = 0;
      mbar_init_fence();
    }
    __syncwarp();
    // token t's rows (a paged cache: through the block table)
    const uint8_t* kc_base = P.x.k_nf4 + g * p.kc_stride[2];
    const uint8_t* kr_base = P.x.k_residual + g * p.kr_stride[2];
    const uint8_t* v_base = static_cast<const uint8_t*>(P.x.v) + g * p.v_stride[2] * v_es;
    int kn = 0, ks = 0;  // the next K tile, its stage
    uint32_t kph = 0;    // its stage's round parity
    auto issue_k = [&]() {
      mbar_wait(kempty(ks), kph ^ 1u);  // the stage's previous tile scored by every consumer warp
      const uint32_t codes_a = smem_u32(k_ring + ks * Sm::kKStage), resid_a = codes_a + Sm::kCodes;
      const int64_t t0 = tile_start(kn);
      const int nt = tile_len(kn);
      constexpr int kCg = kD / 32;  // 16-byte granules of a token's codes
      for (int e = lane; e < nt * kCg; e += 32) {
        const int t = e / kCg, c = e % kCg;
        cp_async16_to(codes_a + uint32_t(t * (kD / 2) + 16 * (c ^ code_swz<kD>(t))),
                      kc_base + p.pages.offset(p.kc_stride, b, t0 + t) + 16 * c);
      }
      if constexpr (kRes) {
        constexpr int kRg = kD / 16;
        for (int e = lane; e < nt * kRg; e += 32) {
          const int t = e / kRg, c = e % kRg;
          cp_async16_to(resid_a + uint32_t(t * kD + 16 * (c ^ res_swz<kD>(t))),
                        kr_base + p.pages.offset(p.kr_stride, b, t0 + t) + 16 * c);
        }
      }
      cp_async_mbar_arrive(kfull(ks));
      ++kn;
      if (++ks == SK) {
        ks = 0;
        kph ^= 1u;
      }
    };
    int vs = 0;        // the next V stage
    uint32_t vph = 0;  // its round parity
    // V rows of the kept tokens of tile `tile`, its two halves into the next two V stages
    auto issue_v = [&](int tile) {
      const int64_t t0 = tile_start(tile);
      const int nt = tile_len(tile);
      if (P.prune) mbar_wait(keepb(tile & 1), uint32_t(tile >> 1) & 1u);  // the consumer warps' ballots of the tile
      uint32_t km[4];
      const int skipped = tile_keep_words(km, P.prune, allb + (tile & 1) * 64 * 4, nq_real, t0, nt, n_blocks, int(bs), bs_shift);
      if (lane == 0 && skipped) misc[0] += skipped;
      const int vg = kDv * v_es / 16;  // 16-byte granules of a token's V row
      for (int half = 0; half < 2; ++half) {
        mbar_wait(vempty(vs), vph ^ 1u);  // the stage's previous half multiplied by its warpgroup
        const uint32_t dst = smem_u32(v_ring + vs * vhalf);
        const int th0 = kTile / 2 * half;
        const int nth = nt - th0 < 0 ? 0 : (nt - th0 > kTile / 2 ? kTile / 2 : nt - th0);
        for (int e = lane; e < nth * vg; e += 32) {
          const int tl = e / vg, c = e % vg, t = th0 + tl;
          if (!((word4(km, t / 32) >> (t % 32)) & 1u)) continue;
          cp_async16_to(dst + uint32_t(tl * kDv * v_es + 16 * c),
                        v_base + p.pages.offset(p.v_stride, b, t0 + t) * v_es + 16 * c);
        }
        cp_async_mbar_arrive(vfull(vs));
        __syncwarp();  // every lane's reads of the ballots are done
        if (lane == 0) mbar_arrive(vfull(vs));
        if (++vs == VH) {
          vs = 0;
          vph ^= 1u;
        }
      }
    };
    // the first K stages before the CTA barrier (they wait on nothing), then per tile i: V(i) once
    // its keep decisions are known, then K(i + SK) once tile i is scored
    while (kn < n_tiles && kn < SK) issue_k();
    __syncthreads();
    for (int i = 0; i < n_tiles; ++i) {
      issue_v(i);
      if (kn < n_tiles) issue_k();
    }
    cp_async_drain();
    return;
  }

  // ---- consumer warps ----
  for (int e = tid; e < nq * kD; e += kWsConsumers)
    q_s[e] = e / kD < nq_real ? decode_bf16(P.x.q[b * p.q_stride[0] + (g * G + q_first + e / kD) * p.q_stride[2] + e % kD])
                              : 0.f;
  for (int c = tid; c < kD; c += kWsConsumers) {
    scale_s[c] = detail::load_float(P.x.k_scale, p.scale_dtype, b * p.ks_stride[0] + g * p.ks_stride[1] + c);
    vscale_s[c] = v8 ? P.x.v_scale[b * p.vs_stride[0] + g * p.vs_stride[1] + c] : 1.f;
  }
  if (tid < 16) lut[tid] = nf4_value(uint8_t(tid));
  if (tid < kMaxHeads) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0.f;
  }
  __syncthreads();  // the barriers' initialisation and the tables above

  float o[kHG][kCV];
#pragma unroll
  for (int h = 0; h < kHG; ++h)
#pragma unroll
    for (int c = 0; c < kCV; ++c) o[h][c] = 0.f;

  int ks = 0;                 // K stage of the tile to score
  uint32_t kph = 0;           // its round parity
  const int wg = warp / 4;    // the warpgroup: P @ V over the tile's half wg (tokens [64 wg, 64 wg + 64))
  int vs = wg;                // V stage of this warpgroup's half of the tile to multiply (half 2 j + wg)
  uint32_t vph = 0;
  // Iteration it scores tile it and publishes its keep decisions, then runs softmax and P @ V of
  // tile it - 1 (as split_kernel).
  bool have_thr = false;
  for (int it = 0; it <= n_tiles; ++it) {
    const int cur = it & 1, prv = cur ^ 1;
    if (it < n_tiles) {
      const int nt = tile_len(it);
      mbar_wait(kfull(ks), kph);
      const uint8_t* codes_s = k_ring + ks * Sm::kKStage;
      float* Sc = S + cur * nq * kTile;
      for (int h0 = 0; h0 < nq; h0 += kHG)
        score_tile<kD, kHG, kRes, true>(P, codes_s, codes_s + Sm::kCodes, q_s, scale_s, lut, Sc, h0, min(kHG, nq - h0),
                                        nt);
      __syncwarp();  // the warp's reads of the stage are done
      if (lane == 0) mbar_arrive(kempty(ks));
      if (++ks == SK) {
        ks = 0;
        kph ^= 1u;
      }
      if (P.prune && !have_thr) {
        griddep_wait();  // the threshold kernel's results
        if (tid < nq_real) {
          const int64_t i = int64_t(b) * p.heads + g * G + q_first + tid;
          float m = -INFINITY;
          if (!P.thr)
            for (int z = 0; z < 2 * kThrSub; ++z) m = nan_max(m, P.bmax[int64_t(z) * p.batch * p.heads + i]);
          thr_s[tid] = P.thr ? P.thr[i] : m - p.delta;
        }
        have_thr = true;
      }
      named_barrier_sync(kWsBarrier, kWsConsumers);  // the tile's scores (and the thresholds)
      if (P.prune) {  // per scored head h: ballots of the tile's blocks below its threshold, row h of allb[cur]
        const int bsi = int(bs);
        int* rows = allb + cur * 64 * 4;
        for (int h = warp; h < nq_real; h += kWsConsumers / 32) {
          const float* Sh = Sc + h * kTile;
          const float th = thr_s[h];
          if (bsi >= 4) {  // bit = the leader lane (kb * bs / 4) of each block below
            const float4 s4 = reinterpret_cast<const float4*>(Sh)[lane];
            float m = nan_max(nan_max(s4.x, s4.y), nan_max(s4.z, s4.w));
            for (int off = 1; off < bsi / 4; off <<= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, off));
            const unsigned below = __ballot_sync(0xffffffffu, m < th && lane % (bsi / 4) == 0);
            if (lane == 0) rows[h * 4] = int(below);
          } else {
            for (int u = 0; u < 4; u += bsi) {
              float m = Sh[4 * lane + u];
              if (bsi == 2) m = nan_max(m, Sh[4 * lane + u + 1]);
              const unsigned bl = __ballot_sync(0xffffffffu, m < th);
              if (lane == 0) rows[h * 4 + u / bsi] = int(bl);  // bit l: block (4 l + u) / bsi
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(keepb(cur));  // the producer issues V of the kept blocks
      }
    } else {
      // the last iteration scores nothing, so it has no barrier of the tile's scores: this one
      // orders the previous iteration's P @ V reads of Pm and alpha_s before the softmax below
      // rewrites them, and (a single tile) the ballots of tile 0 before tile_keep_words reads them
      named_barrier_sync(kWsBarrier, kWsConsumers);
    }
    if (it == 0) continue;
    // tile j = it - 1: online softmax (warp w for own head w; P = 0 for padding heads, skipped
    // and absent tokens), then P @ V
    const int j = it - 1, ntj = tile_len(j);
    uint32_t km[4];  // the tile's token keep flags
    tile_keep_words(km, P.prune, allb + prv * 64 * 4, nq_real, tile_start(j), ntj, n_blocks, int(bs), bs_shift);
    if (warp < kHG) {
      const bool real = warp < n_own;
      const float* Sh = S + prv * nq * kTile + (own_in_q + (real ? warp : 0)) * kTile;
      const float4 sv = reinterpret_cast<const float4*>(Sh)[lane];
      const float sl[4] = {sv.x, sv.y, sv.z, sv.w};
      float s4[4];
      float mt = -INFINITY;
      const uint32_t kl = word4(km, lane / 8) >> (4 * (lane % 8));  // tokens 4 lane + [0, 4)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const bool kept = (kl >> u) & 1u;
        s4[u] = kept ? sl[u] : -INFINITY;
        mt = nan_max(mt, s4[u]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mt = nan_max(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      const float m_old = m_run[warp], m_new = nan_max(m_old, mt);
      const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
      float ls = 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float pt = (!real || m_new == -INFINITY || s4[u] == -INFINITY) ? 0.f : __expf(s4[u] - m_new);
        Pm[(4 * lane + u) * kMaxHeads + warp] = pt;
        ls += pt;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, off);
      __syncwarp();
      if (lane == 0) {
        alpha_s[warp] = alpha;
        m_run[warp] = m_new;
        l_run[warp] = l_run[warp] * alpha + ls;
      }
    }
    named_barrier_sync(kWsBarrier, kWsConsumers);  // P and alpha of tile j
    // P @ V: warp w over tokens [16 w, 16 w + 16), lane over channels [kCV lane, kCV lane + kCV)
    {
#pragma unroll
      for (int h = 0; h < kHG; ++h) {
        const float a = alpha_s[h];
#pragma unroll
        for (int c = 0; c < kCV; ++c) o[h][c] *= a;
      }
      mbar_wait(vfull(vs), vph);
      const uint8_t* vb = v_ring + vs * vhalf;  // token t of the tile: row t - 64 wg of the stage
      const int t_row0 = kTile / 2 * wg;
      const uint32_t kw = word4(km, warp / 2) >> (16 * (warp % 2));  // tokens 16 warp + [0, 16)
      // one token's V channels [kCV lane, kCV lane + kCV) as floats: bf16 bits, or FP8 codes
      auto pv_tokens = [&](auto load_row) {
#pragma unroll 2
        for (int u = 0; u < 16; ++u) {
          const int t = 16 * warp + u;
          if (!((kw >> u) & 1u)) continue;
          float v[kCV];
          load_row(t, v);
          const float* pr = Pm + t * kMaxHeads;
#pragma unroll
          for (int h = 0; h < kHG; ++h) {
            const float pt = pr[h];
#pragma unroll
            for (int c = 0; c < kCV; ++c) o[h][c] = fmaf(pt, v[c], o[h][c]);
          }
        }
      };
      if (!v8) {
        pv_tokens([&](int t, float* v) {
          const uint16_t* vr = reinterpret_cast<const uint16_t*>(vb + (t - t_row0) * kDv * 2) + kCV * lane;
          if constexpr (kCV == 2) {
            const uint32_t w = *reinterpret_cast<const uint32_t*>(vr);
            v[0] = __uint_as_float(w << 16);
            v[1] = __uint_as_float(w & 0xFFFF0000u);
          } else {
#pragma unroll
            for (int c4 = 0; c4 < kCV / 4; ++c4) {
              const uint2 w = *reinterpret_cast<const uint2*>(vr + 4 * c4);
              v[4 * c4 + 0] = __uint_as_float(w.x << 16);
              v[4 * c4 + 1] = __uint_as_float(w.x & 0xFFFF0000u);
              v[4 * c4 + 2] = __uint_as_float(w.y << 16);
              v[4 * c4 + 3] = __uint_as_float(w.y & 0xFFFF0000u);
            }
          }
        });
      } else {
        pv_tokens([&](int t, float* v) {
          const uint8_t* vr = vb + (t - t_row0) * kDv + kCV * lane;
          uint32_t w[kCV / 2];  // kCV = 2, 4 or 8 codes: one pair per word
          if constexpr (kCV == 2) {
            w[0] = *reinterpret_cast<const uint16_t*>(vr);
          } else if constexpr (kCV == 4) {
            const uint32_t x = *reinterpret_cast<const uint32_t*>(vr);
            w[0] = x;
            w[1] = x >> 16;
          } else {
            const uint2 x = *reinterpret_cast<const uint2*>(vr);
            w[0] = x.x;
            w[1] = x.x >> 16;
            w[2] = x.y;
            w[3] = x.y >> 16;
          }
#pragma unroll
          for (int i = 0; i < kCV / 2; ++i) {
            const float2 f = fp8x2_to_float2(w[i], v_e4m3);
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
          }
        });
      }
      __syncwarp();  // the warp's reads of the V stage are done
      if (lane == 0) mbar_arrive(vempty(vs));
      vs += 2;  // this warpgroup's half of the next tile: two V stages on
      if (vs >= VH) {
        vs -= VH;
        vph ^= 1u;
      }
    }
  }
  named_barrier_sync(kWsBarrier, kWsConsumers);  // every warp's P @ V done; every copy has landed
  // reduce o over the 8 warps (through the rings: 8 * kHG * Dv floats fit there)
  float* red = reinterpret_cast<float*>(k_ring);
#pragma unroll
  for (int h = 0; h < kHG; ++h)
#pragma unroll
    for (int c = 0; c < kCV; ++c) red[(warp * kHG + h) * kDv + kCV * lane + c] = o[h][c];
  named_barrier_sync(kWsBarrier, kWsConsumers);
  const int n_splits = P.n_splits;
  for (int e = tid; e < n_own * kDv; e += kWsConsumers) {
    const int h = e / kDv, c = e % kDv;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWsConsumers / 32; ++w) s += red[(w * kHG + h) * kDv + c];
    P.part[((int64_t(b) * p.heads + g * G + h_own + h) * n_splits + split) * (2 + kDv) + 2 + c] = s * vscale_s[c];
  }
  if (tid < n_own) {
    float* dst = P.part + ((int64_t(b) * p.heads + g * G + h_own + tid) * n_splits + split) * (2 + kDv);
    dst[0] = m_run[tid];
    dst[1] = l_run[tid];
  }
  if (tid == 0 && hc == 0) P.skipped[(int64_t(b) * p.heads_kv + g) * n_splits + split] = misc[0];
}

}  // namespace lowbit::cuda::decode_fused
