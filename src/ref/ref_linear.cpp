// src/ref/ref_linear.cpp: CPU reference of the dense NVFP4 linear: every operand decoded exactly to
// fp32 (E2M1 x E4M3 products and bf16 values are exact), dot products in fp64 rounded once to
// fp32, then the per-tensor decode scales and the bias in fp32 (the dual GEMM's conventions).
#include <algorithm>
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
constexpr int64_t kPackRows = 64, kPackK = 64, kPackData = 2048, kPackChunk = 2304;

/// Bit offset within its chunk of the code of row r (0..63), element k (0..63) of the chunk: the
/// fragment order of the prepack kernel. Thread tid = 32 w + 4 g + t holds rows 16 w + g and
/// 16 w + g + 8 (hi) and, per 16-deep step s, elements 16 s + 2 t (+1) and 16 s + 2 t + 8 (+1):
/// in word s of its 16 bytes, nibble 2 (2 kh + hi) + odd... at bit 4 (2 kh + hi) + 16 odd.
int64_t pack_bit(int64_t r, int64_t k) {
  const int64_t w = r / 16, g = r % 8, hi = (r % 16) / 8;
  const int64_t s = k / 16, kh = (k % 16) / 8, t = (k % 8) / 2, odd = k % 2;
  const int64_t tid = 32 * w + 4 * g + t;
  return (16 * tid + 4 * s) * 8 + 4 * (2 * kh + hi) + 16 * odd;
}
}  // namespace

void nvfp4_gemm_prepack(const Nvfp4GemmPlan& p, uint8_t* out) {
  const int64_t kt_n = p.K / kPackK;
  parallel_for(p.N / kPackRows, [&](int64_t rb) {
    for (int64_t kt = 0; kt < kt_n; ++kt) {
      uint8_t* dst = out + (rb * kt_n + kt) * kPackChunk;
      std::fill(dst, dst + kPackChunk, uint8_t(0));
      for (int64_t r = 0; r < kPackRows; ++r) {
        const int64_t n = rb * kPackRows + r;
        for (int64_t k = 0; k < kPackK; ++k) {
          const int64_t kk = kt * kPackK + k, bit = pack_bit(r, k);
          const uint8_t code = (p.b[n * p.b_sN + kk / 2] >> ((kk & 1) * 4)) & 0xF;
          dst[bit / 8] = uint8_t(dst[bit / 8] | (code << (bit % 8)));
        }
        for (int64_t j = 0; j < kPackK / 16; ++j) dst[kPackData + 4 * r + j] = p.sfb[p.spb.offset(0, n, kt * 4 + j)];
      }
    }
  });
}

void nvfp4_gemm_unpack(const uint8_t* packed, int64_t N, int64_t K, uint8_t* codes, uint8_t* scales) {
  const int64_t kt_n = K / kPackK;
  parallel_for(N / kPackRows, [&](int64_t rb) {
    for (int64_t kt = 0; kt < kt_n; ++kt) {
      const uint8_t* src = packed + (rb * kt_n + kt) * kPackChunk;
      for (int64_t r = 0; r < kPackRows; ++r) {
        const int64_t n = rb * kPackRows + r;
        for (int64_t k = 0; k < kPackK; k += 2) {
          const int64_t b0 = pack_bit(r, k), b1 = pack_bit(r, k + 1);
          const uint8_t c0 = (src[b0 / 8] >> (b0 % 8)) & 0xF, c1 = (src[b1 / 8] >> (b1 % 8)) & 0xF;
          codes[n * (K / 2) + (kt * kPackK + k) / 2] = uint8_t(c0 | (c1 << 4));
        }
        for (int64_t j = 0; j < kPackK / 16; ++j) scales[n * (K / 16) + kt * 4 + j] = src[kPackData + 4 * r + j];
      }
    }
  });
}

void nvfp4_gemm(const Nvfp4GemmPlan& p_in) {
  Nvfp4GemmPlan p = p_in;
  std::vector<uint8_t> codes, scales;  // a packed B, unpacked
  if (p.b_packed) {
    codes.resize(size_t(p.N * p.K / 2));
    scales.resize(size_t(p.N * p.K / 16));
    nvfp4_gemm_unpack(p.b, p.N, p.K, codes.data(), scales.data());
    p.b = codes.data();
    p.b_sN = p.K / 2;
    p.sfb = scales.data();
    p.spb = ScalePlan{};
    p.spb.layout = ScaleLayout::row_major();
    p.spb.rows = p.spb.rows_pad = p.N;
    p.spb.cols = p.K / 16;
  }
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
