// lowbit/gemm.hpp: the GEMM operations (C++ API). CPU tensors run the fp32/fp64 reference in
// src/ref; CUDA tensors run the sm_90a kernels where they exist, and otherwise throw
// NotSupportedError (never a silent fallback).
#pragma once

#include "lowbit/ops.hpp"

namespace lowbit {

/// NVFP4 dual GEMM with fused SiLU (the SwiGLU of an LLM MLP, GPU MODE "nvfp4 dual gemm"):
///
///   C[m, n, l] = silu(G) * U,   G = sum_k A[m,k,l] B1[n,k,l] * sa_g,   U = sum_k A[m,k,l] B2[n,k,l] * sa_u
///
/// with A/B1/B2 elements e2m1(code) * e4m3(block scale of its 16 K-elements) and, when the
/// per-tensor amaxes are given, the NVFP4 per-tensor decode scales S_dec(amax) folded into
/// sa_g = S_dec(a) * S_dec(b1), sa_u = S_dec(a) * S_dec(b2) (1 when absent). Accumulation in
/// fp32 (the reference accumulates in fp64), silu(x) = x / (1 + exp(-x)) and the product in fp32,
/// output rounded to nearest even.
struct DualGemmArgs {
  /// [M, K/2, L] or [M, K/2]: uint8 or float4_e2m1fn_x2, element 2k in the low nibble, K
  /// contiguous; other strides free (the GPU MODE tensors are [M, K/2, L] views of (L, M, K/2)).
  TensorView a, b1, b2;
  /// E4M3 block scales (float8_e4m3fn or uint8), addressed through their storage (row-major, or
  /// the documented batch-last / 6-D views of it, see ops.hpp): L matrices of MN x K/16 in `sf_layout` — ScaleLayout::row_major() for the GPU
  /// MODE reference tensors [MN, K/16, L], ScaleLayout::blocked128x4() for the permuted
  /// [32, 4, MN/128, 4, K/64, L] tensors (cuBLAS / CUTLASS layout). A 3-D [MN, K/16, L] or
  /// 6-D tensor is read by index: it must have exactly the strides of the GPU MODE view
  /// ([MN, K/16, L]: (K/16, 1, MN*K/16) elements), a C-contiguous one (L > 1) is refused.
  TensorView sfa, sfb1, sfb2;
  ScaleLayout sf_layout = ScaleLayout::row_major();
  /// Optional NVFP4 per-tensor amaxes (float32 [1]), as written by quantize(compute_global_amax).
  TensorView amax_a, amax_b1, amax_b2;
  /// [M, N, L] or [M, N]: float16 or bfloat16, N contiguous, other strides free.
  TensorView c;
  /// Optional: weights already prepacked by nvfp4_dual_gemm_prepack (uint8, CUDA). When given,
  /// b1/b2/sfb1/sfb2 are not read (leave them absent) and N is taken from c.
  TensorView packed_b;
};

/// Constraints: M >= 1 (any), N a multiple of 128, K a multiple of 64, L >= 1.
void nvfp4_dual_gemm_silu(const DualGemmArgs& args, Stream stream = {});

/// Bytes of the prepacked weights for N outputs, K inputs, L batches.
int64_t nvfp4_dual_gemm_packed_bytes(int64_t N, int64_t K, int64_t L = 1);

/// Prepares b1, b2, sfb1, sfb2 (and sf_layout) of `args` once, as serving engines do at load
/// time, into `packed` (uint8 [nvfp4_dual_gemm_packed_bytes(N, K, L)], CUDA): gate/up rows
/// interleaved by 8, each thread's fragments contiguous. a / sfa / c of `args` are not used.
void nvfp4_dual_gemm_prepack(const DualGemmArgs& args, const TensorView& packed, Stream stream = {});

}  // namespace lowbit

namespace lowbit {

/// Grouped GEMM for MoE with MXFP4 expert weights (FlashInfer group_gemm_mxfp4_nt_groupwise
/// conventions):  out[m, :] = A[m, :] @ B[g]^T  for every row m of group g,
/// m_indptr[g] <= m < m_indptr[g+1]. A is MXFP8 (E4M3 or E5M2 codes with a UE8M0 scale per 32
/// K-elements) or plain bf16 (W4A16); B is MXFP4 (E2M1 codes, element 2k in the low nibble,
/// UE8M0 per 32). Decoded values are code * 2^(scale - 127); accumulation in fp32 (the reference
/// in fp64); out rounded to nearest even.
struct GroupGemmArgs {
  TensorView a;  ///< [cum_m, K]: float8_e4m3fn / float8_e5m2 (MXFP8 codes) or bfloat16
  /// MXFP8 activation scales (float8_e8m0fnu or uint8): cum_m x K/32 in a_scale_layout —
  /// blocked128x4 with per-group padding (FlashInfer's rule, the default) or row-major.
  TensorView a_scale;
  ScaleLayout a_scale_layout = ScaleLayout::blocked128x4(GroupPad::kFlashInfer);
  TensorView b;        ///< [G, N, K/2] uint8 / float4_e2m1fn_x2
  TensorView b_scale;  ///< G matrices of N x K/32 in b_scale_layout (blocked128x4 or row-major)
  ScaleLayout b_scale_layout = ScaleLayout::blocked128x4();
  TensorView m_indptr;  ///< int32 / int64 [G+1], m_indptr[0] = 0, non-decreasing, m_indptr[G] = cum_m
  TensorView out;       ///< [cum_m, N] bfloat16 / float16
  /// b / b_scale are the outputs of group_gemm_mxfp4_prepack (contiguous [G, Np, Kp/2] and
  /// [G, Np, Kp/32], lowbit/mxfp4_pack.hpp); N is taken from out, b_scale_layout is not used.
  bool b_packed = false;
};

/// Constraints: K a multiple of 32 (the MX block), N a multiple of 8; empty groups allowed.
void group_gemm_mxfp4_nt_groupwise(const GroupGemmArgs& args, Stream stream = {});

/// Reorders MXFP4 expert weights once (at load time, as serving engines do) into the layout the
/// sm_90a kernel decodes with the fewest instructions (lowbit/mxfp4_pack.hpp): b [G, N, K/2] and
/// b_scale (G x N x K/32 in b_scale_layout: row-major or blocked128x4) -> packed_b uint8
/// [G, Np, Kp/2] and packed_scale uint8 [G, Np, Kp/32], contiguous, Np = N rounded up to 128,
/// Kp = K rounded up to 256. Lossless (mxfp4_packed_code inverts it); CPU and CUDA tensors.
void group_gemm_mxfp4_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& b_scale_layout,
                              const TensorView& packed_b, const TensorView& packed_scale, Stream stream = {});

}  // namespace lowbit

namespace lowbit {

/// How activations enter the expert GEMMs of the MoE MLP.
enum class ActQuant : uint8_t {
  kBF16,   ///< W4A16: activations rounded to bf16
  kMXFP8,  ///< W4A8: activations quantized to MXFP8 E4M3 (RCEIL) per 32 K-elements
};

/// The gpt-oss expert MLP (FORMATS.md section 8), one call: for every token t and each of its
/// k routed experts e = topk_ids[t, j]:
///   h = act(x[t]) @ W1[e]^T + b1[e]           (2I outputs, gate/up interleaved: gate = h[0::2], up = h[1::2])
///   g = min(gate, limit); u = clamp(up, -limit, limit)
///   y = g * sigmoid(alpha * g) * (u + 1)
///   o = act(y) @ W2[e]^T + b2[e]
///   out[t] = sum_j topk_weights[t, j] * o      (fixed order j = 0..k-1, no atomics)
/// with act() the ActQuant rounding, W1/W2 MXFP4 (as converted from a gpt-oss checkpoint by
/// `lowbit convert-gpt-oss`), fp32 arithmetic elsewhere, out rounded to nearest even.
struct MoeMlpArgs {
  TensorView x;             ///< [T, H] bfloat16 / float32
  TensorView topk_ids;      ///< [T, k] int32 expert ids in [0, E); -1 skips the slot
  TensorView topk_weights;  ///< [T, k] float32
  TensorView w1, w1_scale;  ///< [E, 2I, H/2] MXFP4 codes; [E, 2I, H/32] UE8M0 row-major
  TensorView b1;            ///< [E, 2I] float32 / bfloat16
  TensorView w2, w2_scale;  ///< [E, H, I/2]; [E, H, I/32]
  TensorView b2;            ///< [E, H]
  /// w1 / w1_scale / w2 / w2_scale are group_gemm_mxfp4_prepack outputs (row-major scales in).
  bool packed = false;
  float alpha = 1.702f;
  float limit = 7.0f;
  ActQuant act = ActQuant::kBF16;
  TensorView out;  ///< [T, H] bfloat16 / float32
};

void gpt_oss_moe_mlp(const MoeMlpArgs& args, Stream stream = {});

}  // namespace lowbit
