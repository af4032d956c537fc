// lowbit/scale_layout.hpp: where scale (r, c) of an R x C scale matrix lives in memory.
//
// R is the number of rows (M or N), C = K / block the number of scale columns.
//  * kRowMajor       offset = r*C + c                                  size R*C
//  * kColMajor       offset = c*Rp + r, Rp = round_up(R, row_align)    size C*Rp
//                    (row_align 4 for fp32 / 16 for 1-byte scales makes TMA strides 16-byte aligned)
//  * kBlocked128x4   cuBLAS / CUTLASS SM100 / FlashInfer layout_128x4 / torchao to_blocked:
//                    R padded to 128, C to 4 (zeros), one 512-byte atom per (128-row, 4-col) tile,
//                    offset = ((r/128)*(Cp/4) + c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4.
//                    Per batch it is byte-identical to the 6-D [32,4,R/128,4,Cp/4,L] view.
//  * kBlocked8x4     FlashInfer's small-M layout: offset = (r/8)*(Cp/4)*32 + (c/4)*32 + (r%8)*4 + c%4.
//
// Grouped GEMM (MoE): rows are split into groups by m_indptr[0..G]; each group's rows are placed
// at a padded start so that every group begins on a 128-row tile of a kBlocked128x4 matrix:
//  * GroupPad::kFlashInfer  start(g) = (m_indptr[g] + g*127) / 128 * 128   (FlashInfer's rule)
//  * GroupPad::kCumsum      start(g) = sum_{i<g} round_up(m_i, 128)       (torchao's rule)
// The two differ (sizes 127,127 -> starts 0,128 vs 0,128 but ends 384 vs 256); both are offered.
#pragma once

#include "lowbit/config.hpp"

namespace lowbit {

enum class ScaleLayoutKind : uint8_t { kRowMajor, kColMajor, kBlocked128x4, kBlocked8x4 };
enum class GroupPad : uint8_t { kNone, kFlashInfer, kCumsum };

struct ScaleLayout {
  ScaleLayoutKind kind = ScaleLayoutKind::kRowMajor;
  int32_t row_align = 1;  ///< kColMajor only: rows padded to a multiple of this
  GroupPad group_pad = GroupPad::kNone;  ///< kBlocked128x4 only, with m_indptr

  static constexpr ScaleLayout row_major() { return {ScaleLayoutKind::kRowMajor, 1, GroupPad::kNone}; }
  static constexpr ScaleLayout col_major(int row_align = 1) { return {ScaleLayoutKind::kColMajor, row_align, GroupPad::kNone}; }
  static constexpr ScaleLayout blocked128x4(GroupPad g = GroupPad::kNone) { return {ScaleLayoutKind::kBlocked128x4, 1, g}; }
  static constexpr ScaleLayout blocked8x4() { return {ScaleLayoutKind::kBlocked8x4, 1, GroupPad::kNone}; }
};

// The size helpers below do unchecked int64 arithmetic (they run in kernels too): the API checks
// every size it derives from caller-given numbers with the overflow-checked versions in
// src/core/checked.hpp first, so these only ever see values whose results fit.
LOWBIT_HOST_DEVICE constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
LOWBIT_HOST_DEVICE constexpr int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

/// Rows of the stored matrix (padding included) for R logical rows (no groups).
LOWBIT_HOST_DEVICE constexpr int64_t scale_rows_padded(const ScaleLayout& l, int64_t R) {
  switch (l.kind) {
    case ScaleLayoutKind::kRowMajor: return R;
    case ScaleLayoutKind::kColMajor: return round_up(R, l.row_align);
    case ScaleLayoutKind::kBlocked128x4: return round_up(R, 128);
    case ScaleLayoutKind::kBlocked8x4: return round_up(R, 8);
  }
  return R;
}

LOWBIT_HOST_DEVICE constexpr int64_t scale_cols_padded(const ScaleLayout& l, int64_t C) {
  return (l.kind == ScaleLayoutKind::kBlocked128x4 || l.kind == ScaleLayoutKind::kBlocked8x4) ? round_up(C, 4) : C;
}

/// Elements of one stored scale matrix of Rp padded rows (see scale_rows_padded / grouped rows).
LOWBIT_HOST_DEVICE constexpr int64_t scale_size_rows(const ScaleLayout& l, int64_t Rp, int64_t C) {
  return Rp * scale_cols_padded(l, C);
}

LOWBIT_HOST_DEVICE constexpr int64_t scale_size(const ScaleLayout& l, int64_t R, int64_t C) {
  return scale_size_rows(l, scale_rows_padded(l, R), C);
}

/// Offset of (r, c) in a stored matrix with Rp padded rows and C logical columns.
LOWBIT_HOST_DEVICE constexpr int64_t scale_offset(const ScaleLayout& l, int64_t Rp, int64_t C, int64_t r, int64_t c) {
  switch (l.kind) {
    case ScaleLayoutKind::kRowMajor: return r * C + c;
    case ScaleLayoutKind::kColMajor: return c * Rp + r;
    case ScaleLayoutKind::kBlocked128x4: {
      const int64_t cp4 = ceil_div(C, 4);
      return ((r >> 7) * cp4 + (c >> 2)) * 512 + (r & 31) * 16 + ((r & 127) >> 5) * 4 + (c & 3);
    }
    case ScaleLayoutKind::kBlocked8x4: {
      const int64_t cp4 = ceil_div(C, 4);
      return (r >> 3) * cp4 * 32 + (c >> 2) * 32 + (r & 7) * 4 + (c & 3);
    }
  }
  return 0;
}

/// Inverse of scale_offset over the padded matrix: the (r, c) stored at `offset`.
LOWBIT_HOST_DEVICE constexpr void scale_coords(const ScaleLayout& l, int64_t Rp, int64_t C, int64_t offset,
                                               int64_t* r, int64_t* c) {
  const int64_t Cp = scale_cols_padded(l, C);
  switch (l.kind) {
    case ScaleLayoutKind::kRowMajor: *r = offset / C; *c = offset % C; return;
    case ScaleLayoutKind::kColMajor: *c = offset / Rp; *r = offset % Rp; return;
    case ScaleLayoutKind::kBlocked128x4: {
      const int64_t atom = offset >> 9, in = offset & 511, cp4 = Cp / 4;
      *r = (atom / cp4) * 128 + ((in >> 2) & 3) * 32 + (in >> 4);
      *c = (atom % cp4) * 4 + (in & 3);
      return;
    }
    case ScaleLayoutKind::kBlocked8x4: {
      const int64_t cp4 = Cp / 4, tile = offset >> 5, in = offset & 31;
      *r = (tile / cp4) * 8 + (in >> 2);
      *c = (tile % cp4) * 4 + (in & 3);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Grouped (MoE) padding

/// Padded start row of group g (0 <= g <= G) given the group boundaries m_indptr[0..G].
template <typename IndT>
LOWBIT_HOST_DEVICE int64_t group_padded_start(GroupPad p, const IndT* m_indptr, int64_t g) {
  if (p == GroupPad::kFlashInfer) return (int64_t(m_indptr[g]) + g * 127) / 128 * 128;
  if (p == GroupPad::kCumsum) {
    int64_t s = 0;
    for (int64_t i = 0; i < g; ++i) s += round_up(int64_t(m_indptr[i + 1]) - int64_t(m_indptr[i]), 128);
    return s;
  }
  return int64_t(m_indptr[g]);
}

/// Stored rows that a caller must allocate for M total rows in G groups without reading
/// m_indptr (no host sync): exact for kFlashInfer, an upper bound for kCumsum.
LOWBIT_HOST_DEVICE constexpr int64_t grouped_rows_alloc(GroupPad p, int64_t M, int64_t G) {
  return p == GroupPad::kFlashInfer ? (M + G * 127) / 128 * 128 : round_up(M + G * 127, 128);
}

/// Group of row r (m_indptr non-decreasing, m_indptr[0] <= r < m_indptr[G]): binary search.
template <typename IndT>
LOWBIT_HOST_DEVICE int64_t group_of_row(const IndT* m_indptr, int64_t G, int64_t r) {
  int64_t lo = 0, hi = G;  // invariant: m_indptr[lo] <= r < m_indptr[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (int64_t(m_indptr[mid]) <= r) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace lowbit
