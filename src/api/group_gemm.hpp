// src/api/group_gemm.hpp: checks shared by the grouped MXFP4 GEMM and the gpt-oss MoE MLPs (weights,
// the row layouts of m_counts).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "lowbit/mxfp4_pack.hpp"

namespace lowbit::detail {

/// Checks a group_gemm_mxfp4_prepack pair for G experts of N x K and returns the row-major plan
/// of its scales.
inline void check_packed_weights(Checker& c, const TensorView& b, const char* b_arg, const TensorView& s, const char* s_arg,
                                 int64_t G, int64_t N, int64_t K, ScalePlan* sp) {
  int64_t Np, Kp;
  if (!checked_mxfp4_packed_rows(N, &Np)) c.fail(b_arg, "the packed rows of N = " + std::to_string(N) + " overflow a 64-bit integer");
  if (!checked_mxfp4_packed_k(K, &Kp)) c.fail(b_arg, "the packed K of K = " + std::to_string(K) + " overflow a 64-bit integer");
  c.require(b, Req(b_arg).dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).shape({G, Np, Kp / 2}).contiguous("packed weights"));
  c.require(s, Req(s_arg).dtypes({DType::kUE8M0, DType::kUInt8}).shape({G, Np, Kp / 32}).contiguous("packed scales"));
  plan_scales(c, s, s_arg, ScaleLayout::row_major(), G, Np, Kp / 32, sp, Checker::Batch::kFirst);
}

/// Checks a group_gemm_mxfp4_prepack_fp8 pair for G experts of N x K: b [G, Np/128, Kq/128, 128, 64],
/// s [G, Np/128, Kq/128, 128, 4], both contiguous uint8.
inline void check_fp8_packed_weights(Checker& c, const TensorView& b, const char* b_arg, const TensorView& s,
                                     const char* s_arg, int64_t G, int64_t N, int64_t K) {
  int64_t Np, Kq;
  if (!checked_mxfp4_packed_rows(N, &Np)) c.fail(b_arg, "the packed rows of N = " + std::to_string(N) + " overflow a 64-bit integer");
  if (!checked_round_up(K, kMxfp4Fp8PackK, &Kq)) c.fail(b_arg, "the packed K of K = " + std::to_string(K) + " overflow a 64-bit integer");
  const int64_t rt = Np / kMxfp4PackRows, kt = Kq / kMxfp4Fp8PackK;
  c.require(b, Req(b_arg).dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).shape({G, rt, kt, kMxfp4PackRows, 64})
                   .contiguous("FP8-path packed weights (group_gemm_mxfp4_prepack_fp8)"));
  c.require(s, Req(s_arg).dtypes({DType::kUE8M0, DType::kUInt8}).shape({G, rt, kt, kMxfp4PackRows, 4})
                   .contiguous("FP8-path packed scales (group_gemm_mxfp4_prepack_fp8)"));
}

/// The element stride between consecutive rows of a 2-D [rows, C] tensor or of a 3-D
/// [G, rows_per_group, C] one (the masked layout) whose rows all lie at one stride: the batch
/// stride must be rows_per_group times the row stride (a contiguous tensor, or a row-sliced 2-D
/// buffer viewed as 3-D), so that row r of group g is row g * rows_per_group + r of one matrix.
inline int64_t uniform_row_stride(const Checker& c, const TensorView& t, const char* arg) {
  if (t.ndim == 2) return t.strides[0];
  if (t.shape[0] == 0 || t.shape[1] == 0) return t.strides[1];
  if (t.shape[1] == 1) return t.strides[0];
  if (t.shape[0] > 1 && t.strides[0] != t.shape[1] * t.strides[1])
    c.fail(arg, "the masked layout reads every row at one stride: the first dimension's stride must be " +
                    std::to_string(t.shape[1]) + " x the second's (e.g. a contiguous tensor), got " + t.describe());
  return t.strides[1];
}

/// The rows of a grouped operand (the grouped GEMM's a, the expert MLP's x): 2-D [rows, C] (the
/// contiguous layout) or 3-D [G, max_tokens, C] (the masked layout: a batch per group). Its dtype,
/// rank and storage order are checked by the caller.
struct GroupedRows {
  bool masked = false;
  int64_t rows = 0;        ///< every row (masked: G * max_tokens)
  int64_t cols = 0;        ///< C
  int64_t max_tokens = 0;  ///< masked: rows per group; else 0
};

inline GroupedRows grouped_rows(const Checker& c, const TensorView& t, const char* arg) {
  GroupedRows r;
  r.masked = t.ndim == 3;
  r.cols = t.shape[t.ndim - 1];
  r.max_tokens = r.masked ? t.shape[1] : 0;
  r.rows = r.masked ? c.mul(arg, t.shape[0], t.shape[1]) : t.shape[0];
  return r;
}

/// A masked operand has one batch per group (`group`: the word for one, "group" or "expert").
inline void check_batch_per_group(const Checker& c, const TensorView& t, const char* arg, const GroupedRows& r,
                                  int64_t G, const char* group) {
  if (r.masked && t.shape[0] != G)
    c.fail(arg, std::string("the masked layout takes one batch per ") + group + ": expected [" + std::to_string(G) +
                    ", max_tokens, " + std::to_string(r.cols) + "], got " + t.describe());
}

/// m_counts of G groups: int32 / int64, a contiguous [G] tensor (rows per `group`).
inline void check_group_counts(Checker& c, const TensorView& counts, int64_t G, const char* group) {
  c.require(counts, Req("m_counts").dtypes({DType::kInt32, DType::kInt64}));
  if (counts.ndim != 1 || counts.shape[0] != G || (G > 1 && counts.strides[0] != 1))
    c.fail("m_counts", "expected a contiguous [" + std::to_string(G) + "] tensor (rows per " + group + "), got " +
                           counts.describe());
}

/// The output of a grouped call with the rows of r and n columns: [G, max_tokens, n] (masked) or
/// [rows, n], last dimension contiguous, rows at one stride; returns that stride.
inline int64_t check_grouped_out(Checker& c, const TensorView& out, const DTypes& dtypes, const GroupedRows& r,
                                 int64_t G, int64_t n) {
  if (r.masked)
    c.require(out, Req("out").dtypes(dtypes).shape({G, r.max_tokens, n}).last_contiguous());
  else
    c.require(out, Req("out").dtypes(dtypes).shape({r.rows, n}).last_contiguous());
  return uniform_row_stride(c, out, "out");
}

/// Host per-group row counts [G] (int32 / int64), copied once and validated: non-negative and,
/// with max_tokens > 0 (masked layout), at most max_tokens each, else (contiguous layout) at most
/// `rows` together. Returns the compact group bounds [G+1] (int64): the one copy that is used.
inline std::vector<int64_t> host_count_bounds(const Checker& c, const TensorView& counts, const char* arg, int64_t G,
                                              int64_t rows, int64_t max_tokens) {
  std::vector<int64_t> ind(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t v = counts.dtype == DType::kInt64 ? counts.ptr<int64_t>()[g] : int64_t(counts.ptr<int32_t>()[g]);
    if (v < 0) c.fail(arg, "count " + std::to_string(v) + " of group " + std::to_string(g) + " is negative");
    if (max_tokens > 0 && v > max_tokens)
      c.fail(arg, "count " + std::to_string(v) + " of group " + std::to_string(g) + " exceeds max_tokens = " +
                      std::to_string(max_tokens) + " (the rows of each group's batch)");
    if (max_tokens == 0 && v > rows - ind[size_t(g)])
      c.fail(arg, "the counts of groups 0.." + std::to_string(g) + " add up to more than the " + std::to_string(rows) +
                      " rows given");
    ind[size_t(g + 1)] = ind[size_t(g)] + v;
  }
  return ind;
}

/// The layout of per-expert weight scales: row-major or 128x4 blocked, not grouped.
inline void check_expert_scale_layout(const Checker& c, const ScaleLayout& l, const char* arg) {
  if (l.group_pad != GroupPad::kNone || (l.kind != ScaleLayoutKind::kRowMajor && l.kind != ScaleLayoutKind::kBlocked128x4))
    c.fail(arg, "expected row_major or blocked128x4 (per expert)");
}

#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
/// The CUDA kernels read weight rows with 16-byte copies.
inline void require_aligned16(const Checker& c, const TensorView& t, const char* arg, std::initializer_list<int64_t> byte_strides) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int64_t s : byte_strides) ok = ok && s % 16 == 0;
  if (!ok) c.fail(arg, "the CUDA kernel needs a 16-byte aligned base and row/batch strides that are multiples of 16 bytes, got " + t.describe());
}

/// The CUDA kernels read weight scales (b_scale, data at `scales`) packed with 8-byte copies and a
/// 128x4 blocked tensor with 4-byte ones.
inline void require_scale_alignment(const Checker& c, const TensorView& b_scale, const uint8_t* scales, bool packed,
                                    const ScaleLayout& layout) {
  if (packed && reinterpret_cast<uintptr_t>(scales) % 8 != 0)
    c.fail("b_scale", "the CUDA kernel needs 8-byte aligned packed scales, got " + b_scale.describe());
  if (!packed && layout.kind == ScaleLayoutKind::kBlocked128x4 && reinterpret_cast<uintptr_t>(scales) % 4 != 0)
    c.fail("b_scale", "the CUDA kernel needs a 4-byte aligned 128x4 scale tensor, got " + b_scale.describe());
}
#endif

}  // namespace lowbit::detail
