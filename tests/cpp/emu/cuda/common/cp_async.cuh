// host emulation (tests/cpp/emu/cuda_runtime.h): cp.async as an immediate 16-byte copy
#pragma once
#include <cstring>
#include <cuda_runtime.h>
namespace lowbit::cuda_emu {
inline void cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
}  // namespace lowbit::cuda_emu
