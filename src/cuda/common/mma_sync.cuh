// src/cuda/common/mma_sync.cuh: the warp-level tensor-core product mma.sync.m16n8k16 (sm_80+) with
// bf16 or fp16 operands and fp32 accumulators, for kernels whose tiles are too small or irregular
// for wgmma (the K projection of the decode cache's encode). The fragments of a warp (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4, each 32-bit register holding
// two 16-bit elements, the lower index in the low half:
//   A 16 x 16 (row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
//                          a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B 16 x 8 (K x N):      b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   C 16 x 8 (fp32):       c[0], c[1] = C[g][2t], C[g][2t+1]; c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
// tests/cpp/emu/cuda/common/mma_sync.cuh is the host emulation of this product (same fragments).
#pragma once

#include <cstdint>

namespace lowbit::cuda {

/// c += A B over one 16 x 8 x 16 block (kFp16: fp16 operands, else bf16).
template <bool kFp16>
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, const uint32_t* b) {
  if constexpr (kFp16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

}  // namespace lowbit::cuda
