// src/cuda/attention/mxfp8_attn_fp8_producer.cuh: the producer warpgroup of the FP8 tensor-core
// path (precision kFp8). Once per CTA: the head's largest finite K and V scale per 32-channel block
// (Ak[b], Av[b]). Per key tile: TMA loads of the raw K and V codes (swizzled as the wgmma operands,
// 2-stage ring), then all 128 threads write the E4M3 operands of the consumers (2-stage rings):
//   K'[j, c]   = e4m3(k code * 2^(k_scale[j, b] - Ak[b]))                 same layout as raw K
//   V'^T[c, k] = e4m3(v code[key(k), c] * 2^(v_scale[key(k), b] - Av[b]))  transposed, K-major
// (b = c / 32; key(k): the token order of mxfp8_attn_fp8_convert.cuh). Exact wherever a token's
// block scale equals the head's; otherwise one rounding of the codes pushed below E4M3's normal
// range. Keys past the sequence: zeros in V'^T, anything in K' (their scores are masked).
#pragma once

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/mxfp8_attn_fp8_convert.cuh"
#include "cuda/attention/mxfp8_attn_fp8_traits.cuh"
#include "cuda/attention/mxfp8_attn_producer.cuh"  // AttnSmem, kProducerBarrier
#include "cuda/attention/mxfp8_attn_schedule.cuh"

namespace lowbit::cuda::attention::fp8 {

/// misc[0 .. 8): Ak[b], misc[8 .. 16): Av[b], misc[16 ...]: scan scratch (16 ints per warp).
constexpr int kMiscAk = 0, kMiscAv = 8, kMiscScratch = 16;

/// The head's largest finite K and V scale of every 32-channel block (127 where a block has none).
/// Run by the producer warpgroup; visible to all after the next CTA barrier.
template <class T>
__device__ void scan_kv_block_scales(const AttnParams& p, const SeqBounds& s, int b, int hk, const AttnSmem<T>& sm) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  int mk[T::kBlocks], mv[T::kBlocks];
#pragma unroll
  for (int i = 0; i < T::kBlocks; ++i) mk[i] = mv[i] = -1;
  for_each_kv_scale<T::kBlocks>(p, s, b, hk, tid, [&](int i, int kb, int vb) {
    if (kb != 255) mk[i] = max(mk[i], kb);
    if (vb != 255) mv[i] = max(mv[i], vb);
  });
  int* scratch = sm.misc() + kMiscScratch + 16 * warp;
#pragma unroll
  for (int i = 0; i < T::kBlocks; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mk[i] = max(mk[i], __shfl_xor_sync(0xffffffffu, mk[i], o));
      mv[i] = max(mv[i], __shfl_xor_sync(0xffffffffu, mv[i], o));
    }
    if (lane == 0) {
      scratch[i] = mk[i];
      scratch[8 + i] = mv[i];
    }
  }
  cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);
  if (tid < 16 && (tid % 8) < T::kBlocks) {
    int m = -1;
#pragma unroll
    for (int w = 0; w < 4; ++w) m = max(m, sm.misc()[kMiscScratch + 16 * w + tid]);
    sm.misc()[tid] = m < 0 ? 127 : m;  // tid < 8: Ak, 8..15: Av
  }
}

template <class T>
__device__ __forceinline__ void issue_kv_tile(const AttnParams& p, const SeqBounds& s, int b, int hk, int t, int st,
                                              const AttnSmem<T>& sm) {
  uint64_t* bar = sm.raw_full(st);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, 2 * T::kRawBytes);
  const int tok = s.k_start + t * T::kBlockN, bb = p.varlen ? 0 : b;
  constexpr uint64_t kHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
#pragma unroll
  for (int a = 0; a < T::kD / T::kWQK; ++a) {  // one box per swizzle atom of the row
    cute::SM90_TMA_LOAD_4D::copy(&p.tm_k, bar, kHint, sm.raw_k(st) + a * T::kBlockN * T::kWQK, a * T::kWQK, tok, hk,
                                 bb);
    cute::SM90_TMA_LOAD_4D::copy(&p.tm_v, bar, kHint, sm.raw_v(st) + a * T::kBlockN * T::kWQK, a * T::kWQK, tok, hk,
                                 bb);
  }
}

/// The V transpose unit of this producer thread: 8 logical k (kc) by kVC channels (group cg), and
/// its shared-memory offsets split into a per-thread part and compile-time parts.
/// NOTE: cg rotates with kc so that a warp's raw-V reads and V'^T writes spread over the banks.
template <class T>
struct VUnit {
  int kc, cg;
  uint32_t rd_base[4];  ///< raw V: slot e reads rd_base[rd_sel(e)] + rd_step(e)
  uint32_t wr_base;     ///< V'^T: channel j of the unit is written at wr_base + wr_off(j) ^ ...
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
  /// V'^T row cg * kVC + j (j < kVC), byte 8 kc: rows are kWV-byte swizzle atoms.
  __host__ __device__ uint32_t wr(int j) const {
    constexpr int kW = T::kWV;
    const int sw = kW == 128 ? (j & 7) : ((j >> 1) & 3);  // cg * kVC is a multiple of 8
    return wr_base + uint32_t(j * kW) + uint32_t((wr_x ^ sw) << 4);
  }
};

/// The scale factors of a tile in shared memory: the producer threads turn the tile's K and V
/// scale bytes into f16 factors 2^(scale - reference) once per (token, block), in one of two
/// buffers, and read them back per K chunk / V slot. Thread tid handles token tid % kBlockN,
/// blocks [first, first + kNB) of its K and of its V scales.
template <class T>
struct FactorStage {
  static constexpr int kNB = T::kBlocks * T::kBlockN / 128;  ///< blocks per thread (K and V each)
  static_assert(2 * kNB == T::kFacPerThread, "factor split");
  uint16_t* fac;
  int tok, first;
  __device__ FactorStage(uint8_t* base, int tid) : fac(reinterpret_cast<uint16_t*>(base + T::kOffFac)) {
    tok = tid % T::kBlockN;
    first = (tid / T::kBlockN) * kNB;
  }
  __device__ uint16_t* at(int buf, int kv, int token, int blk) const {
    return fac + ((buf * 2 + kv) * T::kBlockN + token) * T::kBlocks + blk;
  }
  /// Scale bytes of this thread's blocks for tile t (0 past the sequence): kw (K), vw (V), four
  /// per register.
  __device__ void load(const AttnParams& p, const SeqBounds& s, const uint8_t* ks, const uint8_t* vs, int t,
                       int n_tiles, uint32_t (&kw)[(kNB + 3) / 4], uint32_t (&vw)[(kNB + 3) / 4]) const {
    const int key = t * T::kBlockN + tok;
    const bool in = t < n_tiles && key < s.len_k;
    const int64_t k = s.k_start + (in ? key : 0);
    const uint8_t* kp = ks + k * p.ks_stride[2] + first;
    const uint8_t* vp = vs + k * p.vs_stride[2] + first;
#pragma unroll
    for (int i = 0; i < (kNB + 3) / 4; ++i) kw[i] = vw[i] = 0;
#pragma unroll
    for (int i = 0; i < kNB; ++i) {
      kw[i / 4] |= (in ? uint32_t(kp[i]) : 0u) << (8 * (i % 4));
      vw[i / 4] |= (in ? uint32_t(vp[i]) : 0u) << (8 * (i % 4));
    }
  }
  /// The factors of the bytes kw / vw into buffer buf (references Ak / Av per block from misc).
  __device__ void store(int buf, const uint32_t (&kw)[(kNB + 3) / 4], const uint32_t (&vw)[(kNB + 3) / 4],
                        const int* misc) const {
#pragma unroll
    for (int i = 0; i < kNB; ++i) {
      const int ksc = int((kw[i / 4] >> (8 * (i % 4))) & 0xFFu), vsc = int((vw[i / 4] >> (8 * (i % 4))) & 0xFFu);
      *at(buf, 0, tok, first + i) = uint16_t(f16_factor(ksc, misc[kMiscAk + first + i]));
      *at(buf, 1, tok, first + i) = uint16_t(f16_factor(vsc, misc[kMiscAv + first + i]));
    }
  }
};

/// The producer's work for one row block: n_tiles key tiles; g counts the tiles of earlier row
/// blocks (the ring positions continue across row blocks).
template <class T>
__device__ void produce_row_block(const AttnParams& p, const SeqBounds& s, int b, int hk, int n_tiles, uint32_t g,
                                  const AttnSmem<T>& sm) {
  constexpr int kBlockN = T::kBlockN, kD = T::kD, kVC = T::kVC, kChunksPerRow = kD / 16;
  const int tid = threadIdx.x % 128;
  const VUnit<T> vu(tid);
  const int vblk = vu.cg * kVC / 32;     // the scale block of the unit's channels
  const int kc16 = tid % kChunksPerRow;  // the thread's K chunks: (tid + 128 i) % kChunksPerRow = kc16
  const uint8_t* ks = p.k_scale + b * p.ks_stride[0] + hk * p.ks_stride[1];
  const uint8_t* vs = p.v_scale + b * p.vs_stride[0] + hk * p.vs_stride[1];
  const FactorStage<T> fs(sm.base, tid);
  const int* misc = sm.misc();

  if (tid == 0) {
    for (int t = 0; t < min(n_tiles, T::kStages); ++t) fp8::issue_kv_tile<T>(p, s, b, hk, t, (g + t) % T::kStages, sm);
  }
  uint32_t skw[(FactorStage<T>::kNB + 3) / 4], svw[(FactorStage<T>::kNB + 3) / 4];
  fs.load(p, s, ks, vs, 0, n_tiles, skw, svw);
  fs.store(0, skw, svw, misc);
  cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);
  for (int t = 0; t < n_tiles; ++t) {
    const uint32_t gt = g + t;
    const int st = gt % T::kStages, buf = t % 2;
    const uint32_t ph = (gt / T::kStages) & 1;
    const bool partial = (t + 1) * kBlockN > s.len_k;  // the last tile of a sequence, keys past its end
    cutlass::arch::ClusterTransactionBarrier::wait(sm.raw_full(st), ph);
    if (partial) {
      // Keys past the sequence (in a varlen batch: the next sequence's, maybe NaN): their raw V rows
      // become zeros before the transpose reads them (their P is 0, but 0 x NaN is not). K' needs
      // nothing: the consumers set their scores to -inf.
      const int valid = s.len_k - t * kBlockN;
      for (int c = tid; c < (kBlockN - valid) * kChunksPerRow; c += 128)
        *reinterpret_cast<uint4*>(sm.raw_v(st) + sw_offset<T::kWQK>(kBlockN, valid + c / kChunksPerRow,
                                                                    (c % kChunksPerRow) * 16)) = make_uint4(0, 0, 0, 0);
      cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);
    }
    cutlass::arch::ClusterBarrier::wait(sm.k_empty(st), ph ^ 1);
    // K' in place of the layout TMA wrote (the chunk's swizzled offset is the same in both).
#pragma unroll
    for (int i = 0; i < (kProfile == 1 ? 0 : T::kKChunks); ++i) {
      const int tok = (tid + 128 * i) / kChunksPerRow;
      const uint32_t off = sw_offset<T::kWQK>(kBlockN, tok, kc16 * 16);
      uint4 w = *reinterpret_cast<const uint4*>(sm.raw_k(st) + off);
      const uint32_t f = uint32_t(*fs.at(buf, 0, tok, kc16 / 2)) * 0x10001u;
      w.x = rescale_e4m3x4(w.x, f);
      w.y = rescale_e4m3x4(w.y, f);
      w.z = rescale_e4m3x4(w.z, f);
      w.w = rescale_e4m3x4(w.w, f);
      *reinterpret_cast<uint4*>(sm.k(st) + off) = w;
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(sm.k_full(st));
    fs.load(p, s, ks, vs, t + 1, n_tiles, skw, svw);  // tile t + 1's scale bytes, stored after V'^T

    // V'^T: the raw rows of the unit's 8 tokens, re-rounded and transposed, 4 channels at a time.
    uint32_t raw[8][kVC / 4], fp[4];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint8_t* src = sm.raw_v(st) + vu.rd(e);
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
      fp[E] = uint32_t(*fs.at(buf, 1, unit_token(vu.kc, 2 * E), vblk)) |
              (uint32_t(*fs.at(buf, 1, unit_token(vu.kc, 2 * E + 1), vblk)) << 16);
    cutlass::arch::ClusterBarrier::wait(sm.v_empty(st), ph ^ 1);
#pragma unroll
    for (int q = 0; q < (kProfile == 1 ? 0 : kVC / 4); ++q) {
      uint32_t out[4][2];
      transpose_group<kVC / 4>(raw, q, fp, out);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        *reinterpret_cast<uint2*>(sm.v(st) + vu.wr(4 * q + i)) = make_uint2(out[i][0], out[i][1]);
      }
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(sm.v_full(st));
    fs.store(buf ^ 1, skw, svw, misc);  // tile t + 1's factors (the other buffer: nobody reads it now)
    cutlass::arch::NamedBarrier::sync(128, kProducerBarrier);  // raw stage st is free, factors t + 1 visible
    if (tid == 0 && t + T::kStages < n_tiles) fp8::issue_kv_tile<T>(p, s, b, hk, t + T::kStages, st, sm);
  }
}

}  // namespace lowbit::cuda::attention::fp8
