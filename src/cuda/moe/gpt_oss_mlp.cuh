// src/cuda/moe/gpt_oss_mlp.cuh: kernels of the gpt-oss expert MLPs around the grouped GEMM: routing,
// gather (with the activation rounding; from routed tokens or from expert-grouped rows) and the
// weighted combine.
#pragma once

#include "cuda/moe/group_prepass.cuh"

namespace lowbit::cuda {
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
/// indptr[E]: from x[token of src_slot[r]] (gather; p.expert_rows: from x's row of compact row r,
/// MXFP8 x decoded) or from y[r] (fp32 [rows][K]), rounded to bf16 or through MXFP8 E4M3 (RCEIL)
/// as the reference's act() does. One warp per (row, 64-wide block).
__global__ void prep_rows_kernel(MoeMlpPlan p, const int32_t* indptr, const int32_t* src_slot, const float* y,
                                 int64_t K, int64_t Kp, int KT, uint16_t* act) {
  griddep_wait();
  const int lane = threadIdx.x & 31;
  const int64_t kblocks = Kp / 64;
  const int64_t items = int64_t(indptr[p.E]) * kblocks;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const BlockFormat f = BlockFormat::mxfp8();
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < items; item += warps) {
    const int64_t r = item / kblocks, k0 = (item % kblocks) * 64, k = k0 + 2 * lane;
    int64_t t = 0;  // the x row
    if (!y) t = p.expert_rows ? p.expert_row(indptr, group_of_row(indptr, p.E, r), r) : src_slot[r] / p.topk;
    float v[2] = {0.0f, 0.0f};
    if (k < K) {
      for (int h = 0; h < 2; ++h) v[h] = y ? y[r * K + k + h] : p.x_value(t, k + h);
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
    reinterpret_cast<uint32_t*>(act + r * Kp)[act_index(k, KT) >> 1] = act_pair_bf16(v[0], v[1]);
  }
}

/// Zeroes the K padding (elements K .. Kp-1, in act_pos order) of the compact rows r < indptr[E]
/// of act [rows][Kp], which the next GEMM reads in whole K tiles (its weights are zero there): the
/// expert MLP's bf16 act2, whose other elements the gate_up epilogue writes. Work follows the rows
/// of the counts (a memset of all `rows` would follow the masked layout's bound).
__global__ void zero_k_tail_kernel(const int32_t* indptr, int64_t E, int64_t K, int64_t Kp, int KT, uint16_t* act) {
  griddep_wait();
  const int64_t tail = Kp - K, n = int64_t(indptr[E]) * tail;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / tail, k = K + i % tail;
    act[r * Kp + act_index(k, KT)] = 0;
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
}  // namespace lowbit::cuda
