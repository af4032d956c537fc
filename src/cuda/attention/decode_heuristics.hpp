// src/cuda/attention/decode_heuristics.hpp: the choices of the fused decode attention's launcher
// (sm90_nf4_decode_fused.cu). Host-only pure functions of shared-memory sizes, unit-tested on the
// CPU (tests/cpp/test_heuristics.cpp). Outside lowbit::cuda, so that the host emulation of the kernels
// (tests/cpp/emu/) uses them as they are.
#pragma once

#include <cstddef>

namespace lowbit::heuristics::decode {

constexpr size_t kSmemPerSm = 228 * 1024;   ///< sm_90 shared memory per SM
constexpr size_t kSmemPerCta = 227 * 1024;  ///< sm_90 opt-in shared memory per CTA
constexpr size_t kSmemReserved = 1024;      ///< reserved by the runtime per CTA
constexpr int kMaxCtasPerSm = 2;            ///< the split kernel's __launch_bounds__ (256 threads, 2 CTAs)

/// CTAs of `bytes` dynamic shared memory that fit on one SM (0: not even one), at most kMaxCtasPerSm.
constexpr int ctas_per_sm(size_t bytes) {
  if (bytes > kSmemPerCta) return 0;
  const size_t n = kSmemPerSm / (bytes + kSmemReserved);
  return n < size_t(kMaxCtasPerSm) ? int(n) : kMaxCtasPerSm;
}

/// K buffers of the split kernel, given its shared memory with one and with two: two (K of the
/// next tile issued a whole iteration ahead) when they keep as many CTAs per SM as one, else one
/// (0: neither fits). `forced` (1 or 2, from LOWBIT_DECODE_K_STAGES; 0 otherwise) takes that count
/// whenever it fits at all: the development A/B of docs/design/decode_kernel.md.
constexpr int pick_k_stages(size_t bytes1, size_t bytes2, int forced = 0) {
  if (forced == 2 && ctas_per_sm(bytes2) > 0) return 2;
  if (forced == 1 && ctas_per_sm(bytes1) > 0) return 1;
  if (ctas_per_sm(bytes1) == 0) return 0;
  return ctas_per_sm(bytes2) >= ctas_per_sm(bytes1) ? 2 : 1;
}

}  // namespace lowbit::heuristics::decode
