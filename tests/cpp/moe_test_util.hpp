// tests/cpp/moe_test_util.hpp: operands of the MoE reference tests (test_moe_mlp_ref.cpp,
// test_moe_layouts_ref.cpp) made through the public quantize() / dequantize(): MXFP4 expert weights
// with their dequantized values, and act(), the MLP's rounding of its activations.
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/moe.hpp"
#include "ref_formats.hpp"

namespace moetest {

using lowbit::BlockFormat;
using lowbit::DType;
using lowbit::ScaleLayout;
using lowbit::TensorView;

struct Weights {
  std::vector<uint8_t> q, s;
  std::vector<float> deq;  // [G, N, K]
};

/// G x N x K random weights (reftest::randn(seed, scale)) quantized to MXFP4 (row-major scales),
/// and their dequantized values.
inline Weights mxfp4_weights(int64_t G, int64_t N, int64_t K, uint64_t seed, float scale) {
  Weights w;
  auto f = reftest::randn(size_t(G * N * K), seed, scale);
  w.q.resize(size_t(G * N * K / 2));
  w.s.resize(size_t(G * N * K / 32));
  w.deq.resize(f.size());
  lowbit::quantize(TensorView(f.data(), DType::kFloat32, {G, N, K}), BlockFormat::mxfp4(), ScaleLayout::row_major(),
                   TensorView(w.q.data(), DType::kUInt8, {G, N, K / 2}),
                   TensorView(w.s.data(), DType::kUE8M0, {G, N, K / 32}));
  lowbit::dequantize(TensorView(w.q.data(), DType::kUInt8, {G, N, K / 2}),
                     TensorView(w.s.data(), DType::kUE8M0, {G, N, K / 32}), BlockFormat::mxfp4(),
                     ScaleLayout::row_major(), TensorView(w.deq.data(), DType::kFloat32, {G, N, K}));
  return w;
}

/// act() of the MLP through the public quantize/dequantize API: bf16, or MXFP8 (RCEIL) of the row.
inline void act_round(std::vector<float>& v, bool mxfp8) {
  const int64_t n = int64_t(v.size());
  if (!mxfp8) {
    for (auto& x : v) x = lowbit::decode_bf16(lowbit::encode_bf16(x));
    return;
  }
  std::vector<uint8_t> q(v.size()), s(v.size() / 32);
  lowbit::quantize(TensorView(v.data(), DType::kFloat32, {1, n}), BlockFormat::mxfp8(), ScaleLayout::row_major(),
                   TensorView(q.data(), DType::kE4M3, {1, n}), TensorView(s.data(), DType::kUE8M0, {1, n / 32}));
  lowbit::dequantize(TensorView(q.data(), DType::kE4M3, {1, n}), TensorView(s.data(), DType::kUE8M0, {1, n / 32}),
                     BlockFormat::mxfp8(), ScaleLayout::row_major(), TensorView(v.data(), DType::kFloat32, {1, n}));
}

}  // namespace moetest
