// tests/cpp/gpu_conversions_util.hpp: what the conversion GPU tests (gpu_test_conversions.cpp,
// gpu_test_conversions_ops.cpp) share: the device check and its skip macro, poisoned host /
// device buffers, tensor views, the byte comparison, the test data and the format and layout
// lists.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"

namespace convtest {

using namespace lowbit;

inline bool gpu_ok() {
  static int ok = -1;
  if (ok < 0) {
    const BuildInfo b = build_info();
    ok = b.cuda_built && b.device_count > 0 && b.sm >= 90;
  }
  return ok == 1;
}

#define SKIP_WITHOUT_GPU() \
  do {                     \
    if (!gpu_ok()) GTEST_SKIP() << "no sm_90 CUDA device"; \
  } while (0)

#define CUDA_OK(x) ASSERT_EQ(cudaSuccess, (x)) << #x

constexpr uint8_t kPoison = 0xAB;

/// A host buffer and its device twin.
struct Buf {
  std::vector<uint8_t> h;
  void* d = nullptr;
  size_t n = 0;
  Buf() = default;
  explicit Buf(size_t bytes) : h(bytes, kPoison), n(bytes) {
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) d = nullptr;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : h(std::move(o.h)), d(o.d), n(o.n) { o.d = nullptr; }
  ~Buf() {
    if (d) cudaFree(d);
  }
  void upload() { cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice); }
  void poison() {
    std::fill(h.begin(), h.end(), kPoison);
    cudaMemset(d, kPoison, n);
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> r(n);
    cudaMemcpy(r.data(), d, n, cudaMemcpyDeviceToHost);
    return r;
  }
};

inline TensorView view(void* p, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides, bool gpu) {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  v.device = gpu ? Device::kCUDA : Device::kCPU;
  return v;
}
inline TensorView dense(void* p, DType t, std::vector<int64_t> shape, bool gpu) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = s;
    s *= shape[size_t(i)];
  }
  return view(p, t, shape, st, gpu);
}

/// Compares whole buffers; returns the number of differing bytes (reports the first few).
inline size_t compare(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      if (bad < 4) ADD_FAILURE() << what << ": byte " << i << " cpu 0x" << std::hex << int(cpu[i]) << " gpu 0x" << int(gpu[i]);
      ++bad;
    }
  }
  return bad;
}

// ---------------------------------------------------------------------------------------------
// data

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(12345);
  return r;
}

/// Row-wise varied test data with specials (fp32 values).
inline std::vector<float> make_values(int64_t rows, int64_t K, int block) {
  std::vector<float> v(size_t(rows * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ui(0, 1 << 30);
  const float ties[] = {1.0625f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 464.0f, 61440.0f, 0.5f, 6.0f, 7.0f,
                        448.0f, 1.5f, 0.125f, 3.0f, 240.0f, 57344.0f, 0.0f};
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = int(r % 10);
    const int e = int(ui(rng()) % 41) - 20;
    for (int64_t k = 0; k < K; ++k) {
      float x = nd(rng()) * std::ldexp(1.0f, e);
      const int64_t blk = k / block;
      switch (kind) {
        case 4: {  // exact ties on a power-of-two grid, block max fixed
          const float t = ties[ui(rng()) % 20];
          x = (ui(rng()) & 1 ? -t : t) * std::ldexp(1.0f, (int(blk) % 7) - 3);
          if (k % block == 0) x = std::ldexp(1.0f, 9 + int(blk % 5));
          break;
        }
        case 5:  // zero blocks, subnormal-amax blocks, -0
          if (blk % 3 == 0) x = (k & 1) ? -0.0f : 0.0f;
          else if (blk % 3 == 1) x = nd(rng()) * 1e-40f;
          break;
        case 6:  // NaN / Inf in some blocks
          if (blk % 4 == 1 && k % block == 3) x = NAN;
          if (blk % 4 == 2 && k % block == 5) x = (k & 2) ? INFINITY : -INFINITY;
          if (blk % 4 == 3 && k % block == 7) x = -NAN;
          break;
        case 7:  // saturating magnitudes and tiny mixed
          x = (ui(rng()) % 3 == 0) ? nd(rng()) * 3e38f : nd(rng()) * 1e-30f;
          break;
        case 8:  // one big outlier per block (FLOOR clipping, large dynamic range)
          if (k % block == 1) x *= 1e6f;
          break;
        case 9:  // finite blocks wider than FLT_MAX (UINT4: max - min overflows), up to +-FLT_MAX
          x = float(std::ldexp(double(ui(rng()) % 1024 + 1) / 1024.0 * ((k & 1) ? -1.0 : 1.0), 128) *
                    (1.0 - std::ldexp(1.0, -24)));
          if (k % block == 2) x = (blk & 1) ? 2e38f : -2e38f;
          break;
        default: break;
      }
      v[size_t(r * K + k)] = x;
    }
  }
  return v;
}

inline void store_as(DType t, const std::vector<float>& v, uint8_t* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kFloat32) std::memcpy(out + 4 * i, &v[i], 4);
    else {
      const uint16_t h = t == DType::kFloat16 ? encode_fp16(v[i]) : encode_bf16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

struct Fmt {
  const char* name;
  BlockFormat f;
};
inline std::vector<Fmt> formats() {
  std::vector<Fmt> r = {
      {"mxfp8_e4m3_rceil", BlockFormat::mxfp8(Elem::kE4M3, false)},
      {"mxfp8_e4m3_floor", BlockFormat::mxfp8(Elem::kE4M3, true)},
      {"mxfp8_e5m2_rceil", BlockFormat::mxfp8(Elem::kE5M2, false)},
      {"mxfp8_e5m2_floor", BlockFormat::mxfp8(Elem::kE5M2, true)},
      {"mxfp4_rceil", BlockFormat::mxfp4(false)},
      {"mxfp4_floor", BlockFormat::mxfp4(true)},
      {"nvfp4_zero", BlockFormat::nvfp4(ZeroScale::kZero)},
      {"nvfp4_minsub", BlockFormat::nvfp4(ZeroScale::kMinSubnormal)},
      {"nvfp4_one", BlockFormat::nvfp4(ZeroScale::kOne)},
      {"fp8_g128_f32", BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kF32)},
      {"fp8_g128_ue8m0", BlockFormat::fp8_group(128, Elem::kE4M3, ScaleType::kUE8M0)},
      {"fp8e5_g64_f32", BlockFormat::fp8_group(64, Elem::kE5M2, ScaleType::kF32)},
      {"fp8_g256_f32", BlockFormat::fp8_group(256, Elem::kE4M3, ScaleType::kF32)},
      {"fp8_g48_f32", BlockFormat::fp8_group(48, Elem::kE4M3, ScaleType::kF32)},
      {"int4_g128_f32", BlockFormat::int4_group(128, false, ScaleType::kF32)},
      {"int4_g32_ue8m0", BlockFormat::int4_group(32, false, ScaleType::kUE8M0)},
      {"uint4_g128_zp", BlockFormat::int4_group(128, true)},
      {"uint4_g8_zp", BlockFormat::int4_group(8, true)},
      {"nf4_b64", BlockFormat::nf4(64)},
      {"nf4_b64_hi", BlockFormat::nf4(64, NibbleOrder::kHighFirst)},
      {"nf4_b32", BlockFormat::nf4(32)},
      {"mxfp4_hi", BlockFormat{Elem::kE2M1, 32, ScaleType::kUE8M0, ScaleRule::kMxRceil, NibbleOrder::kHighFirst}},
  };
  return r;
}

struct Lay {
  const char* name;
  ScaleLayout l;
};
inline std::vector<Lay> layouts() {
  return {{"row", ScaleLayout::row_major()},         {"col", ScaleLayout::col_major(1)},
          {"col4", ScaleLayout::col_major(4)},       {"col16", ScaleLayout::col_major(16)},
          {"b128x4", ScaleLayout::blocked128x4()},   {"b8x4", ScaleLayout::blocked8x4()},
          {"grp_fi", ScaleLayout::blocked128x4(GroupPad::kFlashInfer)},
          {"grp_cs", ScaleLayout::blocked128x4(GroupPad::kCumsum)}};
}

}  // namespace convtest
