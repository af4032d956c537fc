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
constexpr int kMaxCtasPerSm = 2;            ///< the split kernels' __launch_bounds__ (at most 2 CTAs)

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

/// Ring depths of the warp-specialized split kernel (nf4_decode_ws.cuh): K stages in whole tiles
/// (128 tokens), V stages in half tiles (64 tokens); {0, 0}: none fits (or none forced).
struct WsStages {
  int k = 0, v = 0;
};

/// The ring depths of the warp-specialized split kernel, given its shared memory bytes(k, v): the
/// first pair of the order below that keeps the most CTAs per SM reachable up to `target` (the
/// kernel's __launch_bounds__ minimum: 2 at D <= 128 with at most 4 heads per CTA, else 1). `forced`
/// (LOWBIT_DECODE_WS_STAGES=KxV, the development A/B; k in 2..4, v in 2..8) whenever it fits at all.
template <typename Bytes>
constexpr WsStages pick_ws_stages(Bytes bytes, int target, WsStages forced = {}) {
  constexpr WsStages order[] = {{4, 4}, {3, 4}, {4, 3}, {3, 3}, {2, 4}, {2, 3}, {3, 2}, {2, 2}};
  if (forced.k >= 2 && forced.k <= 4 && forced.v >= 2 && forced.v <= 8 && ctas_per_sm(bytes(forced.k, forced.v)) > 0)
    return forced;
  int best = 0;
  for (const WsStages& s : order) {
    const int n = ctas_per_sm(bytes(s.k, s.v));
    best = n > best ? (n < target ? n : target) : best;
  }
  if (best == 0) return {};
  for (const WsStages& s : order)
    if (ctas_per_sm(bytes(s.k, s.v)) >= best) return s;
  return {};
}

/// The split kernel of the fused path: split_kernel (sm90_nf4_decode_fused.cu), or the
/// warp-specialized split_kernel_ws (nf4_decode_ws.cuh).
enum class Pipeline { kSplit, kWs, kInvalid };

/// Statuses of the launcher beyond cudaError_t's (outside its range), for a development setting
/// it cannot honour; status_message names the variable. cuda::error_string gives the message.
constexpr int kStatusBadPipeline = 0x4C420001;  ///< LOWBIT_DECODE_PIPELINE not unset / split / ws
constexpr int kStatusBadWsStages = 0x4C420002;  ///< LOWBIT_DECODE_WS_STAGES not KxV in range
constexpr int kStatusWsDoesNotFit = 0x4C420003;  ///< ws asked for, its shared memory does not fit
constexpr const char* status_message(int status) {
  switch (status) {
    case kStatusBadPipeline: return "invalid LOWBIT_DECODE_PIPELINE: expected split (the default) or ws";
    case kStatusBadWsStages: return "invalid LOWBIT_DECODE_WS_STAGES: expected KxV, K in 2..4, V in 2..8";
    case kStatusWsDoesNotFit:
      return "LOWBIT_DECODE_PIPELINE=ws: the warp-specialized split kernel's shared memory does not fit this call";
    default: return nullptr;
  }
}

constexpr bool env_equals(const char* a, const char* b) {
  for (; *a && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}

/// LOWBIT_DECODE_PIPELINE (the development A/B of docs/design/decode_kernel.md), read by the
/// launcher at each call: unset or empty -> kSplit (the default), "split" -> kSplit, "ws" -> kWs,
/// anything else -> kInvalid (the launcher fails the call with kStatusBadPipeline).
constexpr Pipeline parse_pipeline(const char* env) {
  if (env == nullptr || env[0] == 0 || env_equals(env, "split")) return Pipeline::kSplit;
  if (env_equals(env, "ws")) return Pipeline::kWs;
  return Pipeline::kInvalid;
}

/// LOWBIT_DECODE_WS_STAGES: unset or empty -> {0, 0} (the heuristic's depths); "KxV" with K in
/// 2..4 and V in 2..8 (one digit each) -> {K, V}; anything else -> {-1, -1} (invalid).
constexpr WsStages parse_ws_stages(const char* env) {
  if (env == nullptr || env[0] == 0) return {};
  if (env[0] >= '2' && env[0] <= '4' && env[1] == 'x' && env[2] >= '2' && env[2] <= '8' && env[3] == 0)
    return {env[0] - '0', env[2] - '0'};
  return {-1, -1};
}

/// The fused path's split kernel for one call.
struct PipelineChoice {
  int status = 0;     ///< 0, or a kStatus* above (the call fails)
  bool ws = false;    ///< split_kernel_ws (else split_kernel)
  WsStages stages;    ///< ws: its ring depths
};

/// The split kernel of a call that takes the fused path, from the two variables' values (nullptr:
/// unset) and the warp-specialized kernel's shared memory ws_bytes(k, v) and CTA target
/// (pick_ws_stages). ws asked for but not fitting at any depth fails the call (kStatusWsDoesNotFit)
/// rather than running split_kernel in its place; LOWBIT_DECODE_WS_STAGES is read only for ws.
template <typename Bytes>
constexpr PipelineChoice choose_pipeline(const char* pipeline_env, const char* stages_env, Bytes ws_bytes, int target) {
  PipelineChoice c;
  const Pipeline p = parse_pipeline(pipeline_env);
  if (p == Pipeline::kInvalid) {
    c.status = kStatusBadPipeline;
  } else if (p == Pipeline::kWs) {
    const WsStages forced = parse_ws_stages(stages_env);
    if (forced.k < 0) {
      c.status = kStatusBadWsStages;
    } else {
      c.stages = pick_ws_stages(ws_bytes, target, forced);
      c.ws = c.stages.k > 0;
      if (!c.ws) c.status = kStatusWsDoesNotFit;
    }
  }
  return c;
}

}  // namespace lowbit::heuristics::decode
