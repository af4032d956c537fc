// src/cuda/common/selftest.hpp: device self-tests of the fast codecs (used by the GPU tests).
#pragma once

#include <cstdint>

namespace lowbit::cuda {

/// Checks of selftest_encoders, in the order of the result arrays.
enum SelftestCheck : int {
  kCheckE4M3Finite,   ///< fast e4m3 satfinite vs encode_e4m3(x, kFinite), all 2^32 fp32
  kCheckE4M3None,     ///< fast e4m3 vs encode_e4m3(x, kNone)
  kCheckE5M2Finite,
  kCheckE5M2None,
  kCheckE2M1,         ///< fast e2m1 vs encode_e2m1
  kCheckNF4,          ///< binary-search nf4 vs encode_nf4
  kCheckInt4,         ///< vs encode_int4
  kCheckF16,          ///< hardware fp16 encode (+ NaN fix) vs encode_fp16
  kCheckBF16,         ///< hardware bf16 encode (+ NaN fix) vs encode_bf16
  kCheckDecF16,       ///< all 2^16 fp16 codes: fast decode vs decode_fp16 (bits)
  kCheckDecE4M3,      ///< all 2^8 codes
  kCheckDecE5M2,
  kCheckRawE4M3NaN,   ///< informational: raw hardware satfinite e4m3 vs software (no NaN fix)
  kCheckRawE5M2NaN,
  kSelftestCount
};

/// Runs every check exhaustively on the current device; fills mismatch counts and the first
/// mismatching input (0xFFFFFFFF when none). Returns a cudaError_t.
int selftest_encoders(uint64_t* mismatches, uint32_t* first_bad);

}  // namespace lowbit::cuda
