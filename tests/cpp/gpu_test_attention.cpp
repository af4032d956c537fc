// MXFP8 flash-attention forward (lowbit::flash_attn_mxfp8 / flash_attn_mxfp8_varlen) on the GPU
// against the host attentions of attention_util.hpp, with FlashAttention-3's accuracy rule:
//
//   max|O - O_ref| <= 2 max|O_pt - O_ref| + 2 max|bf16(O_ref) - O_ref|  (per 32-channel block)
//   |lse - lse_ref| <= 1e-3 max(1, |lse_ref|)   (+ 2^-10 max_j softmax_scale sum_c |q_c k_c| on the
//                                                 FP8 path: the E8M13 accumulator of FP8 MMAs)
//
// O_ref: fp64 attention of the dequantized operands (checked against the library's CPU
// reference by test_attention_ref.cpp); O_pt: the same attention in low precision, P rounded as
// the kernel rounds it (kKernelPE4M3). Outputs are poisoned with 0xFF bytes (NaN) first; rows
// that see no key must read exactly out 0, lse -inf. Random MXFP8 operands with per-row and
// per-block scale exponents up to +-40 (values stay finite). The full sweep lives in
// tests/python/test_attention_gpu.py; this is a subset of its shapes. Each test runs for the
// default exact path (GpuAttention.*, P in bf16) and the opt-in FP8 tensor-core path
// (GpuAttentionFp8.*, AttnPrecision::kFp8: P in E4M3, O_pt rounds P to E4M3 too).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "gpu_test_util.hpp"
#include "lowbit/attention.hpp"

using namespace lowbit;
using attntest::Data;
using attntest::Shape;

namespace {

using gputest::Dev;
using gputest::have_gpu;

/// Whether the kernel rounds P to E4M3 before the PV product (docs/attention.md, "Kernel").
constexpr bool kKernelPE4M3 = false;

bool have_kernel() {
  if (!have_gpu()) return false;
  const BuildInfo b = build_info();
  return std::find(b.cuda_ops.begin(), b.cuda_ops.end(), "flash_attn_mxfp8") != b.cuda_ops.end();
}

TensorView dev_view(void* p, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(p, t, dims, Device::kCUDA, 0);
}

struct GpuOut {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

GpuOut run_gpu(const Data& x, float scale, AttnPrecision prec = AttnPrecision::kExact) {
  const Shape& s = x.s;
  Dev<uint8_t> q(x.q), k(x.k), v(x.v), qs(x.qs), ks(x.ks), vs(x.vs);
  Dev<uint16_t> o(x.q.size());
  Dev<float> lse(size_t(s.b * s.h * s.sq));
  cudaMemset(o.p, 0xFF, o.n * 2);
  cudaMemset(lse.p, 0xFF, lse.n * 4);
  AttnArgs a;
  a.softmax_scale = scale;
  a.causal = s.causal;
  a.precision = prec;
  flash_attn_mxfp8(dev_view(q.p, DType::kE4M3, {s.b, s.sq, s.h, s.d}), dev_view(k.p, DType::kE4M3, {s.b, s.sk, s.hk, s.d}),
                   dev_view(v.p, DType::kE4M3, {s.b, s.sk, s.hk, s.d}),
                   dev_view(qs.p, DType::kUE8M0, {s.b, s.h, s.sq, s.d / 32}),
                   dev_view(ks.p, DType::kUE8M0, {s.b, s.hk, s.sk, s.d / 32}),
                   dev_view(vs.p, DType::kUE8M0, {s.b, s.hk, s.sk, s.d / 32}),
                   dev_view(o.p, DType::kBFloat16, {s.b, s.sq, s.h, s.d}), dev_view(lse.p, DType::kFloat32, {s.b, s.h, s.sq}), a);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {o.get(), lse.get()};
}

/// The accuracy rule over one problem; `what` names it in failures. p_e4m3: the path rounds P to
/// E4M3 (the FP8 path), and so does O_pt.
/// fp8_scores: the scores come from FP8 tensor cores, whose accumulator keeps 13 fraction bits
/// (E8M13 on Hopper), so lse may also move by a few of its roundings relative to the row's
/// largest softmax_scale * sum_c |q_c k_c|: 2^-10 of it is allowed on top of the 1e-3 rule.
void check_rule(const Data& x, const GpuOut& g, double scale, const std::string& what, bool p_e4m3 = kKernelPE4M3,
                bool fp8_scores = false) {
  const attntest::Result ref = attntest::naive(x, scale), pt = attntest::low_precision(x, scale, p_e4m3);
  // the rule per 32-channel block of the head dimension (the blocks' magnitudes differ by up to
  // 2^80 when the V scales are spread: one maximum over all of them would hide the small ones)
  const int64_t d = x.s.d, nb = d / 32;
  std::vector<double> err(size_t(nb), 0.0), err_pt(size_t(nb), 0.0), err_bf16(size_t(nb), 0.0);
  int bad = 0;
  for (size_t e = 0; e < ref.out.size(); ++e) {
    const double o = decode_bf16(g.o[e]), r = ref.out[e];
    const size_t blk = size_t(int64_t(e) % d / 32);
    if (!std::isfinite(o)) {
      if (bad++ < 5) ADD_FAILURE() << what << ": out[" << e << "] = " << o << " (reference " << r << ")";
      continue;
    }
    err[blk] = std::max(err[blk], std::fabs(o - r));
    err_pt[blk] = std::max(err_pt[blk], std::fabs(pt.out[e] - r));
    err_bf16[blk] = std::max(err_bf16[blk], std::fabs(attntest::bf16(r) - r));
  }
  for (size_t blk = 0; blk < size_t(nb); ++blk)
    EXPECT_LE(err[blk], 2 * err_pt[blk] + 2 * err_bf16[blk])
        << what << ", channels " << blk * 32 << "..: max|O - O_ref| = " << err[blk] << ", max|O_pt - O_ref| = "
        << err_pt[blk] << ", max|bf16(O_ref) - O_ref| = " << err_bf16[blk];
  const Shape& s = x.s;
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h)
      for (int64_t i = 0; i < s.sq; ++i) {
        const size_t e = size_t((b * s.h + h) * s.sq + i);
        const double l = g.lse[e], r = ref.lse[e];
        if (attntest::visible(s, i) == 0) {
          EXPECT_EQ(l, -std::numeric_limits<double>::infinity()) << what << ": masked row " << i << " lse";
          for (int64_t c = 0; c < s.d; ++c)
            if (g.o[x.iq(b, i, h, c)] != 0 && bad++ < 5)
              ADD_FAILURE() << what << ": masked row " << i << " out[" << c << "] = " << decode_bf16(g.o[x.iq(b, i, h, c)]);
        } else if (!(std::fabs(l - r) <= 1e-3 * std::max(1.0, std::fabs(r)) +
                                             (fp8_scores ? std::ldexp(ref.score_abs[e], -10) : 0.0)) &&
                   bad++ < 5) {
          ADD_FAILURE() << what << ": lse[b " << b << ", h " << h << ", i " << i << "] = " << l << ", reference " << r;
        }
      }
}

std::string name(const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "b%lld sq%lld sk%lld h%lld/%lld d%lld%s", (long long)s.b, (long long)s.sq,
                (long long)s.sk, (long long)s.h, (long long)s.hk, (long long)s.d, s.causal ? " causal" : "");
  return buf;
}

void fixed_length_sweep(AttnPrecision prec) {
  const bool fp8 = prec == AttnPrecision::kFp8;
  const std::pair<int64_t, int64_t> lens[] = {{1, 239}, {3, 799}, {113, 203}, {128, 217}, {108, 256}, {799, 3}, {1024, 1023}};
  const std::pair<int64_t, int64_t> heads[] = {{1, 1}, {4, 1}, {8, 2}};
  uint64_t seed = 1000;
  int n = 0;
  for (const auto& [sq, sk] : lens)
    for (int64_t d : {64, 128, 256})
      for (bool causal : {false, true}) {
        const auto& [h, hk] = heads[size_t(n++) % 3];
        const Shape s{sq * sk > 100000 ? 1 : 2, sq, sk, h, hk, d, causal};
        const Data x = attntest::make_data(s, seed++, n % 2 ? 40 : 0);
        const double scale = 1.0 / std::sqrt(double(d));
        check_rule(x, run_gpu(x, float(scale), prec), scale, name(s) + (fp8 ? " fp8" : ""), fp8 || kKernelPE4M3, fp8);
      }
}

TEST(GpuAttention, FixedLengthSweep) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  fixed_length_sweep(AttnPrecision::kExact);
}

TEST(GpuAttentionFp8, FixedLengthSweep) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  fixed_length_sweep(AttnPrecision::kFp8);
}

void softmax_scale_and_mqa(AttnPrecision prec) {
  const bool fp8 = prec == AttnPrecision::kFp8;
  const Shape s{1, 127, 512, 8, 1, 128, true};
  const Data x = attntest::make_data(s, 7, 10);
  check_rule(x, run_gpu(x, 0.05f, prec), double(0.05f), name(s) + " scale 0.05", fp8 || kKernelPE4M3, fp8);
}

TEST(GpuAttention, SoftmaxScaleAndMqa) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  softmax_scale_and_mqa(AttnPrecision::kExact);
}

TEST(GpuAttentionFp8, SoftmaxScaleAndMqa) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  softmax_scale_and_mqa(AttnPrecision::kFp8);
}

void varlen(AttnPrecision prec) {
  const bool fp8 = prec == AttnPrecision::kFp8;
  const int64_t h = 4, hk = 2, d = 128;
  const std::vector<int64_t> lq = {1, 300, 129, 2048, 17}, lk = {5, 300, 1000, 2048, 1};
  for (bool causal : {false, true}) {
    std::vector<Data> seqs;
    std::vector<int32_t> cq = {0}, ck = {0};
    for (size_t b = 0; b < lq.size(); ++b) {
      seqs.push_back(attntest::make_data({1, lq[b], lk[b], h, hk, d, causal}, 500 + b, 20));
      cq.push_back(cq.back() + int32_t(lq[b]));
      ck.push_back(ck.back() + int32_t(lk[b]));
    }
    const int64_t TQ = cq.back(), TK = ck.back();
    std::vector<uint8_t> q(size_t(TQ * h * d)), k(size_t(TK * hk * d)), v(k.size()), qs(size_t(h * TQ * d / 32)),
        ks(size_t(hk * TK * d / 32)), vs(ks.size());
    for (size_t b = 0; b < lq.size(); ++b) {
      const Data& x = seqs[b];
      std::memcpy(&q[size_t(cq[b] * h * d)], x.q.data(), x.q.size());
      std::memcpy(&k[size_t(ck[b] * hk * d)], x.k.data(), x.k.size());
      std::memcpy(&v[size_t(ck[b] * hk * d)], x.v.data(), x.v.size());
      for (int64_t hh = 0; hh < h; ++hh)
        std::memcpy(&qs[size_t((hh * TQ + cq[b]) * d / 32)], &x.qs[x.iqs(0, hh, 0, 0)], size_t(lq[b] * d / 32));
      for (int64_t hh = 0; hh < hk; ++hh) {
        std::memcpy(&ks[size_t((hh * TK + ck[b]) * d / 32)], &x.ks[x.iks(0, hh, 0, 0)], size_t(lk[b] * d / 32));
        std::memcpy(&vs[size_t((hh * TK + ck[b]) * d / 32)], &x.vs[x.iks(0, hh, 0, 0)], size_t(lk[b] * d / 32));
      }
    }
    Dev<uint8_t> dq(q), dk(k), dv(v), dqs(qs), dks(ks), dvs(vs);
    Dev<int32_t> dcq(cq), dck(ck);
    Dev<uint16_t> o(size_t(TQ * h * d));
    Dev<float> lse(size_t(h * TQ));
    cudaMemset(o.p, 0xFF, o.n * 2);
    cudaMemset(lse.p, 0xFF, lse.n * 4);
    AttnArgs a;
    a.causal = causal;
    a.precision = prec;
    flash_attn_mxfp8_varlen(dev_view(dq.p, DType::kE4M3, {TQ, h, d}), dev_view(dk.p, DType::kE4M3, {TK, hk, d}),
                            dev_view(dv.p, DType::kE4M3, {TK, hk, d}), dev_view(dqs.p, DType::kUE8M0, {h, TQ, d / 32}),
                            dev_view(dks.p, DType::kUE8M0, {hk, TK, d / 32}),
                            dev_view(dvs.p, DType::kUE8M0, {hk, TK, d / 32}),
                            dev_view(dcq.p, DType::kInt32, {int64_t(cq.size())}),
                            dev_view(dck.p, DType::kInt32, {int64_t(ck.size())}), 2048, 2048,
                            dev_view(o.p, DType::kBFloat16, {TQ, h, d}), dev_view(lse.p, DType::kFloat32, {h, TQ}), a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> ho = o.get();
    const std::vector<float> hl = lse.get();
    for (size_t b = 0; b < lq.size(); ++b) {
      GpuOut g;
      g.o.assign(ho.begin() + cq[b] * h * d, ho.begin() + cq[b + 1] * h * d);
      for (int64_t hh = 0; hh < h; ++hh)
        g.lse.insert(g.lse.end(), hl.begin() + hh * TQ + cq[b], hl.begin() + hh * TQ + cq[b + 1]);
      check_rule(seqs[b], g, 1.0 / std::sqrt(double(d)), "varlen " + name(seqs[b].s) + (fp8 ? " fp8" : ""),
                 fp8 || kKernelPE4M3, fp8);
    }
  }
}

TEST(GpuAttention, Varlen) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  varlen(AttnPrecision::kExact);
}

TEST(GpuAttentionFp8, Varlen) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  varlen(AttnPrecision::kFp8);
}

/// The NaN pattern of one head: rows where nan_row(i) holds are NaN in lse and every channel; other
/// elements must be NaN where nan_elem(i, c) holds and finite unless nan_allowed(i, c).
template <typename Row, typename Elem, typename Allowed>
void expect_nan_pattern(const Shape& s, const Data& x, const GpuOut& g, Row nan_row, Elem nan_elem, Allowed nan_allowed) {
  for (int64_t i = 0; i < s.sq; ++i) {
    EXPECT_EQ(std::isnan(g.lse[size_t(i)]), nan_row(i)) << "lse row " << i;
    for (int64_t c = 0; c < s.d; ++c) {
      const bool nan = std::isnan(decode_bf16(g.o[x.iq(0, i, 0, c)]));
      if (nan_row(i) || nan_elem(i, c)) {
        EXPECT_TRUE(nan) << "row " << i << " c " << c;
      } else if (!nan_allowed(i, c)) {
        EXPECT_FALSE(nan) << "row " << i << " c " << c;
      }
    }
  }
}

void nan_rules(AttnPrecision prec) {
  // q row 5 NaN scale, key 40 NaN code, v[70, 3] NaN code; causal 200 x 200, one head
  const Shape s{1, 200, 200, 1, 1, 64, true};
  Data x = attntest::make_data(s, 77, 0);
  x.qs[x.iqs(0, 0, 5, 0)] = 255;
  x.k[x.ik(0, 40, 0, 9)] = 0x7F;
  x.v[x.ik(0, 70, 0, 3)] = 0xFF;
  const GpuOut g = run_gpu(x, 0.125f, prec);
  // out[i, 3] for i < 70: NaN allowed (rows of the key tile that holds key 70; docs/attention.md)
  expect_nan_pattern(
      s, x, g, [](int64_t i) { return i == 5 || i >= 40; }, [](int64_t, int64_t) { return false; },
      [](int64_t, int64_t c) { return c == 3; });
}

TEST(GpuAttention, NaNRules) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  nan_rules(AttnPrecision::kExact);
}

TEST(GpuAttentionFp8, NaNRules) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  nan_rules(AttnPrecision::kFp8);
}

void nan_scale_bytes(AttnPrecision prec) {
  // q row 5 a NaN code, key 40 a NaN scale byte (channels 32..63), v[170, 0..31] a NaN scale byte
  const Shape s{1, 300, 300, 1, 1, 64, true};
  Data x = attntest::make_data(s, 78, 0);
  x.q[x.iq(0, 5, 0, 33)] = 0x7F;
  x.ks[x.iks(0, 0, 40, 32)] = 255;
  x.vs[x.iks(0, 0, 170, 0)] = 255;
  const GpuOut g = run_gpu(x, 0.125f, prec);
  // rows 128..169 share key 170's tile (128 keys at d = 64 on both paths): NaN allowed in channels 0..31
  expect_nan_pattern(
      s, x, g, [](int64_t i) { return i == 5 || i >= 40; }, [](int64_t i, int64_t c) { return i >= 170 && c < 32; },
      [](int64_t i, int64_t c) { return c < 32 && i >= 128; });
}

TEST(GpuAttention, NaNScaleBytes) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  nan_scale_bytes(AttnPrecision::kExact);
}

TEST(GpuAttentionFp8, NaNScaleBytes) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  nan_scale_bytes(AttnPrecision::kFp8);
}

TEST(GpuAttention, MisalignedCodesAreRefused) {
  if (!have_kernel()) GTEST_SKIP() << "no CUDA device or no sm_90a attention kernel in this build";
  // TMA needs 16-byte aligned bases and strides: a q one byte off, or a k with a row stride of
  // 72 bytes, is refused naming the argument (nothing is launched)
  const Shape s{1, 4, 4, 1, 1, 64, false};
  const Data x = attntest::make_data(s, 3, 0);
  Dev<uint8_t> q(size_t(4 * 64 + 16)), k(size_t(4 * 72)), v(x.v), qs(x.qs), ks(x.ks), vs(x.vs);
  Dev<uint16_t> o(x.q.size());
  Dev<float> lse(4);
  const auto call = [&](TensorView qv, TensorView kv) {
    flash_attn_mxfp8(qv, kv, dev_view(v.p, DType::kE4M3, {1, 4, 1, 64}), dev_view(qs.p, DType::kUE8M0, {1, 1, 4, 2}),
                     dev_view(ks.p, DType::kUE8M0, {1, 1, 4, 2}), dev_view(vs.p, DType::kUE8M0, {1, 1, 4, 2}),
                     dev_view(o.p, DType::kBFloat16, {1, 4, 1, 64}), dev_view(lse.p, DType::kFloat32, {1, 1, 4}));
  };
  const TensorView k_ok = dev_view(k.p, DType::kE4M3, {1, 4, 1, 64});
  try {
    call(dev_view(q.p + 1, DType::kE4M3, {1, 4, 1, 64}), k_ok);
    ADD_FAILURE() << "a misaligned q was accepted";
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.arg(), "q") << e.what();
  }
  try {
    call(dev_view(q.p, DType::kE4M3, {1, 4, 1, 64}),
         TensorView(k.p, DType::kE4M3, {1, 4, 1, 64}, {288, 72, 64, 1}, Device::kCUDA, 0));
    ADD_FAILURE() << "a k row stride of 72 bytes was accepted";
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.arg(), "k") << e.what();
  }
}

}  // namespace
