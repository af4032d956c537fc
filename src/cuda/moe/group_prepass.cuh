// src/cuda/moe/group_prepass.cuh: the activation pre-pass of the MXFP4 grouped GEMM: A (MXFP8 or
// bf16) -> bf16 rows in act_pos order (compact rows: group_layout.cuh), with the per-row shift into
// bf16's range.
#pragma once

#include "cuda/moe/group_params.cuh"

namespace lowbit::cuda {
namespace {

// ------------------------------------------------------------------------------------------
// Activation pre-pass: A (MXFP8 or bf16) -> bf16 [M][Kp] in act_pos order, zero beyond K.

__device__ __forceinline__ uint32_t act_pair_bf16(float v0, float v1) {
  return uint32_t(encode_bf16(v0)) | (uint32_t(encode_bf16(v1)) << 16);
}

/// The row's shift into bf16's range (see the file comment): 2^ka, ka = max(0, lo - the row's
/// smallest scale byte). Warp-wide; the loads are issued together (one round trip for K <= 8192).
__device__ __forceinline__ float act_row_shift(const GroupArgs& A, int64_t srow, int lo, int lane) {
  const int64_t kb = A.K / 32;
  uint32_t mn = 255u;
  for (int64_t c0 = 0; c0 < kb; c0 += 8 * 32) {
    uint32_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = c0 + 32 * i + lane;
      v[i] = c < kb ? A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, c)] : 255u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) mn = v[i] < mn ? v[i] : mn;
  }
  mn = __reduce_min_sync(0xFFFFFFFFu, mn);
  return float(1 << (int(mn) < lo ? lo - int(mn) : 0));
}

/// One warp per (row, strip of A.strip 64-wide K blocks); lane l handles K elements 2l, 2l+1 of
/// each block. MXFP8 rows are multiplied by their shift (exact); tok_scale gets 2^kWShift / shift.
__global__ void act_prepass_kernel(GroupArgs A) {
  griddep_launch_dependents();  // the GEMM may start fetching weights meanwhile
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int64_t kblocks = A.Kp / 64, strips = (kblocks + A.strip - 1) / A.strip;
  const int lo = A.a_dtype == DType::kE4M3 ? 3 : 10;  // bf16 holds e4m3 / e5m2 * 2^(s-127) exactly for s >= lo
  const bool e4 = A.a_dtype == DType::kE4M3;
  auto bf16_inexact = [](float v) { return v == v && decode_bf16(encode_bf16(v)) != v; };
  // m_counts layouts: the compact rows of the groups only (their bounds come from the kernel before)
  const int64_t rows = A.group_rows_only ? A.bound(A.G) : A.M;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < rows * strips; item += warps) {
    const int64_t m = item / strips, b0 = (item % strips) * A.strip;
    const int64_t b1 = b0 + A.strip < kblocks ? b0 + A.strip : kblocks;
    const int64_t am = A.a_pitch ? A.a_row(A.group_of(m), m) : m;  // compact row m's row of A
    int64_t srow = 0;
    float up = 1.0f;
    if (A.a_scale) {
      srow = A.a_scale_row(am);
      up = act_row_shift(A, srow, lo, lane);
      if (A.tok_scale && b0 == 0 && lane == 0) const_cast<float*>(A.tok_scale)[m] = kWUnshift / up;
    }
    for (int64_t kb = b0; kb < b1; ++kb) {
      const int64_t k = kb * 64 + 2 * lane;
      float v0 = 0.0f, v1 = 0.0f;
      bool inexact = false;
      if (k < A.K) {
        if (A.a_scale) {
          const uint8_t* src = static_cast<const uint8_t*>(A.a) + am * A.a_sM + k;
          const uint8_t s = A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, k >> 5)];
          const float sc = decode_ue8m0(s) * up;  // exact
          const float c0 = e4 ? decode_e4m3(src[0]) : decode_e5m2(src[0]);
          const float c1 = e4 ? decode_e4m3(src[1]) : decode_e5m2(src[1]);
          v0 = c0 * sc;
          v1 = c1 * sc;
          // NOTE: exact in fp32 unless the shift pushes a finite element past fp32's range (sc may
          // itself be +Inf there, and 0 * Inf is NaN); NaN codes and the NaN scale byte stay NaN.
          // bf16 misses an element only in a row spanning more than bf16's range (a scale byte
          // below lo and one near the top in the same row). Both send the row's CTAs to the exact
          // recomputation from the original operands.
          const bool finite_in = s != 255u;
          inexact = bf16_inexact(v0) || bf16_inexact(v1) || (finite_in && isfinite(c0) && !isfinite(v0)) ||
                    (finite_in && isfinite(c1) && !isfinite(v1));
        } else {
          const uint16_t* src = static_cast<const uint16_t*>(A.a) + am * A.a_sM + k;
          v0 = decode_bf16(src[0]);
          v1 = decode_bf16(src[1]);
        }
      }
      reinterpret_cast<uint32_t*>(const_cast<uint16_t*>(A.act) + m * A.Kp)[act_index(k, A.KT) >> 1] = act_pair_bf16(v0, v1);
      // one flag byte per (row, K block): the GEMM checks the blocks of its rows
      inexact = __any_sync(0xFFFFFFFFu, inexact);
      if (A.tok_flag && lane == 0) const_cast<uint8_t*>(A.tok_flag)[m * kblocks + kb] = inexact ? 1 : 0;
    }
  }
}

}  // namespace
}  // namespace lowbit::cuda
