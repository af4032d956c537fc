// src/cuda/attention/mxfp8_attn_consumer.cuh: a consumer warpgroup of the MXFP8 attention kernel
// (64 query rows): Q' once per row block, then per key tile S = Q' K'^T (bf16 wgmma, fp32
// accumulators), the online softmax in base 2 with every scale folded into one factor per row,
// P = bf16(exp2(...)) fed from registers to O += P V' (bf16 wgmma, V' MN-major), and the epilogue
// (1/l, the head's V exponent, bf16 out, lse).
#pragma once

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <cfloat>
#include <utility>

#include "cuda/attention/mxfp8_attn_producer.cuh"
#include "cuda/attention/mxfp8_attn_pipeline.cuh"

namespace lowbit::cuda::attention {

template <int kN>
struct QkMma;
template <>
struct QkMma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct QkMma<64> {
  using Op = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct QkMma<32> {
  using Op = cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <int kN>
struct PvMma;
template <>
struct PvMma<64> {
  using Op = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;
};
template <>
struct PvMma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;
};
template <>
struct PvMma<256> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;
};

/// Q' for this warpgroup's 64 rows (two threads per row, kD/2 channels each) and the per-row
/// factor rf = softmax_scale * log2(e) * 2^(e - c) into shared memory, where e = oq + ok - 254
/// (oq: the row's largest finite scale) and c = clamp(e, -110, 110) is folded into Q'.
template <class T>
__device__ void load_q(const AttnParams& p, const SeqBounds& s, int b, int h, int row_base, int wgc,
                       const AttnSmem<T>& sm) {
  constexpr int kD = T::kD, kHalf = kD / 2;
  const int tid = threadIdx.x % 128, rr = tid / 2, half = tid % 2;
  const int row = row_base + rr;  // row of the sequence
  uint8_t* dq = sm.q(wgc);
  const int ok = sm.misc()[0];
  if (row < s.len_q) {
    const int64_t srow = s.q_start + row;
    const uint8_t* qs = p.q_scale + b * p.qs_stride[0] + h * p.qs_stride[1] + srow * p.qs_stride[2];
    int sc[T::kBlocks];
    int oq = -1;
#pragma unroll
    for (int i = 0; i < T::kBlocks; ++i) {
      sc[i] = qs[i];
      if (sc[i] != 255) oq = max(oq, sc[i]);
    }
    if (oq < 0) oq = 127;
    const int e = oq + ok - 254, c = min(max(e, -110), 110);
    if (half == 0) sm.rf()[wgc * 64 + rr] = ldexpf(p.scale_log2, e - c);
    const uint8_t* qp = p.q + b * p.q_stride[0] + srow * p.q_stride[1] + h * p.q_stride[2] + half * kHalf;
#pragma unroll
    for (int j = 0; j < kHalf / 16; ++j) {
      const uint4 w = *reinterpret_cast<const uint4*>(qp + 16 * j);
      const int col = half * kHalf + 16 * j;
      const int scb = qs[col / 32];  // (a register array indexed by half would live in local memory)
      const int fe = scb - oq + c;
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
      uint32_t o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t word = ws[k / 2], sh = (k % 2) * 16;
        const float v0 = scb == 255 ? __int_as_float(0x7FC00000) : ldexpf(e4m3_to_f32((word >> sh) & 0xFF), fe);
        const float v1 = scb == 255 ? __int_as_float(0x7FC00000) : ldexpf(e4m3_to_f32((word >> (sh + 8)) & 0xFF), fe);
        const __nv_bfloat162 bb = __floats2bfloat162_rn(v0, v1);
        o[k] = *reinterpret_cast<const uint32_t*>(&bb);
      }
      *reinterpret_cast<uint4*>(dq + bf16_sw128_offset(64, rr, col)) = make_uint4(o[0], o[1], o[2], o[3]);
      *reinterpret_cast<uint4*>(dq + bf16_sw128_offset(64, rr, col + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else {
    if (half == 0) sm.rf()[wgc * 64 + rr] = p.scale_log2;
#pragma unroll
    for (int j = 0; j < kHalf / 8; ++j)
      *reinterpret_cast<uint4*>(dq + bf16_sw128_offset(64, rr, half * kHalf + 8 * j)) = make_uint4(0, 0, 0, 0);
  }
}

/// One consumer warpgroup's row block: rows row_base .. row_base + 63 of the sequence.
template <class T>
__device__ void consume_row_block(const AttnParams& p, const SeqBounds& s, int b, int h, int m0, int n_tiles,
                                  uint32_t g, int wgc, const AttnSmem<T>& sm) {
  constexpr int kD = T::kD, kBlockN = T::kBlockN;
  constexpr int kS = kBlockN / 2;  // score accumulators per thread
  constexpr int kO = kD / 2;       // output accumulators per thread
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int row_base = m0 + 64 * wgc;
  const int bar_id = 2 + wgc;

  cutlass::arch::NamedBarrier::sync(128, bar_id);  // the previous row block's reads of Q' are done
  load_q<T>(p, s, b, h, row_base, wgc, sm);
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
  const uint32_t q_addr = cute::cast_smem_ptr_to_uint(sm.q(wgc));

  auto issue_qk = [&](float (&sacc)[kS], int st) {
    const uint32_t k_addr = cute::cast_smem_ptr_to_uint(sm.k(st));
    fence_acc(sacc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da = smem_desc<128>(q_addr + (kk / 4) * 64 * 128 + (kk % 4) * 32);
      const uint64_t db = smem_desc<128>(k_addr + (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
      gmma_ss<typename QkMma<kBlockN>::Op>(da, db, sacc, kk > 0, std::make_index_sequence<kS>{});
    }
    cute::warpgroup_commit_batch();
  };
  uint32_t pa[kBlockN / 16][4];  // P as bf16 A fragments
  auto issue_pv = [&](int st) {
    const uint32_t v_addr = cute::cast_smem_ptr_to_uint(sm.v(st));
    fence_acc(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) {
      gmma_rs<typename PvMma<kD>::Op>(pa[kc], smem_desc_mn(v_addr + kc * 16 * 128, kBlockN * 128), o,
                                      std::make_index_sequence<kO>{});
    }
    cute::warpgroup_commit_batch();
  };
  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
  };
  // The online softmax of tile t: sacc becomes P (fp32), returns the rescale factors of O.
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
    const float mb0 = mn0 == -INFINITY ? 0.f : mn0;
    const float mb1 = mn1 == -INFINITY ? 0.f : mn1;
    mx0 = mn0;
    mx1 = mn1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int j = 0; j < kS / 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float p0 = fast_exp2(fmaf(sacc[4 * j + e], rf0, -mb0));
        float p1 = fast_exp2(fmaf(sacc[4 * j + 2 + e], rf1, -mb1));
        if (masked_tile) {
          if (sacc[4 * j + e] == -INFINITY) p0 = 0.f;
          if (sacc[4 * j + 2 + e] == -INFINITY) p1 = 0.f;
        }
        sacc[4 * j + e] = p0;
        sacc[4 * j + 2 + e] = p1;
        ps0 += p0;
        ps1 += p1;
      }
    }
    l0 = l0 * alpha0 + ps0;
    l1 = l1 * alpha1 + ps1;
  };
  // P as the bf16 A fragments: k16 chunk kc is n8 blocks 2kc, 2kc+1 of the accumulator.
  auto pack_p = [&](const float (&sacc)[kS]) {
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) {
      const float* d = sacc + 8 * kc;
      pa[kc][0] = pack_bf16x2(d[0], d[1]);
      pa[kc][1] = pack_bf16x2(d[2], d[3]);
      pa[kc][2] = pack_bf16x2(d[4], d[5]);
      pa[kc][3] = pack_bf16x2(d[6], d[7]);
    }
  };
  auto rescale_o = [&](float alpha0, float alpha1) {
#pragma unroll
    for (int j = 0; j < kO / 4; ++j) {
      o[4 * j] *= alpha0;
      o[4 * j + 1] *= alpha0;
      o[4 * j + 2] *= alpha1;
      o[4 * j + 3] *= alpha1;
    }
  };

  // The key tiles (mxfp8_attn_pipeline.cuh: S(t) and PV(t-1) issued together).
  run_key_tiles<T::kStages, kS>(n_tiles, g, sm, o, issue_qk, issue_pv, release, softmax, pack_p, rescale_o);

  // Epilogue.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 == 0.f ? 0.f : 1.f / l0, inv1 = l1 == 0.f ? 0.f : 1.f / l1;
  const float vf = ldexpf(1.f, sm.misc()[1] - 127);  // V' = v * 2^(127 - ov)
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
      const float f = empty ? 0.f : inv * vf;
      const float a = empty ? 0.f : o[4 * j + 2 * rsel] * f, c = empty ? 0.f : o[4 * j + 2 * rsel + 1] * f;
      const __nv_bfloat162 v = __floats2bfloat162_rn(a, c);
      *reinterpret_cast<__nv_bfloat162*>(op + col) = v;
    }
    if (q4 == 0) {
      const float m = rsel ? mx1 : mx0, l = rsel ? l1 : l0;
      const float lse = empty ? -INFINITY : (m + log2f(l)) * 0.69314718055994531f;
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + srow * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace lowbit::cuda::attention
