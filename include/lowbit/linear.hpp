// lowbit/linear.hpp: the dense low-precision linears (C++ API), reached through lowbit/gemm.hpp:
//
//   mxfp4_gemm:  C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N])   MXFP4 weights, bf16 or MXFP8 activations
//   nvfp4_gemm:  C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N])   NVFP4 weights, bf16 or NVFP4 activations
//
// CPU tensors run the fp32/fp64 reference in src/ref; CUDA tensors run the sm_90a kernels
// (mxfp4_gemm: the grouped MXFP4 GEMM's kernel with one group; nvfp4_gemm: the NVFP4 dual GEMM's
// mainloop, N a multiple of 128 and K of 64, other shapes refused with NotSupportedError naming
// the constraint: never a silent fallback). Both take weights prepacked once (at load time).
// Layouts and rules: docs/linear.md.
#pragma once

#include "lowbit/ops.hpp"

namespace lowbit {

/// Dense MXFP4 linear (the one-group case of group_gemm_mxfp4_nt_groupwise):
///
///   C[m, n] = sum_k A[m, k] * B[n, k]  (+ bias[n])
///
/// B is MXFP4: E2M1 codes, element 2k in the low nibble, one UE8M0 scale per 32 K-elements
/// (decoded code * 2^(scale - 127)). A is bfloat16 (W4A16) or MXFP8 (W4A8: E4M3 / E5M2 codes with
/// a UE8M0 scale per 32 K-elements). Accumulation in fp32 (the reference: fp64, rounded once to
/// fp32), then + bias in fp32, C rounded to nearest even.
struct Mxfp4GemmArgs {
  TensorView a;  ///< [M, K]: bfloat16, or float8_e4m3fn / float8_e5m2 codes; K contiguous, row stride free
  /// MXFP8 activation scales (float8_e8m0fnu or uint8), M x K/32 in a_scale_layout (row_major or
  /// blocked128x4, stored in index order); absent for bfloat16 A.
  TensorView a_scale;
  ScaleLayout a_scale_layout = ScaleLayout::row_major();
  /// [N, K/2] uint8 / float4_e2m1fn_x2, K contiguous, row stride free; with b_packed the output of
  /// group_gemm_mxfp4_prepack for one group: contiguous [1, Np, Kp/2] or [Np, Kp/2].
  TensorView b;
  /// UE8M0 weight scales (float8_e8m0fnu or uint8): N x K/32 in b_scale_layout (row_major or
  /// blocked128x4); with b_packed the prepack's contiguous [1, Np, Kp/32] or [Np, Kp/32].
  TensorView b_scale;
  ScaleLayout b_scale_layout = ScaleLayout::row_major();
  bool b_packed = false;  ///< b / b_scale come from group_gemm_mxfp4_prepack; N is taken from out
  TensorView bias;        ///< optional [N]: float32 / bfloat16 / float16, contiguous
  TensorView out;         ///< [M, N]: bfloat16 / float16, N contiguous, row stride free
};

/// Constraints: M >= 0, K a positive multiple of 32, N a positive multiple of 8.
void mxfp4_gemm(const Mxfp4GemmArgs& args, Stream stream = {});

/// Dense NVFP4 linear:
///
///   C[m, n] = (sum_k A[m, k] * B[n, k]) * sa * sb  (+ bias[n])
///
/// B is NVFP4: E2M1 codes (element 2k in the low nibble) with one E4M3 block scale per 16
/// K-elements; sb = S_dec(amax_b) = 1 / (448 * 6 / amax_b) when the per-tensor amax is given, else
/// 1 (the dual GEMM's convention). A is bfloat16 (W4A16, sa = 1) or NVFP4 like B (sa = S_dec(amax_a)
/// or 1). Dot products of the decoded blocks in fp64 (the reference), rounded once to fp32, times
/// sa * sb (fp32), + bias in fp32, C rounded to nearest even.
struct Nvfp4GemmArgs {
  /// [M, K] bfloat16, or [M, K/2] NVFP4 codes (uint8 / float4_e2m1fn_x2); K contiguous, row stride free
  TensorView a;
  TensorView a_scale;  ///< NVFP4 A: E4M3 (float8_e4m3fn / uint8) M x K/16 in a_scale_layout; absent for bf16
  ScaleLayout a_scale_layout = ScaleLayout::row_major();
  TensorView amax_a;   ///< optional float32 [1] per-tensor amax of A (NVFP4 A only)
  TensorView b;        ///< [N, K/2] uint8 / float4_e2m1fn_x2, K contiguous; with b_packed the
                       ///< nvfp4_gemm_prepack output (uint8, nvfp4_gemm_packed_bytes(N, K), contiguous)
  TensorView b_scale;  ///< E4M3 N x K/16 in b_scale_layout (row_major or blocked128x4); absent with b_packed
  ScaleLayout b_scale_layout = ScaleLayout::row_major();
  TensorView amax_b;   ///< optional float32 [1] per-tensor amax of B
  TensorView bias;     ///< optional [N]: float32 / bfloat16 / float16, contiguous
  TensorView out;      ///< [M, N]: bfloat16 / float16, N contiguous
  bool b_packed = false;  ///< b is nvfp4_gemm_prepack's output; N is taken from out
};

/// Constraints: M >= 0, K a positive multiple of 16, N >= 1 (b_packed: N a multiple of 128, K of
/// 64). CUDA: N a multiple of 128 and K of 64, else NotSupportedError naming the constraint.
void nvfp4_gemm(const Nvfp4GemmArgs& args, Stream stream = {});

/// Bytes of nvfp4_gemm's prepacked weights: N a positive multiple of 128, K of 64 (the CUDA
/// kernel's tiles): (N / 64) x (K / 64) chunks of 2304 bytes.
int64_t nvfp4_gemm_packed_bytes(int64_t N, int64_t K);

/// Prepares b [N, K/2] and b_scale (E4M3 N x K/16 in b_scale_layout) once, as serving engines do at
/// load time, into `packed` (uint8, nvfp4_gemm_packed_bytes(N, K) elements, contiguous) for
/// nvfp4_gemm(b_packed): each 64-row x 64-deep chunk holds the kernel threads' code fragments and
/// the rows' E4M3 scales (the layout: src/ref/ref_linear.hpp). CPU and CUDA give the same bytes;
/// a call with prepacked weights gives the bits of the call without.
void nvfp4_gemm_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& b_scale_layout,
                        const TensorView& packed, Stream stream = {});

}  // namespace lowbit
