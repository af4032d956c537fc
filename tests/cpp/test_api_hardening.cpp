// Hardening of the C++ API's argument checks: checked size arithmetic, aligned and index-ordered
// buffers, host index arrays validated and used from one private copy, eps finite and > 0, no
// negative per-tensor amax. Every refusal is an ArgumentError naming the argument, before any
// output is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "arg_error_util.hpp"
#include "lowbit/error.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void expect_arg(const std::function<void()>& fn, const std::string& arg, const std::string& also = "") {
  argtest::expect_arg_error(fn, arg, also);
}

bool all_equal(const std::vector<uint8_t>& v, uint8_t b) {
  for (uint8_t x : v)
    if (x != b) return false;
  return true;
}

}  // namespace

// --- checked size arithmetic -------------------------------------------------------------------

TEST(ApiHardening, ScaleShapeRefusesNegativeSizes) {
  const BlockFormat f = BlockFormat::mxfp4();
  expect_arg([&] { scale_shape(f, ScaleLayout::row_major(), 1, -5, 32); }, "M");
  expect_arg([&] { scale_shape(f, ScaleLayout::row_major(), -1, 4, 32); }, "L");
  expect_arg([&] { scale_shape(f, ScaleLayout::row_major(), 1, 4, -32); }, "K");
  expect_arg([&] { scale_shape(f, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), 1, 4, 32, -2); }, "groups");
  EXPECT_EQ(scale_shape(f, ScaleLayout::row_major(), 1, 0, 32), (std::vector<int64_t>{1, 0, 1}));
}

TEST(ApiHardening, ScaleShapeRefusesOverflow) {
  const BlockFormat f = BlockFormat::mxfp4();
  expect_arg([&] { scale_shape(f, ScaleLayout::blocked128x4(), 1, kMax, 32); }, "M", "overflow");
  expect_arg([&] { scale_shape(f, ScaleLayout::col_major(16), 1, kMax - 3, 32); }, "M", "overflow");
  expect_arg([&] { scale_shape(f, ScaleLayout::blocked8x4(), 1, kMax, 32); }, "M", "overflow");
  expect_arg([&] { scale_shape(f, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), 1, 10, 32, int64_t(1) << 62); },
             "groups", "overflow");
  expect_arg([&] { scale_shape(f, ScaleLayout::blocked128x4(GroupPad::kCumsum), 1, kMax - 100, 32, 1); }, "groups",
             "overflow");
  expect_arg([&] { scale_shape(f, ScaleLayout::row_major(), int64_t(1) << 62, int64_t(1) << 20, 32); }, "L", "overflow");
  // the largest sizes that fit are still answered
  EXPECT_EQ(scale_shape(f, ScaleLayout::row_major(), 1, kMax, 32), (std::vector<int64_t>{1, kMax, 1}));
}

TEST(ApiHardening, ConvertScaleLayoutHugeRIsRefusedNotSigfpe) {
  std::vector<uint8_t> in(16, 1), out(16, 0xCC);
  expect_arg([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUInt8, {16}), ScaleLayout::row_major(),
                         TensorView(out.data(), DType::kUInt8, {16}), ScaleLayout::blocked128x4(), int64_t(1) << 62, 4);
  }, "R", "overflow");
  expect_arg([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUInt8, {16}), ScaleLayout::blocked128x4(),
                         TensorView(out.data(), DType::kUInt8, {16}), ScaleLayout::row_major(), 4, kMax - 1);
  }, "C", "overflow");
  EXPECT_TRUE(all_equal(out, 0xCC));
}

TEST(ApiHardening, DualGemmPackedBytesChecked) {
  EXPECT_EQ(nvfp4_dual_gemm_packed_bytes(128, 64, 1), 4 * 2304);
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(-128, 64, 1); }, "N");
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(128, -64, 1); }, "K");
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(128, 64, -1); }, "L");
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(kMax, 64, 1); }, "N", "overflow");
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(int64_t(1) << 40, int64_t(1) << 30, 1); }, "K", "overflow");
  expect_arg([] { nvfp4_dual_gemm_packed_bytes(int64_t(1) << 20, int64_t(1) << 20, int64_t(1) << 40); }, "L", "overflow");
}

TEST(ApiHardening, TensorSizesThatOverflowAreRefused) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> q(64, 0xCC), s(8, 0xCC);
  const BlockFormat f = BlockFormat::mxfp8();
  // a stride-0 view whose element count does not fit in int64
  expect_arg([&] {
    quantize(TensorView(x.data(), DType::kFloat32, {int64_t(1) << 62, 64}, {0, 1}), f, ScaleLayout::row_major(),
             TensorView(q.data(), DType::kE4M3, {1, 64}), TensorView(s.data(), DType::kUE8M0, {1, 2}));
  }, "x", "64-bit");
  // strides whose byte span does not fit
  expect_arg([&] {
    quantize(TensorView(x.data(), DType::kFloat32, {3, 64}, {kMax / 2, 1}), f, ScaleLayout::row_major(),
             TensorView(q.data(), DType::kE4M3, {3, 64}), TensorView(s.data(), DType::kUE8M0, {3, 2}));
  }, "x", "64-bit");
  // a stride-0 output shape that does not fit
  expect_arg([&] {
    quantize(TensorView(x.data(), DType::kFloat32, {1, 64}), f, ScaleLayout::blocked128x4(),
             TensorView(q.data(), DType::kE4M3, {1, 64}), TensorView(s.data(), DType::kUE8M0, {kMax, 2}, {0, 1}));
  }, "scales", "64-bit");
  EXPECT_TRUE(all_equal(q, 0xCC));
  EXPECT_TRUE(all_equal(s, 0xCC));
}

// --- alignment ----------------------------------------------------------------------------------

TEST(ApiHardening, MisalignedPointersAreRefused) {
  std::vector<uint8_t> xb(4 * 64 * 4 + 8, 0), q(4 * 64, 0xCC), s(64, 0xCC), outb(4 * 64 * 4 + 8, 0xCC);
  float* xm = reinterpret_cast<float*>(xb.data() + 1);  // misaligned for float
  ASSERT_NE(reinterpret_cast<uintptr_t>(xm) % 4, 0u);
  const BlockFormat f = BlockFormat::mxfp8();
  expect_arg([&] {
    quantize(TensorView(xm, DType::kFloat32, {4, 64}), f, ScaleLayout::row_major(), TensorView(q.data(), DType::kE4M3, {4, 64}),
             TensorView(s.data(), DType::kUE8M0, {4, 2}));
  }, "x", "aligned");
  expect_arg([&] {
    tensor_amax(TensorView(xm, DType::kFloat32, {4, 64}), TensorView(outb.data(), DType::kFloat32, {1}));
  }, "x", "4-byte");
  // float32 scales of an fp8 group format, misaligned
  const BlockFormat g = BlockFormat::fp8_group(32);
  std::vector<float> xa(4 * 64, 1.0f);
  expect_arg([&] {
    quantize(TensorView(xa.data(), DType::kFloat32, {4, 64}), g, ScaleLayout::row_major(),
             TensorView(q.data(), DType::kE4M3, {4, 64}), TensorView(s.data() + 2, DType::kFloat32, {4, 2}));
  }, "scales", "aligned");
  EXPECT_TRUE(all_equal(q, 0xCC));
  EXPECT_TRUE(all_equal(s, 0xCC));
}

// --- index order ---------------------------------------------------------------------------------

TEST(ApiHardening, ScalesNotInIndexOrderAreRefused) {
  const int64_t M = 8, K = 64;
  std::vector<float> x(size_t(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 13) - 6.0f;
  std::vector<uint8_t> q(size_t(M * K), 0xCC), s(size_t(M * 2), 0xCC);
  const BlockFormat f = BlockFormat::mxfp8();
  const TensorView xv(x.data(), DType::kFloat32, {M, K});
  // [M, C] with Fortran strides (1, M): a dense permutation, but not index order
  expect_arg([&] {
    quantize(xv, f, ScaleLayout::row_major(), TensorView(q.data(), DType::kE4M3, {M, K}),
             TensorView(s.data(), DType::kUE8M0, {M, 2}, {1, M}));
  }, "scales", "index order");
  // [L, M, C] Fortran
  expect_arg([&] {
    quantize(TensorView(x.data(), DType::kFloat32, {2, M / 2, K}), f, ScaleLayout::row_major(),
             TensorView(q.data(), DType::kE4M3, {2, M / 2, K}), TensorView(s.data(), DType::kUE8M0, {2, M / 2, 2}, {1, 2, 2 * M / 2}));
  }, "scales", "index order");
  EXPECT_TRUE(all_equal(q, 0xCC));
  EXPECT_TRUE(all_equal(s, 0xCC));
  // the documented views keep working: contiguous, and the batch-last [M, C, L] view
  quantize(xv, f, ScaleLayout::row_major(), TensorView(q.data(), DType::kE4M3, {M, K}), TensorView(s.data(), DType::kUE8M0, {M, 2}));
  std::vector<uint8_t> s2(s.size(), 0), q2(q.size(), 0);
  quantize(TensorView(x.data(), DType::kFloat32, {2, M / 2, K}), f, ScaleLayout::row_major(),
           TensorView(q2.data(), DType::kE4M3, {2, M / 2, K}), TensorView(s2.data(), DType::kUE8M0, {M / 2, 2, 2}, {2, 1, M}));
  EXPECT_EQ(s, s2);
  // zero points follow the same rule
  const BlockFormat u = BlockFormat::int4_group(32, true);
  std::vector<uint8_t> sf(size_t(M * 2 * 4), 0xCC), z(size_t(M * 2), 0xCC), q4(size_t(M * K / 2), 0xCC);
  QuantArgs a;
  a.zeros = TensorView(z.data(), DType::kUInt8, {M, 2}, {1, M});
  expect_arg([&] {
    quantize(xv, u, ScaleLayout::row_major(), TensorView(q4.data(), DType::kUInt8, {M, K / 2}),
             TensorView(sf.data(), DType::kFloat32, {M, 2}), a);
  }, "zeros", "index order");
  EXPECT_TRUE(all_equal(z, 0xCC));
}

TEST(ApiHardening, GemmScalesNotInIndexOrderAreRefused) {
  // grouped GEMM / prepack: a Fortran-ordered [G, Np, Cp] b_scale with G = 1 is dense and looks
  // like a batch-last view of one, but the batch of these scales is their first dimension
  const int64_t N = 32, K = 128;
  std::vector<uint8_t> b(size_t(N * K / 2), 0x22), bs(128 * 4, 127), pb(128 * 128, 0xCC), ps(128 * 8, 0xCC);
  const TensorView bv(b.data(), DType::kUInt8, {1, N, K / 2});
  expect_arg([&] {
    group_gemm_mxfp4_prepack(bv, TensorView(bs.data(), DType::kUE8M0, {1, 128, 4}, {1, 1, 128}),
                             ScaleLayout::blocked128x4(), TensorView(pb.data(), DType::kUInt8, {1, 128, 128}),
                             TensorView(ps.data(), DType::kUInt8, {1, 128, 8}), Stream{});
  }, "b_scale", "index order");
  EXPECT_TRUE(all_equal(pb, 0xCC));
  EXPECT_TRUE(all_equal(ps, 0xCC));
  std::vector<uint16_t> a(size_t(17 * K), 0x3f80), out(size_t(17 * N), 0xCCCC);
  std::vector<int64_t> ind{0, 17};
  GroupGemmArgs g;
  g.a = TensorView(a.data(), DType::kBFloat16, {17, K});
  g.a_scale_layout = ScaleLayout::row_major();
  g.b = bv;
  g.b_scale = TensorView(bs.data(), DType::kUE8M0, {1, N, K / 32}, {1, 1, N});
  g.b_scale_layout = ScaleLayout::row_major();
  g.m_indptr = TensorView(ind.data(), DType::kInt64, {2});
  g.out = TensorView(out.data(), DType::kBFloat16, {17, N});
  expect_arg([&] { group_gemm_mxfp4_nt_groupwise(g, Stream{}); }, "b_scale", "index order");
  for (uint16_t v : out) ASSERT_EQ(v, 0xCCCC);
  g.b_scale = TensorView(bs.data(), DType::kUE8M0, {1, N, K / 32});
  group_gemm_mxfp4_nt_groupwise(g, Stream{});  // row-major storage is read as before

  // dual GEMM: a C-contiguous [N, K/16, L] scale tensor holds its L matrices interleaved
  const int64_t M = 5, Nd = 128, Kd = 64, L = 2;
  std::vector<uint8_t> ad(size_t(L * M * Kd / 2), 0x22), bd(size_t(L * Nd * Kd / 2), 0x22);
  std::vector<uint8_t> sa(size_t(L * M * Kd / 16), 0x38), sb(size_t(L * Nd * Kd / 16), 0x38);
  std::vector<uint16_t> c(size_t(L * M * Nd), 0xCCCC);
  DualGemmArgs d;
  d.a = TensorView(ad.data(), DType::kUInt8, {M, Kd / 2, L}, {Kd / 2, 1, M * Kd / 2});
  d.b1 = d.b2 = TensorView(bd.data(), DType::kUInt8, {Nd, Kd / 2, L}, {Kd / 2, 1, Nd * Kd / 2});
  d.sfa = TensorView(sa.data(), DType::kE4M3, {M, Kd / 16, L}, {Kd / 16, 1, M * Kd / 16});
  d.sfb1 = d.sfb2 = TensorView(sb.data(), DType::kE4M3, {Nd, Kd / 16, L}, {Kd / 16, 1, Nd * Kd / 16});
  d.c = TensorView(c.data(), DType::kFloat16, {M, Nd, L}, {Nd, 1, M * Nd});
  d.sfb2 = TensorView(sb.data(), DType::kE4M3, {Nd, Kd / 16, L});
  expect_arg([&] { nvfp4_dual_gemm_silu(d, Stream{}); }, "sfb2", "expected element strides (4, 1, 512)");
  d.sfb2 = d.sfb1;
  d.sfa = TensorView(sa.data(), DType::kE4M3, {M, Kd / 16, L}, {1, M, M * Kd / 16});
  expect_arg([&] { nvfp4_dual_gemm_silu(d, Stream{}); }, "sfa", "expected element strides (4, 1, 20)");
  for (uint16_t v : c) ASSERT_EQ(v, 0xCCCC);
  // the 6-D blocked view must have the GPU MODE strides, even when C-contiguous
  std::vector<uint8_t> sba(size_t(L * 128 * 4), 0x38);
  d.sfa = TensorView(sba.data(), DType::kE4M3, {32, 4, 1, 4, 1, L}, {16, 4, 512, 1, 512, 512});
  d.sfb1 = TensorView(sba.data(), DType::kE4M3, {32, 4, 1, 4, 1, L}, {16, 4, 512, 1, 512, 512});
  d.sfb2 = TensorView(sba.data(), DType::kE4M3, {32, 4, 1, 4, 1, L});
  d.sf_layout = ScaleLayout::blocked128x4();
  expect_arg([&] { nvfp4_dual_gemm_silu(d, Stream{}); }, "sfb2", "expected element strides");
  d.sfb2 = d.sfb1;
  nvfp4_dual_gemm_silu(d, Stream{});  // the documented views are read
  EXPECT_EQ(c[0], c[1]);
}

TEST(ApiHardening, InterleavedBatchScalesAreRefusedByTheFormatOps) {
  // [M, C, L] scales (L > 1) are the batch-last view: C-contiguous ones are not index order
  const int64_t L = 2, M = 4, K = 64;
  std::vector<float> x(size_t(L * M * K), 1.0f);
  std::vector<uint8_t> q(x.size(), 0xCC), s(size_t(L * M * 2), 0xCC);
  expect_arg([&] {
    quantize(TensorView(x.data(), DType::kFloat32, {L, M, K}), BlockFormat::mxfp8(), ScaleLayout::row_major(),
             TensorView(q.data(), DType::kE4M3, {L, M, K}), TensorView(s.data(), DType::kUE8M0, {M, 2, L}));
  }, "scales", "expected element strides (2, 1, 8)");
  EXPECT_TRUE(all_equal(q, 0xCC));
  EXPECT_TRUE(all_equal(s, 0xCC));
}

// --- host index arrays: one private copy ----------------------------------------------------------

TEST(ApiHardening, HostMIndptrIsCopiedBeforeValidation) {
  using namespace lowbit::detail;
  for (const DType dt : {DType::kInt32, DType::kInt64}) {
    std::vector<int32_t> i32 = {0, 100, 300};
    std::vector<int64_t> i64 = {0, 100, 300};
    void* data = dt == DType::kInt32 ? static_cast<void*>(i32.data()) : static_cast<void*>(i64.data());
    const TensorView ind(data, dt, {3});
    Checker c{"test"};
    ScalePlan sp;
    sp.layout = ScaleLayout::blocked128x4(GroupPad::kFlashInfer);
    std::vector<int64_t> copy;
    check_groups(c, ScaleLayout::blocked128x4(GroupPad::kFlashInfer), ind, 1, 300, &sp, &copy);
    ASSERT_EQ(sp.groups, 2);
    EXPECT_NE(sp.m_indptr, data);             // the plan never points at the caller's array
    EXPECT_EQ(sp.m_indptr, copy.data());
    EXPECT_TRUE(sp.indptr64);
    const int64_t before = sp.stored_row(150);
    // the caller's array changes after validation (another thread): the plan does not
    i32 = {0, 100000, -7};
    i64 = {0, 100000, -7};
    EXPECT_EQ(copy, (std::vector<int64_t>{0, 100, 300}));
    EXPECT_EQ(sp.stored_row(150), before);
    EXPECT_EQ(before, 128 + 50);  // group 1 starts at (100 + 127) / 128 * 128 = 128
  }
}

TEST(ApiHardening, GroupedQuantizeUsesTheValidatedBoundaries) {
  // The grouped quantize reads the boundaries it validated: compare with an untouched call.
  const int64_t M = 300, K = 64;
  std::vector<float> x(size_t(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  const int64_t rows = grouped_rows_alloc(GroupPad::kFlashInfer, M, 2);
  std::vector<uint8_t> q(size_t(M * K)), s(size_t(rows * 4)), q2(q.size()), s2(s.size());
  std::vector<int64_t> ind = {0, 100, 300};
  QuantArgs a;
  a.m_indptr = TensorView(ind.data(), DType::kInt64, {3});
  quantize(TensorView(x.data(), DType::kFloat32, {M, K}), BlockFormat::mxfp8(),
           ScaleLayout::blocked128x4(GroupPad::kFlashInfer), TensorView(q.data(), DType::kE4M3, {M, K}),
           TensorView(s.data(), DType::kUE8M0, {rows, 4}), a);
  std::vector<int32_t> ind32 = {0, 100, 300};
  a.m_indptr = TensorView(ind32.data(), DType::kInt32, {3});
  quantize(TensorView(x.data(), DType::kFloat32, {M, K}), BlockFormat::mxfp8(),
           ScaleLayout::blocked128x4(GroupPad::kFlashInfer), TensorView(q2.data(), DType::kE4M3, {M, K}),
           TensorView(s2.data(), DType::kUE8M0, {rows, 4}), a);
  EXPECT_EQ(q, q2);
  EXPECT_EQ(s, s2);
}

// --- eps and the per-tensor amax -------------------------------------------------------------------

TEST(ApiHardening, EpsMustBeFiniteAndPositiveForEveryFormat) {
  const BlockFormat all[] = {BlockFormat::mxfp8(), BlockFormat::mxfp4(), BlockFormat::nvfp4(), BlockFormat::fp8_group(128),
                             BlockFormat::int4_group(128), BlockFormat::int4_group(128, true), BlockFormat::nf4(64)};
  for (BlockFormat f : all) {
    for (float eps : {0.0f, -1e-10f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      f.eps = eps;
      expect_arg([&] { validate_format(f, "test"); }, "eps", "finite and > 0");
    }
    f.eps = 1e-10f;
    EXPECT_NO_THROW(validate_format(f, "test"));
  }
}

TEST(ApiHardening, NegativeOrNanGlobalAmaxIsRefused) {
  std::vector<float> x(4 * 64, 1.0f);
  std::vector<uint8_t> q(4 * 32, 0xCC), s(4 * 4, 0xCC);
  for (float v : {-3.0f, std::numeric_limits<float>::quiet_NaN()}) {
    float g = v;
    QuantArgs a;
    a.global_amax = TensorView(&g, DType::kFloat32, {1});
    expect_arg([&] {
      quantize(TensorView(x.data(), DType::kFloat32, {4, 64}), BlockFormat::nvfp4(), ScaleLayout::row_major(),
               TensorView(q.data(), DType::kUInt8, {4, 32}), TensorView(s.data(), DType::kE4M3, {4, 4}), a);
    }, "global_amax");
  }
  EXPECT_TRUE(all_equal(q, 0xCC));
  EXPECT_TRUE(all_equal(s, 0xCC));
  float g = -1.0f;
  QuantArgs a;
  a.global_amax = TensorView(&g, DType::kFloat32, {1});
  std::vector<float> out(4 * 64, 7.0f);
  expect_arg([&] {
    dequantize(TensorView(q.data(), DType::kUInt8, {4, 32}), TensorView(s.data(), DType::kE4M3, {4, 4}), BlockFormat::nvfp4(),
               ScaleLayout::row_major(), TensorView(out.data(), DType::kFloat32, {4, 64}), a);
  }, "global_amax");
  for (float o : out) ASSERT_EQ(o, 7.0f);
}
