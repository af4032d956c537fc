// src/ref/ref_gemm.cpp: CPU reference of the NVFP4 dual GEMM + SiLU: dequantize every operand
// exactly to fp32 (E2M1 x E4M3 products are exact in fp32), accumulate in fp64, epilogue in fp32.
// The grouped GEMM and the MoE MLP: ref_moe.cpp.
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "ref/ref_gemm.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

namespace {
/// rows x K fp32 values of one NVFP4 operand (batch l).
std::vector<float> decode_nvfp4(const uint8_t* data, int64_t sR, const uint8_t* sf, const ScalePlan& sp, int64_t l,
                                int64_t rows, int64_t K) {
  std::vector<float> out(size_t(rows * K));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + r * sR;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t code = (row[k / 2] >> ((k & 1) * 4)) & 0xF;
      const float s = decode_e4m3(sf[sp.offset(l, r, k / 16)]);
      out[size_t(r * K + k)] = decode_e2m1(code) * s;
    }
  }
  return out;
}
}  // namespace

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void nvfp4_dual_gemm_silu(const DualGemmPlan& p) {
  const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
  const float sg = sda * (p.amax_b1 ? nvfp4_global_decode_scale(*p.amax_b1) : 1.0f);
  const float su = sda * (p.amax_b2 ? nvfp4_global_decode_scale(*p.amax_b2) : 1.0f);
  for (int64_t l = 0; l < p.L; ++l) {
    const auto A = decode_nvfp4(p.a + l * p.a_sL, p.a_sM, p.sfa, p.spa, l, p.M, p.K);
    const auto B1 = decode_nvfp4(p.b1 + l * p.b1_sL, p.b1_sN, p.sfb1, p.spb, l, p.N, p.K);
    const auto B2 = decode_nvfp4(p.b2 + l * p.b2_sL, p.b2_sN, p.sfb2, p.spb, l, p.N, p.K);
    parallel_for(p.M, [&](int64_t m) {
      const float* ar = A.data() + m * p.K;
      for (int64_t n = 0; n < p.N; ++n) {
        const float* g1 = B1.data() + n * p.K;
        const float* g2 = B2.data() + n * p.K;
        double acc_g = 0.0, acc_u = 0.0;
        for (int64_t k = 0; k < p.K; ++k) {
          acc_g += double(ar[k]) * double(g1[k]);
          acc_u += double(ar[k]) * double(g2[k]);
        }
        const float g = float(acc_g) * sg, u = float(acc_u) * su;
        store_float(p.c, p.c_dtype, l * p.c_sL + m * p.c_sM + n, silu(g) * u);
      }
    });
  }
}

}  // namespace lowbit::ref
