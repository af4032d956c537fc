// src/cuda/attention/mxfp8_attn_fp8_traits.cuh: tile shapes, register split and shared-memory map
// of the FP8 tensor-core path of the MXFP8 attention forward (precision kFp8; design record:
// docs/design/mxfp8_attention.md, "FP8 tensor-core path (opt-in)"). The kernel parameters are the
// exact path's AttnParams (mxfp8_attn_params.cuh).
#pragma once

#include <cstdint>

// Dev builds only (bench/dev/attn_mxfp8_kernel.cu): 2 = the consumers skip their products and
// softmax (the loads and handshakes alone). Outputs are then meaningless. Never set in the library.
#ifndef LOWBIT_ATTN_FP8_PROFILE
#define LOWBIT_ATTN_FP8_PROFILE 0
#endif

// Dev builds only: the depth of the K' and V'^T rings (2 in the library).
#ifndef LOWBIT_ATTN_FP8_STAGES
#define LOWBIT_ATTN_FP8_STAGES 2
#endif

// Dev builds only: query-row blocks per CTA (1 in the library).
#ifndef LOWBIT_ATTN_FP8_ROWS_PER_CTA
#define LOWBIT_ATTN_FP8_ROWS_PER_CTA 1
#endif

namespace lowbit::cuda::attention::fp8 {

constexpr int kProfile = LOWBIT_ATTN_FP8_PROFILE;

/// One CTA = one producer warpgroup (one thread issues the TMA loads of K' and V'^T, written by the
/// pre-pass, mxfp8_attn_fp8_prep.cuh) + two consumer warpgroups of 64 query rows. FP8 operands are
/// K-major, stored in swizzle atoms of 128 bytes (64 where a row has 64 bytes).
template <int kD_>
struct Traits {
  static constexpr int kD = kD_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kD == 256 ? 64 : 128;  ///< keys per tile
  static constexpr int kStages = LOWBIT_ATTN_FP8_STAGES;
  static constexpr int kRowsPerCta = LOWBIT_ATTN_FP8_ROWS_PER_CTA;    ///< query-row blocks per CTA (grid.x)
  static constexpr int kBlocks = kD / 32;               ///< scale blocks per row
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegs = 104;
  static constexpr int kFullArrivals = 1;  ///< K' / V' "full" barriers: the TMA thread's expect_tx
  static constexpr int kConsumerRegs = 200;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 504, "register pool of 384 threads at 168");

  static constexpr int kWQK = kD >= 128 ? 128 : 64;            ///< atom bytes of Q', K' (and raw V in the pre-pass) rows
  static constexpr int kWV = kBlockN >= 128 ? 128 : 64;        ///< atom bytes of V'^T rows (tokens)
  static constexpr int kVC = kD == 64 ? 8 : 16;                ///< channels per V transpose unit
  static constexpr int kVUnits = (kBlockN / 8) * (kD / kVC);   ///< transpose units per tile
  static_assert(kVUnits == 128, "one V transpose unit per pre-pass thread");

  static constexpr int kQBytes = kBlockM * kD;     ///< Q' (E4M3), two 64-row halves
  static constexpr int kKBytes = kBlockN * kD;     ///< K' per stage
  static constexpr int kVBytes = kBlockN * kD;     ///< V'^T per stage

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  static constexpr int kOffRf = kOffV + kStages * kVBytes;  ///< float per query row
  static constexpr int kOffMisc = kOffRf + kBlockM * 4;     ///< Ak[8], Av[8]
  static constexpr int kMiscBytes = 4 * 16;
  static constexpr int kOffBar = (kOffMisc + kMiscBytes + 7) / 8 * 8;
  static constexpr int kBarBytes = 8 * 5 * kStages;  ///< (raw_full, unused), k_full, k_empty, v_full, v_empty
  static constexpr int kSmemBytes = kOffBar + kBarBytes + 1024;  ///< + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kOffK % 1024 == 0 && kOffV % 1024 == 0 && kKBytes % 1024 == 0 && (kQBytes / 2) % 1024 == 0,
                "swizzle atoms 1024-aligned");
};

}  // namespace lowbit::cuda::attention::fp8
