// src/api/group_gemm.cpp: validation and dispatch of the grouped MXFP4 GEMM (its three row layouts:
// m_indptr, contiguous m_counts, masked m_counts) and its weight prepack (lowbit/moe.hpp).
#include <cstdint>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "api/group_gemm.hpp"
#include "lowbit/moe.hpp"
#include "ref/ref_moe.hpp"
#include "cuda/moe/launch_moe.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds

namespace lowbit {
using namespace detail;

namespace {

/// Both weight prepacks (the exact path's layout, fp8 = false, and the FP8 tensor-core path's): the
/// same inputs and plan, only the packed outputs' shapes and the kernel differ.
void prepack(const char* op, bool fp8, const TensorView& b, const TensorView& b_scale, const ScaleLayout& lb,
             const TensorView& packed_b, const TensorView& packed_scale, Stream stream) {
  Checker c{op};
  c.require(b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (b.ndim != 3 || b.shape[2] == 0 || b.shape[2] % 16 != 0 || b.shape[1] == 0)
    c.fail("b", "expected [groups, N, K/2] with K a positive multiple of 32, got " + b.describe());
  c.last_contiguous(b, "b");
  const int64_t G = b.shape[0], N = b.shape[1], K = 2 * b.shape[2];
  c.require(b_scale, Req("b_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
  check_expert_scale_layout(c, lb, "b_scale_layout");
  Mxfp4PackPlan p;
  plan_scales(c, b_scale, "b_scale", lb, G, N, K / 32, &p.spb, Checker::Batch::kFirst);
  if (fp8) {
    check_fp8_packed_weights(c, packed_b, "packed_b", packed_scale, "packed_scale", G, N, K);
  } else {
    ScalePlan out_plan;
    check_packed_weights(c, packed_b, "packed_b", packed_scale, "packed_scale", G, N, K, &out_plan);
  }
  c.no_overlap({{"packed_b", &packed_b}, {"packed_scale", &packed_scale}}, {{"b", &b}, {"b_scale", &b_scale}});
  p.G = G; p.N = N; p.K = K;
  p.b = b.ptr<uint8_t>(); p.b_sG = b.strides[0]; p.b_sN = b.strides[1];
  p.b_scale = b_scale.ptr<uint8_t>();
  p.packed_b = static_cast<uint8_t*>(packed_b.data);
  p.packed_scale = static_cast<uint8_t*>(packed_scale.data);
  if (c.dev == Device::kCPU) {
    if (fp8)
      ref::mxfp4_prepack_fp8(p);
    else
      ref::mxfp4_prepack(p);
    return;
  }
  run_on_device<Kernels::kSm90Gemm>(c, [&] {
    return fp8 ? cuda::mxfp4_prepack_fp8(p, stream.handle) : cuda::mxfp4_prepack(p, stream.handle);
  });
}

}  // namespace

void group_gemm_mxfp4_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& lb,
                              const TensorView& packed_b, const TensorView& packed_scale, Stream stream) {
  prepack("group_gemm_mxfp4_prepack", false, b, b_scale, lb, packed_b, packed_scale, stream);
}

void group_gemm_mxfp4_prepack_fp8(const TensorView& b, const TensorView& b_scale, const ScaleLayout& lb,
                                  const TensorView& packed_b, const TensorView& packed_scale, Stream stream) {
  prepack("group_gemm_mxfp4_prepack_fp8", true, b, b_scale, lb, packed_b, packed_scale, stream);
}

void group_gemm_mxfp4_nt_groupwise(const GroupGemmArgs& x, Stream stream) {
  Checker c{"group_gemm_mxfp4_nt_groupwise"};
  c.require(x.a, Req("a").dtypes({DType::kE4M3, DType::kE5M2, DType::kBFloat16})
                     .rank(2, 3, "[cum_m, K] or (masked layout) [G, max_tokens, K]").last_contiguous());
  const GroupedRows ar = grouped_rows(c, x.a, "a");
  const bool masked = ar.masked;
  const int64_t K = ar.cols, max_tokens = ar.max_tokens, M = ar.rows;  // M: rows of a
  if (K % 32 != 0 || K == 0) c.fail("a", "K = " + std::to_string(K) + " must be a positive multiple of 32 (the MX block)");
  const int64_t a_sM = uniform_row_stride(c, x.a, "a");
  if (x.precision != GemmPrecision::kExact && x.precision != GemmPrecision::kFp8TensorCores)
    c.fail("precision", "expected kExact or kFp8TensorCores, got " + std::to_string(int(x.precision)));
  const bool fp8 = x.precision == GemmPrecision::kFp8TensorCores;
  if (fp8 && x.a.dtype == DType::kBFloat16)
    c.fail("precision", "kFp8TensorCores takes MXFP8 activations (float8_e4m3fn / float8_e5m2 codes with a_scale), "
                        "got bfloat16 a: use kExact for bf16 activations");
  c.require(x.b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (fp8 && !x.b_packed)
    throw NotSupportedError(std::string(c.op) + ": precision kFp8TensorCores reads the weights only in the FP8-path "
                            "packed layout: pass group_gemm_mxfp4_prepack_fp8's outputs as b / b_scale with "
                            "b_packed = true");
  if (fp8) {
    if (x.b.ndim != 5)
      c.fail("b", "precision kFp8TensorCores takes the FP8-path packed layout [groups, Np/128, Kq/128, 128, 64] "
                  "(group_gemm_mxfp4_prepack_fp8; group_gemm_mxfp4_prepack's layout is the exact path's), got " +
                      x.b.describe());
  } else if (x.b.ndim != 3 || (!x.b_packed && x.b.shape[2] != K / 2)) {
    c.fail("b", "expected [groups, N, " + std::to_string(K / 2) + "], got " + x.b.describe());
  }
  c.last_contiguous(x.b, "b");
  const int64_t G = x.b.shape[0];
  if (x.b_packed) c.present(x.out, "out");
  const int64_t N = x.b_packed ? (x.out.ndim == x.a.ndim ? x.out.shape[x.out.ndim - 1] : 0) : x.b.shape[1];
  if (N % 8 != 0 || N == 0) c.fail(x.b_packed ? "out" : "b", "N = " + std::to_string(N) + " must be a positive multiple of 8");
  const bool counts = x.m_counts.present();
  if (counts && x.m_indptr.present()) c.fail("m_counts", "give either m_indptr or m_counts, not both");
  if (masked && !counts)
    c.fail("m_counts", "is required with a 3-D a [G, max_tokens, K] (the masked layout: rows per group)");
  check_batch_per_group(c, x.a, "a", ar, G, "group");
  if (counts) {
    check_group_counts(c, x.m_counts, G, "group");
  } else {
    c.require(x.m_indptr, Req("m_indptr").dtypes({DType::kInt32, DType::kInt64}));
    if (x.m_indptr.ndim != 1 || x.m_indptr.shape[0] != G + 1 || x.m_indptr.strides[0] != 1)
      c.fail("m_indptr", "expected a contiguous [" + std::to_string(G + 1) + "] tensor (groups + 1), got " + x.m_indptr.describe());
  }
  if (x.expected_m < 0) c.fail("expected_m", "expected a count >= 0 (0: max_tokens), got " + std::to_string(x.expected_m));
  const int64_t o_sM = check_grouped_out(c, x.out, {DType::kBFloat16, DType::kFloat16}, ar, G, N);

  GroupGemmPlan p;
  p.M = M; p.N = N; p.K = K; p.G = G;
  p.a = x.a.data;
  p.a_dtype = x.a.dtype;
  p.a_sM = a_sM;
  p.b = x.b.ptr<uint8_t>();
  p.b_sG = x.b.strides[0];
  p.b_sN = x.b.strides[1];
  p.m_indptr = x.m_indptr.data;
  p.indptr64 = x.m_indptr.dtype == DType::kInt64;
  p.max_tokens = max_tokens;
  p.expected_m = x.expected_m;
  std::vector<int64_t> indptr_copy;  // host m_indptr / counts: the one copy that is validated and used
  p.out = x.out.data;
  p.out_dtype = x.out.dtype;
  p.o_sM = o_sM;
  if (x.a.dtype == DType::kBFloat16) {
    if (x.a_scale.present()) c.fail("a_scale", "bfloat16 activations (W4A16) take no scales");
  } else {
    c.require(x.a_scale, Req("a_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
    const ScaleLayout& la = x.a_scale_layout;
    if (!(la.kind == ScaleLayoutKind::kRowMajor && la.group_pad == GroupPad::kNone) &&
        !(la.kind == ScaleLayoutKind::kBlocked128x4 && la.group_pad != GroupPad::kNone))
      c.fail("a_scale_layout", "expected row_major or blocked128x4 with per-group padding");
    if (counts && la.kind != ScaleLayoutKind::kRowMajor)
      c.fail("a_scale_layout", "the m_counts layouts take row_major activation scales (the per-group padded 128x4 "
                               "layout is defined by m_indptr)");
    if (la.group_pad != GroupPad::kNone) check_groups(c, la, x.m_indptr, 1, M, &p.spa, &indptr_copy);
    plan_scales(c, x.a_scale, "a_scale", la, 1, M, K / 32, &p.spa, Checker::Batch::kFirst);
    p.a_scale = x.a_scale.ptr<uint8_t>();
  }
  if (counts) {
    if (x.m_counts.device == Device::kCPU) {  // validated here; device counts are clamped by the kernels (no host sync)
      indptr_copy = host_count_bounds(c, x.m_counts, "m_counts", G, M, max_tokens);
      p.m_indptr = indptr_copy.data();
      p.indptr64 = true;
    } else {
      p.m_indptr = nullptr;
      p.counts = x.m_counts.data;
      p.counts64 = x.m_counts.dtype == DType::kInt64;
    }
  } else {
    if (x.m_indptr.device == Device::kCPU && (x.a.dtype == DType::kBFloat16 || x.a_scale_layout.group_pad == GroupPad::kNone)) {
      ScalePlan tmp;  // validates the boundaries (device-resident boundaries are trusted: no host sync)
      check_groups(c, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), x.m_indptr, 1, M, &tmp, &indptr_copy);
    }
    if (x.m_indptr.device == Device::kCPU) {  // the group bounds are read from the validated copy
      p.m_indptr = indptr_copy.data();
      p.indptr64 = true;
    }
  }
  if (fp8) {
    check_fp8_packed_weights(c, x.b, "b", x.b_scale, "b_scale", G, N, K);
    p.b_packed = true;
    p.fp8 = true;
  } else if (x.b_packed) {
    check_packed_weights(c, x.b, "b", x.b_scale, "b_scale", G, N, K, &p.spb);
    p.b_packed = true;
  } else {
    c.require(x.b_scale, Req("b_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
    const ScaleLayout& lb = x.b_scale_layout;
    check_expert_scale_layout(c, lb, "b_scale_layout");
    plan_scales(c, x.b_scale, "b_scale", lb, G, N, K / 32, &p.spb, Checker::Batch::kFirst);
  }
  p.b_scale = x.b_scale.ptr<uint8_t>();
  c.no_overlap({{"out", &x.out}}, {{"a", &x.a}, {"a_scale", &x.a_scale}, {"b", &x.b}, {"b_scale", &x.b_scale},
                                   {"m_indptr", &x.m_indptr}, {"m_counts", &x.m_counts}});
  if (c.dev == Device::kCPU) {
    ref::group_gemm_mxfp4(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  if (fp8) {  // the FP8 path's CUDA kernel: activation tiles by TMA, weight tiles by bulk copies
    if (reinterpret_cast<uintptr_t>(x.a.data) % 16 != 0 || a_sM % 16 != 0)
      throw NotSupportedError(std::string(c.op) + ": precision kFp8TensorCores on CUDA reads a by TMA: it needs a "
                              "16-byte aligned base and a row stride that is a multiple of 16 bytes, got " + x.a.describe());
    if (M >= (int64_t(1) << 31))
      throw NotSupportedError(std::string(c.op) + ": precision kFp8TensorCores on CUDA reads a by TMA: it needs fewer "
                              "than 2^31 rows, got " + std::to_string(M));
    if (reinterpret_cast<uintptr_t>(x.b.data) % 16 != 0 || reinterpret_cast<uintptr_t>(x.b_scale.data) % 16 != 0)
      throw NotSupportedError(std::string(c.op) + ": precision kFp8TensorCores on CUDA needs 16-byte aligned packed "
                              "weights and scales (the outputs of group_gemm_mxfp4_prepack_fp8 are), got " +
                              x.b.describe() + " and " + x.b_scale.describe());
  } else {
    require_aligned16(c, x.b, "b", {p.b_sG, p.b_sN});
  }
  require_scale_alignment(c, x.b_scale, p.b_scale, x.b_packed, x.b_scale_layout);
#endif
  run_on_device<Kernels::kSm90Gemm>(
      c, [&] { return fp8 ? cuda::group_gemm_mxfp4_fp8(p, stream.handle) : cuda::group_gemm_mxfp4(p, stream.handle); });
}

}  // namespace lowbit
