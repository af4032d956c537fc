// src/cuda/moe/group_epilogue.cuh: epilogue of the MXFP4 grouped GEMM: the exact fp32 fallback
// (exact_dot), bias, SwiGLU, the final stores and finish_tile.
#pragma once

#include "cuda/moe/group_scheduler.cuh"

namespace lowbit::cuda {
namespace {

/// Exact fp32 recomputation of one accumulator entry (row R, compact token row m of group g) over
/// K elements [k0, k1).
__device__ float exact_dot(const GroupArgs& A, int64_t g, int64_t R, int64_t m, int64_t k0, int64_t k1) {
  const int64_t n = A.wrow(R);
  const int64_t am = A.a ? A.a_row(g, m) : m;  // the row of the original A
  const int64_t srow = (A.a && A.a_scale) ? A.a_scale_row(am) : 0;
  float acc = 0.0f, sa = 1.0f;
  for (int64_t k = k0; k < k1; ++k) {
    float av;
    if (A.a) {
      if (A.a_scale) {
        if ((k & 31) == 0 || k == k0)
          sa = decode_ue8m0(A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, k >> 5)]);
        const uint8_t c = static_cast<const uint8_t*>(A.a)[am * A.a_sM + k];
        av = (A.a_dtype == DType::kE4M3 ? decode_e4m3(c) : decode_e5m2(c)) * sa;
      } else {
        av = decode_bf16(static_cast<const uint16_t*>(A.a)[am * A.a_sM + k]);
      }
    } else {
      av = decode_bf16(A.act[m * A.Kp + act_index(k, A.KT)]);
    }
    acc = fmaf(A.weight(g, n, k), av, acc);
  }
  return acc;
}

__device__ __forceinline__ float load_bias(const GroupArgs& A, int64_t g, int64_t n) {
  return load_float(A.mlp.bias, A.mlp.bias_dtype, g * A.mlp.bias_sG + n);
}

/// gpt-oss clamped SwiGLU of one feature (FORMATS.md section 8), as the reference computes it.
__device__ __forceinline__ float swiglu(const GroupArgs& A, float hg, float hu) {
  const float g = hg < A.mlp.limit ? hg : A.mlp.limit;
  const float u = hu < -A.mlp.limit ? -A.mlp.limit : (hu > A.mlp.limit ? A.mlp.limit : hu);
  return g * (1.0f / (1.0f + expf(-A.mlp.alpha * g))) * (u + 1.0f);
}

/// Final store of kernel rows (R, R + 8) to output row m (a compact row plus A.o_offset(g)), group g.
__device__ __forceinline__ void store_pair(const GroupArgs& A, int64_t g, int64_t m, int64_t R, float v0, float v1) {
  if (A.mode == kEpiSwiglu) {
    const int64_t f = (R >> 4) * 8 + (R & 7);  // feature: stored rows 2f (gate) and 2f + 1 (up)
    if (2 * f + 1 >= A.N) return;
    const float y = swiglu(A, v0 + load_bias(A, g, 2 * f), v1 + load_bias(A, g, 2 * f + 1));
    if (A.mlp.out_act_layout)
      static_cast<uint16_t*>(A.out)[m * A.o_sM + act_index(f, A.mlp.out_kt)] = encode_bf16(y);
    else
      static_cast<float*>(A.out)[m * A.o_sM + f] = y;
    return;
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = R + 8 * h;
    if (n >= A.N) continue;
    const float v = h ? v1 : v0;
    // NOTE: two stores, not one store of a selected value: the one-store form made the 128-token
    // kernel 12 % slower (H200, gpt-oss-20b gate_up, T = 4096), and the MLP's down GEMM (fp32
    // out) keeps its plain fp32 store.
    if (A.mode != kEpiBias)
      store_float(A.out, A.out_dtype, m * A.o_sM + n, v);
    else if (A.out_dtype == DType::kFloat32)
      static_cast<float*>(A.out)[m * A.o_sM + n] = v + load_bias(A, g, n);
    else
      store_float(A.out, A.out_dtype, m * A.o_sM + n, v + load_bias(A, g, n));
  }
}

/// Byte `idx` (0..11) of three consecutive words.
__device__ __forceinline__ uint32_t pick_byte(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t idx) {
  const uint32_t w = idx < 4 ? w0 : (idx < 8 ? w1 : w2);
  return (w >> (8 * (idx & 3))) & 0xFFu;
}

/// Epilogue of a CTA's tile, run by all its threads: the exactness check (activation blocks the
/// pre-pass flagged), then this thread's accumulator rows rl, rl + 8 for its tokens (consumer
/// false: none), unshifted by 2^kWShift, to the output (its rows: GroupArgs::o_offset) or the
/// split-K partials (compact rows). m0 / m1: the tile's compact rows. Its CTA barrier also ends the
/// tile's use of shared memory (a CTA looping over work items reuses it after this).
template <int kTileN, int kTileK, bool kItems = false>
__device__ __forceinline__ void finish_tile(const GroupArgs& A, const float (&acc)[kTileN / 2], bool consumer,
                                            int tid, int rl, int t, int64_t grp, int64_t m0, int64_t m1, int64_t R0,
                                            int split, int64_t kt0, int64_t kt1) {
  bool bad = false;
  if (A.tok_flag && tid < kTileN && m0 + tid < m1)
    for (int64_t c = kt0 * (kTileK / 64); c < kt1 * (kTileK / 64); ++c) bad |= A.tok_flag[(m0 + tid) * (A.Kp / 64) + c] != 0;
  bad = __syncthreads_or(bad);
  if (!consumer) return;
  const int64_t kb = kt0 * kTileK, ke = kt1 * kTileK < A.K ? kt1 * kTileK : A.K;
  const int64_t ooff = A.splits == 1 ? A.o_offset(grp) : 0;  // output row of compact row m: m + ooff
  const int64_t R = R0 + rl;
  auto put = [&](int64_t m, float v0, float v1) {
    if (A.splits == 1) {
      store_pair(A, grp, m + ooff, R, v0, v1);
    } else {
      float* w = A.ws + (int64_t(split) * A.M + m) * A.N;
      w[R] = v0;
      if (R + 8 < A.N) w[R + 8] = v1;
    }
  };
  // NOTE (kItems): the exact recomputation (rare) takes its own loop, which reads no accumulator,
  // so that the unrolled loop over the accumulators stays small enough to be unrolled (kept in
  // registers) inside the kernels' loop over work items. Without the item loop the one loop below
  // is unrolled whole (and ptxas allocates that form best: the split form spilled in the K loop of
  // the 32-token kernels).
  if constexpr (kItems) {
    if (bad) {
#pragma unroll 1
      for (int i = 0; i < kTileN / 4; ++i) {
        const int64_t m = m0 + 8 * (i >> 1) + 2 * t + (i & 1);
        if (m >= m1 || R >= A.N) continue;
        put(m, exact_dot(A, grp, R, m, kb, ke), R + 8 < A.N ? exact_dot(A, grp, R + 8, m, kb, ke) : 0.0f);
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kTileN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + 8 * j + 2 * t + h;
      if (m >= m1 || R >= A.N) continue;
      const float un = A.tok_scale ? A.tok_scale[m] : kWUnshift;  // a power of two: exact
      float v0 = acc[4 * j + h] * un, v1 = acc[4 * j + 2 + h] * un;
      if (!kItems && bad) {
        v0 = exact_dot(A, grp, R, m, kb, ke);
        v1 = R + 8 < A.N ? exact_dot(A, grp, R + 8, m, kb, ke) : 0.0f;
      }
      put(m, v0, v1);
    }
  }
}

}  // namespace
}  // namespace lowbit::cuda
