// host emulation (tests/cpp/emu/cuda_runtime.h): the generic decode kernels are not emulated; a
// call that would take them fails (the emu test only builds calls of the fused path)
#pragma once
#include <cuda_runtime.h>
#include "core/plan_decode.hpp"
namespace lowbit::cuda_emu {
inline int attn_decode_nf4_generic(const detail::DecodeNf4Plan&, const detail::DecodeNf4Ptrs&, void*, int64_t, void*) {
  return cudaErrorInvalidConfiguration;
}
}  // namespace lowbit::cuda_emu
