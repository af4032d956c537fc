// src/cuda/moe/group_layout.cuh: the m_counts row layouts of the grouped GEMM and of the expert MLP
// on the device (lowbit/moe.hpp, docs/moe_ep.md): per-group row counts -> compact group bounds,
// read and clamped on the GPU, no host synchronisation (CUDA-graph safe).
//
// Every kernel downstream works in the compact row space: group g holds compact rows
// indptr[g] .. indptr[g+1]-1, and the activation pre-pass, the GEMM tiles, split-K and its
// finalize address those rows only, so the work follows the counts. Only the reads of the
// original activations and the final output stores map a compact row m of group g back to its
// row of the caller's tensors: m itself (contiguous layout) or g * max_tokens + (m - indptr[g])
// (masked layout, GroupArgs::a_pitch / o_pitch). Rows outside the counts are never touched.
//
// No CUTLASS here: the host emulation compiles this file for the CPU
// (tests/cpp/emu/emu_test_moe_layout.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {
namespace {

/// A device count as the kernels use it: below 0 -> 0; masked layout (max_tokens > 0): above
/// max_tokens -> max_tokens; contiguous layout: above `rows` -> rows (the group then ends at row
/// `rows` anyway).
__host__ __device__ __forceinline__ int64_t clamp_count(int64_t c, int64_t rows, int64_t max_tokens) {
  const int64_t cap = max_tokens > 0 ? max_tokens : rows;
  return c < 0 ? 0 : (c > cap ? cap : c);
}

/// One warp: indptr[0] = 0, indptr[g+1] = min(indptr[g] + clamp_count(counts[g]), rows) for
/// g < G (counts int32 or int64; IndT the bounds' type). `rows`: the rows of the caller's
/// activation tensor (masked: G x max_tokens, which the clamped counts never exceed). Launch
/// with one block of 32 threads.
template <typename IndT>
__global__ void counts_to_indptr_kernel(const void* counts, bool counts64, int64_t G, int64_t rows, int64_t max_tokens,
                                        IndT* indptr) {
  const int lane = int(threadIdx.x & 31);
  if (lane == 0) indptr[0] = IndT(0);
  int64_t carry = 0;  // indptr of the first group of the chunk
  for (int64_t c0 = 0; c0 < G; c0 += 32) {
    const int64_t g = c0 + lane;
    int64_t v = 0;
    if (g < G) {
      const int64_t raw = counts64 ? static_cast<const int64_t*>(counts)[g] : int64_t(static_cast<const int32_t*>(counts)[g]);
      v = clamp_count(raw, rows, max_tokens);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {  // inclusive scan over the lanes, saturated at rows (no overflow)
      const int64_t t = __shfl_up_sync(0xFFFFFFFFu, v, o);
      if (lane >= o) v = v + t < rows ? v + t : rows;
    }
    const int64_t end = carry + v < rows ? carry + v : rows;
    if (g < G) indptr[g + 1] = IndT(end);
    const int64_t total = __shfl_sync(0xFFFFFFFFu, v, 31);
    carry = carry + total < rows ? carry + total : rows;
  }
}

}  // namespace
}  // namespace lowbit::cuda
