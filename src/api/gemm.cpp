// src/api/gemm.cpp: validation and dispatch of the GEMM ops (lowbit/gemm.hpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <initializer_list>

#include "api/check.hpp"
#include "api/device.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/mxfp4_pack.hpp"
#include "ref/ref_gemm.hpp"
#include "cuda/gemm/launch_gemm.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds

namespace lowbit {
using namespace detail;

namespace {

#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
/// The CUDA kernels read weight rows with 16-byte copies.
void require_aligned16(const Checker& c, const TensorView& t, const char* arg, std::initializer_list<int64_t> byte_strides) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int64_t s : byte_strides) ok = ok && s % 16 == 0;
  if (!ok) c.fail(arg, "the CUDA kernel needs a 16-byte aligned base and row/batch strides that are multiples of 16 bytes, got " + t.describe());
}
#endif

/// A packed NVFP4 operand [R, K/2, L] or [R, K/2]: rows, L, row and batch strides (bytes).
struct Operand {
  int64_t R = 0, Kb = 0, L = 1, sR = 0, sL = 0;
};

Operand fp4_operand(Checker& c, const TensorView& t, const char* arg) {
  c.require(t, Req(arg).dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).rank(2, 3, "[rows, K/2, L] or [rows, K/2]"));
  if (t.shape[1] > 1 && t.strides[1] != 1) c.fail(arg, "the packed K dimension (dim 1) must be contiguous, got " + t.describe());
  Operand o;
  o.R = t.shape[0];
  o.Kb = t.shape[1];
  o.sR = t.strides[0];
  if (t.ndim == 3) {
    o.L = t.shape[2];
    o.sL = t.strides[2];
  }
  return o;
}

void e4m3_scales(Checker& c, const TensorView& s, const char* arg) { c.require(s, Req(arg).dtypes({DType::kE4M3, DType::kUInt8})); }

const float* amax_arg(Checker& c, const TensorView& t, const char* arg) {
  if (!t.present()) return nullptr;
  c.require(t, Req(arg).dtypes({DType::kFloat32}).one_element("one element (the per-tensor amax)"));
  if (t.device == Device::kCPU && *t.ptr<float>() < 0.0f)
    c.fail(arg, "the per-tensor amax must be >= 0, got " + std::to_string(*t.ptr<float>()));
  return t.ptr<float>();
}

void check_dual_sf_layout(const Checker& c, const ScaleLayout& l) {
  if (l.kind != ScaleLayoutKind::kRowMajor && l.kind != ScaleLayoutKind::kBlocked128x4)
    c.fail("sf_layout", "expected row_major (GPU MODE reference [MN, K/16, L]) or blocked128x4 (permuted [32,4,MN/128,4,K/64,L])");
  if (l.group_pad != GroupPad::kNone) c.fail("sf_layout", "grouped padding does not apply to a dense GEMM");
}

/// Checks the weight side (b1, b2, sfb1, sfb2, amax_b*) of a dual GEMM and fills p (N, K, L).
void plan_dual_weights(Checker& c, const DualGemmArgs& x, DualGemmPlan* p) {
  const Operand b1 = fp4_operand(c, x.b1, "b1");
  const Operand b2 = fp4_operand(c, x.b2, "b2");
  const int64_t N = b1.R, K = b1.Kb * 2, L = b1.L;
  if (N % 128 != 0 || N == 0) c.fail("b1", "N = " + std::to_string(N) + " must be a positive multiple of 128");
  if (K % 64 != 0 || K == 0) c.fail("b1", "K = " + std::to_string(K) + " must be a positive multiple of 64");
  if (x.b1.ndim != x.b2.ndim || b2.R != N || b2.Kb != b1.Kb || b2.L != L)
    c.fail("b2", "expected the shape of b1 (" + x.b1.describe() + "), got " + x.b2.describe());
  check_dual_sf_layout(c, x.sf_layout);
  e4m3_scales(c, x.sfb1, "sfb1");
  e4m3_scales(c, x.sfb2, "sfb2");
  p->N = N;
  p->K = K;
  p->L = L;
  p->b1 = x.b1.ptr<uint8_t>();
  p->b2 = x.b2.ptr<uint8_t>();
  p->b1_sN = b1.sR; p->b1_sL = b1.sL;
  p->b2_sN = b2.sR; p->b2_sL = b2.sL;
  p->sfb1 = x.sfb1.ptr<uint8_t>();
  p->sfb2 = x.sfb2.ptr<uint8_t>();
  plan_scales(c, x.sfb1, "sfb1", x.sf_layout, L, N, K / 16, &p->spb, Checker::Batch::kLast);
  ScalePlan spb2;
  plan_scales(c, x.sfb2, "sfb2", x.sf_layout, L, N, K / 16, &spb2, Checker::Batch::kLast);
}

}  // namespace

int64_t nvfp4_dual_gemm_packed_bytes(int64_t N, int64_t K, int64_t L) {
  // [L][2N/64 row blocks][K/64 tiles][128 threads x 16 B fragments + 64 rows x 4 E4M3 scales]
  const Checker c{"nvfp4_dual_gemm_packed_bytes"};
  if (N < 0) c.fail("N", "must be >= 0, got " + std::to_string(N));
  if (K < 0) c.fail("K", "must be >= 0, got " + std::to_string(K));
  if (L < 0) c.fail("L", "must be >= 0, got " + std::to_string(L));
  const int64_t row_blocks = c.mul("N", 2, N) / 64;
  return c.mul("L", L, c.mul("K", row_blocks, K / 64 * (128 * 16 + 64 * 4)));
}

void nvfp4_dual_gemm_prepack(const DualGemmArgs& x, const TensorView& packed, Stream stream) {
  Checker c{"nvfp4_dual_gemm_prepack"};
  DualGemmPlan p;
  plan_dual_weights(c, x, &p);
  c.require(packed, Req("packed").dtypes({DType::kUInt8}));
  c.storage(packed, "packed", nvfp4_dual_gemm_packed_bytes(p.N, p.K, p.L));
  c.no_overlap({{"packed", &packed}}, {{"b1", &x.b1}, {"b2", &x.b2}, {"sfb1", &x.sfb1}, {"sfb2", &x.sfb2}});
  if (c.dev != Device::kCUDA) c.fail("packed", "prepacking produces the CUDA kernel's layout: pass CUDA tensors");
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::nvfp4_dual_gemm_prepack(p, packed.ptr<uint8_t>(), stream.handle); });
}

void nvfp4_dual_gemm_silu(const DualGemmArgs& x, Stream stream) {
  Checker c{"nvfp4_dual_gemm_silu"};
  const Operand a = fp4_operand(c, x.a, "a");
  const int64_t M = a.R, K = a.Kb * 2, L = a.L;
  if (M < 1) c.fail("a", "M must be >= 1, got " + x.a.describe());
  if (L < 1) c.fail("a", "L must be >= 1, got " + x.a.describe());
  if (K % 64 != 0 || K == 0) c.fail("a", "K = " + std::to_string(K) + " must be a positive multiple of 64");
  DualGemmPlan p;
  const bool prepacked = x.packed_b.present();
  if (prepacked) {
    for (const auto& [t, n] : {std::pair{&x.b1, "b1"}, {&x.b2, "b2"}, {&x.sfb1, "sfb1"}, {&x.sfb2, "sfb2"}})
      if (t->present()) c.fail(n, "must be absent when packed_b (prepacked weights) is given");
    c.present(x.c, "c");
    if (x.c.ndim < 2) c.fail("c", "expected [M, N, L] or [M, N], got " + x.c.describe());
    p.N = x.c.shape[1];
    p.K = K;
    p.L = L;
    if (p.N % 128 != 0 || p.N == 0) c.fail("c", "N = " + std::to_string(p.N) + " must be a positive multiple of 128");
    c.require(x.packed_b, Req("packed_b").dtypes({DType::kUInt8}));
    c.storage(x.packed_b, "packed_b", nvfp4_dual_gemm_packed_bytes(p.N, K, L));
    check_dual_sf_layout(c, x.sf_layout);
  } else {
    plan_dual_weights(c, x, &p);
    if (x.a.ndim != x.b1.ndim) c.fail("b1", "a, b1 and b2 must all be 2-D or all 3-D");
    if (p.K != K || p.L != L)
      c.fail("b1", "expected [N, " + std::to_string(a.Kb) + (x.a.ndim == 3 ? ", " + std::to_string(L) : "") +
                       "] to match a, got " + x.b1.describe());
  }
  const int64_t N = p.N;
  e4m3_scales(c, x.sfa, "sfa");
  c.require(x.c, Req("c").dtypes({DType::kFloat16, DType::kBFloat16})
                     .shape(x.a.ndim == 3 ? std::vector<int64_t>{M, N, L} : std::vector<int64_t>{M, N}));
  if (x.c.strides[1] != 1) c.fail("c", "the N dimension (dim 1) must be contiguous, got " + x.c.describe());
  p.M = M;
  p.a = x.a.ptr<uint8_t>();
  p.a_sM = a.sR;
  p.a_sL = a.sL;
  p.sfa = x.sfa.ptr<uint8_t>();
  plan_scales(c, x.sfa, "sfa", x.sf_layout, L, M, K / 16, &p.spa, Checker::Batch::kLast);
  p.amax_a = amax_arg(c, x.amax_a, "amax_a");
  p.amax_b1 = amax_arg(c, x.amax_b1, "amax_b1");
  p.amax_b2 = amax_arg(c, x.amax_b2, "amax_b2");
  p.c = x.c.data;
  p.c_dtype = x.c.dtype;
  p.c_sM = x.c.strides[0];
  p.c_sL = x.c.ndim == 3 ? x.c.strides[2] : 0;
  c.no_overlap({{"c", &x.c}}, {{"a", &x.a}, {"b1", &x.b1}, {"b2", &x.b2}, {"sfa", &x.sfa}, {"sfb1", &x.sfb1},
                               {"sfb2", &x.sfb2}, {"amax_a", &x.amax_a}, {"amax_b1", &x.amax_b1}, {"amax_b2", &x.amax_b2},
                               {"packed_b", &x.packed_b}});
  if (c.dev == Device::kCPU) {
    if (prepacked) c.fail("packed_b", "prepacked weights are for the CUDA kernel; the CPU reference takes b1/b2");
    ref::nvfp4_dual_gemm_silu(p);
    return;
  }
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::nvfp4_dual_gemm(p, prepacked ? x.packed_b.ptr<uint8_t>() : nullptr, stream.handle); });
}

}  // namespace lowbit

namespace lowbit {
using namespace detail;

namespace {

/// Checks a group_gemm_mxfp4_prepack pair for G experts of N x K and returns the row-major plan
/// of its scales.
void check_packed_weights(Checker& c, const TensorView& b, const char* b_arg, const TensorView& s, const char* s_arg,
                          int64_t G, int64_t N, int64_t K, ScalePlan* sp) {
  int64_t Np, Kp;
  if (!checked_mxfp4_packed_rows(N, &Np)) c.fail(b_arg, "the packed rows of N = " + std::to_string(N) + " overflow a 64-bit integer");
  if (!checked_mxfp4_packed_k(K, &Kp)) c.fail(b_arg, "the packed K of K = " + std::to_string(K) + " overflow a 64-bit integer");
  c.require(b, Req(b_arg).dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).shape({G, Np, Kp / 2}).contiguous("packed weights"));
  c.require(s, Req(s_arg).dtypes({DType::kUE8M0, DType::kUInt8}).shape({G, Np, Kp / 32}).contiguous("packed scales"));
  plan_scales(c, s, s_arg, ScaleLayout::row_major(), G, Np, Kp / 32, sp, Checker::Batch::kFirst);
}
}  // namespace

void group_gemm_mxfp4_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& lb,
                              const TensorView& packed_b, const TensorView& packed_scale, Stream stream) {
  Checker c{"group_gemm_mxfp4_prepack"};
  c.require(b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (b.ndim != 3 || b.shape[2] == 0 || b.shape[2] % 16 != 0 || b.shape[1] == 0)
    c.fail("b", "expected [groups, N, K/2] with K a positive multiple of 32, got " + b.describe());
  c.last_contiguous(b, "b");
  const int64_t G = b.shape[0], N = b.shape[1], K = 2 * b.shape[2];
  c.require(b_scale, Req("b_scale").dtypes({DType::kUE8M0, DType::kUInt8}));
  if (lb.group_pad != GroupPad::kNone || (lb.kind != ScaleLayoutKind::kRowMajor && lb.kind != ScaleLayoutKind::kBlocked128x4))
    c.fail("b_scale_layout", "expected row_major or blocked128x4 (per expert)");
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
    if (lb.group_pad != GroupPad::kNone || (lb.kind != ScaleLayoutKind::kRowMajor && lb.kind != ScaleLayoutKind::kBlocked128x4))
      c.fail("b_scale_layout", "expected row_major or blocked128x4 (per expert)");
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

namespace lowbit {
using namespace detail;

void gpt_oss_moe_mlp(const MoeMlpArgs& x, Stream stream) {
  Checker c{"gpt_oss_moe_mlp"};
  c.require(x.x, Req("x").dtypes({DType::kBFloat16, DType::kFloat32}).rank(2, "[T, H]").last_contiguous());
  const int64_t T = x.x.shape[0], H = x.x.shape[1];
  if (H % 32 != 0 || H == 0) c.fail("x", "hidden size H = " + std::to_string(H) + " must be a positive multiple of 32");
  c.require(x.w1, Req("w1").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (x.packed) {  // E and I from b1 [E, 2I]
    c.present(x.b1, "b1");
    if (x.b1.ndim != 2 || x.b1.shape[1] % 2 != 0) c.fail("b1", "expected [E, 2I], got " + x.b1.describe());
  } else if (x.w1.ndim != 3 || x.w1.shape[2] != H / 2 || x.w1.shape[1] % 2 != 0) {
    c.fail("w1", "expected [E, 2I, " + std::to_string(H / 2) + "] (gate/up rows interleaved), got " + x.w1.describe());
  }
  c.last_contiguous(x.w1, "w1");
  const int64_t E = x.packed ? x.b1.shape[0] : x.w1.shape[0], I = x.packed ? x.b1.shape[1] / 2 : x.w1.shape[1] / 2;
  if (I % 32 != 0 || I == 0)
    c.fail(x.packed ? "b1" : "w1", "intermediate size I = " + std::to_string(I) + " must be a positive multiple of 32");
  ScalePlan unused;
  if (x.packed) {
    check_packed_weights(c, x.w1, "w1", x.w1_scale, "w1_scale", E, 2 * I, H, &unused);
    check_packed_weights(c, x.w2, "w2", x.w2_scale, "w2_scale", E, H, I, &unused);
  } else {
    const DTypes ue8m0 = {DType::kUE8M0, DType::kUInt8};
    c.require(x.w1_scale, Req("w1_scale").dtypes(ue8m0).shape({E, 2 * I, H / 32}).last_contiguous());
    c.require(x.w2, Req("w2").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).shape({E, H, I / 2}).last_contiguous());
    c.require(x.w2_scale, Req("w2_scale").dtypes(ue8m0).shape({E, H, I / 32}).last_contiguous());
  }
  const DTypes bias = {DType::kFloat32, DType::kBFloat16};
  c.require(x.b1, Req("b1").dtypes(bias).shape({E, 2 * I}).last_contiguous());
  c.require(x.b2, Req("b2").dtypes(bias).shape({E, H}).last_contiguous());
  c.present(x.topk_ids, "topk_ids");
  if (x.topk_ids.dtype == DType::kInt64)
    c.fail("topk_ids", "expected dtype int32 expert ids, got int64 (convert torch.topk's int64 indices to int32; "
                       "the Python API does this itself)");
  c.dtype(x.topk_ids, "topk_ids", {DType::kInt32});
  if (x.topk_ids.ndim != 2 || x.topk_ids.shape[0] != T) c.fail("topk_ids", "expected [" + std::to_string(T) + ", k], got " + x.topk_ids.describe());
  c.last_contiguous(x.topk_ids, "topk_ids");
  const int64_t k = x.topk_ids.shape[1];
  c.require(x.topk_weights, Req("topk_weights").dtypes({DType::kFloat32}).shape({T, k}).last_contiguous());
  c.require(x.out, Req("out").dtypes({DType::kBFloat16, DType::kFloat32}).shape({T, H}).last_contiguous());
  if (!(x.limit > 0.0f)) c.fail("limit", "expected limit > 0, got " + std::to_string(x.limit));
  if (!std::isfinite(x.alpha)) c.fail("alpha", "expected a finite alpha, got " + std::to_string(x.alpha));
  MoeMlpPlan p;
  p.T = T; p.H = H; p.I = I; p.E = E; p.topk = k;
  p.x = x.x.data; p.x_dtype = x.x.dtype; p.x_sT = x.x.strides[0];
  p.ids = x.topk_ids.ptr<int32_t>(); p.ids_sT = x.topk_ids.strides[0];
  p.weights = x.topk_weights.ptr<float>(); p.w_sT = x.topk_weights.strides[0];
  p.w1 = x.w1.ptr<uint8_t>(); p.w1_sE = x.w1.strides[0]; p.w1_sR = x.w1.strides[1];
  p.w1s = x.w1_scale.ptr<uint8_t>(); p.w1s_sE = x.w1_scale.strides[0]; p.w1s_sR = x.w1_scale.strides[1];
  p.w2 = x.w2.ptr<uint8_t>(); p.w2_sE = x.w2.strides[0]; p.w2_sR = x.w2.strides[1];
  p.w2s = x.w2_scale.ptr<uint8_t>(); p.w2s_sE = x.w2_scale.strides[0]; p.w2s_sR = x.w2_scale.strides[1];
  p.b1 = x.b1.data; p.b1_dtype = x.b1.dtype; p.b1_sE = x.b1.strides[0];
  p.b2 = x.b2.data; p.b2_dtype = x.b2.dtype; p.b2_sE = x.b2.strides[0];
  p.alpha = x.alpha; p.limit = x.limit; p.act_mxfp8 = x.act == ActQuant::kMXFP8; p.packed = x.packed;
  p.out = x.out.data; p.out_dtype = x.out.dtype; p.o_sT = x.out.strides[0];
  c.no_overlap({{"out", &x.out}}, {{"x", &x.x}, {"topk_ids", &x.topk_ids}, {"topk_weights", &x.topk_weights},
                                   {"w1", &x.w1}, {"w1_scale", &x.w1_scale}, {"b1", &x.b1}, {"w2", &x.w2},
                                   {"w2_scale", &x.w2_scale}, {"b2", &x.b2}});
  std::vector<int32_t> ids_copy;  // host ids: the one copy that is validated and used
  if (x.topk_ids.device == Device::kCPU) {
    ids_copy.resize(size_t(c.mul("topk_ids", T, k)));
    const int32_t* ids = x.topk_ids.ptr<int32_t>();
    if (k > 0)
      for (int64_t t = 0; t < T; ++t) std::memcpy(&ids_copy[size_t(t * k)], ids + t * x.topk_ids.strides[0], size_t(k) * 4);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids_copy[size_t(t * k + j)];
        if (e < -1 || e >= E)
          c.fail("topk_ids", "expert id " + std::to_string(e) + " at [" + std::to_string(t) + ", " + std::to_string(j) +
                                 "] is outside [-1, " + std::to_string(E) + ")");
      }
    p.ids = ids_copy.data();
    p.ids_sT = k;
  }
  if (c.dev == Device::kCPU) {
    ref::gpt_oss_moe_mlp(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  require_aligned16(c, x.w1, "w1", {p.w1_sE, p.w1_sR});
  require_aligned16(c, x.w2, "w2", {p.w2_sE, p.w2_sR});
  if (x.packed && (reinterpret_cast<uintptr_t>(p.w1s) % 8 != 0 || reinterpret_cast<uintptr_t>(p.w2s) % 8 != 0))
    c.fail("w1_scale", "the CUDA kernel needs 8-byte aligned packed scales");
  if (E > 4096) c.fail("w1", "the CUDA MLP routes at most 4096 experts, got E = " + std::to_string(E));
  if (T * k >= (int64_t(1) << 31)) c.fail("topk_ids", "T * k must be below 2^31 routed rows");
#endif
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::gpt_oss_moe_mlp(p, stream.handle); });
}

}  // namespace lowbit
