// src/ref/ref_linear.hpp: CPU reference of the dense NVFP4 linear (nvfp4_gemm), the definition a
// CUDA kernel will be checked against with the GEMM rule |out - ref| <= 1e-3 + 1e-3 |ref|. The
// dense MXFP4 linear (mxfp4_gemm) runs ref::group_gemm_mxfp4 with one group (ref_moe.hpp).
#pragma once

#include "core/plan_linear.hpp"

namespace lowbit::ref {

/// p.b_packed: b holds nvfp4_gemm_prepack's chunks (unpacked here first).
void nvfp4_gemm(const detail::Nvfp4GemmPlan& p);

/// The prepacked B of nvfp4_gemm (p.b / p.sfb / p.spb, N % 64 == 0, K % 64 == 0) into `out`
/// (nvfp4_gemm_packed_bytes(N, K) bytes): for each 64-row block rb and 64-deep K tile kt, chunk
/// (rb * K/64 + kt) of 2304 bytes: 128 threads' fragments of 16 bytes (the layout
/// src/cuda/gemm/single_epilogue.cuh's prepack kernel writes and the dual GEMM's mainloop reads),
/// then the 64 rows' four E4M3 scales (row r at byte 2048 + 4 r, K block j at + j).
void nvfp4_gemm_prepack(const detail::Nvfp4GemmPlan& p, uint8_t* out);

/// The inverse: codes [N, K/2] (element 2k in the low nibble) and row-major E4M3 scales [N, K/16].
void nvfp4_gemm_unpack(const uint8_t* packed, int64_t N, int64_t K, uint8_t* codes, uint8_t* scales);

}  // namespace lowbit::ref
