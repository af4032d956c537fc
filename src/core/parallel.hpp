// src/core/parallel.hpp: a minimal parallel-for over [0, n) for the CPU reference paths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace lowbit::detail {

template <typename F>
void parallel_for(int64_t n, F&& fn, int64_t min_per_thread = 1) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t nt = std::min<int64_t>(hw, std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread)));
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(nt));
  for (int64_t t = 0; t < nt; ++t) {
    ts.emplace_back([&, t] {
      try {
        for (int64_t i = t * n / nt; i < (t + 1) * n / nt; ++i) fn(i);
      } catch (...) {
        errs[size_t(t)] = std::current_exception();
      }
    });
  }
  for (auto& th : ts) th.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace lowbit::detail
