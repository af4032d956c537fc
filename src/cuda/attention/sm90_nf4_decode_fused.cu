// src/cuda/attention/sm90_nf4_decode_fused.cu: the fast path of the decode attention over an NF4 +
// FP8-residual K cache (lowbit/decode_attention.hpp): one kernel reads each byte of the cache
// once, a second merges the splits.
//   threshold (pruning on, no given threshold): a CTA per (KV head, sequence) scores the first and
//     the last pruning blocks; thr[b, h] = max(their maxima) - delta. Lets the main grid start at
//     once (programmatic dependent launch): the main kernel waits for it only at its first keep
//     decision.
//   split: a CTA per (split of the sequence, KV head, chunk of <= 8 query heads of its group, batch)
//     walks its tiles of 128 tokens: cp.async of the K codes and residuals of tile i + 2 while tile
//     i is scored (two CUDA-core lanes per token, the key decoded by the kcache.hpp rule, one read
//     of K serving every query head of the group), the block maxima and keep decisions of the
//     tile, then cp.async of V for the kept blocks only, online softmax (warp per head) and P @ V
//     (warp per 16 tokens, lane per Dv / 32 channels). Writes (m, l, o) of its heads and its
//     skipped-block count.
//   merge: a CTA per (query head, sequence): log-sum-exp merge of the splits, out in bf16, the skip
//     ratio.
// Taken when D == Dv, every row of codes, residuals and V starts 16-byte aligned, and (pruning on)
// block_size divides the 128-token tile; the other calls run the generic kernels of
// sm90_nf4_decode.cu (docs/decode_attention.md).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/plan_decode.hpp"
#include "cuda/attention/decode_heuristics.hpp"
#include "cuda/attention/launch_decode.hpp"
#include "cuda/attention/nf4_decode_generic.hpp"
#include "cuda/attention/nf4_decode_tile.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/workspace.cuh"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda {
namespace decode_fused {

/// Stage 0: grid (H_kv, B, 2 * kThrSub), kThreads threads. CTA (g, b, z) scores tokens
/// 8 * (z % kThrSub) + warp of the first (z < kThrSub) or the last pruning block of sequence b (a
/// warp per token, lanes over the channels, q read from global memory) and writes the maximum of
/// each query head of KV head g over its tokens to bmax[z][b, h] (-inf without a token).
template <int kD>
__global__ void __launch_bounds__(kThreads) threshold_kernel(const Params P) {
  griddep_launch_dependents();
  const DecodeNf4Plan& p = P.p;
  const int64_t g = blockIdx.x, b = blockIdx.y;
  const int z = int(blockIdx.z), which = z / kThrSub, sub = z % kThrSub;
  const int G = int(p.heads / p.heads_kv);
  const int64_t L = seq_len(p, P.x, b), bs = p.block_size, n = p.blocks(L);
  constexpr int kWarps = kThreads / 32, kPer = kD / 32;
  __shared__ float red[kWarps][64];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = n == 0 ? 0 : (which == 0 ? 0 : (n - 1) * bs), t1 = min(L, t0 + bs);
  const int64_t t = t0 + sub * kWarps + warp;
  for (int h0 = 0; h0 < G; h0 += 64) {
    const int nh = min(64, G - h0);
    for (int h = lane; h < 64; h += 32) red[warp][h] = -INFINITY;
    __syncwarp();
    if (t < t1) {
      float k[kPer];
      const uint8_t* codes = P.x.k_nf4 + p.pages.offset(p.kc_stride, b, t) + g * p.kc_stride[2];
      const int64_t s0 = b * p.ks_stride[0] + g * p.ks_stride[1];
      const int64_t r0 = p.pages.offset(p.kr_stride, b, t) + g * p.kr_stride[2];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = lane * kPer + i;
        float v = kcache_decode(unpack_nibble(p.nibbles, codes[c / 2], c & 1),
                                detail::load_float(P.x.k_scale, p.scale_dtype, s0 + c));
        if (p.use_residual) v = kcache_add_residual(v, detail::load_float(P.x.k_residual, p.residual_dtype, r0 + c));
        k[i] = v;
      }
      for (int h = 0; h < nh; ++h) {
        const uint16_t* qh = P.x.q + b * p.q_stride[0] + (g * G + h0 + h) * p.q_stride[2] + lane * kPer;
        float acc = 0.f;
#pragma unroll
        for (int c = 0; c < kPer; ++c) acc = fmaf(decode_bf16(qh[c]), k[c], acc);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) red[warp][h] = finite_or_nan(p.softmax_scale * acc);
      }
    }
    __syncthreads();
    if (threadIdx.x < nh) {
      float m = -INFINITY;
      for (int w = 0; w < kWarps; ++w) m = nan_max(m, red[w][threadIdx.x]);
      P.bmax[(int64_t(z) * p.batch + b) * p.heads + g * G + h0 + threadIdx.x] = m;
    }
    __syncthreads();
  }
}

/// Whether block kb of the tile is below the threshold of every scored head. Row h of `bits` holds
/// head h's ballots: bs >= 4: word 0, bit kb * bs / 4 (the block's leader lane); bs < 4: word u / bs,
/// bit l for the block starting at token 4 l + u.
__device__ __forceinline__ bool all_heads_below(const int* bits, int nq, int bs, int kb) {
  for (int h = 0; h < nq; ++h) {
    const unsigned* row = reinterpret_cast<const unsigned*>(bits + h * 8);
    bool b;
    if (bs >= 4) {
      b = (row[0] >> (kb * bs / 4)) & 1u;
    } else {
      const int t = kb * bs, l = t / 4, u = t % 4;
      b = (row[u / bs] >> l) & 1u;
    }
    if (!b) return false;
  }
  return true;
}

/// Stage 1: grid (n_splits, H_kv * head_chunks, B), kThreads threads, Smem<kD, kRes> bytes.
template <int kD, int kHG, bool kRes>
__global__ void __launch_bounds__(kThreads, 2) split_kernel(const Params P) {
  griddep_launch_dependents();
  using Sm = Smem<kD, kRes>;
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
  const int nbt = P.prune ? int(kTile / bs) : 1;  // pruning blocks per tile (bs divides kTile)
  const int bs_shift = P.prune ? __ffs(int(bs)) - 1 : 0;  // bs divides kTile = 128: a power of two

  const bool v8 = p.v_dtype != DType::kBFloat16;  // FP8 V codes (the channel scales applied at the end)
  const bool v_e4m3 = p.v_dtype == DType::kE4M3;
  const int vbuf = Sm::v_bytes(v8);                // bytes of one V buffer

  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int ks = P.k_stages;                  // K buffers (1 or 2): tile i in buffer i % ks
  uint8_t* k_s = smem_raw;                    // [ks] buffers of Sm::kKStage bytes: codes | resid
  uint8_t* v_s = k_s + ks * Sm::kKStage;      // [2] buffers of vbuf bytes
  float* q_s = reinterpret_cast<float*>(v_s + 2 * vbuf);
  float* scale_s = q_s + nq * kD;
  float* vscale_s = scale_s + kD;             // [Dv]: 1 for bf16 V
  float* S = vscale_s + kD;                   // [2][nq][kTile]
  float* Pm = S + 2 * nq * kTile;             // P[t][kMaxHeads]
  float* lut = Pm + kTile * kMaxHeads;        // 16
  float* alpha_s = lut + 16;                  // [kMaxHeads]
  float* m_run = alpha_s + kMaxHeads;
  float* l_run = m_run + kMaxHeads;
  float* thr_s = l_run + kMaxHeads;           // [64] (nq <= 64 when pruning)
  int* allb_s = reinterpret_cast<int*>(thr_s + 64);  // [64][8]: ballots of blocks below each head's threshold
  int* keep_s = allb_s + 64 * 8;              // [2][kTile]
  int* misc = keep_s + 2 * kTile;             // [0]: skipped blocks

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // token t's rows (a paged cache: through the block table)
  const uint8_t* kc_base = P.x.k_nf4 + g * p.kc_stride[2];
  const uint8_t* kr_base = P.x.k_residual + g * p.kr_stride[2];
  const int v_es = v8 ? 1 : 2;  // bytes per V element
  const uint8_t* v_base = static_cast<const uint8_t*>(P.x.v) + g * p.v_stride[2] * v_es;
  auto tile_start = [&](int tile) { return t_begin + int64_t(tile) * kTile; };
  auto tile_len = [&](int tile) { return int(t_end - tile_start(tile) < kTile ? t_end - tile_start(tile) : kTile); };

  // K codes and residuals of tile `tile` into its K buffer
  auto load_k = [&](int tile) {
    uint8_t* codes_s = k_s + (tile % ks) * Sm::kKStage;
    uint8_t* resid_s = codes_s + Sm::kCodes;
    const int64_t t0 = tile_start(tile);
    const int nt = tile_len(tile);
    constexpr int kCg = kD / 32;  // 16-byte granules of a token's codes
    for (int e = tid; e < nt * kCg; e += kThreads) {
      const int t = e / kCg, c = e % kCg;
      cp_async16(codes_s + t * code_pitch<kD>() + 16 * c, kc_base + p.pages.offset(p.kc_stride, b, t0 + t) + 16 * c);
    }
    if constexpr (kRes) {
      constexpr int kRg = kD / 16;
      for (int e = tid; e < nt * kRg; e += kThreads) {
        const int t = e / kRg, c = e % kRg;
        cp_async16(resid_s + t * res_pitch<kD>() + 16 * c, kr_base + p.pages.offset(p.kr_stride, b, t0 + t) + 16 * c);
      }
    }
  };
  // V rows of the kept tokens of tile `tile` into V buffer `buf` (keep flags of that buffer)
  auto load_v = [&](int tile, int buf) {
    const int64_t t0 = tile_start(tile);
    const int nt = tile_len(tile);
    const int* keep = keep_s + buf * kTile;
    const int vg = kDv * v_es / 16;  // 16-byte granules of a token's V row
    for (int e = tid; e < nt * vg; e += kThreads) {
      const int t = e / vg, c = e % vg;
      if (P.prune && !keep[t >> bs_shift]) continue;
      cp_async16(v_s + buf * vbuf + t * kDv * v_es + 16 * c, v_base + p.pages.offset(p.v_stride, b, t0 + t) * v_es + 16 * c);
    }
  };

  // prologue: K of the first tile in flight, then q, the channel scales and the NF4 table
  load_k(0);
  cp_async_commit();
  for (int e = tid; e < nq * kD; e += kThreads)
    q_s[e] = e / kD < nq_real ? decode_bf16(P.x.q[b * p.q_stride[0] + (g * G + q_first + e / kD) * p.q_stride[2] + e % kD])
                              : 0.f;
  for (int c = tid; c < kD; c += kThreads) {
    scale_s[c] = detail::load_float(P.x.k_scale, p.scale_dtype, b * p.ks_stride[0] + g * p.ks_stride[1] + c);
    vscale_s[c] = v8 ? P.x.v_scale[b * p.vs_stride[0] + g * p.vs_stride[1] + c] : 1.f;
  }
  if (tid < 16) lut[tid] = nf4_value(uint8_t(tid));
  if (tid < kMaxHeads) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0.f;
  }
  if (tid == 0) misc[0] = 0;

  float o[kHG][kCV];
#pragma unroll
  for (int h = 0; h < kHG; ++h)
#pragma unroll
    for (int c = 0; c < kCV; ++c) o[h][c] = 0.f;

  // Iteration it scores tile it (K landed), decides its blocks, starts K(it + 1) and V(it), then
  // runs softmax and P @ V of tile it - 1, whose V was started one iteration earlier. K(it + 1) is
  // started before tile it is scored with two K buffers, after it with one. cp.async groups:
  // K0 | per iteration: K(it + 1), V(it) (empty groups keep the count uniform), so the waits are
  // the same for both: K(it) at the top of iteration it has V(it - 1) after it, V(it - 1) before
  // P @ V has K(it + 1) and V(it).
  bool have_thr = false;
  for (int it = 0; it <= n_tiles; ++it) {
    const int cur = it & 1, prv = cur ^ 1;
    if (it < n_tiles) {
      const int nt = tile_len(it);
      const int64_t t0 = tile_start(it);
      if (it == 0)
        cp_async_wait<0>();
      else
        cp_async_wait<1>();  // K(it); V(it - 1) may be in flight
      __syncthreads();
      if (ks == 2) {  // the other K buffer held tile it - 1, scored by every thread before the barrier
        if (it + 1 < n_tiles) load_k(it + 1);
        cp_async_commit();
      }
      const uint8_t* codes_s = k_s + (it % ks) * Sm::kKStage;
      float* Sc = S + cur * nq * kTile;
      for (int h0 = 0; h0 < nq; h0 += kHG)
        score_tile<kD, kHG, kRes>(P, codes_s, codes_s + Sm::kCodes, q_s, scale_s, lut, Sc, h0, min(kHG, nq - h0), nt);
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
      __syncthreads();
      // keep decisions of the tile's pruning blocks (bs divides kTile): a block is skipped when
      // every scored head is below its threshold (the first and last blocks are always kept)
      int* keep = keep_s + cur * kTile;
      if (P.prune) {  // per scored head h: ballots of the tile's blocks below its threshold, row h of allb_s
        const int bsi = int(bs);
        for (int h = warp; h < nq_real; h += kThreads / 32) {
          const float* Sh = Sc + h * kTile;
          const float th = thr_s[h];
          unsigned below = 0;  // bs >= 4: bit = the leader lane (kb * bs / 4) of each block below
          if (bsi >= 4) {
            const float4 s4 = reinterpret_cast<const float4*>(Sh)[lane];
            float m = nan_max(nan_max(s4.x, s4.y), nan_max(s4.z, s4.w));
            for (int off = 1; off < bsi / 4; off <<= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, off));
            below = __ballot_sync(0xffffffffu, m < th && lane % (bsi / 4) == 0);  // bit = leader lane
          } else {
            for (int u = 0; u < 4; u += bsi) {
              float m = Sh[4 * lane + u];
              if (bsi == 2) m = nan_max(m, Sh[4 * lane + u + 1]);
              const unsigned bl = __ballot_sync(0xffffffffu, m < th);
              if (lane == 0) allb_s[h * 8 + u / bsi] = int(bl);  // bit l: block (4 l + u) / bsi
            }
          }
          if (bsi >= 4 && lane == 0) allb_s[h * 8] = int(below);
        }
        __syncthreads();
      }
      if (tid < nbt) {
        const int64_t start = t0 + int64_t(tid) * bs, j = start / bs;  // global block index
        int k = 1;
        if (start >= t_end) {
          k = 0;  // past the sequence: not a block of it
        } else if (P.prune && j > 0 && j + 1 < n_blocks && all_heads_below(allb_s, nq_real, int(bs), tid)) {
          k = 0;
          atomicAdd(misc, 1);
        }
        keep[tid] = k;
      }
      __syncthreads();
      if (ks == 1) {
        if (it + 1 < n_tiles) load_k(it + 1);  // the K buffer is free: every thread has scored
        cp_async_commit();
      }
      load_v(it, cur);
      cp_async_commit();
    } else {
      cp_async_commit();
      cp_async_commit();
    }
    if (it == 0) continue;
    // tile j = it - 1: online softmax (warp w for own head w; P = 0 for padding heads, skipped
    // and absent tokens), then P @ V
    const int j = it - 1, ntj = tile_len(j);
    const int* keep = keep_s + prv * kTile;
    if (warp < kHG) {
      const bool real = warp < n_own;
      const float* Sh = S + prv * nq * kTile + (own_in_q + (real ? warp : 0)) * kTile;
      const float4 sv = reinterpret_cast<const float4*>(Sh)[lane];
      const float sl[4] = {sv.x, sv.y, sv.z, sv.w};
      float s4[4];
      float mt = -INFINITY;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int t = 4 * lane + u;
        const bool kept = t < ntj && (!P.prune || keep[t >> bs_shift]);
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
    cp_async_wait<2>();  // V(j); K(it + 1) and V(it) may be in flight
    __syncthreads();
    // P @ V: warp w over tokens [16 w, 16 w + 16), lane over channels [kCV lane, kCV lane + kCV)
    {
#pragma unroll
      for (int h = 0; h < kHG; ++h) {
        const float a = alpha_s[h];
#pragma unroll
        for (int c = 0; c < kCV; ++c) o[h][c] *= a;
      }
      const uint8_t* vb = v_s + prv * vbuf;
      // one token's V channels [kCV lane, kCV lane + kCV) as floats: bf16 bits, or FP8 codes
      auto pv_tokens = [&](auto load_row) {
#pragma unroll 2
        for (int u = 0; u < 16; ++u) {
          const int t = 16 * warp + u;
          if (t >= ntj || (P.prune && !keep[t >> bs_shift])) continue;
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
          const uint16_t* vr = reinterpret_cast<const uint16_t*>(vb + t * kDv * 2) + kCV * lane;
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
          const uint8_t* vr = vb + t * kDv + kCV * lane;
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
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  // reduce o over the 8 warps (through a V buffer: 8 * kHG * Dv floats <= 128 * Dv bf16)
  float* red = reinterpret_cast<float*>(v_s);
#pragma unroll
  for (int h = 0; h < kHG; ++h)
#pragma unroll
    for (int c = 0; c < kCV; ++c) red[(warp * kHG + h) * kDv + kCV * lane + c] = o[h][c];
  __syncthreads();
  const int n_splits = P.n_splits;
  for (int e = tid; e < n_own * kDv; e += kThreads) {
    const int h = e / kDv, c = e % kDv;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) s += red[(w * kHG + h) * kDv + c];
    P.part[((int64_t(b) * p.heads + g * G + h_own + h) * n_splits + split) * (2 + kDv) + 2 + c] = s * vscale_s[c];
  }
  if (tid < n_own) {
    float* dst = P.part + ((int64_t(b) * p.heads + g * G + h_own + tid) * n_splits + split) * (2 + kDv);
    dst[0] = m_run[tid];
    dst[1] = l_run[tid];
  }
  if (tid == 0 && hc == 0) P.skipped[(int64_t(b) * p.heads_kv + g) * n_splits + split] = misc[0];
}

/// Stage 2: grid (H_q, B), Dv threads.
template <int kDv>
__global__ void __launch_bounds__(256) merge_kernel(const Params P) {
  griddep_wait();
  const DecodeNf4Plan& p = P.p;
  const int64_t b = blockIdx.y, h = blockIdx.x;
  const int64_t L = seq_len(p, P.x, b), n = p.blocks(L);
  const int64_t nc = (L + int64_t(P.split_tiles) * kTile - 1) / (int64_t(P.split_tiles) * kTile);
  const float* part = P.part + (b * p.heads + h) * P.n_splits * (2 + kDv);
  float m_all = -INFINITY;
  for (int64_t c = 0; c < nc; ++c) m_all = nan_max(m_all, part[c * (2 + kDv)]);
  float l = 0.f, o = 0.f;
  const int ch = threadIdx.x;
  for (int64_t c = 0; c < nc; ++c) {
    const float mc = part[c * (2 + kDv)];
    if (mc == -INFINITY) continue;  // no kept token in the split
    const float w = __expf(mc - m_all);
    l = fmaf(w, part[c * (2 + kDv) + 1], l);
    o = fmaf(w, part[c * (2 + kDv) + 2 + ch], o);
  }
  P.x.out[b * p.o_stride[0] + h * p.o_stride[1] + ch] = encode_bf16(o / l);
  const int G = int(p.heads / p.heads_kv);
  if (p.has_skip_ratio && h % G == 0 && threadIdx.x == 0) {
    int sk = 0;
    const int64_t g = h / G;
    for (int64_t c = 0; c < nc; ++c) sk += P.skipped[(b * p.heads_kv + g) * P.n_splits + c];
    P.x.skip_ratio[b * p.sr_stride[0] + g * p.sr_stride[1]] = n > 0 ? float(double(sk) / double(n)) : 0.f;
  }
}

template <int kD, int kHG, bool kRes>
cudaError_t launch(Params P, cudaStream_t st, int device) {
  const DecodeNf4Plan& p = P.p;
  auto kern = split_kernel<kD, kHG, kRes>;
  const size_t smem = Smem<kD, kRes>::bytes(P.qk_heads, p.v_dtype != DType::kBFloat16, P.k_stages);
  if (smem > size_t(kMaxSmem)) return cudaErrorInvalidValue;  // excluded by the dispatch
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, kMaxSmem, device, opted)) return e;  // once, the largest any call needs
  // splits: at most one wave of CTAs at the kernel's occupancy (no partial second wave), whole
  // tiles, at least one tile each
  int occ = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, kThreads, smem)) return e;
  const int64_t slots = int64_t(sm_count(device)) * (occ > 0 ? occ : 1);
  const int64_t tiles = (p.seqlen + kTile - 1) / kTile;
  const int64_t units = p.batch * p.heads_kv * P.head_chunks;
  const int64_t want = slots / units > 1 ? slots / units : 1;  // splits per sequence
  const int64_t per = (tiles + want - 1) / want;
  P.split_tiles = int(per < 1 ? 1 : per);
  P.n_splits = int((tiles + P.split_tiles - 1) / P.split_tiles);
  if (P.n_splits < 1) P.n_splits = 1;
  // workspace: bmax [2 kThrSub, B, H_q], part [B, H_q, n_splits, 2 + Dv], skipped [B, H_kv, n_splits]
  const size_t bmax_b = size_t(2 * kThrSub * p.batch * p.heads) * 4;
  const size_t part_b = size_t(p.batch * p.heads) * size_t(P.n_splits) * (2 + kD) * 4;
  const size_t skip_b = size_t(p.batch * p.heads_kv) * size_t(P.n_splits) * 4;
  cudaMemPool_t pool;
  if (cudaError_t e = workspace_pool(&pool)) return e;
  void* ws = nullptr;
  if (cudaError_t e = cudaMallocFromPoolAsync(&ws, bmax_b + part_b + skip_b, pool, st)) return e;
  P.bmax = static_cast<float*>(ws);
  P.part = reinterpret_cast<float*>(static_cast<char*>(ws) + bmax_b);
  P.skipped = reinterpret_cast<int*>(static_cast<char*>(ws) + bmax_b + part_b);
  P.thr = p.has_threshold ? P.x.threshold : nullptr;
  cudaError_t e = cudaSuccess;
  const dim3 grid(unsigned(P.n_splits), unsigned(p.heads_kv * P.head_chunks), unsigned(p.batch));
  if (P.prune && !p.has_threshold) {
    // the split kernel may start while the threshold kernel runs (it waits before its first
    // decision); its other inputs were written before the threshold kernel started
    threshold_kernel<kD><<<dim3(unsigned(p.heads_kv), unsigned(p.batch), 2 * kThrSub), kThreads, 0, st>>>(P);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = launch_pdl(kern, grid, dim3(kThreads), smem, st, P);
  } else {
    kern<<<grid, kThreads, smem, st>>>(P);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = launch_pdl(merge_kernel<kD>, dim3(unsigned(p.heads), unsigned(p.batch)), dim3(kD), 0, st, P);
  const cudaError_t f = cudaFreeAsync(ws, st);
  return e != cudaSuccess ? e : f;
}

/// Heads per CTA (kHG), head chunks and scored heads of a call.
void head_split(Params& P, int G, int& kHG) {
  kHG = G <= 1 ? 1 : (G <= 4 ? 4 : 8);
  P.head_chunks = (G + kHG - 1) / kHG;
  P.qk_heads = (P.prune && P.head_chunks > 1) ? G : kHG;
}

/// Whether the split kernel's shared memory fits for this call.
/// The split kernel's shared memory for this call with `k_stages` K buffers.
size_t smem_bytes(const DecodeNf4Plan& p, int qk_heads, int k_stages) {
  const bool v8 = p.v_dtype != DType::kBFloat16, r = p.use_residual;
  switch (p.head_dim) {
    case 64: return r ? Smem<64, true>::bytes(qk_heads, v8, k_stages) : Smem<64, false>::bytes(qk_heads, v8, k_stages);
    case 128: return r ? Smem<128, true>::bytes(qk_heads, v8, k_stages) : Smem<128, false>::bytes(qk_heads, v8, k_stages);
    case 256: return r ? Smem<256, true>::bytes(qk_heads, v8, k_stages) : Smem<256, false>::bytes(qk_heads, v8, k_stages);
    default: return ~size_t(0);
  }
}

/// K buffers of this call (decode_heuristics.hpp), 0 when the split kernel does not fit at all.
int k_stages_for(const DecodeNf4Plan& p, int qk_heads) {
  const char* env = std::getenv("LOWBIT_DECODE_K_STAGES");  // development A/B only
  const int forced = env && (env[0] == '1' || env[0] == '2') && env[1] == 0 ? env[0] - '0' : 0;
  return heuristics::decode::pick_k_stages(smem_bytes(p, qk_heads, 1), smem_bytes(p, qk_heads, 2), forced);
}

template <int kD>
cudaError_t launch_d(Params P, int G, cudaStream_t st, int device) {
  int kHG = 8;
  head_split(P, G, kHG);
  auto go = [&](auto hg) -> cudaError_t {
    constexpr int H = decltype(hg)::value;
    return P.p.use_residual ? launch<kD, H, true>(P, st, device) : launch<kD, H, false>(P, st, device);
  };
  if (kHG == 1) return go(std::integral_constant<int, 1>{});
  if (kHG == 4) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, 8>{});
}

bool aligned16(const void* ptr, int64_t stride_bytes) {
  return (reinterpret_cast<uintptr_t>(ptr) % 16 == 0) && (stride_bytes % 16 == 0);
}

}  // namespace decode_fused

int attn_decode_nf4(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                    int64_t workspace_bytes, void* stream) {
  using namespace decode_fused;
  if (plan.batch == 0 || plan.heads == 0) return cudaSuccess;
  if (plan.batch > 65535 || plan.heads > 65535 || plan.seqlen > (int64_t(1) << 36)) return cudaErrorInvalidConfiguration;
  const int G = int(plan.heads / plan.heads_kv);
  const bool prune = plan.has_threshold || std::isfinite(plan.delta);
  // the fused path's conditions (docs/decode_attention.md): otherwise the generic kernels
  bool fused = plan.head_dim == plan.head_dim_v && plan.seqlen > 0;
  fused = fused && aligned16(ptrs.k_nf4, plan.kc_stride[0]) && aligned16(ptrs.k_nf4, plan.kc_stride[1]) &&
          aligned16(ptrs.k_nf4, plan.kc_stride[2]);
  if (plan.use_residual)
    fused = fused && aligned16(ptrs.k_residual, plan.kr_stride[0]) && aligned16(ptrs.k_residual, plan.kr_stride[1]) &&
            aligned16(ptrs.k_residual, plan.kr_stride[2]);
  const int v_es = plan.v_dtype == DType::kBFloat16 ? 2 : 1;
  fused = fused && aligned16(ptrs.v, v_es * plan.v_stride[0]) && aligned16(ptrs.v, v_es * plan.v_stride[1]) &&
          aligned16(ptrs.v, v_es * plan.v_stride[2]);
  if (prune) fused = fused && plan.block_size <= kTile && kTile % plan.block_size == 0 && G <= 64;
  if (plan.heads_kv > 65535 / ((G + 7) / 8)) fused = false;
  Params P{};
  P.p = plan;
  P.x = ptrs;
  P.prune = prune;
  int kHG = 8;
  head_split(P, G, kHG);
  P.k_stages = fused ? k_stages_for(plan, P.qk_heads) : 0;
  if (P.k_stages == 0) return attn_decode_nf4_generic(plan, ptrs, workspace, workspace_bytes, stream);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (plan.head_dim) {
    case 64: return launch_d<64>(P, G, st, device);
    case 128: return launch_d<128>(P, G, st, device);
    case 256: return launch_d<256>(P, G, st, device);
    default: return attn_decode_nf4_generic(plan, ptrs, workspace, workspace_bytes, stream);
  }
}

}  // namespace lowbit::cuda
