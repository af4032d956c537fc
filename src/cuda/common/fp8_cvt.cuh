// src/cuda/common/fp8_cvt.cuh: packed E4M3 <-> f16 conversions of whole 32-bit registers (sm_89+):
// four E4M3 codes to two f16x2 (codes 0, 1 -> lo; 2, 3 -> hi), and back with nearest-even
// satfinite rounding (NaN stays NaN). The PTX register-half moves let ptxas address the halves in
// the conversion itself (F2FP.F16.E4M3.UNPACK_B R, R.H1; F2FP.SATFINITE.E4M3.F16.UNPACK_B_MERGE_C)
// where the cuda_fp8.h intrinsics, taking 16-bit values, cost a shift or a PRMT per pair.
#pragma once

#include <cstdint>

namespace lowbit::cuda {

/// Bytes 0, 1 of w -> lo (f16x2, byte 0 in the low half), bytes 2, 3 -> hi; exact.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

/// f16x2 lo, hi -> four E4M3 codes (lo's halves in bytes 0, 1; hi's in bytes 2, 3).
__device__ __forceinline__ uint32_t f16x2x2_to_e4m3x4(uint32_t lo, uint32_t hi) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f16x2 l, %1;\n cvt.rn.satfinite.e4m3x2.f16x2 h, %2;\n"
      " mov.b32 %0, {l, h};\n}\n"
      : "=r"(d)
      : "r"(lo), "r"(hi));
  return d;
}

/// Four floats -> four E4M3 codes (nearest even, satfinite), a in byte 0 .. d in byte 3.
__device__ __forceinline__ uint32_t f32x4_to_e4m3x4(float a, float b, float c, float d) {
  uint32_t r;
  asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
      " mov.b32 %0, {l, h};\n}\n"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

}  // namespace lowbit::cuda
