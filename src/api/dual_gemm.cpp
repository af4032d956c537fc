// src/api/dual_gemm.cpp: validation and dispatch of the NVFP4 dual GEMM + SiLU and its weight
// prepack (lowbit/gemm.hpp).
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "lowbit/gemm.hpp"
#include "ref/ref_gemm.hpp"
#include "cuda/gemm/launch_gemm.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds

namespace lowbit {
using namespace detail;

namespace {

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
