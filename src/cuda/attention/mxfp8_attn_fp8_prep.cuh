// src/cuda/attention/mxfp8_attn_fp8_prep.cuh: the operand pre-pass of the FP8 tensor-core path of
// the MXFP8 attention forward (precision kFp8). Two kernels before the attention kernel, once per
// call, write what every query-row block of a (sequence, KV head) reads:
//   1. refs:    the head's largest finite K and V scale of every 32-channel block, Ak[b] and Av[b]
//               (-1 where a block has none, read as 127: prep_ref), int32 [batch][heads_kv][16] (Ak
//               at 0.., Av at 8..), by atomicMax over chunks of kRefTokens tokens;
//   2. convert: per key tile of kBlockN tokens
//                 K'[j, c]   = e4m3(k code * 2^(k_scale[j, b] - Ak[b]))                row-major
//                 V'^T[c, k] = e4m3(v code[key(k), c] * 2^(v_scale[key(k), b] - Av[b]))  transposed
//               (b = c / 32; key(k): the token order of mxfp8_attn_fp8_convert.cuh), tokens past
//               the sequence written as zeros up to the end of its last tile.
// The attention kernel's producer then only issues TMA loads of K' and V'^T (swizzled boxes: the
// shared-memory images are the wgmma operands as they are). Each tile is converted once per
// (sequence, KV head) instead of once per (query-row block, query head), and no thread of the
// attention kernel waits on a conversion.
//
// Workspace layout (prep_token_offset): sequence b's tokens start at row
//   off_b = round_up(k_start_b, 16) + b (kBlockN + 16)
// of K' [heads_kv][W][d] and V'^T [heads_kv][d][W] (W a multiple of 16, prep_width), so that every
// sequence has room for its zero-padded last tile and V'^T's tiles start 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/mxfp8_attn_fp8_convert.cuh"
#include "cuda/attention/mxfp8_attn_fp8_traits.cuh"
#include "cuda/attention/mxfp8_attn_params.cuh"
#include "cuda/attention/mxfp8_attn_schedule.cuh"

namespace lowbit::cuda::attention::fp8 {

/// What the two pre-pass kernels read and write.
struct PrepParams {
  const uint8_t* k = nullptr;  ///< e4m3 codes; byte strides {batch, token, head}, channels contiguous
  const uint8_t* v = nullptr;
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  const uint8_t* k_scale = nullptr;  ///< UE8M0 bytes; byte strides {batch, head, token}
  const uint8_t* v_scale = nullptr;
  int64_t ks_stride[3] = {0, 0, 0};
  int64_t vs_stride[3] = {0, 0, 0};
  const int32_t* cu_seqlens_k = nullptr;  ///< varlen only
  int seqlen_k = 0;                       ///< fixed length (varlen: unused)
  int varlen = 0;
  int64_t width = 0;         ///< W: tokens per (head) row of the workspace, a multiple of 16
  int32_t* refs = nullptr;   ///< [batch][heads_kv][16]
  uint8_t* kp = nullptr;     ///< K'  [heads_kv][W][d]
  uint8_t* vt = nullptr;     ///< V'^T [heads_kv][d][W]
};

constexpr int kPrepThreads = 128;

/// First workspace row of sequence b (k_start_b: its first token in the packed k of a varlen call,
/// b * seqlen_k otherwise).
__host__ __device__ __forceinline__ int64_t prep_token_offset(int64_t k_start_b, int b, int block_n) {
  return (k_start_b + 15) / 16 * 16 + int64_t(b) * (block_n + 16);
}
/// W for `batch` sequences of `total_k` tokens in all (fixed length: batch * seqlen_k).
__host__ __device__ __forceinline__ int64_t prep_width(int64_t total_k, int64_t batch, int block_n) {
  return (total_k + batch * (block_n + 16) + 15) / 16 * 16;
}

__device__ __forceinline__ SeqBounds prep_bounds(const int32_t* cu, int varlen, int seqlen_k, int b) {
  SeqBounds s;
  if (varlen) {
    s.k_start = cu[b];
    s.len_k = cu[b + 1] - s.k_start;
  } else {
    s.len_k = seqlen_k;
  }
  return s;
}

constexpr int kRefTokens = 1024;  ///< tokens per CTA of the refs kernel (8 per thread)

/// Grid (token chunks of kRefTokens, heads_kv, batch), after refs was filled with -1 (bytes 0xFF):
/// each CTA raises Ak[b] and Av[b] of its (sequence, KV head) to the largest finite scale of its
/// tokens (atomicMax). A block that keeps -1 has no finite scale: its reference is 127
/// (prep_ref()).
template <int kBlocks>
__global__ void __launch_bounds__(kPrepThreads) attn_fp8_prep_refs_kernel(const PrepParams p) {
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const SeqBounds s = prep_bounds(p.cu_seqlens_k, p.varlen, p.seqlen_k, b);
  const int t0 = chunk * kRefTokens;
  if (t0 >= s.len_k) return;
  const uint8_t* ks = p.k_scale + b * p.ks_stride[0] + hk * p.ks_stride[1];
  const uint8_t* vs = p.v_scale + b * p.vs_stride[0] + hk * p.vs_stride[1];
  int mk[kBlocks], mv[kBlocks];
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) mk[i] = mv[i] = -1;
#pragma unroll
  for (int r = 0; r < kRefTokens / kPrepThreads; ++r) {
    const int t = t0 + r * kPrepThreads + tid;
    if (t >= s.len_k) break;
    const int64_t tok = s.k_start + t;
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      const int kb = ks[tok * p.ks_stride[2] + i], vb = vs[tok * p.vs_stride[2] + i];
      if (kb != 255) mk[i] = max(mk[i], kb);
      if (vb != 255) mv[i] = max(mv[i], vb);
    }
  }
  __shared__ int red[kPrepThreads / 32][16];
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mk[i] = max(mk[i], __shfl_xor_sync(0xffffffffu, mk[i], o));
      mv[i] = max(mv[i], __shfl_xor_sync(0xffffffffu, mv[i], o));
    }
    if (lane == 0) {
      red[warp][i] = mk[i];
      red[warp][8 + i] = mv[i];
    }
  }
  __syncthreads();
  if (tid < 16 && tid % 8 < kBlocks) {
    int m = -1;
#pragma unroll
    for (int w = 0; w < kPrepThreads / 32; ++w) m = max(m, red[w][tid]);
    if (m >= 0) atomicMax(p.refs + (int64_t(b) * gridDim.y + hk) * 16 + tid, m);
  }
}

/// A reference as the refs kernel left it: 127 for a block with no finite scale.
__device__ __forceinline__ int prep_ref(int r) { return r < 0 ? 127 : r; }

/// The V transpose unit of a pre-pass thread: 8 logical k (kc) by kVC channels (group cg) of a
/// key tile, read from the tile's raw V rows staged in shared memory in the swizzled layout
/// sw_offset<kWQK> (the layout TMA writes), 16-byte chunk reads spread over the banks.
/// NOTE: cg rotates with kc so that a warp's raw-V reads spread over the banks.
template <class T>
struct VUnit {
  int kc, cg;
  uint32_t rd_base[4];  ///< raw V: slot e reads rd_base[rd_sel(e)] + rd_step(e)
  uint32_t wr_base;     ///< V'^T (shared-memory image): channel j of the unit at wr_base + wr_off(j) ^ ...
  int wr_x;             ///< (kc / 2), XORed with the compile-time swizzle of row j
  __host__ __device__ explicit VUnit(int tid) {
    constexpr int kNKC = T::kBlockN / 8, kNCG = T::kD / T::kVC, kW = T::kWQK;
    static_assert(128 / kNKC == kNCG, "units of a thread block cover every (kc, cg) once");
    const int lane = tid % 32, warp = tid / 32;
    kc = lane % kNKC;
    const int r = lane / kNKC + (32 / kNKC) * warp;
    cg = (r + (kc >> 1)) % kNCG;
    // raw V (rows = tokens, kW-byte swizzle atoms): slot e's token is base_tok + off(e), and its
    // swizzle bits are those of base_tok OR those of off(e) (no carry: see unit_token)
    const int base_tok = unit_token(kc, 0), col = cg * T::kVC;
    const int atom = col / kW, chunk = (col % kW) >> 4, sub = col & 15;
    const int swb = kW == 128 ? (base_tok & 7) : ((base_tok >> 1) & 3);
#pragma unroll
    for (int c = 0; c < 4; ++c)
      rd_base[c] = uint32_t(atom * T::kBlockN * kW + base_tok * kW + (((chunk ^ swb) ^ c) << 4) + sub);
    wr_base = uint32_t(cg * T::kVC * T::kWV + 8 * (kc & 1));
    wr_x = kc >> 1;
  }
  /// Slot e: token offset from base_tok and the low swizzle bits it adds.
  static constexpr int off(int e) { return 2 * (e >> 2) + (e & 1) + 8 * ((e >> 1) & 1); }
  static constexpr int rd_sel(int e) { return T::kWQK == 128 ? (off(e) & 7) : ((off(e) >> 1) & 3); }
  __host__ __device__ uint32_t rd(int e) const { return rd_base[rd_sel(e)] + uint32_t(off(e) * T::kWQK); }
  /// Where TMA puts V'^T row cg * kVC + j (j < kVC), byte 8 kc, of a tile in shared memory (rows
  /// of kWV-byte swizzle atoms): the consumers' operand layout.
  __host__ __device__ uint32_t wr(int j) const {
    constexpr int kW = T::kWV;
    const int sw = kW == 128 ? (j & 7) : ((j >> 1) & 3);  // cg * kVC is a multiple of 8
    return wr_base + uint32_t(j * kW) + uint32_t((wr_x ^ sw) << 4);
  }
};

/// Grid (key tiles of the longest sequence, heads_kv, batch): K' and V'^T of one key tile.
template <class T>
__global__ void __launch_bounds__(kPrepThreads) attn_fp8_prep_kv_kernel(const PrepParams p) {
  constexpr int kBlockN = T::kBlockN, kD = T::kD, kVC = T::kVC, kChunks = kD / 16;
  const int t = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const SeqBounds s = prep_bounds(p.cu_seqlens_k, p.varlen, p.seqlen_k, b);
  if (t * kBlockN >= s.len_k) return;
  const int valid = min(kBlockN, s.len_k - t * kBlockN);
  const int64_t k_abs = p.varlen ? int64_t(s.k_start) : int64_t(b) * p.seqlen_k;
  const int64_t row0 = prep_token_offset(k_abs, b, kBlockN) + int64_t(t) * kBlockN;  // workspace row of key 0
  const int64_t tok0 = s.k_start + int64_t(t) * kBlockN;  // token of key 0 in k / v (batch b)
  const int bb = p.varlen ? 0 : b;
  const int* ref = p.refs + (int64_t(b) * gridDim.y + hk) * 16;
  const uint8_t* kg = p.k + bb * p.k_stride[0] + hk * p.k_stride[2];
  const uint8_t* vg = p.v + bb * p.v_stride[0] + hk * p.v_stride[2];
  const uint8_t* ks = p.k_scale + b * p.ks_stride[0] + hk * p.ks_stride[1];
  const uint8_t* vs = p.v_scale + b * p.vs_stride[0] + hk * p.vs_stride[1];

  __shared__ __align__(1024) uint8_t raw_v[kBlockN * kD];  // raw V codes, sw_offset<kWQK> layout
  __shared__ uint16_t vfac[kBlockN][T::kBlocks];          // f16 factors 2^(v_scale - Av)
  __shared__ int refs[16];
  if (tid < 16) refs[tid] = prep_ref(ref[tid]);
  __syncthreads();

  // K' (row-major, coalesced 16-byte chunks) and the raw V rows into shared memory.
  // All of the thread's loads first (kIters 16-byte chunks of K and of V), then the stores.
  constexpr int kIters = kBlockN * kChunks / kPrepThreads;
  static_assert(kBlockN * kChunks % kPrepThreads == 0, "whole chunks per thread");
  uint8_t* kp = p.kp + (int64_t(hk) * p.width + row0) * kD;
  uint4 w[kIters], x[kIters];
  int ksc[kIters];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = tid + i * kPrepThreads, j = c / kChunks, ch = c % kChunks;
    w[i] = x[i] = make_uint4(0, 0, 0, 0);
    ksc[i] = 0;
    if (j < valid) {
      const int64_t tok = tok0 + j;
      w[i] = *reinterpret_cast<const uint4*>(kg + tok * p.k_stride[1] + ch * 16);
      x[i] = *reinterpret_cast<const uint4*>(vg + tok * p.v_stride[1] + ch * 16);
      ksc[i] = ks[tok * p.ks_stride[2] + ch / 2];
    }
  }
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = tid + i * kPrepThreads, j = c / kChunks, ch = c % kChunks;
    if (j < valid) {
      const uint32_t f = f16_factor(ksc[i], refs[ch / 2]) * 0x10001u;
      w[i].x = rescale_e4m3x4(w[i].x, f);
      w[i].y = rescale_e4m3x4(w[i].y, f);
      w[i].z = rescale_e4m3x4(w[i].z, f);
      w[i].w = rescale_e4m3x4(w[i].w, f);
    }
    *reinterpret_cast<uint4*>(kp + int64_t(j) * kD + ch * 16) = w[i];
    *reinterpret_cast<uint4*>(raw_v + sw_offset<T::kWQK>(kBlockN, j, ch * 16)) = x[i];
  }
  for (int i = tid; i < kBlockN * T::kBlocks; i += kPrepThreads) {
    const int j = i / T::kBlocks, blk = i % T::kBlocks;
    vfac[j][blk] = j < valid ? uint16_t(f16_factor(vs[(tok0 + j) * p.vs_stride[2] + blk], refs[8 + blk])) : 0;
  }
  __syncthreads();

  // V'^T: the unit's 8 tokens, re-rounded and transposed, 4 channels at a time, 8 bytes per row.
  const VUnit<T> vu(tid);
  const int vblk = vu.cg * kVC / 32;
  uint32_t raw[8][kVC / 4], fp[4];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint8_t* src = raw_v + vu.rd(e);
    if constexpr (kVC == 16) {
      const uint4 w = *reinterpret_cast<const uint4*>(src);
      raw[e][0] = w.x;
      raw[e][1] = w.y;
      raw[e][2] = w.z;
      raw[e][3] = w.w;
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(src);
      raw[e][0] = w.x;
      raw[e][1] = w.y;
    }
  }
#pragma unroll
  for (int E = 0; E < 4; ++E)
    fp[E] = uint32_t(vfac[unit_token(vu.kc, 2 * E)][vblk]) | (uint32_t(vfac[unit_token(vu.kc, 2 * E + 1)][vblk]) << 16);
  uint8_t* vt = p.vt + int64_t(hk) * kD * p.width + row0 + 8 * vu.kc;
#pragma unroll
  for (int q = 0; q < kVC / 4; ++q) {
    uint32_t out[4][2];
    transpose_group<kVC / 4>(raw, q, fp, out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = vu.cg * kVC + 4 * q + i;
      *reinterpret_cast<uint2*>(vt + int64_t(c) * p.width) = make_uint2(out[i][0], out[i][1]);
    }
  }
}

}  // namespace lowbit::cuda::attention::fp8
