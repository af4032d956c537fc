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

/// The emulator set up for one kernel launch (its orderings, `sms` SMs, an empty launch log) and put
/// back to its defaults (copies at issue, wgmma at wait, 2 SMs) when this goes out of scope, also
/// when a failed assertion returns early.
class Launch {
 public:
  Launch(const Mode& mode, int sms) {
    emu::sm_count = sms;
    emu::cp_async_mode = mode.copies;
    emu::wgmma_mode = mode.mma;
    emu::launch_log.clear();
  }
  ~Launch() {
    emu::sm_count = 2;
    emu::cp_async_mode = emu::CpAsyncMode::kImmediate;
    emu::wgmma_mode = emu::WgmmaMode::kAtWait;
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
};

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
