// lowbit/moe.hpp: the MoE operations (C++ API): the grouped MXFP4 GEMM (three row layouts: group
// boundaries, contiguous counts, masked batches), its weight prepack, the gpt-oss expert MLP with
// routing and the one over expert-grouped rows (expert parallelism); also reached through
// lowbit/gemm.hpp. CPU tensors run the fp32/fp64
// reference in src/ref; CUDA tensors run the sm_90a kernels where they exist, and otherwise throw
// NotSupportedError (never a silent fallback).
#pragma once

#include "lowbit/ops.hpp"

namespace lowbit {

/// The arithmetic of the grouped MXFP4 GEMM (GroupGemmArgs::precision).
enum class GemmPrecision : uint8_t {
  /// The default: every operand decoded exactly (bf16 on the tensor cores), fp32 accumulation;
  /// within one ulp of the output dtype of the fp64 reference (docs/design/moe_grouped_gemm.md).
  kExact,
  /// Opt-in, MXFP8 activations only: each K block of 32 is one FP8 wgmma (weights decoded to E4M3
  /// with the row scale folded in, activations as stored), its partial sum scaled by the block's
  /// two UE8M0 scales and added into fp32. Hopper's FP8 accumulation keeps fewer mantissa bits, so
  /// results are not bit-exact: |out - ref| <= 1 ulp of out + (2^-7 + (K/32) 2^-24) sum_k |a_k b_k|
  /// (docs/design/moe_grouped_gemm.md, "FP8 tensor-core path"). Weights in the FP8-path packed
  /// layout (group_gemm_mxfp4_prepack_fp8, b_packed = true). CPU tensors compute the exact
  /// reference (within that bound by definition).
  kFp8TensorCores,
};

/// Grouped GEMM for MoE with MXFP4 expert weights (FlashInfer group_gemm_mxfp4_nt_groupwise
/// conventions):  out[m, :] = A[m, :] @ B[g]^T  for every row m of group g. A is MXFP8 (E4M3 or
/// E5M2 codes with a UE8M0 scale per 32 K-elements) or plain bf16 (W4A16); B is MXFP4 (E2M1
/// codes, element 2k in the low nibble, UE8M0 per 32). Decoded values are code * 2^(scale - 127);
/// accumulation in fp32 (the reference in fp64); out rounded to nearest even.
///
/// The rows of each group are given in one of three layouts (docs/moe_ep.md):
///  - boundaries: `m_indptr` [G+1], a 2-D A [cum_m, K]; group g is rows m_indptr[g] .. m_indptr[g+1]-1.
///  - contiguous counts: `m_counts` [G], a 2-D A [M, K]; group g is the m_counts[g] rows after
///    those of groups < g (tokens sorted by local expert, DeepEP's normal mode); sum(m_counts) <= M,
///    and rows at or beyond the sum are neither read nor written.
///  - masked: `m_counts` [G], a 3-D A [G, max_tokens, K] and out [G, max_tokens, N]; group g is
///    rows 0 .. m_counts[g]-1 of batch g (DeepEP's low-latency mode, pplx-kernels); the other
///    rows of each batch are neither read nor written. The work scales with the counts, not with
///    max_tokens.
/// Host m_indptr / m_counts are validated (m_counts: non-negative, sum <= M, or <= max_tokens
/// each); device ones are read on the GPU without a host synchronisation (CUDA-graph safe) and
/// clamped instead: bounds into [0, M]; counts below 0 count as 0, a contiguous group ends at row
/// M at the latest, a masked count above max_tokens counts as max_tokens.
struct GroupGemmArgs {
  TensorView a;  ///< [cum_m, K] or (masked) [G, max_tokens, K]: float8_e4m3fn / float8_e5m2 (MXFP8 codes) or bfloat16
  /// MXFP8 activation scales (float8_e8m0fnu or uint8): one per 32 K-elements of every row of a,
  /// in a_scale_layout — blocked128x4 with per-group padding (FlashInfer's rule, the default;
  /// m_indptr only) or row-major (any layout; masked: [G, max_tokens, K/32] or its 2-D view).
  TensorView a_scale;
  ScaleLayout a_scale_layout = ScaleLayout::blocked128x4(GroupPad::kFlashInfer);
  TensorView b;        ///< [G, N, K/2] uint8 / float4_e2m1fn_x2
  TensorView b_scale;  ///< G matrices of N x K/32 in b_scale_layout (blocked128x4 or row-major)
  ScaleLayout b_scale_layout = ScaleLayout::blocked128x4();
  TensorView m_indptr;  ///< int32 / int64 [G+1], m_indptr[0] = 0, non-decreasing, m_indptr[G] = cum_m
  TensorView m_counts;  ///< int32 / int64 [G] rows per group (instead of m_indptr): contiguous or masked layout
  /// Masked layout: the typical rows per group, a hint for the tile size (0: max_tokens). Any
  /// value gives the same result; only the speed depends on it.
  int64_t expected_m = 0;
  TensorView out;       ///< [cum_m, N] or (masked) [G, max_tokens, N]: bfloat16 / float16
  /// b / b_scale are the outputs of group_gemm_mxfp4_prepack (contiguous [G, Np, Kp/2] and
  /// [G, Np, Kp/32], lowbit/mxfp4_pack.hpp), or with precision kFp8TensorCores of
  /// group_gemm_mxfp4_prepack_fp8 ([G, Np/128, Kq/128, 128, 64] and [G, Np/128, Kq/128, 128, 4]);
  /// N is taken from out, b_scale_layout is not used.
  bool b_packed = false;
  /// kExact (default) or the opt-in kFp8TensorCores (MXFP8 a, FP8-path packed b; GemmPrecision).
  GemmPrecision precision = GemmPrecision::kExact;
};

/// Constraints: K a multiple of 32 (the MX block), N a multiple of 8; empty groups allowed.
/// precision kFp8TensorCores: a MXFP8 (E4M3 or E5M2 codes with a_scale; bfloat16 a is refused,
/// naming `precision`), b / b_scale from group_gemm_mxfp4_prepack_fp8 with b_packed (other weights
/// are refused with NotSupportedError); on CUDA also a's base 16-byte aligned, its row stride a
/// multiple of 16 bytes and fewer than 2^31 rows (the activation tiles are read by TMA:
/// NotSupportedError otherwise). CPU tensors compute the exact reference for either precision.
void group_gemm_mxfp4_nt_groupwise(const GroupGemmArgs& args, Stream stream = {});

/// Reorders MXFP4 expert weights once (at load time, as serving engines do) into the layout the
/// sm_90a kernel decodes with the fewest instructions (lowbit/mxfp4_pack.hpp): b [G, N, K/2] and
/// b_scale (G x N x K/32 in b_scale_layout: row-major or blocked128x4) -> packed_b uint8
/// [G, Np, Kp/2] and packed_scale uint8 [G, Np, Kp/32], contiguous, Np = N rounded up to 128,
/// Kp = K rounded up to 256. Lossless (mxfp4_packed_code inverts it); CPU and CUDA tensors.
void group_gemm_mxfp4_prepack(const TensorView& b, const TensorView& b_scale, const ScaleLayout& b_scale_layout,
                              const TensorView& packed_b, const TensorView& packed_scale, Stream stream = {});

/// The weight prepack of the FP8 tensor-core path (GemmPrecision::kFp8TensorCores;
/// lowbit/mxfp4_pack.hpp): b [G, N, K/2] and b_scale (G x N x K/32 in b_scale_layout) -> packed_b
/// uint8 [G, Np/128, Kq/128, 128, 64] and packed_scale uint8 [G, Np/128, Kq/128, 128, 4],
/// contiguous, Np = N rounded up to 128, Kq = K rounded up to 128: one 128-row x 128-K tile of
/// codes and of scale bytes after the other, each thread's codes of a tile contiguous, bits placed
/// for the E2M1 -> E4M3 decode. Lossless (mxfp4_fp8_code inverts it); CPU and CUDA tensors.
void group_gemm_mxfp4_prepack_fp8(const TensorView& b, const TensorView& b_scale, const ScaleLayout& b_scale_layout,
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

/// The gpt-oss expert MLP over rows already grouped by expert (expert parallelism: what a
/// dispatch delivers to the GPU of the experts), without routing or weighting: for every row x_r
/// of local expert e,
///   h = act(x_r) @ W1[e]^T + b1[e]; g = min(h[0::2], limit); u = clamp(h[1::2], -limit, limit)
///   y = g * sigmoid(alpha * g) * (u + 1);   out_r = act(y) @ W2[e]^T + b2[e]
/// with the rounding points of gpt_oss_moe_mlp (each row's out_r is bit for bit that op's
/// per-expert term o before its weighting, CPU reference; docs/moe_ep.md). The rows of expert e:
///  - contiguous: x [M, H], the m_counts[e] rows after those of experts < e; sum(m_counts) <= M;
///  - masked: x [E, max_tokens, H], rows 0 .. m_counts[e]-1 of batch e.
/// Rows outside the counts are neither read nor written. Host m_counts are validated, device
/// ones clamped (GroupGemmArgs). x may also be MXFP8 as a quantized dispatch delivers it: E4M3
/// codes with x_scale (UE8M0 per 32, row-major); act() then rounds the decoded values.
struct ExpertMlpArgs {
  TensorView x;         ///< [M, H] or [E, max_tokens, H]: bfloat16 / float32, or float8_e4m3fn with x_scale
  TensorView x_scale;   ///< MXFP8 x: [M, H/32] / [E, max_tokens, H/32] (or the 2-D view) UE8M0, row-major
  TensorView m_counts;  ///< [E] int32 / int64
  TensorView w1, w1_scale;  ///< [E, 2I, H/2] MXFP4 codes; [E, 2I, H/32] UE8M0 row-major
  TensorView b1;            ///< [E, 2I] float32 / bfloat16
  TensorView w2, w2_scale;  ///< [E, H, I/2]; [E, H, I/32]
  TensorView b2;            ///< [E, H]
  bool packed = false;      ///< weights from group_gemm_mxfp4_prepack (as MoeMlpArgs::packed)
  float alpha = 1.702f;
  float limit = 7.0f;
  ActQuant act = ActQuant::kBF16;
  int64_t expected_m = 0;   ///< masked layout: tile-size hint (GroupGemmArgs::expected_m)
  TensorView out;           ///< x's leading shape with H: bfloat16 / float32
};

void gpt_oss_expert_mlp(const ExpertMlpArgs& args, Stream stream = {});

}  // namespace lowbit
