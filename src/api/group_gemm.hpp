// src/api/group_gemm.hpp: checks shared by the grouped MXFP4 GEMM and the gpt-oss MoE MLP.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

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
#endif

}  // namespace lowbit::detail
