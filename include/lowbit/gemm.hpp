// lowbit/gemm.hpp: the GEMM operations (C++ API): the NVFP4 dual GEMM here, the grouped MXFP4
// GEMM and the MoE MLP in lowbit/moe.hpp, the dense MXFP4 / NVFP4 linears in lowbit/linear.hpp
// (both included). CPU tensors run the fp32/fp64 reference in
// src/ref; CUDA tensors run the sm_90a kernels where they exist, and otherwise throw
// NotSupportedError (never a silent fallback).
#pragma once

#include "lowbit/linear.hpp"
#include "lowbit/moe.hpp"
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
