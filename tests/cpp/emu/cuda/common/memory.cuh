// host emulation (tests/cpp/emu/cuda_runtime.h): vector loads / stores and fp32 input chunks
#pragma once
#include "cuda/common/codecs.cuh"
namespace lowbit::cuda_emu::dev {
inline uint4 ld_stream(const void* p) {
  uint4 r;
  std::memcpy(&r, p, 16);
  return r;
}
inline void st_stream(void* p, uint4 v) { std::memcpy(p, &v, 16); }
inline void st_stream8(void* p, uint2 v) { std::memcpy(p, &v, 8); }
template <DType T>
struct Chunk16 {
  static_assert(T == DType::kFloat32, "the encode reads fp32 keys only");
  uint32_t w[16];
  void load(const void* p) { std::memcpy(w, p, 64); }
  float get(int i) const { return bits_float(w[i]); }
};
}  // namespace lowbit::cuda_emu::dev
