// host emulation (tests/cpp/emu/cuda_runtime.h, emu_sm90.hpp) of src/cuda/common/mbarrier.cuh:
// the mbarriers, the cp.async copies they count (landing at issue or at the wait that covers them,
// emu::cp_async_mode) and the named barriers of the warp-specialized decode pipeline.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "emu_sm90.hpp"
namespace lowbit::cuda_emu {
inline uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
inline void mbar_init(uint32_t bar, uint32_t count) { emu::mbar_init(bar, count); }
inline void mbar_init_fence() {}
inline void mbar_arrive(uint32_t bar) { emu::mbar_arrive(bar); }
inline void mbar_wait(uint32_t bar, uint32_t parity) { emu::mbar_wait(bar, parity); }
inline void cp_async16_to(uint32_t dst, const void* src) { emu::cp_async_shared(dst, src, 16, 16); }
inline void cp_async_mbar_arrive(uint32_t bar) { emu::cp_async_arrive_noinc(bar); }
inline void cp_async_drain() {
  emu::cp_async_commit_group();
  emu::cp_async_wait_group(0);
}
/// CUTLASS's NamedBarrier::sync(n, id): hardware barrier id + 8 (the first 8 are CUTLASS's).
inline void named_barrier_sync(uint32_t id, uint32_t n) {
  if (id >= 8) emu::fail("NamedBarrier::sync: user barrier id outside 0..7");
  emu::named_barrier_sync(id + 8, n);
}
}  // namespace lowbit::cuda_emu
