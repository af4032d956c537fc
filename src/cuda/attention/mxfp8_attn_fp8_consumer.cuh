// src/cuda/attention/mxfp8_attn_fp8_consumer.cuh: a consumer warpgroup of the FP8 tensor-core
// path (precision kFp8; 64 query rows): Q' once per row block, then per key tile
//   S = Q' K'^T                      FP8 wgmma (E4M3 x E4M3, fp32 accumulators), SS, K-major
//   P = e4m3(2^(S rf - m + 8))       online softmax in base 2; P scaled by 2^8 (FlashAttention-3's
//                                     offset: P <= 256 < 448, saturation impossible), row sum l of
//                                     the unrounded values
//   O += P V'                        FP8 wgmma, P from the S registers (RS), V'^T K-major
// and the epilogue out = O 2^(Av[b] - 127) / l per 32-channel block b, lse = (m - 8 + log2 l) ln 2.
// Q' = e4m3(q code * 2^(q_scale[i, b] + Ak[b] - R_i)), R_i = max_b (q_scale[i, b] + Ak[b]): the
// scores are 2^(R_i - 254) Q' K'^T, every block scale of Q and K applied, the row's factor folded
// into the softmax scale (rf_i = softmax_scale log2(e) 2^(R_i - 254)).
#pragma once

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <cfloat>
#include <utility>

#include "cuda/attention/mxfp8_attn_convert.cuh"  // fast_exp2, pack helpers of the exact path
#include "cuda/attention/mxfp8_attn_fp8_producer.cuh"
#include "cuda/attention/mxfp8_attn_pipeline.cuh"

namespace lowbit::cuda::attention::fp8 {

namespace gmma = cute::SM90::GMMA;

template <int kN>
struct QkMma;  // S (64 x kN) += Q' (64 x 32) K'^T, both from shared memory
template <>
struct QkMma<128> {
  using Op = gmma::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;
};
template <>
struct QkMma<64> {
  using Op = gmma::MMA_64x64x32_F32E4M3E4M3_SS_TN<>;
};
template <int kN>
struct PvMma;  // O (64 x kN) += P (64 x 32, registers) V'^T
template <>
struct PvMma<64> {
  using Op = gmma::MMA_64x64x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct PvMma<128> {
  using Op = gmma::MMA_64x128x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct PvMma<256> {
  using Op = gmma::MMA_64x256x32_F32E4M3E4M3_RS_TN<>;
};

/// Q' for this warpgroup's 64 rows (two threads per row, kD/2 channels each) and the per-row
/// factor rf = softmax_scale * log2(e) * 2^(R - 254) into shared memory. Rows past the sequence:
/// zeros. A row with no finite block scale keeps R = 254 (its Q' is NaN).
template <class T>
__device__ void load_q(const AttnParams& p, const SeqBounds& s, int b, int h, int row_base, int wgc,
                       const AttnSmem<T>& sm) {
  constexpr int kD = T::kD, kHalf = kD / 2;
  const int tid = threadIdx.x % 128, rr = tid / 2, half = tid % 2;
  const int row = row_base + rr;  // row of the sequence
  uint8_t* dq = sm.q(wgc);
  if (row < s.len_q) {
    const int64_t srow = s.q_start + row;
    const uint8_t* qs = p.q_scale + b * p.qs_stride[0] + h * p.qs_stride[1] + srow * p.qs_stride[2];
    int r = -1;
#pragma unroll
    for (int i = 0; i < T::kBlocks; ++i) {
      const int sc = qs[i];
      if (sc != 255) r = max(r, sc + sm.misc()[kMiscAk + i]);
    }
    if (r < 0) r = 254;
    // NOTE: at least FLT_MIN, so that a masked score (-inf) times rf stays -inf (its P 0) without a
    // per-score test; a row whose factor is below it has scores of at most 2^-100 (P uniform).
    if (half == 0) sm.rf()[wgc * 64 + rr] = fmaxf(ldexpf(p.scale_log2, r - 254), FLT_MIN);
    const uint8_t* qp = p.q + b * p.q_stride[0] + srow * p.q_stride[1] + h * p.q_stride[2] + half * kHalf;
#pragma unroll
    for (int j = 0; j < kHalf / 16; ++j) {
      const int col = half * kHalf + 16 * j, blk = col / 32;
      const int sc = qs[blk];
      const uint32_t f = (sc == 255 ? 0x7E00u : f16_pow2_neg(r - sc - sm.misc()[kMiscAk + blk])) * 0x10001u;
      uint4 w = *reinterpret_cast<const uint4*>(qp + 16 * j);
      w.x = rescale_e4m3x4(w.x, f);
      w.y = rescale_e4m3x4(w.y, f);
      w.z = rescale_e4m3x4(w.z, f);
      w.w = rescale_e4m3x4(w.w, f);
      *reinterpret_cast<uint4*>(dq + sw_offset<T::kWQK>(64, rr, col)) = w;
    }
  } else {
    if (half == 0) sm.rf()[wgc * 64 + rr] = p.scale_log2;
#pragma unroll
    for (int j = 0; j < kHalf / 16; ++j)
      *reinterpret_cast<uint4*>(dq + sw_offset<T::kWQK>(64, rr, half * kHalf + 16 * j)) = make_uint4(0, 0, 0, 0);
  }
}

/// One consumer warpgroup's row block: rows row_base .. row_base + 63 of the sequence.
template <class T>
__device__ void consume_row_block(const AttnParams& p, const SeqBounds& s, int b, int h, int m0, int n_tiles,
                                  uint32_t g, int wgc, const AttnSmem<T>& sm) {
  constexpr int kD = T::kD, kBlockN = T::kBlockN;
  constexpr int kS = kBlockN / 2;  // score accumulators per thread
  constexpr int kO = kD / 2;       // output accumulators per thread
  constexpr float kPOffset = 8.f;  // P scaled by 2^8 before its E4M3 rounding
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int row_base = m0 + 64 * wgc;
  const int bar_id = 2 + wgc;

  cutlass::arch::NamedBarrier::sync(128, bar_id);  // the previous row block's reads of Q' are done
  fp8::load_q<T>(p, s, b, h, row_base, wgc, sm);
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(128, bar_id);

  const int r0 = 16 * warp + lane / 4, r1 = r0 + 8;  // accumulator rows within the 64
  const int row0 = row_base + r0, row1 = row_base + r1;
  const float rf0 = sm.rf()[wgc * 64 + r0], rf1 = sm.rf()[wgc * 64 + r1];
  const int diag = s.len_k - s.len_q;  // key j visible to row i when j <= i + diag (causal)

  float o[kO];
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] = 0.f;
  float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // wgmma descriptors of step 0; the k32 steps add their offsets (k32_desc)
  const uint64_t q_desc = smem_desc<T::kWQK>(cute::cast_smem_ptr_to_uint(sm.q(wgc)));
  const uint64_t k_desc0 = smem_desc<T::kWQK>(cute::cast_smem_ptr_to_uint(sm.k(0)));
  const uint64_t v_desc0 = smem_desc<T::kWV>(cute::cast_smem_ptr_to_uint(sm.v(0)));
  static_assert(T::kKBytes % 16 == 0 && T::kVBytes % 16 == 0, "stage strides in descriptor units");

  auto issue_qk = [&](float (&sacc)[kS], int st) {
    const uint64_t k_desc = k_desc0 + uint64_t(st * (T::kKBytes >> 4));
    fence_acc(sacc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kD / 32; ++kk) {
      gmma_ss<typename QkMma<kBlockN>::Op>(k32_desc<T::kWQK>(q_desc, 64, kk), k32_desc<T::kWQK>(k_desc, kBlockN, kk), sacc,
                                           kk > 0, std::make_index_sequence<kS>{});
    }
    cute::warpgroup_commit_batch();
  };
  uint32_t pa[kBlockN / 32][4];  // P as E4M3 A fragments, one k32 chunk each
  auto issue_pv = [&](int st) {
    const uint64_t v_desc = v_desc0 + uint64_t(st * (T::kVBytes >> 4));
    fence_acc(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kc = 0; kc < kBlockN / 32; ++kc) {
      gmma_rs<typename PvMma<kD>::Op>(pa[kc], k32_desc<T::kWV>(v_desc, kD, kc), o, std::make_index_sequence<kO>{});
    }
    cute::warpgroup_commit_batch();
  };
  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
  };
  // The online softmax of tile t: sacc becomes 2^8 P (fp32), returns the rescale factors of O.
  auto softmax = [&](float (&sacc)[kS], int t, float& alpha0, float& alpha1) {
    // Masks: keys past the sequence, and (causal) keys after a row's diagonal.
    const int key0 = t * kBlockN;
    const bool masked_tile = key0 + kBlockN > s.len_k || (p.causal && key0 + kBlockN - 1 > row_base + diag);
    float tmax0 = -INFINITY, tmax1 = -INFINITY;
    if (masked_tile) {
      const int lim0 = p.causal ? min(s.len_k - 1, row0 + diag) : s.len_k - 1;
      const int lim1 = p.causal ? min(s.len_k - 1, row1 + diag) : s.len_k - 1;
#pragma unroll
      for (int j = 0; j < kS / 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * j + 2 * q4 + e;
          if (key > lim0) sacc[4 * j + e] = -INFINITY;
          if (key > lim1) sacc[4 * j + 2 + e] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kS / 4; ++j) {
      tmax0 = fmaxf(tmax0, fmaxf(sacc[4 * j], sacc[4 * j + 1]));
      tmax1 = fmaxf(tmax1, fmaxf(sacc[4 * j + 2], sacc[4 * j + 3]));
    }
    tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, 1));
    tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, 2));
    tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, 1));
    tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, 2));
    const float mn0 = fmaxf(mx0, tmax0 * rf0), mn1 = fmaxf(mx1, tmax1 * rf1);
    alpha0 = mn0 == -INFINITY ? 1.f : fast_exp2(mx0 - mn0);
    alpha1 = mn1 == -INFINITY ? 1.f : fast_exp2(mx1 - mn1);
    // NOTE: exponent s rf - (m - 8) <= 8 (m >= every s rf of the row so far): 2^8 P <= 256 < 448.
    const float mb0 = (mn0 == -INFINITY ? 0.f : mn0) - kPOffset;
    const float mb1 = (mn1 == -INFINITY ? 0.f : mn1) - kPOffset;
    mx0 = mn0;
    mx1 = mn1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int j = 0; j < kS / 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // masked scores: -inf * rf - mb = -inf, 2^-inf = 0 (rf >= FLT_MIN, load_q)
        const float p0 = fast_exp2(fmaf(sacc[4 * j + e], rf0, -mb0));
        const float p1 = fast_exp2(fmaf(sacc[4 * j + 2 + e], rf1, -mb1));
        sacc[4 * j + e] = p0;
        sacc[4 * j + 2 + e] = p1;
        ps0 += p0;
        ps1 += p1;
      }
    }
    l0 = l0 * alpha0 + ps0;
    l1 = l1 * alpha1 + ps1;
  };
  // P as E4M3 A fragments, one per k32 chunk (p_frag_src: the accumulator entries in the order
  // of the 8-bit A layout; V'^T holds the keys in the matching order).
  auto pack_p = [&](const float (&sacc)[kS]) {
#pragma unroll
    for (int kc = 0; kc < kBlockN / 32; ++kc) {
      const float* d = sacc + 16 * kc;
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pa[kc][r] = f32x4_to_e4m3(d[p_frag_src(r, 0)], d[p_frag_src(r, 1)], d[p_frag_src(r, 2)], d[p_frag_src(r, 3)]);
    }
  };
  auto rescale_o = [&](float alpha0, float alpha1) {
    // NOTE: skipped when no row of the warp raised its maximum (alpha = 1 exactly).
    if (!__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) return;
#pragma unroll
    for (int j = 0; j < kO / 4; ++j) {
      o[4 * j] *= alpha0;
      o[4 * j + 1] *= alpha0;
      o[4 * j + 2] *= alpha1;
      o[4 * j + 3] *= alpha1;
    }
  };

  if constexpr (kProfile == 2) {  // dev builds: the stages' handshakes alone
    auto phase = [&](uint32_t gt) { return (gt / T::kStages) & 1; };
    for (int t = 0; t < n_tiles; ++t) {
      const uint32_t gt = g + t;
      const int st = gt % T::kStages;
      cutlass::arch::ClusterBarrier::wait(sm.k_full(st), phase(gt));
      release(sm.k_empty(st));
      cutlass::arch::ClusterBarrier::wait(sm.v_full(st), phase(gt));
      release(sm.v_empty(st));
    }
    return;
  }
  // The key tiles (mxfp8_attn_pipeline.cuh: S(t) and PV(t-1) issued together).
  run_key_tiles<T::kStages, kS>(n_tiles, g, sm, o, issue_qk, issue_pv, release, softmax, pack_p, rescale_o);

  // Epilogue: out = O 2^(Av[b] - 127) / l per 32-channel block b (V'^T = v * 2^(v_scale - Av[b])).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 == 0.f ? 0.f : 1.f / l0, inv1 = l1 == 0.f ? 0.f : 1.f / l1;
  float vf[T::kBlocks];
#pragma unroll
  for (int i = 0; i < T::kBlocks; ++i) vf[i] = ldexpf(1.f, sm.misc()[kMiscAv + i] - 127);
#pragma unroll
  for (int rsel = 0; rsel < 2; ++rsel) {
    const int row = rsel ? row1 : row0;
    if (row >= s.len_q) continue;
    const float inv = rsel ? inv1 : inv0;
    const bool empty = (rsel ? l1 : l0) == 0.f;
    const int64_t srow = s.q_start + row;
    uint16_t* op = p.out + b * p.o_stride[0] + srow * p.o_stride[1] + h * p.o_stride[2];
#pragma unroll
    for (int j = 0; j < kO / 4; ++j) {
      const int col = 8 * j + 2 * q4;
      const float f = empty ? 0.f : inv * vf[j / 4];
      const float a = empty ? 0.f : o[4 * j + 2 * rsel] * f, c = empty ? 0.f : o[4 * j + 2 * rsel + 1] * f;
      const __nv_bfloat162 v = __floats2bfloat162_rn(a, c);
      *reinterpret_cast<__nv_bfloat162*>(op + col) = v;
    }
    if (q4 == 0) {
      const float m = rsel ? mx1 : mx0, l = rsel ? l1 : l0;
      const float lse = empty ? -INFINITY : (m - kPOffset + log2f(l)) * 0.69314718055994531f;
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + srow * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace lowbit::cuda::attention::fp8
