// tests/cpp/emu/cutlass/arch/barrier.h: host emulation of the CUTLASS mbarrier entry points that
// src/cuda/common/sm90_gemm_common.cuh forwards to (ClusterBarrier / ClusterTransactionBarrier's
// static init / arrive / arrive_and_expect_tx / try_wait / wait, fence_barrier_init,
// fence_view_async_shared, cpasync_barrier_arrive_noinc), forwarded to the mbarrier, cp.async and
// proxy-fence emulation of emu_sm90.hpp. Shadows CUTLASS's header on the emu tests' include path.
// Test code only.
#pragma once

#include <cstdint>

#include "emu_sm90.hpp"

namespace cutlass::arch {

struct ClusterBarrier {
  using ValueType = uint64_t;
  static uint32_t addr(ValueType const* p) { return uint32_t(__cvta_generic_to_shared(p)); }
  static void init(ValueType const* p, uint32_t arrive_count) { emu::mbar_init(addr(p), arrive_count); }
  static void arrive(ValueType const* p) { emu::mbar_arrive(addr(p)); }
  static bool try_wait(ValueType const* p, uint32_t phase) { return emu::mbar_try_wait(addr(p), phase); }
  static void wait(ValueType const* p, uint32_t phase) { emu::mbar_wait(addr(p), phase); }
};
struct ClusterTransactionBarrier : ClusterBarrier {
  static void arrive_and_expect_tx(ValueType const* p, uint32_t bytes) { emu::mbar_arrive_expect_tx(addr(p), bytes); }
};

/// fence.mbarrier_init.release.cluster: the emulated barriers are visible once initialised.
inline void fence_barrier_init() {}
/// fence.proxy.async.shared::cta.
inline void fence_view_async_shared() { emu::fence_proxy_async(); }
/// cp.async.mbarrier.arrive.noinc.shared::cta.b64.
inline void cpasync_barrier_arrive_noinc(uint64_t const* p) {
  emu::cp_async_arrive_noinc(uint32_t(__cvta_generic_to_shared(p)));
}

}  // namespace cutlass::arch
