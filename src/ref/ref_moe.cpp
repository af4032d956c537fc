// src/ref/ref_moe.cpp: CPU references of the MXFP4 grouped GEMM (every row layout), its weight
// prepack and the gpt-oss expert MLPs (routed, and over expert-grouped rows): dequantize every
// operand exactly to fp32, accumulate in fp64, epilogue in fp32. The grouped GEMM with one group and
// a bias is also the dense mxfp4_gemm's reference.
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "lowbit/mxfp4_pack.hpp"
#include "ref/ref_moe.hpp"

namespace lowbit::ref {
using namespace lowbit::detail;

void group_gemm_mxfp4(const GroupGemmPlan& p) {
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t c0 = p.bound(g), c1 = p.bound(g + 1);  // compact rows of the group
    if (c1 <= c0) continue;
    const int64_t m0 = p.phys_row(g, c0), m1 = m0 + (c1 - c0);  // its rows of a and out
    std::vector<float> B(size_t(p.N * p.K));
    const uint8_t* bg = p.b + g * p.b_sG;
    const int64_t Np = mxfp4_packed_rows(p.N), Kq = mxfp4_fp8_packed_k(p.K);
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t k = 0; k < p.K; ++k) {
        if (p.fp8) {  // the FP8-path packed layout (tiles of 128 x 128)
          const uint8_t code = uint8_t(mxfp4_fp8_code(p.b, g, n, k, Np, Kq));
          B[size_t(n * p.K + k)] = decode_e2m1(code) * decode_ue8m0(p.b_scale[mxfp4_fp8_scale_offset(g, n, k, Np, Kq)]);
          continue;
        }
        const uint8_t code = uint8_t(mxfp4_row_code(bg + n * p.b_sN, k, p.b_packed));
        B[size_t(n * p.K + k)] = decode_e2m1(code) * decode_ue8m0(p.b_scale[p.spb.offset(g, n, k / 32)]);
      }
    parallel_for(m1 - m0, [&](int64_t i) {
      const int64_t m = m0 + i;
      std::vector<float> A(size_t(p.K));
      for (int64_t k = 0; k < p.K; ++k) {
        const float v = load_float(p.a, p.a_dtype, m * p.a_sM + k);
        A[size_t(k)] = p.a_scale ? v * decode_ue8m0(p.a_scale[p.spa.offset(0, m, k / 32)]) : v;
      }
      for (int64_t n = 0; n < p.N; ++n) {
        double acc = 0.0;
        const float* br = B.data() + n * p.K;
        for (int64_t k = 0; k < p.K; ++k) acc += double(A[size_t(k)]) * double(br[k]);
        const float bias = p.bias ? load_float(p.bias, p.bias_dtype, n) : 0.0f;
        store_float(p.out, p.out_dtype, m * p.o_sM + n, p.bias ? float(acc) + bias : float(acc));
      }
    });
  }
}

}  // namespace lowbit::ref

namespace lowbit::ref {
using namespace lowbit::detail;

void round_activation(float* v, int64_t n, bool mxfp8) {
  if (!mxfp8) {
    for (int64_t i = 0; i < n; ++i) v[i] = decode_bf16(encode_bf16(v[i]));
    return;
  }
  const BlockFormat f = BlockFormat::mxfp8();
  for (int64_t b = 0; b < n; b += 32) {
    BlockStats st = block_stats_init(v[b]);
    for (int64_t i = 1; i < 32; ++i) st.add(v[b + i]);
    const BlockScale s = compute_block_scale(f, st, QuantContext{});
    for (int64_t i = 0; i < 32; ++i) v[b + i] = decode_element(f, encode_element(f, s, v[b + i]), s.code, 0);
  }
}

namespace {
/// One output row of an MXFP4 expert matrix times a vector: sum_k dec(W[r, k]) * v[k] in fp64.
double mxfp4_row_dot(const uint8_t* w, const uint8_t* ws, const float* v, int64_t K, bool packed) {
  double acc = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t code = uint8_t(mxfp4_row_code(w, k, packed));
    acc += double(decode_e2m1(code) * decode_ue8m0(ws[k / 32])) * double(v[k]);
  }
  return acc;
}
}  // namespace

void mxfp4_prepack(const Mxfp4PackPlan& p) {
  const int64_t Np = mxfp4_packed_rows(p.N), Kp = mxfp4_packed_k(p.K);
  parallel_for(p.G * Np, [&](int64_t gn) {
    const int64_t g = gn / Np, n = gn % Np;
    uint8_t* out = p.packed_b + gn * (Kp / 2);
    for (int64_t w = 0; w < Kp / 8; ++w) {
      const uint32_t word = p.word(g, n, w);
      for (int i = 0; i < 4; ++i) out[4 * w + i] = uint8_t(word >> (8 * i));
    }
    uint8_t* so = p.packed_scale + gn * (Kp / 32);
    for (int64_t c = 0; c < Kp / 32; ++c) so[c] = p.scale(g, n, c);
  });
}

void mxfp4_prepack_fp8(const Mxfp4PackPlan& p) {
  const int64_t Np = mxfp4_packed_rows(p.N), Kq = mxfp4_fp8_packed_k(p.K), kts = Kq / kMxfp4Fp8PackK;
  parallel_for(p.G * Np, [&](int64_t gn) {
    const int64_t g = gn / Np, n = gn % Np;
    for (int64_t kt = 0; kt < kts; ++kt) {
      const int64_t tile = (g * (Np / kMxfp4PackRows) + n / kMxfp4PackRows) * kts + kt;
      uint8_t* out = p.packed_b + tile * kMxfp4Fp8TileBytes + (n % kMxfp4PackRows) * 64;
      for (int w = 0; w < 16; ++w) {
        const uint32_t word = p.fp8_word(g, n, kt, w);
        for (int i = 0; i < 4; ++i) out[4 * w + i] = uint8_t(word >> (8 * i));
      }
      uint8_t* so = p.packed_scale + tile * kMxfp4Fp8TileScales + (n % kMxfp4PackRows) * 4;
      for (int b = 0; b < 4; ++b) so[b] = p.scale(g, n, kt * 4 + b);
    }
  });
}

namespace {
/// One expert's term of the MLP for an activation row x (already through act()):
/// o[h] = act(y) @ W2[e]^T + b2[e] with y the clamped SwiGLU of act(x) @ W1[e]^T + b1[e] (y: I
/// floats of scratch). Shared by the routed MLP and the expert-row MLP, so that both give the
/// same bits for the same (row, expert).
void expert_term(const MoeMlpPlan& p, int64_t e, const float* x, float* y, float* o) {
  for (int64_t i = 0; i < p.I; ++i) {
    float hv[2];
    for (int r = 0; r < 2; ++r) {
      const int64_t row = 2 * i + r;
      const double d = mxfp4_row_dot(p.w1 + e * p.w1_sE + row * p.w1_sR, p.w1s + e * p.w1s_sE + row * p.w1s_sR, x,
                                     p.H, p.packed);
      hv[r] = float(d) + load_float(p.b1, p.b1_dtype, e * p.b1_sE + row);
    }
    const float g = hv[0] < p.limit ? hv[0] : p.limit;
    const float u = hv[1] < -p.limit ? -p.limit : (hv[1] > p.limit ? p.limit : hv[1]);
    y[i] = g * (1.0f / (1.0f + std::exp(-p.alpha * g))) * (u + 1.0f);
  }
  round_activation(y, p.I, p.act_mxfp8);
  for (int64_t h = 0; h < p.H; ++h) {
    const double d = mxfp4_row_dot(p.w2 + e * p.w2_sE + h * p.w2_sR, p.w2s + e * p.w2s_sE + h * p.w2s_sR, y, p.I, p.packed);
    o[h] = float(d) + load_float(p.b2, p.b2_dtype, e * p.b2_sE + h);
  }
}
}  // namespace

void gpt_oss_moe_mlp(const MoeMlpPlan& p) {
  parallel_for(p.T, [&](int64_t t) {
    std::vector<float> x(size_t(p.H)), y(size_t(p.I)), o(size_t(p.H)), acc(size_t(p.H), 0.0f);
    for (int64_t h = 0; h < p.H; ++h) x[size_t(h)] = load_float(p.x, p.x_dtype, t * p.x_sT + h);
    round_activation(x.data(), p.H, p.act_mxfp8);
    for (int64_t j = 0; j < p.topk; ++j) {
      const int32_t e = p.ids[t * p.ids_sT + j];
      if (e < 0) continue;
      const float wt = p.weights[t * p.w_sT + j];
      expert_term(p, e, x.data(), y.data(), o.data());
      for (int64_t h = 0; h < p.H; ++h) acc[size_t(h)] += wt * o[size_t(h)];
    }
    for (int64_t h = 0; h < p.H; ++h) store_float(p.out, p.out_dtype, t * p.o_sT + h, acc[size_t(h)]);
  });
}

void gpt_oss_expert_mlp(const MoeMlpPlan& p) {
  const int64_t rows = p.row_indptr[p.E];  // compact rows of all experts
  parallel_for(rows, [&](int64_t r) {
    const int64_t e = group_of_row(p.row_indptr, p.E, r), xr = p.expert_row(p.row_indptr, e, r);
    std::vector<float> x(size_t(p.H)), y(size_t(p.I)), o(size_t(p.H));
    for (int64_t h = 0; h < p.H; ++h) x[size_t(h)] = p.x_value(xr, h);
    round_activation(x.data(), p.H, p.act_mxfp8);
    expert_term(p, e, x.data(), y.data(), o.data());
    for (int64_t h = 0; h < p.H; ++h) store_float(p.out, p.out_dtype, xr * p.o_sT + h, o[size_t(h)]);
  });
}

}  // namespace lowbit::ref
