// src/api/group_gemm.cpp: validation and dispatch of the grouped MXFP4 GEMM and its weight
// prepack (lowbit/gemm.hpp).
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

void group_gemm_mxfp4_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& lb,
                              const TensorView& packed_b, const TensorView& packed_scale, Stream stream) {
  Checker c{"group_gemm_mxfp4_prepack"};
  c.require(b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (b.ndim != 3 || b.shape[2] == 0 || b.shape[2] % 16 != 0 || b.shape[1] == 0)
    c.fail("b", "expected [groups, N, K/2] with K a positive multiple of 32, got " + b.describe());
  c.last_contiguous(b, "b");
  const int64_t G = b.shape[0], N = b.shape[1], K = 2 * b.shape[2];
  c.require(b_scale, Req("b_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
  check_expert_scale_layout(c, lb, "b_scale_layout");
  Mxfp4PackPlan p;
  plan_scales(c, b_scale, "b_scale", lb, G, N, K / 32, &p.spb, Checker::Batch::kFirst);
  ScalePlan out_plan;
  check_packed_weights(c, packed_b, "packed_b", packed_scale, "packed_scale", G, N, K, &out_plan);
  c.no_overlap({{"packed_b", &packed_b}, {"packed_scale", &packed_scale}}, {{"b", &b}, {"b_scale", &b_scale}});
  p.G = G; p.N = N; p.K = K;
  p.b = b.ptr<uint8_t>(); p.b_sG = b.strides[0]; p.b_sN = b.strides[1];
  p.b_scale = b_scale.ptr<uint8_t>();
  p.packed_b = static_cast<uint8_t*>(packed_b.data);
  p.packed_scale = static_cast<uint8_t*>(packed_scale.data);
  if (c.dev == Device::kCPU) {
    ref::mxfp4_prepack(p);
    return;
  }
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::mxfp4_prepack(p, stream.handle); });
}

void group_gemm_mxfp4_nt_groupwise(const GroupGemmArgs& x, Stream stream) {
  Checker c{"group_gemm_mxfp4_nt_groupwise"};
  c.require(x.a, Req("a").dtypes({DType::kE4M3, DType::kE5M2, DType::kBFloat16}).rank(2, "[cum_m, K]").last_contiguous());
  const int64_t M = x.a.shape[0], K = x.a.shape[1];
  if (K % 32 != 0 || K == 0) c.fail("a", "K = " + std::to_string(K) + " must be a positive multiple of 32 (the MX block)");
  c.require(x.b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (x.b.ndim != 3 || (!x.b_packed && x.b.shape[2] != K / 2))
    c.fail("b", "expected [groups, N, " + std::to_string(K / 2) + "], got " + x.b.describe());
  c.last_contiguous(x.b, "b");
  const int64_t G = x.b.shape[0];
  if (x.b_packed) c.present(x.out, "out");
  const int64_t N = x.b_packed ? (x.out.ndim == 2 ? x.out.shape[1] : 0) : x.b.shape[1];
  if (N % 8 != 0 || N == 0) c.fail(x.b_packed ? "out" : "b", "N = " + std::to_string(N) + " must be a positive multiple of 8");
  c.require(x.m_indptr, Req("m_indptr").dtypes({DType::kInt32, DType::kInt64}));
  if (x.m_indptr.ndim != 1 || x.m_indptr.shape[0] != G + 1 || x.m_indptr.strides[0] != 1)
    c.fail("m_indptr", "expected a contiguous [" + std::to_string(G + 1) + "] tensor (groups + 1), got " + x.m_indptr.describe());
  c.require(x.out, Req("out").dtypes({DType::kBFloat16, DType::kFloat16}).shape({M, N}).last_contiguous());

  GroupGemmPlan p;
  p.M = M; p.N = N; p.K = K; p.G = G;
  p.a = x.a.data;
  p.a_dtype = x.a.dtype;
  p.a_sM = x.a.strides[0];
  p.b = x.b.ptr<uint8_t>();
  p.b_sG = x.b.strides[0];
  p.b_sN = x.b.strides[1];
  p.m_indptr = x.m_indptr.data;
  p.indptr64 = x.m_indptr.dtype == DType::kInt64;
  std::vector<int64_t> indptr_copy;  // host m_indptr: the one copy that is validated and used
  p.out = x.out.data;
  p.out_dtype = x.out.dtype;
  p.o_sM = x.out.strides[0];
  if (x.a.dtype == DType::kBFloat16) {
    if (x.a_scale.present()) c.fail("a_scale", "bfloat16 activations (W4A16) take no scales");
  } else {
    c.require(x.a_scale, Req("a_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
    const ScaleLayout& la = x.a_scale_layout;
    if (!(la.kind == ScaleLayoutKind::kRowMajor && la.group_pad == GroupPad::kNone) &&
        !(la.kind == ScaleLayoutKind::kBlocked128x4 && la.group_pad != GroupPad::kNone))
      c.fail("a_scale_layout", "expected row_major or blocked128x4 with per-group padding");
    if (la.group_pad != GroupPad::kNone) check_groups(c, la, x.m_indptr, 1, M, &p.spa, &indptr_copy);
    plan_scales(c, x.a_scale, "a_scale", la, 1, M, K / 32, &p.spa, Checker::Batch::kFirst);
    p.a_scale = x.a_scale.ptr<uint8_t>();
  }
  if (x.m_indptr.device == Device::kCPU && (x.a.dtype == DType::kBFloat16 || x.a_scale_layout.group_pad == GroupPad::kNone)) {
    ScalePlan tmp;  // validates the boundaries (device-resident boundaries are trusted: no host sync)
    check_groups(c, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), x.m_indptr, 1, M, &tmp, &indptr_copy);
  }
  if (x.m_indptr.device == Device::kCPU) {  // the group bounds are read from the validated copy
    p.m_indptr = indptr_copy.data();
    p.indptr64 = true;
  }
  if (x.b_packed) {
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
                                   {"m_indptr", &x.m_indptr}});
  if (c.dev == Device::kCPU) {
    ref::group_gemm_mxfp4(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  require_aligned16(c, x.b, "b", {p.b_sG, p.b_sN});
  if (x.b_packed && reinterpret_cast<uintptr_t>(p.b_scale) % 8 != 0)
    c.fail("b_scale", "the CUDA kernel needs 8-byte aligned packed scales, got " + x.b_scale.describe());
  if (!x.b_packed && x.b_scale_layout.kind == ScaleLayoutKind::kBlocked128x4 && reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0)
    c.fail("b_scale", "the CUDA kernel needs a 4-byte aligned 128x4 scale tensor, got " + x.b_scale.describe());
#endif
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::group_gemm_mxfp4(p, stream.handle); });
}

}  // namespace lowbit
