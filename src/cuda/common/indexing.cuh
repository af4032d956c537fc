// src/cuda/common/indexing.cuh: index arithmetic of the sm_90a kernels: fast 32-bit division
// by run-time constants and the row maps of grouped (MoE) scale layouts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/plan.hpp"

namespace lowbit::cuda {

/// Unsigned 32-bit division by a run-time constant (n < 2^32): q = (umulhi(n, m) + n) >> s.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    s = 0;
    while ((uint64_t(1) << s) < div) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - div)) / div + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return uint32_t((uint64_t(__umulhi(n, m)) + n) >> s);
  }
};

namespace dev {

// ---------------------------------------------------------------------------------------------
// grouped (MoE) layouts: padded starts in shared memory

/// Group boundaries and padded starts of a grouped ScalePlan, staged in shared memory by
/// stage(); row maps then cost a binary search over G+1 shared entries.
struct GroupMap {
  const int64_t* ind = nullptr;    // [G+1] m_indptr (shared)
  const int64_t* start = nullptr;  // [G+1] padded starts (shared)
  int64_t G = 0;

  /// Stored row of logical row r.
  __device__ __forceinline__ int64_t stored_row(int64_t r) const {
    int64_t lo = 0, hi = G;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (ind[mid] <= r) lo = mid; else hi = mid;
    }
    return start[lo] + (r - ind[lo]);
  }
  /// Logical row stored at row s, or -1 for a padding row.
  __device__ __forceinline__ int64_t logical_row(int64_t s) const {
    int64_t lo = 0, hi = G;  // largest g < G with start[g] <= s
    if (s < start[0]) return -1;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) >> 1;
      if (start[mid] <= s) lo = mid; else hi = mid;
    }
    const int64_t off = s - start[lo];
    return off < ind[lo + 1] - ind[lo] ? ind[lo] + off : -1;
  }
};

/// Largest G whose map is staged in shared memory (2 x 8 B x (G+1)).
constexpr int64_t kMaxSmemGroups = 2047;
/// Shared bytes of one staged map: ind + start (G+1 each) + 1024 scan slots.
inline size_t group_smem_bytes(const detail::ScalePlan& sp) {
  return sp.groups > 0 ? size_t(8 * (2 * (sp.groups + 1) + 1024)) : 0;
}

/// Stages m_indptr and the padded starts (exclusive scan for kCumsum) in `smem`; all threads
/// of the CTA call it (it synchronises).
__device__ inline GroupMap stage_groups(const detail::ScalePlan& sp, int64_t* smem) {
  GroupMap g;
  g.G = sp.groups;
  if (sp.groups == 0) return g;
  const int64_t n = sp.groups + 1;
  int64_t* ind = smem;
  int64_t* st = smem + n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    ind[i] = sp.indptr64 ? static_cast<const int64_t*>(sp.m_indptr)[i]
                         : int64_t(static_cast<const int32_t*>(sp.m_indptr)[i]);
  __syncthreads();
  if (sp.layout.group_pad == GroupPad::kFlashInfer) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st[i] = (ind[i] + i * 127) / 128 * 128;
  } else if (sp.layout.group_pad == GroupPad::kCumsum) {
    // st[g] = sum_{i<g} round_up(m_i, 128): each thread scans a contiguous piece, then the
    // piece totals are scanned by thread 0 over at most blockDim pieces.
    int64_t* piece = smem + 2 * n;  // blockDim.x <= 1024 slots
    const int64_t per = (n + blockDim.x - 1) / blockDim.x;
    const int64_t b = threadIdx.x * per, e = b + per < n ? b + per : n;
    int64_t s = 0;
    for (int64_t i = b; i < e; ++i) {
      st[i] = s;
      if (i + 1 < n) s += round_up(ind[i + 1] - ind[i], 128);
    }
    piece[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t acc = 0;
      for (unsigned t = 0; t < blockDim.x; ++t) {
        const int64_t v = piece[t];
        piece[t] = acc;
        acc += v;
      }
    }
    __syncthreads();
    for (int64_t i = b; i < e; ++i) st[i] += piece[threadIdx.x];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st[i] = ind[i];
  }
  __syncthreads();
  g.ind = ind;
  g.start = st;
  return g;
}

/// Offset of logical (l, r, c) in plan sp (grouped: through the staged map).
__device__ __forceinline__ int64_t scale_off(const detail::ScalePlan& sp, const GroupMap& gm, int64_t l, int64_t r,
                                             int64_t c) {
  const int64_t sr = sp.groups > 0 ? gm.stored_row(r) : r;
  return l * sp.batch_stride + scale_offset(sp.layout, sp.rows_pad, sp.cols, sr, c);
}

}  // namespace dev
}  // namespace lowbit::cuda
