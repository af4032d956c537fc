// src/cuda/attention/mxfp8_attn_producer.cuh: the producer warpgroup of the MXFP8 attention
// kernel. Per key tile: TMA loads of the raw K and V codes (2-stage ring), then all 128 threads
// convert them into the bf16 MMA operands of the consumers (2-stage ring):
//   K' = bf16(k code * 2^(k_scale - ok)),  V' = bf16(v code * 2^(v_scale - ov))
// exact (E4M3 x 2^e is a bf16 value; ok / ov = the head's largest finite K / V scale, so a scale
// more than 246 binades below it would be flushed to zero).
#pragma once

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/mxfp8_attn_convert.cuh"
#include "cuda/attention/mxfp8_attn_schedule.cuh"

namespace lowbit::cuda::attention {

/// Shared-memory regions of one CTA.
template <class T>
struct AttnSmem {
  uint8_t* base;
  __device__ explicit AttnSmem(uint8_t* b) : base(b) {}
  __device__ uint8_t* q(int wg) const { return base + T::kOffQ + wg * (T::kQBytes / 2); }
  __device__ uint8_t* k(int st) const { return base + T::kOffK + st * T::kKBytes; }
  __device__ uint8_t* v(int st) const { return base + T::kOffV + st * T::kVBytes; }
  __device__ uint8_t* raw_k(int st) const { return base + T::kOffRawK + st * T::kRawBytes; }
  __device__ uint8_t* raw_v(int st) const { return base + T::kOffRawV + st * T::kRawBytes; }
  __device__ float* rf() const { return reinterpret_cast<float*>(base + T::kOffRf); }
  /// misc[0] = ok, misc[1] = ov, misc[16 ...] = scan scratch
  __device__ int* misc() const { return reinterpret_cast<int*>(base + T::kOffMisc); }
  __device__ uint64_t* bar(int i) const { return reinterpret_cast<uint64_t*>(base + T::kOffBar) + i; }
  __device__ uint64_t* raw_full(int st) const { return bar(st); }
  // K' and V' have their own rings: K'(t) returns to the producer as soon as S(t) is computed,
  // V'(t) after the PV product of tile t.
  __device__ uint64_t* k_full(int st) const { return bar(T::kStages + st); }
  __device__ uint64_t* k_empty(int st) const { return bar(2 * T::kStages + st); }
  __device__ uint64_t* v_full(int st) const { return bar(3 * T::kStages + st); }
  __device__ uint64_t* v_empty(int st) const { return bar(4 * T::kStages + st); }
};

constexpr int kProducerBarrier = 1;  ///< named barrier of the producer warpgroup

/// Every K and V scale byte of the head that producer thread tid reads (tokens tid, tid + 128, ...):
/// f(i, kb, vb) with kb / vb the bytes of scale block i of a token.
template <int kBlocks, class F>
__device__ __forceinline__ void for_each_kv_scale(const AttnParams& p, const SeqBounds& s, int b, int hk, int tid,
                                                  F&& f) {
  const uint8_t* ks = p.k_scale + b * p.ks_stride[0] + hk * p.ks_stride[1];
  const uint8_t* vs = p.v_scale + b * p.vs_stride[0] + hk * p.vs_stride[1];
  for (int t = tid; t < s.len_k; t += 128) {
    const int64_t tok = s.k_start + t;
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      const int kb = ks[tok * p.ks_stride[2] + i], vb = vs[tok * p.vs_stride[2] + i];
      f(i, kb, vb);
    }
  }
}

/// The head's largest finite K scale (ok) and V scale (ov); 127 when a head has none. Run by the
/// producer warpgroup; visible to all after the next CTA barrier.
template <class T>
__device__ void scan_kv_scales(const AttnParams& p, const SeqBounds& s, int b, int hk, const AttnSmem<T>& sm) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  int mk = -1, mv = -1;
  for_each_kv_scale<T::kBlocks>(p, s, b, hk, tid, [&](int, int kb, int vb) {
    if (kb != 255) mk = max(mk, kb);
    if (vb != 255) mv = max(mv, vb);
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mk = max(mk, __shfl_xor_sync(0xffffffffu, mk, o));
    mv = max(mv, __shfl_xor_sync(0xffffffffu, mv, o));
  }
  int* scratch = sm.misc() + 16;
  if (lane == 0) {
    scratch[2 * warp] = mk;
    scratch[2 * warp + 1] = mv;
  }
  cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);
  if (tid < 2) {
    int m = -1;
#pragma unroll
    for (int w = 0; w < 4; ++w) m = max(m, scratch[2 * w + tid]);
    sm.misc()[tid] = m < 0 ? 127 : m;
  }
}

template <class T>
__device__ __forceinline__ void issue_kv_tile(const AttnParams& p, const SeqBounds& s, int b, int hk, int t, int st,
                                              const AttnSmem<T>& sm) {
  uint64_t* bar = sm.raw_full(st);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, 2 * T::kRawBytes);
  const int tok = s.k_start + t * T::kBlockN, bb = p.varlen ? 0 : b;
  constexpr uint64_t kHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  cute::SM90_TMA_LOAD_4D::copy(&p.tm_k, bar, kHint, sm.raw_k(st), 0, tok, hk, bb);
  cute::SM90_TMA_LOAD_4D::copy(&p.tm_v, bar, kHint, sm.raw_v(st), 0, tok, hk, bb);
}

/// 16 codes (one chunk of a token's row) -> 16 bf16 = code * 2^(scale - ref) into the swizzled
/// operand; scale 255 -> NaN; NaN codes -> NaN; scale -1 (a key past the sequence) -> zeros.
template <class T>
__device__ __forceinline__ void convert_chunk(const uint8_t* raw, uint8_t* dst, int tok, int c16, int scale, int ref) {
  if (scale < 0) {
    *reinterpret_cast<uint4*>(dst + bf16_sw128_offset(T::kBlockN, tok, c16 * 16)) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + bf16_sw128_offset(T::kBlockN, tok, c16 * 16 + 8)) = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4 w = *reinterpret_cast<const uint4*>(raw + tok * T::kD + c16 * 16);
  const uint32_t f = scale == 255 ? 0x7FC07FC0u : bf16x2_pow2(scale - ref + 120);
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    e4m3x4_to_bf16x4_tiny(ws[j], o[2 * j], o[2 * j + 1]);
    o[2 * j] = bf16x2_mul(o[2 * j], f);
    o[2 * j + 1] = bf16x2_mul(o[2 * j + 1], f);
  }
  if (has_nan_code(w.x) | has_nan_code(w.y) | has_nan_code(w.z) | has_nan_code(w.w)) {
#pragma unroll
    for (int j = 0; j < 4; ++j) patch_nan_codes(ws[j], o[2 * j], o[2 * j + 1]);
  }
  *reinterpret_cast<uint4*>(dst + bf16_sw128_offset(T::kBlockN, tok, c16 * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
  *reinterpret_cast<uint4*>(dst + bf16_sw128_offset(T::kBlockN, tok, c16 * 16 + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
}

/// The producer's work for one row block: n_tiles key tiles; g counts the tiles of earlier row
/// blocks (the ring positions continue across row blocks).
template <class T>
__device__ void produce_row_block(const AttnParams& p, const SeqBounds& s, int b, int hk, int n_tiles, uint32_t g,
                                  const AttnSmem<T>& sm) {
  constexpr int kBlockN = T::kBlockN;
  constexpr int kChunksPerRow = T::kD / 16;
  constexpr int kChunks = kBlockN * kChunksPerRow / 128;  // 16-code chunks of K (and of V) per thread
  const int tid = threadIdx.x % 128;
  const int ok = sm.misc()[0], ov = sm.misc()[1];
  const uint8_t* ks = p.k_scale + b * p.ks_stride[0] + hk * p.ks_stride[1];
  const uint8_t* vs = p.v_scale + b * p.vs_stride[0] + hk * p.vs_stride[1];

  if (tid == 0) {
    for (int t = 0; t < min(n_tiles, T::kStages); ++t) issue_kv_tile<T>(p, s, b, hk, t, (g + t) % T::kStages, sm);
  }
  // Scale bytes of a tile, two 16-bit entries per register (-1: a key past the sequence, zeros:
  // its score is masked and its P is 0; a NaN there, read from the next packed sequence, must not
  // reach the product). Loaded one tile ahead so that their latency overlaps the conversion.
  auto load_scales = [&](int t, uint32_t (&kp)[(kChunks + 1) / 2], uint32_t (&vp)[(kChunks + 1) / 2]) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = tid + 128 * i, tok = c / kChunksPerRow, blk = (c % kChunksPerRow) / 2;
      const int key = t * kBlockN + tok;
      const bool in = t < n_tiles && key < s.len_k;
      const int64_t off = int64_t(s.k_start + key);
      const uint32_t kb = in ? ks[off * p.ks_stride[2] + blk] : 0xFFFFu;
      const uint32_t vb = in ? vs[off * p.vs_stride[2] + blk] : 0xFFFFu;
      if (i % 2 == 0) {
        kp[i / 2] = kb;
        vp[i / 2] = vb;
      } else {
        kp[i / 2] |= kb << 16;
        vp[i / 2] |= vb << 16;
      }
    }
  };
  auto unpack = [](const uint32_t (&pk)[(kChunks + 1) / 2], int i) {
    const uint32_t v = (pk[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
    return v == 0xFFFFu ? -1 : int(v);
  };
  uint32_t kpk[(kChunks + 1) / 2], vpk[(kChunks + 1) / 2];
  load_scales(0, kpk, vpk);
  for (int t = 0; t < n_tiles; ++t) {
    const uint32_t gt = g + t;
    const int st = gt % T::kStages;
    const uint32_t ph = (gt / T::kStages) & 1;
    cutlass::arch::ClusterTransactionBarrier::wait(sm.raw_full(st), ph);
    cutlass::arch::ClusterBarrier::wait(sm.k_empty(st), ph ^ 1);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = tid + 128 * i, tok = c / kChunksPerRow, c16 = c % kChunksPerRow;
      convert_chunk<T>(sm.raw_k(st), sm.k(st), tok, c16, unpack(kpk, i), ok);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(sm.k_full(st));
    cutlass::arch::ClusterBarrier::wait(sm.v_empty(st), ph ^ 1);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = tid + 128 * i, tok = c / kChunksPerRow, c16 = c % kChunksPerRow;
      convert_chunk<T>(sm.raw_v(st), sm.v(st), tok, c16, unpack(vpk, i), ov);
    }
    load_scales(t + 1, kpk, vpk);
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(sm.v_full(st));
    cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);  // raw stage st is free
    if (tid == 0 && t + T::kStages < n_tiles) issue_kv_tile<T>(p, s, b, hk, t + T::kStages, st, sm);
  }
}

}  // namespace lowbit::cuda::attention
