// tests/cpp/emu/emu_test_util.hpp: what the emulated GEMM kernel tests share: the two orderings
// every case runs in (emu_sm90.hpp, "Asynchrony").
#pragma once

#include <gtest/gtest.h>

#include "emu_sm90.hpp"

namespace emu_test {

/// When the emulated copies land and when a wgmma reads its operands.
struct Mode {
  emu::CpAsyncMode copies;
  emu::WgmmaMode mma;
};

/// Sets the emulator's modes for the next launch.
inline void apply(const Mode& mode) {
  emu::cp_async_mode = mode.copies;
  emu::wgmma_mode = mode.mma;
}

/// Runs run(mode) under both orderings: copies landing at issue with wgmma reading at
/// wait_group (a missing wait shows as stale data), then copies landing at their wait with wgmma
/// reading at issue (a buffer reused too early or a missing fence shows).
template <class Run>
void in_both_orders(Run&& run) {
  {
    SCOPED_TRACE("copies land at issue, wgmma reads B at wait_group");
    run(Mode{emu::CpAsyncMode::kImmediate, emu::WgmmaMode::kAtWait});
  }
  {
    SCOPED_TRACE("copies land at the wait, wgmma reads B at issue");
    run(Mode{emu::CpAsyncMode::kDeferred, emu::WgmmaMode::kAtIssue});
  }
}

}  // namespace emu_test
