// host emulation (tests/cpp/emu/cuda_runtime.h): cp.async with commit groups, in one of two modes
// (emu::cp_async_mode), so that a pipeline's ordering is checked from both sides:
//   kImmediate: the 16 bytes are copied when the copy is issued (the earliest the hardware may
//     land them): a copy issued into a buffer that other threads still read shows as a wrong result;
//   kDeferred: each thread queues its copies by commit group and performs a group's copies only
//     when a wait_group<N> leaves fewer than N newer groups pending (the latest the hardware may
//     land them): a read of a buffer before its group was waited for sees the stale bytes.
#pragma once
#include <cstring>
#include <deque>
#include <vector>
#include <cuda_runtime.h>
namespace emu {
// CpAsyncMode and cp_async_mode: cuda_runtime.h (the sm_90 copies of emu_sm90.hpp share them).
struct CpAsyncCopy {
  void* dst;
  const void* src;
};
/// This thread's committed groups (oldest first) and the copies issued since the last commit.
struct CpAsyncQueue {
  std::deque<std::vector<CpAsyncCopy>> groups;
  std::vector<CpAsyncCopy> open;
};
inline thread_local CpAsyncQueue cp_async_queue;
inline void cp_async_land(const std::vector<CpAsyncCopy>& g) {
  for (const CpAsyncCopy& c : g) std::memcpy(c.dst, c.src, 16);
}
}  // namespace emu
namespace lowbit::cuda_emu {
inline void cp_async16(void* smem, const void* gmem) {
  if (emu::cp_async_mode == emu::CpAsyncMode::kImmediate)
    std::memcpy(smem, gmem, 16);
  else
    emu::cp_async_queue.open.push_back({smem, gmem});
}
inline void cp_async_commit() {
  emu::CpAsyncQueue& q = emu::cp_async_queue;
  q.groups.push_back(std::move(q.open));
  q.open.clear();
}
/// Lands every committed group but the newest N (copies not yet committed stay queued, as on the
/// device, where wait_group does not wait for them).
template <int N>
inline void cp_async_wait() {
  emu::CpAsyncQueue& q = emu::cp_async_queue;
  while (q.groups.size() > size_t(N)) {
    emu::cp_async_land(q.groups.front());
    q.groups.pop_front();
  }
}
}  // namespace lowbit::cuda_emu
