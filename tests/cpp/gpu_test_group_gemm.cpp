// MXFP4 grouped GEMM (group_gemm_mxfp4_nt_groupwise) on the GPU against the CPU reference run on
// the same bytes: every output element within one ulp of the output dtype at the reference
// value (an element beyond one ulp passes only within 2^-20 * sum_k |a_k b_k|, the resolution of
// an fp32 sum where it cancels), NaN exactly where the reference is NaN, equal infinities.
// Outputs are poisoned (NaN; a finite pattern too where the reference has NaNs) before each call.
// m_indptr lives on the device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lowbit/moe.hpp"
#include "ref_formats.hpp"

using namespace lowbit;

namespace {

using gputest::Dev;
using gputest::have_gpu;

enum class Act { kE4M3, kE5M2, kBF16 };
/// Scale bytes written directly (after FLOOR quantization of randn operands):
///   kWeightHigh: weight scales 130..199; kWeightLow: 0..5; kActLow: activation scales 0..2
///   (E4M3) / 0..9 (E5M2); in these the activation side compensates the weight scale of each K
///   block (products 2^(t + m%4 + n%3)), so every block counts and every decoded element is a
///   finite, exact fp32. kNaN: scale 255 in a few activation rows and weight rows and in the
///   whole expert of an empty group. kPaddingNaN: the blocked layouts' padding bytes are 0xFF.
enum class Special { kNone, kWeightHigh, kWeightLow, kActLow, kNaN, kPaddingNaN };

struct Case {
  std::vector<int> sizes;
  int64_t N, K;
  Act act;
  bool a_blocked, b_blocked, fp16_out, indptr64;
  GroupPad pad;
  Special special;
  bool own_stream;  // run on a created non-blocking stream
};

const char* act_name(Act a) { return a == Act::kE4M3 ? "e4m3" : a == Act::kE5M2 ? "e5m2" : "bf16"; }
const char* special_name(Special s) {
  switch (s) {
    case Special::kNone: return "";
    case Special::kWeightHigh: return " wscale130..199";
    case Special::kWeightLow: return " wscale0..5";
    case Special::kActLow: return " ascale-low";
    case Special::kNaN: return " scale255";
    case Special::kPaddingNaN: return " NaN-padding";
  }
  return "";
}

std::string name(const Case& c) {
  int64_t M = 0;
  for (int s : c.sizes) M += s;
  char b[200];
  std::snprintf(b, sizeof b, "G%zu M%lld N%lld K%lld %s a%s b%s %s %s%s%s%s", c.sizes.size(), (long long)M,
                (long long)c.N, (long long)c.K, act_name(c.act), c.a_blocked ? "blk" : "rm", c.b_blocked ? "blk" : "rm",
                c.fp16_out ? "fp16" : "bf16", c.indptr64 ? "i64" : "i32", c.pad == GroupPad::kCumsum ? " cumsum" : "",
                special_name(c.special), c.own_stream ? " stream" : "");
  return b;
}

double decode_out(uint16_t v, bool fp16) { return fp16 ? double(decode_fp16(v)) : double(decode_bf16(v)); }

/// Spacing of the output dtype at |r| (subnormal spacing below the smallest normal).
double ulp_at(double r, bool fp16) {
  const int p = fp16 ? 10 : 7, emin = fp16 ? -14 : -126;
  r = std::fabs(r);
  int e = emin;
  if (r > 0) {
    int ex;
    std::frexp(r, &ex);
    e = std::max(ex - 1, emin);
  }
  return std::ldexp(1.0, e - p);
}

void run_case(const Case& cs) {
  const int64_t G = int64_t(cs.sizes.size()), N = cs.N, K = cs.K, Kb = K / 32;
  std::vector<int64_t> ind(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) ind[size_t(g + 1)] = ind[size_t(g)] + cs.sizes[size_t(g)];
  const int64_t M = ind[size_t(G)];
  const bool fp8 = cs.act != Act::kBF16;
  const Elem elem = cs.act == Act::kE5M2 ? Elem::kE5M2 : Elem::kE4M3;
  const DType adt = cs.act == Act::kE4M3 ? DType::kE4M3 : cs.act == Act::kE5M2 ? DType::kE5M2 : DType::kBFloat16;
  const uint64_t seed = uint64_t(M * 131 + N * 7 + K) + uint64_t(cs.special) * 1000;

  // operands: FLOOR-quantized randn, scales row-major
  auto xa = reftest::randn(size_t(M * K), seed, 1.0f);
  const auto xb = reftest::randn(size_t(G * N * K), seed + 1, 1.0f / std::sqrt(float(K)));
  std::vector<uint8_t> b(size_t(G * N * K / 2)), bs(size_t(G * N * Kb)), a8(size_t(M * K)), as(size_t(M * Kb));
  std::vector<uint16_t> a16(size_t(M * K));
  quantize(TensorView(const_cast<float*>(xb.data()), DType::kFloat32, {G, N, K}), BlockFormat::mxfp4(true),
           ScaleLayout::row_major(), TensorView(b.data(), DType::kUInt8, {G, N, K / 2}),
           TensorView(bs.data(), DType::kUE8M0, {G, N, Kb}));
  if (fp8)
    quantize(TensorView(xa.data(), DType::kFloat32, {M, K}), BlockFormat::mxfp8(elem, true), ScaleLayout::row_major(),
             TensorView(a8.data(), adt, {M, K}), TensorView(as.data(), DType::kUE8M0, {M, Kb}));
  else
    for (size_t i = 0; i < a16.size(); ++i) a16[i] = encode_bf16(xa[i]);

  // special scale bytes
  auto bs_at = [&](int64_t g, int64_t n, int64_t kb) -> uint8_t& { return bs[size_t((g * N + n) * Kb + kb)]; };
  if (cs.special == Special::kWeightHigh || cs.special == Special::kWeightLow) {
    const bool high = cs.special == Special::kWeightHigh;
    const int t = high ? (cs.act == Act::kE5M2 ? -16 : -8)
                       : (cs.act == Act::kE4M3 ? -16 : cs.act == Act::kE5M2 ? -24 : -8);
    std::vector<int> base(static_cast<size_t>(Kb));
    for (int64_t kb = 0; kb < Kb; ++kb) base[size_t(kb)] = high ? 130 + int((kb * 37) % 68) : int((kb * 5) % 4);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t kb = 0; kb < Kb; ++kb) bs_at(g, n, kb) = uint8_t(base[size_t(kb)] + n % 3);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t kb = 0; kb < Kb; ++kb) {
        const int a_exp = t + 127 - base[size_t(kb)] + int(m % 4);  // (sa - 127)
        if (fp8) {
          as[size_t(m * Kb + kb)] = uint8_t(a_exp + 127);
        } else {
          for (int64_t k = kb * 32; k < kb * 32 + 32; ++k)
            a16[size_t(m * K + k)] = encode_bf16(std::ldexp(decode_bf16(a16[size_t(m * K + k)]), a_exp));
        }
      }
  } else if (cs.special == Special::kActLow) {
    const int top = cs.act == Act::kE4M3 ? 3 : 10, t = cs.act == Act::kE4M3 ? -12 : -20;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t kb = 0; kb < Kb; ++kb) as[size_t(m * Kb + kb)] = uint8_t(kb % top);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t kb = 0; kb < Kb; ++kb) bs_at(g, n, kb) = uint8_t(254 + t - int(kb % top) + int(n % 3));
  } else if (cs.special == Special::kNaN) {
    if (fp8) {
      as[size_t(1 % Kb)] = 255;
      as[size_t((M - 1) * Kb)] = 255;
    }
    for (int64_t g = 0; g < G; ++g) {
      if (ind[size_t(g + 1)] > ind[size_t(g)]) {
        bs_at(g, 3 % N, Kb - 1) = 255;
        bs_at(g, N - 1, 0) = 255;
      } else {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t kb = 0; kb < Kb; ++kb) bs_at(g, n, kb) = 255;
      }
    }
  }

  // stored scales
  const ScaleLayout la = cs.a_blocked ? ScaleLayout::blocked128x4(cs.pad) : ScaleLayout::row_major();
  const ScaleLayout lb = cs.b_blocked ? ScaleLayout::blocked128x4() : ScaleLayout::row_major();
  const TensorView ind_host(ind.data(), DType::kInt64, {G + 1});
  const bool poison_pad = cs.special == Special::kPaddingNaN;
  auto store = [&](const std::vector<uint8_t>& rm, int64_t L, int64_t R, const ScaleLayout& l, bool grouped) {
    if (l.kind == ScaleLayoutKind::kRowMajor) return rm;
    const auto sh = grouped ? scale_shape(BlockFormat::mxfp8(), l, 1, R, K, G)
                            : scale_shape(BlockFormat::mxfp4(), l, L, R, K);
    const int64_t total = sh[0] * sh[1] * sh[2];
    std::vector<uint8_t> st(static_cast<size_t>(total)), used(static_cast<size_t>(total));
    const std::vector<uint8_t> ones(rm.size(), 1);
    const TensorView iv = grouped ? ind_host : TensorView();
    convert_scale_layout(TensorView(const_cast<uint8_t*>(rm.data()), DType::kUInt8, {L, R, Kb}),
                         ScaleLayout::row_major(), TensorView(st.data(), DType::kUInt8, {total}), l, R, Kb, iv);
    convert_scale_layout(TensorView(const_cast<uint8_t*>(ones.data()), DType::kUInt8, {L, R, Kb}),
                         ScaleLayout::row_major(), TensorView(used.data(), DType::kUInt8, {total}), l, R, Kb, iv);
    if (poison_pad)
      for (size_t i = 0; i < st.size(); ++i)
        if (!used[i]) st[i] = 0xFF;
    return st;
  };
  const std::vector<uint8_t> as_st = fp8 ? store(as, 1, M, la, true) : std::vector<uint8_t>();
  const std::vector<uint8_t> bs_st = store(bs, G, N, lb, false);
  std::vector<int32_t> ind32(ind.begin(), ind.end());

  const DType odt = cs.fp16_out ? DType::kFloat16 : DType::kBFloat16;
  auto make_args = [&](void* a, uint8_t* sa, uint8_t* bb, uint8_t* sb, void* ip, uint16_t* out, Device dev) {
    GroupGemmArgs x;
    x.a = TensorView(a, adt, {M, K}, dev);
    if (fp8) {
      x.a_scale = TensorView(sa, DType::kUE8M0, {int64_t(as_st.size())}, dev);
      x.a_scale_layout = la;
    }
    x.b = TensorView(bb, DType::kUInt8, {G, N, K / 2}, dev);
    x.b_scale = TensorView(sb, DType::kUE8M0, {int64_t(bs_st.size())}, dev);
    x.b_scale_layout = lb;
    x.m_indptr = TensorView(ip, cs.indptr64 ? DType::kInt64 : DType::kInt32, {G + 1}, dev);
    x.out = TensorView(out, odt, {M, N}, dev);
    return x;
  };

  // CPU reference
  std::vector<uint16_t> ref(size_t(M * N), 0);
  {
    std::vector<uint8_t> sa_h(as_st), sb_h(bs_st);
    void* a_h = fp8 ? static_cast<void*>(a8.data()) : static_cast<void*>(a16.data());
    void* i_h = cs.indptr64 ? static_cast<void*>(ind.data()) : static_cast<void*>(ind32.data());
    group_gemm_mxfp4_nt_groupwise(make_args(a_h, sa_h.data(), b.data(), sb_h.data(), i_h, ref.data(), Device::kCPU));
  }

  {  // the case is not degenerate: most finite reference outputs are nonzero
    int64_t finite = 0, nonzero = 0;
    for (uint16_t r : ref) {
      const double v = decode_out(r, cs.fp16_out);
      finite += std::isfinite(v);
      nonzero += std::isfinite(v) && v != 0;
    }
    ASSERT_GT(nonzero * 10, finite * 9) << name(cs) << ": mostly zero reference outputs";
  }

  // GPU
  Dev<uint8_t> da8(a8), dsa(as_st.empty() ? std::vector<uint8_t>(1) : as_st), db(b), dsb(bs_st);
  Dev<uint16_t> da16(a16), dout(std::vector<uint16_t>(size_t(M * N)));
  Dev<int64_t> di64(ind);
  Dev<int32_t> di32(ind32);
  cudaStream_t stream = nullptr;
  if (cs.own_stream) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  auto run = [&](int poison_byte) {
    std::vector<uint16_t> got(size_t(M * N));
    cudaMemsetAsync(dout.p, poison_byte, dout.n * 2, stream);
    void* a_d = fp8 ? static_cast<void*>(da8.p) : static_cast<void*>(da16.p);
    void* i_d = cs.indptr64 ? static_cast<void*>(di64.p) : static_cast<void*>(di32.p);
    group_gemm_mxfp4_nt_groupwise(make_args(a_d, fp8 ? dsa.p : nullptr, db.p, dsb.p, i_d, dout.p, Device::kCUDA),
                                  Stream{stream});
    cudaMemcpyAsync(got.data(), dout.p, dout.n * 2, cudaMemcpyDeviceToHost, stream);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << name(cs);
    return got;
  };
  const auto got = run(0xFF);  // 0xFFFF: NaN in bf16 and fp16
  bool ref_has_nan = false;
  for (uint16_t r : ref) ref_has_nan |= std::isnan(decode_out(r, cs.fp16_out));
  std::vector<uint16_t> got2;
  if (ref_has_nan) got2 = run(0x3A);  // 0x3A3A: finite in both
  if (stream) cudaStreamDestroy(stream);

  // decoded operands, for the fp32 sum floor of elements beyond one ulp
  auto a_val = [&](int64_t m, int64_t k) -> double {
    if (!fp8) return decode_bf16(a16[size_t(m * K + k)]);
    const uint8_t c = a8[size_t(m * K + k)];
    const float v = cs.act == Act::kE4M3 ? decode_e4m3(c) : decode_e5m2(c);
    return double(v * decode_ue8m0(as[size_t(m * Kb + k / 32)]));
  };
  auto b_val = [&](int64_t g, int64_t n, int64_t k) -> double {
    const uint8_t c = (b[size_t((g * N + n) * (K / 2) + k / 2)] >> ((k & 1) * 4)) & 0xF;
    return double(decode_e2m1(c) * decode_ue8m0(bs[size_t((g * N + n) * Kb + k / 32)]));
  };

  int64_t bad = 0, beyond = 0;
  double worst = 0;
  int64_t g = 0;
  for (int64_t m = 0; m < M; ++m) {
    while (ind[size_t(g + 1)] <= m) ++g;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      const double r = decode_out(ref[i], cs.fp16_out), v = decode_out(got[i], cs.fp16_out);
      std::string why;
      if (std::isnan(r)) {
        if (!std::isnan(v) || !std::isnan(decode_out(got2[i], cs.fp16_out))) why = "NaN expected";
      } else if (std::isinf(r)) {
        if (v != r) why = "infinity expected";
      } else if (std::isnan(v)) {
        why = "NaN (or never written)";
      } else {
        const double e = std::fabs(v - r) / ulp_at(r, cs.fp16_out);
        worst = std::max(worst, e);
        if (e > 1.0) {
          ++beyond;
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += std::fabs(a_val(m, k) * b_val(g, n, k));
          if (!(std::fabs(v - r) <= std::ldexp(s, -20))) why = std::to_string(e) + " ulps";
        }
      }
      if (!why.empty()) {
        if (bad < 5)
          ADD_FAILURE() << name(cs) << ": m=" << m << " (group " << g << ") n=" << n << ": got " << v << " want " << r
                        << " (" << why << ")";
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0) << name(cs);
  std::printf("[group gemm] %-64s worst %.3g ulps, %lld beyond 1 ulp (within the fp32 sum floor: %lld), misses %lld\n",
              name(cs).c_str(), worst, (long long)beyond, (long long)(beyond - bad), (long long)bad);
}

}  // namespace

class GroupGemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(GroupGemmGpu, MatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_case(GetParam());
}

constexpr GroupPad kFI = GroupPad::kFlashInfer;

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupGemmGpu,
    ::testing::Values(
        // shapes: uneven and empty groups (first / last), gpt-oss sizes, N % 64 != 0, K = 32 * odd
        Case{{5, 0, 130, 1, 0}, 256, 512, Act::kE4M3, true, true, false, false, kFI, Special::kNone, false},
        Case{{0, 1, 4, 50, 300, 0}, 128, 128, Act::kE5M2, false, true, true, true, kFI, Special::kNone, false},
        Case{{0, 37, 0, 90}, 2880, 2880, Act::kE4M3, true, true, false, true, GroupPad::kCumsum, Special::kNone, false},
        Case{{64, 1}, 200, 160, Act::kBF16, false, false, true, false, kFI, Special::kNone, false},
        Case{{0, 2, 0, 0, 3, 1, 0, 7, 0, 0, 1, 0}, 8, 32, Act::kE5M2, true, false, false, true, kFI, Special::kNone,
             false},
        Case{{3, 0, 129, 1}, 24, 96, Act::kE4M3, true, true, true, false, kFI, Special::kNone, true},
        // the kernel's fallback scale ranges, NaN scales, NaN scale padding
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kE4M3, true, false, false, true, kFI, Special::kWeightHigh, false},
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kE5M2, false, true, true, false, kFI, Special::kWeightHigh, false},
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kBF16, false, true, false, false, kFI, Special::kWeightHigh, false},
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kE4M3, true, true, true, true, kFI, Special::kWeightLow, false},
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kE4M3, true, true, false, false, kFI, Special::kActLow, false},
        Case{{0, 5, 130, 0, 33}, 256, 512, Act::kE5M2, false, false, true, true, kFI, Special::kActLow, false},
        Case{{0, 5, 130, 0, 33}, 136, 224, Act::kE4M3, true, true, false, true, kFI, Special::kNaN, false},
        Case{{0, 5, 130, 0, 33}, 136, 224, Act::kBF16, false, false, true, false, kFI, Special::kNaN, false},
        Case{{0, 3, 0, 129, 1}, 200, 96, Act::kE5M2, true, true, false, false, GroupPad::kCumsum, Special::kPaddingNaN,
             false}));
