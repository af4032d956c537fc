// src/core/checked.hpp: overflow-checked size arithmetic for the host-side argument checks.
//
// Every size the API derives from caller-given numbers (shapes, R / C / M / K / L / groups) goes
// through these helpers before the LOWBIT_HOST_DEVICE arithmetic of scale_layout.hpp is used on
// it, so that arithmetic only ever sees values whose results fit in int64. Host only.
#pragma once

#include <cstdint>

#include "lowbit/mxfp4_pack.hpp"
#include "lowbit/scale_layout.hpp"

namespace lowbit::detail {

/// *r = a * b; false on int64 overflow.
inline bool checked_mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }
/// *r = a + b; false on int64 overflow.
inline bool checked_add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }

/// *r = round_up(x, m) for x >= 0, m > 0; false on overflow.
inline bool checked_round_up(int64_t x, int64_t m, int64_t* r) {
  int64_t t;
  if (x < 0 || m <= 0 || !checked_add(x, m - 1, &t)) return false;
  *r = t / m * m;
  return true;
}

/// scale_rows_padded(l, R) for R >= 0; false on overflow.
inline bool checked_scale_rows_padded(const ScaleLayout& l, int64_t R, int64_t* r) {
  switch (l.kind) {
    case ScaleLayoutKind::kRowMajor: *r = R; return R >= 0;
    case ScaleLayoutKind::kColMajor: return checked_round_up(R, l.row_align, r);
    case ScaleLayoutKind::kBlocked128x4: return checked_round_up(R, 128, r);
    case ScaleLayoutKind::kBlocked8x4: return checked_round_up(R, 8, r);
  }
  return false;
}

/// scale_cols_padded(l, C) for C >= 0; false on overflow.
inline bool checked_scale_cols_padded(const ScaleLayout& l, int64_t C, int64_t* r) {
  if (l.kind == ScaleLayoutKind::kBlocked128x4 || l.kind == ScaleLayoutKind::kBlocked8x4) return checked_round_up(C, 4, r);
  *r = C;
  return C >= 0;
}

/// grouped_rows_alloc(p, M, G) for M >= 0, G >= 0; false on overflow.
inline bool checked_grouped_rows_alloc(GroupPad p, int64_t M, int64_t G, int64_t* r) {
  int64_t pad, t;
  if (M < 0 || G < 0 || !checked_mul(G, 127, &pad) || !checked_add(M, pad, &t)) return false;
  if (p == GroupPad::kFlashInfer) {
    *r = t / 128 * 128;
    return true;
  }
  return checked_round_up(t, 128, r);
}

/// mxfp4_packed_rows(N) / mxfp4_packed_k(K) for N, K >= 0; false on overflow.
inline bool checked_mxfp4_packed_rows(int64_t N, int64_t* r) { return checked_round_up(N, kMxfp4PackRows, r); }
inline bool checked_mxfp4_packed_k(int64_t K, int64_t* r) { return checked_round_up(K, kMxfp4PackK, r); }

}  // namespace lowbit::detail
