// src/cuda/attention/mxfp8_attn_params.cuh: the kernel parameters of the MXFP8 flash-attention
// forward, the tile shapes per head dimension and the shared-memory map. The parameters are made
// from the validated plan by one function (make_attn_params in sm90_mxfp8_attention.cu).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace lowbit::cuda::attention {

struct AttnParams {
  CUtensorMap tm_k;  ///< k codes as uint8 [batch][heads_kv][seq][d] (dims innermost first), no swizzle
  CUtensorMap tm_v;
  const uint8_t* q = nullptr;
  const uint8_t* q_scale = nullptr;
  const uint8_t* k_scale = nullptr;
  const uint8_t* v_scale = nullptr;
  uint16_t* out = nullptr;  ///< bf16 bits
  float* lse = nullptr;
  const int32_t* cu_seqlens_q = nullptr;  ///< varlen only
  const int32_t* cu_seqlens_k = nullptr;
  int64_t q_stride[3];   ///< elements: batch, seq, head
  int64_t o_stride[3];
  int64_t qs_stride[3];  ///< bytes: batch, head, seq
  int64_t ks_stride[3];
  int64_t vs_stride[3];
  int64_t lse_stride[3];  ///< elements: batch, head, seq
  int seqlen_q = 0;       ///< fixed length (varlen: unused)
  int seqlen_k = 0;
  int heads_per_kv = 1;   ///< heads / heads_kv
  int causal = 0;
  int varlen = 0;
  float scale_log2 = 0.f;  ///< softmax_scale * log2(e)
  /// FP8 path only: Ak / Av of each (sequence, KV head), int32 [batch][heads_kv][16], from the
  /// pre-pass (mxfp8_attn_fp8_prep.cuh); tm_k / tm_v then map its K' and V'^T.
  const int32_t* kv_ref = nullptr;
};

/// Tile shapes and shared-memory map for head dimension kD. One CTA = one producer warpgroup
/// (TMA loads of the raw K / V tiles, their conversion into the bf16 MMA operands) + two consumer
/// warpgroups of 64 query rows each. K' and V' share one layout: [tokens][64-channel atoms],
/// 128B-swizzled rows (K-major for QK^T, MN-major for PV).
template <int kD_>
struct AttnTraits {
  static constexpr int kD = kD_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kD == 256 ? 32 : 128;  ///< keys per tile
  static constexpr int kStages = 2;
  static constexpr int kBlocks = kD / 32;  ///< scale blocks per row
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegs = 96;  // 96 + 2 * 200 = 496 <= 168 * 384 / 128: the CTA's register pool
  static constexpr int kFullArrivals = 128;  ///< K' / V' "full" barriers: every producer thread
  static constexpr int kConsumerRegs = 200;

  // Byte sizes of the shared-memory regions (each starts 1024-aligned).
  static constexpr int kQBytes = kBlockM * kD * 2;  ///< Q' (bf16, scales folded), two 64-row halves
  static constexpr int kKBytes = kBlockN * kD * 2;  ///< K' (bf16, scales folded), per stage
  static constexpr int kVBytes = kBlockN * kD * 2;  ///< V' (bf16, scales folded), per stage
  static constexpr int kRawBytes = kBlockN * kD;    ///< raw K or V codes (TMA), per stage

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  static constexpr int kOffRawK = kOffV + kStages * kVBytes;
  static constexpr int kOffRawV = kOffRawK + kStages * kRawBytes;
  static constexpr int kOffRf = kOffRawV + kStages * kRawBytes;  ///< float per query row
  static constexpr int kOffMisc = kOffRf + kBlockM * 4;              ///< ok, ov[kBlocks], scan scratch
  static constexpr int kMiscBytes = 4 * (16 + 4 * 2);  ///< ok, ov, scan scratch
  static constexpr int kOffBar = (kOffMisc + kMiscBytes + 7) / 8 * 8;
  static constexpr int kBarBytes = 8 * 5 * kStages;  ///< raw_full, k_full, k_empty, v_full, v_empty
  static constexpr int kSmemBytes = kOffBar + kBarBytes + 1024;  ///< + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

}  // namespace lowbit::cuda::attention
