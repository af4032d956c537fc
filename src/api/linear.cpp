// src/api/linear.cpp: validation and dispatch of the dense linears (lowbit/linear.hpp):
// mxfp4_gemm (CPU: the grouped GEMM's reference with one group; CUDA: the grouped sm_90a kernel with
// one group) and nvfp4_gemm with its prepack (CPU: the reference; CUDA: the dual GEMM's mainloop).
// Every check runs before anything is written: an error names the op and the argument and leaves
// the output untouched.
#include <cstdint>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "api/group_gemm.hpp"
#include "lowbit/linear.hpp"
#include "lowbit/mxfp4_pack.hpp"
#include "ref/ref_linear.hpp"
#include "ref/ref_moe.hpp"
#include "cuda/gemm/launch_gemm.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds
#include "cuda/moe/launch_moe.hpp"

namespace lowbit {
using namespace detail;

namespace {

/// A dense GEMM's scale layout: row_major or blocked128x4, never grouped.
void check_dense_layout(const Checker& c, const ScaleLayout& l, const char* arg) {
  if (l.kind != ScaleLayoutKind::kRowMajor && l.kind != ScaleLayoutKind::kBlocked128x4)
    c.fail(arg, "expected row_major or blocked128x4");
  if (l.group_pad != GroupPad::kNone) c.fail(arg, "grouped padding does not apply to a dense GEMM");
}

/// The optional bias [N]: its pointer (null when absent), dtype in *dt.
const void* bias_arg(Checker& c, const TensorView& t, int64_t N, DType* dt) {
  if (!t.present()) return nullptr;
  c.require(t, Req("bias").dtypes({DType::kFloat32, DType::kBFloat16, DType::kFloat16}).shape({N}).last_contiguous());
  *dt = t.dtype;
  return t.data;
}

/// The output [M, N] (bf16 / fp16, N contiguous).
void out_arg(Checker& c, const TensorView& out, int64_t M, int64_t N) {
  c.require(out, Req("out").dtypes({DType::kBFloat16, DType::kFloat16}).shape({M, N}).last_contiguous());
}

/// Packed weights of one group: [1, R, C] or [R, C], contiguous.
void packed_arg(Checker& c, const TensorView& t, const char* arg, const DTypes& dt, int64_t R, int64_t C) {
  c.require(t, Req(arg).dtypes(dt));
  const bool ok = (t.ndim == 2 && t.shape[0] == R && t.shape[1] == C) ||
                  (t.ndim == 3 && t.shape[0] == 1 && t.shape[1] == R && t.shape[2] == C);
  if (!ok)
    c.fail(arg, "expected the group_gemm_mxfp4_prepack output of one group, [1, " + std::to_string(R) + ", " +
                    std::to_string(C) + "] or [" + std::to_string(R) + ", " + std::to_string(C) + "], got " + t.describe());
  if (!t.is_contiguous()) c.fail(arg, "packed weights must be contiguous, got " + t.describe());
}

}  // namespace

void mxfp4_gemm(const Mxfp4GemmArgs& x, Stream stream) {
  Checker c{"mxfp4_gemm"};
  c.require(x.a, Req("a").dtypes({DType::kE4M3, DType::kE5M2, DType::kBFloat16}).rank(2, "[M, K]").last_contiguous());
  const int64_t M = x.a.shape[0], K = x.a.shape[1];
  if (K % 32 != 0 || K == 0) c.fail("a", "K = " + std::to_string(K) + " must be a positive multiple of 32 (the MX block)");
  const DTypes codes = {DType::kUInt8, DType::kFloat4E2M1x2}, ue8m0 = {DType::kUE8M0, DType::kUInt8};
  int64_t N = 0;
  if (x.b_packed) {
    c.present(x.b, "b");
    c.present(x.out, "out");
    if (x.out.ndim != 2) c.fail("out", "expected [M, N], got " + x.out.describe());
    N = x.out.shape[1];
  } else {
    c.require(x.b, Req("b").dtypes(codes).rank(2, "[N, K/2]").last_contiguous());
    if (x.b.shape[1] != K / 2) c.fail("b", "expected [N, " + std::to_string(K / 2) + "] to match a, got " + x.b.describe());
    N = x.b.shape[0];
  }
  if (N % 8 != 0 || N == 0) c.fail(x.b_packed ? "out" : "b", "N = " + std::to_string(N) + " must be a positive multiple of 8");
  out_arg(c, x.out, M, N);

  GroupGemmPlan p;
  p.M = M; p.N = N; p.K = K; p.G = 1;
  p.a = x.a.data;
  p.a_dtype = x.a.dtype;
  p.a_sM = x.a.strides[0];
  if (x.a.dtype == DType::kBFloat16) {
    if (x.a_scale.present()) c.fail("a_scale", "bfloat16 activations (W4A16) take no scales");
  } else {
    c.require(x.a_scale, Req("a_scale").dtypes(ue8m0));
    check_dense_layout(c, x.a_scale_layout, "a_scale_layout");
    plan_scales(c, x.a_scale, "a_scale", x.a_scale_layout, 1, M, K / 32, &p.spa, Checker::Batch::kFirst);
    p.a_scale = x.a_scale.ptr<uint8_t>();
  }
  if (x.b_packed) {
    int64_t Np, Kp;
    if (!checked_mxfp4_packed_rows(N, &Np) || !checked_mxfp4_packed_k(K, &Kp))
      c.fail("b", "the packed sizes of N = " + std::to_string(N) + ", K = " + std::to_string(K) + " overflow");
    packed_arg(c, x.b, "b", codes, Np, Kp / 2);
    packed_arg(c, x.b_scale, "b_scale", ue8m0, Np, Kp / 32);
    plan_scales(c, x.b_scale, "b_scale", ScaleLayout::row_major(), 1, Np, Kp / 32, &p.spb, Checker::Batch::kFirst);
    p.b_sN = Kp / 2;
    p.b_sG = c.mul("b", Np, Kp / 2);
    p.b_packed = true;
  } else {
    c.require(x.b_scale, Req("b_scale").dtypes(ue8m0));
    check_dense_layout(c, x.b_scale_layout, "b_scale_layout");
    plan_scales(c, x.b_scale, "b_scale", x.b_scale_layout, 1, N, K / 32, &p.spb, Checker::Batch::kFirst);
    p.b_sN = x.b.strides[0];
    p.b_sG = c.mul("b", N, p.b_sN);
  }
  p.b = x.b.ptr<uint8_t>();
  p.b_scale = x.b_scale.ptr<uint8_t>();
  p.bias = bias_arg(c, x.bias, N, &p.bias_dtype);
  p.out = x.out.data;
  p.out_dtype = x.out.dtype;
  p.o_sM = x.out.strides[0];
  c.no_overlap({{"out", &x.out}}, {{"a", &x.a}, {"a_scale", &x.a_scale}, {"b", &x.b}, {"b_scale", &x.b_scale},
                                   {"bias", &x.bias}});
  if (c.dev == Device::kCPU) {
    const int64_t indptr[2] = {0, M};  // one group: every row
    p.m_indptr = indptr;
    p.indptr64 = true;
    ref::group_gemm_mxfp4(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  require_aligned16(c, x.b, "b", {p.b_sG, p.b_sN});
  require_scale_alignment(c, x.b_scale, p.b_scale, x.b_packed, x.b_scale_layout);
#endif
  // m_indptr: the launcher supplies a device-resident constant (cuda::mxfp4_gemm)
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::mxfp4_gemm(p, stream.handle); });
}

namespace {

/// The NVFP4 weights [N, K/2] with their E4M3 scales (N x K/16 in `layout`) into p.b / p.sfb / p.spb.
void nvfp4_weights(Checker& c, const TensorView& b, const TensorView& b_scale, const ScaleLayout& layout, int64_t K,
                   Nvfp4GemmPlan& p) {
  c.require(b, Req("b").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).rank(2, "[N, K/2]").last_contiguous());
  if (b.shape[1] != K / 2) c.fail("b", "expected [N, " + std::to_string(K / 2) + "] to match a, got " + b.describe());
  const int64_t N = b.shape[0];
  if (N < 1) c.fail("b", "N must be >= 1, got " + b.describe());
  c.require(b_scale, Req("b_scale").dtypes({DType::kE4M3, DType::kUInt8}));
  check_dense_layout(c, layout, "b_scale_layout");
  plan_scales(c, b_scale, "b_scale", layout, 1, N, K / 16, &p.spb, Checker::Batch::kFirst);
  p.N = N;
  p.b = b.ptr<uint8_t>();
  p.b_sN = b.strides[0];
  p.sfb = b_scale.ptr<uint8_t>();
}

/// The tiles prepacked weights exist for (the CUDA kernel's): N % 128, K % 64; names `arg`.
void check_packable(const Checker& c, const char* arg, int64_t N, int64_t K) {
  if (N < 1 || N % 128 != 0 || K < 1 || K % 64 != 0)
    c.fail(arg, "prepacked NVFP4 weights need N a positive multiple of 128 and K of 64 (the CUDA kernel's tiles), "
                "got N = " + std::to_string(N) + ", K = " + std::to_string(K));
}

}  // namespace

int64_t nvfp4_gemm_packed_bytes(int64_t N, int64_t K) {
  const Checker c{"nvfp4_gemm_packed_bytes"};
  if (N < 1 || N % 128 != 0) c.fail("N", "must be a positive multiple of 128, got " + std::to_string(N));
  if (K < 1 || K % 64 != 0) c.fail("K", "must be a positive multiple of 64, got " + std::to_string(K));
  return c.mul("K", N / 64, c.mul("K", K / 64, 128 * 16 + 64 * 4));
}

void nvfp4_gemm_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& b_scale_layout,
                        const TensorView& packed, Stream stream) {
  Checker c{"nvfp4_gemm_prepack"};
  c.present(b, "b");
  if (b.ndim != 2) c.fail("b", "expected [N, K/2], got " + b.describe());
  const int64_t K = c.mul("b", 2, b.shape[1]);
  Nvfp4GemmPlan p;
  p.K = K;
  nvfp4_weights(c, b, b_scale, b_scale_layout, K, p);
  check_packable(c, "b", p.N, K);
  c.require(packed, Req("packed").dtypes({DType::kUInt8}).contiguous("packed"));
  c.storage(packed, "packed", nvfp4_gemm_packed_bytes(p.N, K));
  c.no_overlap({{"packed", &packed}}, {{"b", &b}, {"b_scale", &b_scale}});
  if (c.dev == Device::kCPU) {
    ref::nvfp4_gemm_prepack(p, packed.ptr<uint8_t>());
    return;
  }
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::nvfp4_gemm_prepack(p, packed.ptr<uint8_t>(), stream.handle); });
}

void nvfp4_gemm(const Nvfp4GemmArgs& x, Stream stream) {
  Checker c{"nvfp4_gemm"};
  c.require(x.a, Req("a").dtypes({DType::kBFloat16, DType::kUInt8, DType::kFloat4E2M1x2})
                     .rank(2, "[M, K] (bfloat16) or [M, K/2] (NVFP4 codes)").last_contiguous());
  const bool a_bf16 = x.a.dtype == DType::kBFloat16;
  const int64_t M = x.a.shape[0], K = a_bf16 ? x.a.shape[1] : c.mul("a", 2, x.a.shape[1]);
  if (K % 16 != 0 || K == 0) c.fail("a", "K = " + std::to_string(K) + " must be a positive multiple of 16 (the NVFP4 block)");
  Nvfp4GemmPlan p;
  p.M = M;
  p.K = K;
  if (x.b_packed) {
    if (x.b_scale.present()) c.fail("b_scale", "must be absent with b_packed (the prepacked weights hold the scales)");
    c.present(x.out, "out");
    if (x.out.ndim != 2) c.fail("out", "expected [M, N], got " + x.out.describe());
    p.N = x.out.shape[1];
    check_packable(c, "out", p.N, K);
    c.require(x.b, Req("b").dtypes({DType::kUInt8}).contiguous("b"));
    c.storage(x.b, "b", nvfp4_gemm_packed_bytes(p.N, K));
    p.b = x.b.ptr<uint8_t>();
    p.b_packed = true;
  } else {
    nvfp4_weights(c, x.b, x.b_scale, x.b_scale_layout, K, p);
  }
  const int64_t N = p.N;
  out_arg(c, x.out, M, N);
  const DTypes e4m3 = {DType::kE4M3, DType::kUInt8};
  p.a = x.a.data;
  p.a_bf16 = a_bf16;
  p.a_sM = x.a.strides[0];
  if (a_bf16) {
    if (x.a_scale.present()) c.fail("a_scale", "bfloat16 activations (W4A16) take no scales");
    if (x.amax_a.present()) c.fail("amax_a", "bfloat16 activations (W4A16) take no per-tensor amax");
  } else {
    c.require(x.a_scale, Req("a_scale").dtypes(e4m3));
    check_dense_layout(c, x.a_scale_layout, "a_scale_layout");
    plan_scales(c, x.a_scale, "a_scale", x.a_scale_layout, 1, M, K / 16, &p.spa, Checker::Batch::kFirst);
    p.sfa = x.a_scale.ptr<uint8_t>();
    p.amax_a = amax_arg(c, x.amax_a, "amax_a");
  }
  p.amax_b = amax_arg(c, x.amax_b, "amax_b");
  p.bias = bias_arg(c, x.bias, N, &p.bias_dtype);
  p.out = x.out.data;
  p.out_dtype = x.out.dtype;
  p.o_sM = x.out.strides[0];
  c.no_overlap({{"out", &x.out}}, {{"a", &x.a}, {"a_scale", &x.a_scale}, {"amax_a", &x.amax_a}, {"b", &x.b},
                                   {"b_scale", &x.b_scale}, {"amax_b", &x.amax_b}, {"bias", &x.bias}});
  if (c.dev != Device::kCPU) {
    // the kernel covers whole 128-column and 64-deep tiles (the dual GEMM's mainloop)
    if (N % 128 != 0 || K % 64 != 0)
      throw NotSupportedError("nvfp4_gemm: the CUDA kernel needs N a multiple of 128 and K a multiple of 64 (got N = " +
                              std::to_string(N) + ", K = " + std::to_string(K) + "); the CPU reference takes any");
    run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::nvfp4_gemm(p, stream.handle); });
    return;
  }
  ref::nvfp4_gemm(p);
}

}  // namespace lowbit
