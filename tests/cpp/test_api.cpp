// Argument validation of the C++ API (include/lowbit/ops.hpp): every bad input throws
// lowbit::ArgumentError naming the argument, before any output byte is written; CUDA tensors
// on a build without CUDA throw NotSupportedError.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "arg_error_util.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

using namespace lowbit;

namespace {

constexpr uint8_t kPoison = 0xCC;

// Buffers of one quantize call on [M, K] = [4, 64] with poisoned outputs.
struct Bufs {
  static constexpr int64_t M = 4, K = 64;
  std::vector<float> x = std::vector<float>(size_t(M * K));
  std::vector<uint8_t> q = std::vector<uint8_t>(size_t(M * K), kPoison);
  std::vector<uint8_t> s = std::vector<uint8_t>(size_t(M * 8), kPoison);  // room for f32 [M, 2] too
  std::vector<uint8_t> z = std::vector<uint8_t>(size_t(M * 2), kPoison);
  std::vector<float> out = std::vector<float>(size_t(M * K));
  float gamax = 1.0f;
  Bufs() {
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) - 8.0f;
    std::memset(out.data(), kPoison, out.size() * 4);
  }
  TensorView xv() { return TensorView(x.data(), DType::kFloat32, {M, K}); }
  TensorView qv() { return TensorView(q.data(), DType::kE4M3, {M, K}); }
  TensorView q4() { return TensorView(q.data(), DType::kUInt8, {M, K / 2}); }
  TensorView sv(int64_t C = 2) { return TensorView(s.data(), DType::kUE8M0, {M, C}); }
  TensorView sf(int64_t C = 2) { return TensorView(s.data(), DType::kFloat32, {M, C}); }
  TensorView ov() { return TensorView(out.data(), DType::kFloat32, {M, K}); }
};

bool all_poison(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != kPoison) return false;
  return true;
}

// Runs fn, expects ArgumentError for `arg` whose message names it, and that no output changed.
void expect_arg_error(const std::function<void()>& fn, const std::string& arg, Bufs& b, const std::string& also = "") {
  const std::vector<float> x0 = b.x;
  argtest::expect_arg_error(fn, arg, also);
  EXPECT_TRUE(all_poison(b.q.data(), b.q.size())) << "q written";
  EXPECT_TRUE(all_poison(b.s.data(), b.s.size())) << "scales written";
  EXPECT_TRUE(all_poison(b.z.data(), b.z.size())) << "zeros written";
  EXPECT_TRUE(all_poison(b.out.data(), b.out.size() * 4)) << "out written";
  EXPECT_EQ(std::memcmp(x0.data(), b.x.data(), x0.size() * 4), 0) << "input written";
}

const BlockFormat kMx = BlockFormat::mxfp8();

}  // namespace

TEST(Api, QuantizeWrongDtype) {
  Bufs b;
  expect_arg_error([&] { quantize(TensorView(b.x.data(), DType::kInt32, {4, 64}), kMx, ScaleLayout::row_major(), b.qv(), b.sv()); },
                   "x", b, "dtype");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE5M2, {4, 64}), b.sv()); },
                   "q", b, "dtype");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sf()); }, "scales", b, "dtype");
  expect_arg_error([&] {
    quantize(b.xv(), BlockFormat::mxfp4(), ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 32}), b.sv());
  }, "q", b, "dtype");
  expect_arg_error([&] {
    quantize(b.xv(), BlockFormat::nvfp4(), ScaleLayout::row_major(), b.q4(), TensorView(b.s.data(), DType::kUE8M0, {4, 4}));
  }, "scales", b, "dtype");
}

TEST(Api, QuantizeWrongShape) {
  Bufs b;
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 32}), b.sv()); },
                   "q", b, "shape");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {3, 64}), b.sv()); },
                   "q", b, "shape");
  // 4-bit formats take K/2 bytes
  expect_arg_error([&] { quantize(b.xv(), BlockFormat::mxfp4(), ScaleLayout::row_major(), TensorView(b.q.data(), DType::kUInt8, {4, 64}), b.sv()); },
                   "q", b, "shape");
  expect_arg_error([&] { quantize(TensorView(b.x.data(), DType::kFloat32, {256}), kMx, ScaleLayout::row_major(), b.qv(), b.sv()); },
                   "x", b);
  // 2-D x with 3-D q
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {1, 4, 64}), b.sv()); },
                   "q", b, "shape");
}

TEST(Api, QuantizeKNotMultipleOfBlock) {
  Bufs b;
  expect_arg_error([&] {
    quantize(TensorView(b.x.data(), DType::kFloat32, {4, 48}), kMx, ScaleLayout::row_major(),
             TensorView(b.q.data(), DType::kE4M3, {4, 48}), b.sv());
  }, "x", b, "multiple of the block size 32");
  expect_arg_error([&] {
    dequantize(TensorView(b.q.data(), DType::kE4M3, {4, 40}), b.sv(), kMx, ScaleLayout::row_major(),
               TensorView(b.out.data(), DType::kFloat32, {4, 40}));
  }, "out", b, "multiple");
  try {
    scale_shape(BlockFormat::nvfp4(), ScaleLayout::row_major(), 1, 4, 40);
    ADD_FAILURE() << "scale_shape accepted K = 40";
  } catch (const ArgumentError& e) {
    EXPECT_EQ(e.arg(), "K");
  }
}

TEST(Api, NonUnitLastStride) {
  Bufs b;
  expect_arg_error([&] {
    quantize(TensorView(b.x.data(), DType::kFloat32, {4, 32}, {64, 2}), kMx, ScaleLayout::row_major(),
             TensorView(b.q.data(), DType::kE4M3, {4, 32}), TensorView(b.s.data(), DType::kUE8M0, {4, 1}));
  }, "x", b, "stride");
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 64}, {1, 4}), b.sv());
  }, "q", b, "stride");
  expect_arg_error([&] {
    dequantize(b.qv(), b.sv(), kMx, ScaleLayout::row_major(), TensorView(b.out.data(), DType::kFloat32, {4, 64}, {1, 4}));
  }, "out", b, "stride");
  // a non-dense scale tensor
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), TensorView(b.s.data(), DType::kUE8M0, {4, 2}, {4, 1}));
  }, "scales", b, "dense");
}

TEST(Api, Overlap) {
  Bufs b;
  // q written into x's memory
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.x.data(), DType::kE4M3, {4, 64}), b.sv());
  }, "q", b, "overlaps argument 'x'");
  // scales inside q
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), TensorView(b.q.data() + 100, DType::kUE8M0, {4, 2}));
  }, "q", b, "overlaps argument 'scales'");
  // dequantize output over its codes
  expect_arg_error([&] {
    dequantize(TensorView(b.out.data(), DType::kE4M3, {4, 64}), b.sv(), kMx, ScaleLayout::row_major(), b.ov());
  }, "out", b, "overlaps");
  // outputs whose own elements alias: a zero row stride, rows interleaved by a too-small stride
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 64}, {0, 1}), b.sv());
  }, "q", b, "share memory");
  expect_arg_error([&] {
    dequantize(b.qv(), b.sv(), kMx, ScaleLayout::row_major(), TensorView(b.out.data(), DType::kFloat32, {4, 64}, {32, 1}));
  }, "out", b, "share memory");
  // a size-1 dimension may have any stride
  quantize(TensorView(b.x.data(), DType::kFloat32, {1, 64}), kMx, ScaleLayout::row_major(),
           TensorView(b.q.data(), DType::kE4M3, {1, 64}, {0, 1}), TensorView(b.s.data(), DType::kUE8M0, {1, 2}));
}

TEST(Api, ZeroPointsAndGlobalAmax) {
  Bufs b;
  const BlockFormat u4 = BlockFormat::int4_group(32, true);
  expect_arg_error([&] { quantize(b.xv(), u4, ScaleLayout::row_major(), b.q4(), b.sf()); }, "zeros", b, "is required");
  {
    QuantArgs a;
    a.zeros = TensorView(b.z.data(), DType::kUInt8, {4, 2});
    expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sv(), a); }, "zeros", b);
    a.zeros = TensorView(b.z.data(), DType::kUInt8, {4, 1});
    expect_arg_error([&] { quantize(b.xv(), u4, ScaleLayout::row_major(), b.q4(), b.sf(), a); }, "zeros", b, "elements");
    expect_arg_error([&] { dequantize(b.q4(), b.sf(), u4, ScaleLayout::row_major(), b.ov()); }, "zeros", b);
  }
  {
    QuantArgs a;
    a.global_amax = TensorView(&b.gamax, DType::kFloat32, {1});
    expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sv(), a); }, "global_amax", b, "NVFP4");
    expect_arg_error([&] { dequantize(b.qv(), b.sv(), kMx, ScaleLayout::row_major(), b.ov(), a); }, "global_amax", b, "NVFP4");
    a.global_amax = TensorView(b.s.data(), DType::kUInt8, {1});
    expect_arg_error([&] {
      quantize(b.xv(), BlockFormat::nvfp4(), ScaleLayout::row_major(), b.q4(), TensorView(b.z.data(), DType::kE4M3, {4, 4}), a);
    }, "global_amax", b, "dtype");
    QuantArgs c;
    c.compute_global_amax = true;
    b.gamax = 1.0f;
    expect_arg_error([&] {
      quantize(b.xv(), BlockFormat::nvfp4(), ScaleLayout::row_major(), b.q4(), TensorView(b.s.data(), DType::kE4M3, {4, 4}), c);
    }, "global_amax", b);
    c.global_amax = TensorView(&b.gamax, DType::kFloat32, {1});
    expect_arg_error([&] {
      dequantize(b.q4(), TensorView(b.s.data(), DType::kE4M3, {4, 4}), BlockFormat::nvfp4(), ScaleLayout::row_major(), b.ov(), c);
    }, "compute_global_amax", b);
    EXPECT_EQ(b.gamax, 1.0f);
  }
}

TEST(Api, MIndptr) {
  Bufs b;
  const ScaleLayout grouped = ScaleLayout::blocked128x4(GroupPad::kFlashInfer);
  const int64_t rows = grouped_rows_alloc(GroupPad::kFlashInfer, 4, 2);
  std::vector<uint8_t> sg(size_t(rows * 4), kPoison);
  auto call = [&](std::vector<int32_t> ind) {
    return [&b, &sg, grouped, rows, ind]() mutable {
      QuantArgs a;
      a.m_indptr = TensorView(ind.data(), DType::kInt32, {int64_t(ind.size())});
      quantize(b.xv(), kMx, grouped, b.qv(), TensorView(sg.data(), DType::kUE8M0, {rows, 4}), a);
    };
  };
  expect_arg_error(call({1, 2, 4}), "m_indptr", b, "start at 0");
  expect_arg_error(call({0, 3, 2}), "m_indptr", b, "non-decreasing");
  expect_arg_error(call({0, 2, 3}), "m_indptr", b, "last boundary");
  expect_arg_error(call({0, 2, 5}), "m_indptr", b, "last boundary");
  expect_arg_error(call({0}), "m_indptr", b);
  EXPECT_TRUE(all_poison(sg.data(), sg.size()));
  // a valid one works
  call({0, 1, 4})();
  EXPECT_FALSE(all_poison(b.q.data(), b.q.size()));
  std::fill(b.q.begin(), b.q.end(), kPoison);
  // wrong dtype / missing / given to a layout without groups
  {
    std::vector<float> f = {0, 2, 4};
    QuantArgs a;
    a.m_indptr = TensorView(f.data(), DType::kFloat32, {3});
    expect_arg_error([&] { quantize(b.xv(), kMx, grouped, b.qv(), TensorView(sg.data(), DType::kUE8M0, {rows, 4}), a); }, "m_indptr", b,
                     "dtype");
    expect_arg_error([&] { quantize(b.xv(), kMx, grouped, b.qv(), TensorView(sg.data(), DType::kUE8M0, {rows, 4})); }, "m_indptr", b,
                     "required");
    std::vector<int32_t> ok = {0, 2, 4};
    a.m_indptr = TensorView(ok.data(), DType::kInt32, {3});
    expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sv(), a); }, "m_indptr", b);
    // grouped scales too small
    expect_arg_error([&] { quantize(b.xv(), kMx, grouped, b.qv(), TensorView(sg.data(), DType::kUE8M0, {128, 4}), a); }, "scales", b);
  }
}

TEST(Api, ScaleTensorSize) {
  Bufs b;
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sv(3)); }, "scales", b, "elements");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), b.sv(1)); }, "scales", b, "elements");
  // the blocked layout needs the padded 128 x 4 matrix
  std::vector<uint8_t> big(512, kPoison);
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::blocked128x4(), b.qv(), b.sv()); }, "scales", b, "512");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::blocked128x4(), b.qv(), TensorView(big.data(), DType::kUE8M0, {511})); },
                   "scales", b);
  EXPECT_TRUE(all_poison(big.data(), big.size()));
  quantize(b.xv(), kMx, ScaleLayout::blocked128x4(), b.qv(), TensorView(big.data(), DType::kUE8M0, {512}));  // fine
  EXPECT_EQ(scale_shape(kMx, ScaleLayout::blocked128x4(), 1, 4, 64), (std::vector<int64_t>{1, 128, 4}));
  EXPECT_EQ(scale_shape(kMx, ScaleLayout::col_major(16), 2, 4, 64), (std::vector<int64_t>{2, 2, 16}));
  EXPECT_EQ(scale_shape(kMx, ScaleLayout::blocked8x4(), 1, 9, 64), (std::vector<int64_t>{1, 16, 4}));
}

TEST(Api, MissingAndInvalidFormat) {
  Bufs b;
  expect_arg_error([&] { quantize(TensorView(), kMx, ScaleLayout::row_major(), b.qv(), b.sv()); }, "x", b, "required");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(), b.sv()); }, "q", b, "required");
  expect_arg_error([&] { quantize(b.xv(), kMx, ScaleLayout::row_major(), b.qv(), TensorView()); }, "scales", b, "required");
  BlockFormat bad = kMx;
  bad.block = 0;
  expect_arg_error([&] { quantize(b.xv(), bad, ScaleLayout::row_major(), b.qv(), b.sv()); }, "format", b, "block");
  bad = BlockFormat::nvfp4();
  bad.scale_type = ScaleType::kUE8M0;
  expect_arg_error([&] { quantize(b.xv(), bad, ScaleLayout::row_major(), b.q4(), b.sv(4)); }, "format", b);
  bad = BlockFormat::mxfp4();
  bad.block = 31;
  expect_arg_error([&] { quantize(b.xv(), bad, ScaleLayout::row_major(), b.q4(), b.sv()); }, "format", b, "even");
  ScaleLayout l = ScaleLayout::col_major(0);
  expect_arg_error([&] { quantize(b.xv(), kMx, l, b.qv(), b.sv()); }, "layout", b);
  l = ScaleLayout::row_major();
  l.group_pad = GroupPad::kCumsum;
  expect_arg_error([&] { quantize(b.xv(), kMx, l, b.qv(), b.sv()); }, "layout", b);
}

TEST(Api, OtherOps) {
  Bufs b;
  // dequantize: unsupported output dtype
  expect_arg_error([&] { dequantize(b.qv(), b.sv(), kMx, ScaleLayout::row_major(), TensorView(b.out.data(), DType::kInt8, {4, 64})); },
                   "out", b, "dtype");
  // transcode: only 4-bit integer / E2M1 codes; UINT4 needs e4m3
  expect_arg_error([&] { transcode(b.qv(), kMx, TensorView(b.out.data(), DType::kE4M3, {4, 64})); }, "format", b);
  expect_arg_error([&] {
    QuantArgs a;
    a.zeros = TensorView(b.z.data(), DType::kUInt8, {4, 2});
    transcode(b.q4(), BlockFormat::int4_group(32, true), TensorView(b.out.data(), DType::kE5M2, {4, 64}), a);
  }, "out", b, "e4m3");
  // cast: shape mismatch
  expect_arg_error([&] { cast(b.xv(), TensorView(b.out.data(), DType::kFloat16, {4, 63})); }, "out", b, "shape");
  // convert_scale_layout: dtype mismatch, size mismatch
  std::vector<uint8_t> in(8, 1);
  expect_arg_error([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUE8M0, {4, 2}), ScaleLayout::row_major(), TensorView(b.s.data(), DType::kUInt8, {4, 2}),
                         ScaleLayout::col_major(), 4, 2);
  }, "out", b, "dtype");
  expect_arg_error([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUE8M0, {7}), ScaleLayout::row_major(), TensorView(b.s.data(), DType::kUE8M0, {4, 2}),
                         ScaleLayout::col_major(), 4, 2);
  }, "in", b);
  expect_arg_error([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUE8M0, {8}), ScaleLayout::row_major(), TensorView(b.s.data(), DType::kUE8M0, {8}),
                         ScaleLayout::blocked128x4(), 4, 2);
  }, "out", b);
  // convert_scale_layout: the non-positive size is named
  expect_arg_error([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUE8M0, {8}), ScaleLayout::row_major(), TensorView(b.s.data(), DType::kUE8M0, {8}),
                         ScaleLayout::row_major(), 4, 0);
  }, "C", b, "positive");
  expect_arg_error([&] {
    convert_scale_layout(TensorView(in.data(), DType::kUE8M0, {8}), ScaleLayout::row_major(), TensorView(b.s.data(), DType::kUE8M0, {8}),
                         ScaleLayout::row_major(), -1, 2);
  }, "R", b, "positive");
  // tensor_amax: out of two elements
  expect_arg_error([&] { tensor_amax(b.xv(), TensorView(b.out.data(), DType::kFloat32, {2})); }, "out", b);
  // K cache: odd D, wrong codes shape
  std::vector<float> k(2 * 3 * 1 * 5);
  expect_arg_error([&] {
    nf4_kcache_quantize(TensorView(k.data(), DType::kFloat32, {2, 3, 1, 5}), TensorView(b.q.data(), DType::kUInt8, {2, 3, 1, 2}),
                        TensorView(b.out.data(), DType::kFloat32, {2, 1, 5}), TensorView(b.z.data(), DType::kE5M2, {2, 3, 1, 5}));
  }, "k", b, "even");
  std::vector<float> k2(2 * 3 * 1 * 4);
  expect_arg_error([&] {
    nf4_kcache_quantize(TensorView(k2.data(), DType::kFloat32, {2, 3, 1, 4}), TensorView(b.q.data(), DType::kUInt8, {2, 3, 1, 4}),
                        TensorView(b.out.data(), DType::kFloat32, {2, 1, 4}), TensorView(b.s.data(), DType::kE5M2, {2, 3, 1, 4}));
  }, "codes", b, "shape");
  expect_arg_error([&] {
    nf4_kcache_quantize(TensorView(k2.data(), DType::kFloat32, {2, 3, 1, 4}), TensorView(b.q.data(), DType::kUInt8, {2, 3, 1, 2}),
                        TensorView(b.out.data(), DType::kFloat32, {2, 1, 4}), TensorView());
  }, "residual", b, "required");
  // K cache dequantize: errors about the float output name 'out', not 'k'
  expect_arg_error([&] {
    nf4_kcache_dequantize(TensorView(b.q.data(), DType::kUInt8, {2, 3, 1, 2}), TensorView(b.x.data(), DType::kFloat32, {2, 1, 4}),
                          TensorView(), TensorView(b.out.data(), DType::kInt8, {2, 3, 1, 4}));
  }, "out", b, "dtype");
}

TEST(Api, DeviceChecks) {
  Bufs b;
  // mixing devices is an argument error
  expect_arg_error([&] {
    quantize(b.xv(), kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 64}, Device::kCUDA), b.sv());
  }, "q", b, "same device");
  // CUDA tensors on a build without CUDA: NotSupportedError after validation, nothing written
  if (build_info().cuda_built) GTEST_SKIP() << "CUDA build";
  const TensorView xc(b.x.data(), DType::kFloat32, {4, 64}, Device::kCUDA), qc(b.q.data(), DType::kE4M3, {4, 64}, Device::kCUDA),
      sc(b.s.data(), DType::kUE8M0, {4, 2}, Device::kCUDA), oc(b.out.data(), DType::kFloat32, {4, 64}, Device::kCUDA);
  EXPECT_THROW(quantize(xc, kMx, ScaleLayout::row_major(), qc, sc), NotSupportedError);
  EXPECT_THROW(dequantize(qc, sc, kMx, ScaleLayout::row_major(), oc), NotSupportedError);
  EXPECT_THROW(cast(xc, oc), NotSupportedError);
  EXPECT_THROW(tensor_amax(xc, TensorView(&b.gamax, DType::kFloat32, {1}, Device::kCUDA)), NotSupportedError);
  EXPECT_THROW(convert_scale_layout(sc, ScaleLayout::row_major(), TensorView(b.z.data(), DType::kUE8M0, {8}, Device::kCUDA),
                                    ScaleLayout::col_major(), 4, 2),
               NotSupportedError);
  try {
    quantize(xc, kMx, ScaleLayout::row_major(), qc, sc);
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("quantize"), std::string::npos);
  }
  EXPECT_TRUE(all_poison(b.q.data(), b.q.size()));
  EXPECT_TRUE(all_poison(b.s.data(), b.s.size()));
  EXPECT_TRUE(all_poison(b.z.data(), b.z.size()));
  EXPECT_TRUE(all_poison(b.out.data(), b.out.size() * 4));
  EXPECT_EQ(b.gamax, 1.0f);
  // ...but a validation error still comes first, as an ArgumentError
  expect_arg_error([&] { quantize(xc, kMx, ScaleLayout::row_major(), TensorView(b.q.data(), DType::kE4M3, {4, 32}, Device::kCUDA), sc); },
                   "q", b, "shape");
}
