// src/ref/ref_linear.cpp: CPU reference of the dense NVFP4 linear: every operand decoded exactly to
// fp32 (E2M1 x E4M3 products and bf16 values are exact), dot products in fp64 rounded once to
// fp32, then the per-tensor decode scales and the bias in fp32 (the dual GEMM's conventions).
#include <vector>

#include "core/parallel.hpp"
#include "ref/ref_linear.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

namespace {
/// Row r of an NVFP4 operand (codes with row stride sR bytes, E4M3 scales in sp) as K floats.
void decode_row(const uint8_t* data, int64_t sR, const uint8_t* sf, const ScalePlan& sp, int64_t r, int64_t K,
                float* out) {
  const uint8_t* row = data + r * sR;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t code = (row[k / 2] >> ((k & 1) * 4)) & 0xF;
    out[k] = decode_e2m1(code) * decode_e4m3(sf[sp.offset(0, r, k / 16)]);
  }
}
}  // namespace

void nvfp4_gemm(const Nvfp4GemmPlan& p) {
  const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
  const float sd = sda * (p.amax_b ? nvfp4_global_decode_scale(*p.amax_b) : 1.0f);
  std::vector<float> B(size_t(p.N * p.K));
  for (int64_t n = 0; n < p.N; ++n) decode_row(p.b, p.b_sN, p.sfb, p.spb, n, p.K, B.data() + n * p.K);
  parallel_for(p.M, [&](int64_t m) {
    std::vector<float> A(size_t(p.K));
    if (p.a_bf16) {
      const uint16_t* row = static_cast<const uint16_t*>(p.a) + m * p.a_sM;
      for (int64_t k = 0; k < p.K; ++k) A[size_t(k)] = decode_bf16(row[k]);
    } else {
      decode_row(static_cast<const uint8_t*>(p.a), p.a_sM, p.sfa, p.spa, m, p.K, A.data());
    }
    for (int64_t n = 0; n < p.N; ++n) {
      const float* br = B.data() + n * p.K;
      double acc = 0.0;
      for (int64_t k = 0; k < p.K; ++k) acc += double(A[size_t(k)]) * double(br[k]);
      float v = float(acc) * sd;
      if (p.bias) v += load_float(p.bias, p.bias_dtype, n);
      store_float(p.out, p.out_dtype, m * p.o_sM + n, v);
    }
  });
}

}  // namespace lowbit::ref
