// The device group bounds of the m_counts layouts (src/cuda/moe/group_layout.cuh,
// counts_to_indptr_kernel) run on the CPU through the host emulation of tests/cpp/emu/ (the build
// rewrites the header's namespace and launches: tests/cpp/CMakeLists.txt), against the clamping
// rule of lowbit/moe.hpp written out here: negative counts count 0, masked counts above max_tokens
// count max_tokens, contiguous groups end at row M at the latest; int32 and int64 counts and bounds,
// more groups than one warp's 32, counts near the int64 limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda/moe/group_layout.cuh"

namespace {

using lowbit::cuda_emu::counts_to_indptr_kernel;

std::vector<int64_t> rule(const std::vector<int64_t>& c, int64_t rows, int64_t max_tokens) {
  std::vector<int64_t> ind(c.size() + 1, 0);
  for (size_t g = 0; g < c.size(); ++g) {
    int64_t v = c[g] < 0 ? 0 : c[g];
    if (max_tokens > 0 && v > max_tokens) v = max_tokens;
    const int64_t room = rows - ind[g];
    ind[g + 1] = ind[g] + (v < room ? v : room);
  }
  return ind;
}

template <typename CountT, typename IndT>
void check(const std::vector<int64_t>& c, int64_t rows, int64_t max_tokens) {
  std::vector<CountT> counts(c.begin(), c.end());
  std::vector<IndT> ind(c.size() + 1, IndT(-7));
  emu::launch(counts_to_indptr_kernel<IndT>, dim3(1), dim3(32))(static_cast<const void*>(counts.data()),
                                                              sizeof(CountT) == 8, int64_t(c.size()), rows,
                                                              max_tokens, ind.data());
  std::vector<int64_t> cc(counts.begin(), counts.end());
  const auto want = rule(cc, rows, max_tokens);
  for (size_t g = 0; g < ind.size(); ++g)
    ASSERT_EQ(int64_t(ind[g]), want[g]) << "bound " << g << " of " << c.size() << " groups, rows " << rows
                                        << ", max_tokens " << max_tokens;
}

}  // namespace

TEST(EmuMoeLayout, CountsToBoundsClampLikeTheRule) {
  // contiguous: exact sums, a sum past the rows, negative counts
  check<int32_t, int64_t>({3, 0, 5, 1}, 20, 0);
  check<int64_t, int32_t>({3, 0, 50, 1}, 20, 0);
  check<int32_t, int32_t>({-4, 7, -1, 2}, 9, 0);
  // masked: counts above max_tokens, full and empty groups
  check<int64_t, int64_t>({8, 0, 9, -3, 8}, 5 * 8, 8);
  // no groups; more groups than a warp (several chunks of 32)
  check<int32_t, int64_t>({}, 0, 0);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-3, 40);
  std::vector<int64_t> many(77);
  for (auto& v : many) v = d(rng);
  check<int32_t, int64_t>(many, 1000, 0);
  check<int64_t, int32_t>(many, 77 * 30, 30);
  // int64 counts near the limit saturate at the rows instead of overflowing
  const int64_t big = std::numeric_limits<int64_t>::max();
  check<int64_t, int64_t>({big, big, 1}, int64_t(1) << 40, 0);
  check<int64_t, int64_t>(std::vector<int64_t>(40, big / 2), int64_t(1) << 58, 0);
}
