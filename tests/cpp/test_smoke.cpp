#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lowbit/ops.hpp"

TEST(Smoke, QuantizeDequantizeMxfp8) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = float(i) - 20.0f;
  std::vector<uint8_t> q(64), s(2);
  std::vector<float> y(64);
  auto f = lowbit::BlockFormat::mxfp8();
  lowbit::quantize(lowbit::TensorView(x.data(), lowbit::DType::kFloat32, {1, 64}), f, lowbit::ScaleLayout::row_major(),
                   lowbit::TensorView(q.data(), lowbit::DType::kE4M3, {1, 64}),
                   lowbit::TensorView(s.data(), lowbit::DType::kUE8M0, {1, 2}));
  lowbit::dequantize(lowbit::TensorView(q.data(), lowbit::DType::kE4M3, {1, 64}),
                     lowbit::TensorView(s.data(), lowbit::DType::kUE8M0, {1, 2}), f, lowbit::ScaleLayout::row_major(),
                     lowbit::TensorView(y.data(), lowbit::DType::kFloat32, {1, 64}));
  // E4M3 keeps 4 significant bits: relative error <= 2^-4 after the power-of-two block scale
  for (int i = 0; i < 64; ++i) EXPECT_LE(std::abs(y[i] - x[i]), std::abs(x[i]) / 16.0f) << i;
}
