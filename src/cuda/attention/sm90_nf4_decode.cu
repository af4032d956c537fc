// src/cuda/attention/sm90_nf4_decode.cu: the generic kernels of the decode attention over an NF4 +
// FP8-residual K cache with block pruning (lowbit/decode_attention.hpp), for the calls the fused
// path (sm90_nf4_decode_fused.cu) does not take (nf4_decode_generic.hpp lists them); the CPU
// reference's two stages in three kernels:
//   1. scores: s[b, h, t] = softmax_scale * q[b, h] . k[b, t, g]  (k decoded as nf4 * scale +
//      residual, the kcache.hpp rule), written to scratch; one warp per token, each lane 1..2
//      groups of 4 channels, one KV head's G query heads served by one read of K.
//   2. blocks: a CTA per (chunk of pruning blocks, KV head, sequence): the thresholds from the
//      first and last blocks' maxima (or the given ones), the keep decision of each block of the
//      chunk (skipped when every head of the group is below its threshold; the first and last
//      blocks always kept), and the chunk's (m, l, o) over its kept blocks (V read only there).
//   3. merge: a CTA per (query head, sequence): log-sum-exp merge of the chunks, out in bf16; the
//      skip ratio per (sequence, KV head).
// Scores, maxima and sums in fp32 (the reference accumulates in fp64). Sequence lengths are read
// on the device and clamped to [0, T].
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/attention/nf4_decode_generic.hpp"
#include "cuda/common/workspace.cuh"
#include "lowbit/kcache.hpp"

namespace lowbit::cuda {
namespace decode {

using detail::DecodeNf4Plan;
using detail::DecodeNf4Ptrs;

constexpr int kMaxGroup = 16;       ///< query heads per KV head served by one pass (larger groups: several)
constexpr int kChunkTokens = 512;   ///< tokens per stage-2 CTA (rounded to whole pruning blocks)

struct Params {
  DecodeNf4Plan p;
  DecodeNf4Ptrs x;
  float* scores;    ///< [B, H_q, T]
  float* part;      ///< [B, H_q, n_chunks, 2 + Dv]: m, l, o
  int* skipped;     ///< [B, H_kv, n_chunks]
  int64_t n_chunks;
  int64_t chunk_blocks;
};

__device__ __forceinline__ int64_t seq_len(const Params& P, int64_t b) {
  if (!P.p.has_seq_lens) return P.p.seqlen;
  const int64_t L = P.x.seq_lens[b];
  return L < 0 ? 0 : (L > P.p.seqlen ? P.p.seqlen : L);
}

__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7FC00000) : fmaxf(a, b);
}

/// Stage 1: grid (ceil(T / 32), H_kv, B), 1024 threads: warp w takes token 32 * blockIdx.x + w.
template <int kD>
__global__ void __launch_bounds__(1024) scores_kernel(const Params P) {
  const DecodeNf4Plan& p = P.p;
  const int64_t b = blockIdx.z, g = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * 32 + warp;
  const int64_t L = seq_len(P, b);
  if (t >= L) return;
  const int G = int(p.heads / p.heads_kv);
  constexpr int kPer = kD / 32;  // channels per lane (2, 4 or 8), contiguous
  const int c0 = lane * kPer;
  float k[kPer];
  {
    const uint8_t* codes = P.x.k_nf4 + p.pages.offset(p.kc_stride, b, t) + g * p.kc_stride[2];
    const int64_t s0 = b * p.ks_stride[0] + g * p.ks_stride[1];
    const int64_t r0 = p.pages.offset(p.kr_stride, b, t) + g * p.kr_stride[2];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = c0 + i;
      const uint8_t code = unpack_nibble(p.nibbles, codes[c / 2], c & 1);
      float v = kcache_decode(code, detail::load_float(P.x.k_scale, p.scale_dtype, s0 + c));
      if (p.use_residual) v = kcache_add_residual(v, detail::load_float(P.x.k_residual, p.residual_dtype, r0 + c));
      k[i] = v;
    }
  }
  for (int i = 0; i < G; ++i) {
    const int64_t h = g * G + i;
    const uint16_t* q = P.x.q + b * p.q_stride[0] + h * p.q_stride[2] + c0;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc = fmaf(decode_bf16(q[j]), k[j], acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) P.scores[(b * p.heads + h) * p.seqlen + t] = p.softmax_scale * acc;
  }
}

/// Block maximum of head h over tokens [t0, t1) (NaN-propagating), by the whole CTA.
__device__ float block_max(const float* s, int64_t t0, int64_t t1, float* red) {
  float m = -INFINITY;
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) m = nan_max(m, s[t]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < int(blockDim.x / 32); ++w) r = nan_max(r, red[w]);
  __syncthreads();
  return r;
}

/// The pruning threshold of query head h: the given one, else max(first block, last block) - delta
/// (NaN when either maximum is NaN: nothing compares below it). By the whole CTA.
__device__ float head_threshold(const Params& P, const float* s, int64_t b, int64_t h, int64_t L, int64_t n,
                                float* red) {
  if (P.p.has_threshold) return P.x.threshold[b * P.p.heads + h];
  if (n == 0) return 0.f;
  const int64_t bs = P.p.block_size;
  const float mf = block_max(s, 0, min(bs, L), red), ml = block_max(s, (n - 1) * bs, L, red);
  return nan_max(mf, ml) - P.p.delta;
}

/// Stage 2: grid (n_chunks, H_kv, B), 256 threads.
template <int kDv>
__global__ void __launch_bounds__(256) blocks_kernel(const Params P) {
  const DecodeNf4Plan& p = P.p;
  const int64_t b = blockIdx.z, g = blockIdx.y, chunk = blockIdx.x;
  const int G = int(p.heads / p.heads_kv);
  const int64_t L = seq_len(P, b), bs = p.block_size, n = (L + bs - 1) / bs;
  const int64_t j0 = chunk * P.chunk_blocks, j1 = min(n, j0 + P.chunk_blocks);
  __shared__ float red[8];
  __shared__ float thr[kMaxGroup];
  __shared__ float pw[kMaxGroup][64];  // P weights of one 64-token slice of a block
  constexpr int kCh = (kDv + 255) / 256;  // channels per thread (1)
  static_assert(kDv <= 256, "Dv");
  for (int i0 = 0; i0 < G; i0 += kMaxGroup) {
    const int gi = min(kMaxGroup, G - i0);
    // thresholds and the chunk's maximum over kept blocks
    for (int i = 0; i < gi; ++i) {
      const int64_t h = g * G + i0 + i;
      const float t_i = head_threshold(P, P.scores + (b * p.heads + h) * p.seqlen, b, h, L, n, red);
      if (threadIdx.x == 0) thr[i] = t_i;
    }
    __syncthreads();
    float o[kMaxGroup][kCh];
    float l[kMaxGroup], m[kMaxGroup];
#pragma unroll
    for (int i = 0; i < kMaxGroup; ++i) {
      l[i] = 0.f;
      m[i] = -INFINITY;
#pragma unroll
      for (int c = 0; c < kCh; ++c) o[i][c] = 0.f;
    }
    int skipped = 0;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t t0 = j * bs, t1 = min(L, t0 + bs);
      // keep decision, shared by the whole group: skipped when every head of the group is below
      // its threshold (the first and last blocks are always kept)
      bool all_below = j > 0 && j + 1 < n;
      for (int i = 0; i < G && all_below; ++i) {
        const int64_t h = g * G + i;
        const float* s = P.scores + (b * p.heads + h) * p.seqlen;
        const float ti = (i >= i0 && i < i0 + gi) ? thr[i - i0] : head_threshold(P, s, b, h, L, n, red);
        all_below = block_max(s, t0, t1, red) < ti;
      }
      if (all_below) {
        ++skipped;
        continue;
      }
      float mj[kMaxGroup];
      for (int i = 0; i < gi; ++i) mj[i] = block_max(P.scores + (b * p.heads + g * G + i0 + i) * p.seqlen, t0, t1, red);
      // online softmax over the block's tokens, 64 at a time
      for (int i = 0; i < gi; ++i) {
        const float mn = nan_max(m[i], mj[i]);
        const float a = (m[i] == -INFINITY) ? 0.f : __expf(m[i] - mn);
        l[i] *= a;
#pragma unroll
        for (int c = 0; c < kCh; ++c) o[i][c] *= a;
        m[i] = mn;
      }
      for (int64_t u0 = t0; u0 < t1; u0 += 64) {
        const int64_t u1 = min(t1, u0 + 64);
        __syncthreads();
        for (int e = threadIdx.x; e < gi * 64; e += blockDim.x) {
          const int i = e / 64, tt = e % 64;
          float w = 0.f;
          if (u0 + tt < u1) {
            float sv = P.scores[(b * p.heads + g * G + i0 + i) * p.seqlen + u0 + tt];
            if (!isfinite(sv)) sv = __int_as_float(0x7FC00000);  // the reference's non-finite rule
            w = __expf(sv - m[i]);
          }
          pw[i][tt] = w;
        }
        __syncthreads();
        for (int i = 0; i < gi; ++i)
          for (int tt = 0; tt < int(u1 - u0); ++tt) l[i] += pw[i][tt];
#pragma unroll
        for (int c = 0; c < kCh; ++c) {
          const int ch = threadIdx.x + 256 * c;
          if (ch >= kDv) continue;
          for (int tt = 0; tt < int(u1 - u0); ++tt) {
            // bf16, or the FP8 code (its channel scale multiplies the partial o below)
            const float v =
                detail::load_float(P.x.v, p.v_dtype, p.pages.offset(p.v_stride, b, u0 + tt) + g * p.v_stride[2] + ch);
            for (int i = 0; i < gi; ++i) o[i][c] = fmaf(pw[i][tt], v, o[i][c]);
          }
        }
      }
    }
    // the chunk's partials
    for (int i = 0; i < gi; ++i) {
      const int64_t h = g * G + i0 + i;
      float* dst = P.part + ((b * p.heads + h) * P.n_chunks + chunk) * (2 + kDv);
      if (threadIdx.x == 0) {
        dst[0] = m[i];
        dst[1] = l[i];
      }
#pragma unroll
      for (int c = 0; c < kCh; ++c) {
        const int ch = threadIdx.x + 256 * c;
        if (ch < kDv)
          dst[2 + ch] = P.x.v_scale ? o[i][c] * P.x.v_scale[b * p.vs_stride[0] + g * p.vs_stride[1] + ch] : o[i][c];
      }
    }
    if (i0 == 0 && threadIdx.x == 0) P.skipped[(b * p.heads_kv + g) * P.n_chunks + chunk] = skipped;
    __syncthreads();
  }
}

/// Stage 3: grid (H_q, B), kDv threads.
template <int kDv>
__global__ void __launch_bounds__(256) merge_kernel(const Params P) {
  const DecodeNf4Plan& p = P.p;
  const int64_t b = blockIdx.y, h = blockIdx.x;
  const int64_t L = seq_len(P, b), bs = p.block_size, n = (L + bs - 1) / bs;
  const int64_t nc = (n + P.chunk_blocks - 1) / P.chunk_blocks;
  const float* part = P.part + (b * p.heads + h) * P.n_chunks * (2 + kDv);
  float m_all = -INFINITY;
  for (int64_t c = 0; c < nc; ++c) m_all = nan_max(m_all, part[c * (2 + kDv)]);
  float l = 0.f, o = 0.f;
  const int ch = threadIdx.x;
  for (int64_t c = 0; c < nc; ++c) {
    const float mc = part[c * (2 + kDv)];
    if (mc == -INFINITY) continue;  // no kept token in the chunk
    const float w = __expf(mc - m_all);
    l = fmaf(w, part[c * (2 + kDv) + 1], l);
    if (ch < kDv) o = fmaf(w, part[c * (2 + kDv) + 2 + ch], o);
  }
  if (ch < kDv) {
    const float r = o / l;
    P.x.out[b * p.o_stride[0] + h * p.o_stride[1] + ch] = encode_bf16(r);
  }
  const int G = int(p.heads / p.heads_kv);
  if (p.has_skip_ratio && h % G == 0 && threadIdx.x == 0) {
    int sk = 0;
    const int64_t g = h / G;
    for (int64_t c = 0; c < nc; ++c) sk += P.skipped[(b * p.heads_kv + g) * P.n_chunks + c];
    P.x.skip_ratio[b * p.sr_stride[0] + g * p.sr_stride[1]] = n > 0 ? float(double(sk) / double(n)) : 0.f;
  }
}

template <int kD, int kDv>
cudaError_t launch(const Params& P, cudaStream_t st) {
  const DecodeNf4Plan& p = P.p;
  scores_kernel<kD><<<dim3(unsigned((p.seqlen + 31) / 32), unsigned(p.heads_kv), unsigned(p.batch)), 1024, 0, st>>>(P);
  if (cudaError_t e = cudaGetLastError()) return e;
  blocks_kernel<kDv><<<dim3(unsigned(P.n_chunks), unsigned(p.heads_kv), unsigned(p.batch)), 256, 0, st>>>(P);
  if (cudaError_t e = cudaGetLastError()) return e;
  merge_kernel<kDv><<<dim3(unsigned(p.heads), unsigned(p.batch)), 256, 0, st>>>(P);
  return cudaGetLastError();
}

template <int kD>
cudaError_t launch_dv(const Params& P, cudaStream_t st) {
  switch (P.p.head_dim_v) {
    case 64: return launch<kD, 64>(P, st);
    case 128: return launch<kD, 128>(P, st);
    case 256: return launch<kD, 256>(P, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace decode

int attn_decode_nf4_generic(const detail::DecodeNf4Plan& plan, const detail::DecodeNf4Ptrs& ptrs, void* workspace,
                            int64_t workspace_bytes, void* stream) {
  using namespace decode;
  if (plan.batch == 0 || plan.heads == 0) return cudaSuccess;
  if (plan.batch > 65535 || plan.heads > 65535 || plan.seqlen > (int64_t(1) << 36)) return cudaErrorInvalidConfiguration;
  const auto st = static_cast<cudaStream_t>(stream);
  Params P;
  P.p = plan;
  P.x = ptrs;
  const int64_t n_blocks = plan.blocks(plan.seqlen);
  P.chunk_blocks = plan.block_size >= kChunkTokens ? 1 : kChunkTokens / plan.block_size;
  P.n_chunks = n_blocks == 0 ? 1 : (n_blocks + P.chunk_blocks - 1) / P.chunk_blocks;
  const size_t scores_bytes = size_t(plan.batch * plan.heads * plan.seqlen) * 4;
  const size_t part_bytes = size_t(plan.batch * plan.heads * P.n_chunks * (2 + plan.head_dim_v)) * 4;
  const size_t skipped_bytes = size_t(plan.batch * plan.heads_kv * P.n_chunks) * 4;
  const size_t need = scores_bytes + part_bytes + skipped_bytes;
  void* ws = workspace;
  bool own = false;
  if (!ws || workspace_bytes < int64_t(need)) {
    cudaMemPool_t pool;
    if (cudaError_t e = workspace_pool(&pool)) return e;
    if (cudaError_t e = cudaMallocFromPoolAsync(&ws, need, pool, st)) return e;
    own = true;
  }
  P.scores = static_cast<float*>(ws);
  P.part = reinterpret_cast<float*>(static_cast<char*>(ws) + scores_bytes);
  P.skipped = reinterpret_cast<int*>(static_cast<char*>(ws) + scores_bytes + part_bytes);
  cudaError_t e = cudaErrorInvalidValue;
  switch (plan.head_dim) {
    case 64: e = launch_dv<64>(P, st); break;
    case 128: e = launch_dv<128>(P, st); break;
    case 256: e = launch_dv<256>(P, st); break;
    default: break;
  }
  if (own) {
    const cudaError_t f = cudaFreeAsync(ws, st);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

}  // namespace lowbit::cuda
