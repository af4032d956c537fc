// src/core/plan_decode.hpp: the validated descriptions of the NF4 K-cache decode ops
// (lowbit/decode_attention.hpp): the pruned decode attention, the fused K projection + RoPE +
// NF4 encode and the cache append. Shared by the CPU reference (src/ref/ref_decode_attention.cpp)
// and the sm_90a kernels (src/cuda/attention/launch_decode.hpp). Everything here has been
// checked by the API layer (src/api/decode_attention.cpp): implementations trust it.
#pragma once

#include <cstdint>

#include "core/plan_formats.hpp"
#include "core/plan_kcache.hpp"

namespace lowbit::detail {

/// Where token t of sequence b lives in a cache tensor whose strides are s = {s0, s1, ...}.
/// Dense (no block table): at b * s0 + t * s1, the tensor [B, T, H_kv, ...]. Paged (vLLM / FA3
/// block tables): the tensor is [pages, page_size, H_kv, ...] and the token is row
/// t % page_size of page table[b * table_stride + t / page_size], at page * s0 + row * s1.
/// page_size is a power of two; a page id outside [0, pages) is clamped (a device table is not
/// validated: memory stays in bounds, the sequence's result is then unspecified).
struct CachePages {
  const int32_t* table = nullptr;  ///< [B, max_pages] int32; null: dense
  int64_t table_stride = 0;        ///< elements between the rows of the table
  int64_t pages = 0;               ///< the cache tensors' first dimension
  int shift = 0;                   ///< log2(page_size)

  LOWBIT_HOST_DEVICE bool paged() const { return table != nullptr; }
  /// Element offset of token t of sequence b, the head dimension not included.
  LOWBIT_HOST_DEVICE int64_t offset(const int64_t* s, int64_t b, int64_t t) const {
    if (!paged()) return b * s[0] + t * s[1];
    int64_t page = table[b * table_stride + (t >> shift)];
    page = page < 0 ? 0 : (page >= pages ? pages - 1 : page);
    return page * s[0] + (t & ((int64_t(1) << shift) - 1)) * s[1];
  }
};

struct DecodeNf4Plan {
  int64_t batch = 0;      ///< B
  int64_t seqlen = 0;     ///< T: tokens the cache holds (seq_lens[b] <= T)
  int64_t heads = 0;      ///< query heads H_q
  int64_t heads_kv = 0;   ///< KV heads H_kv (heads % heads_kv == 0)
  int64_t head_dim = 0;   ///< D in {64, 128, 256}
  int64_t head_dim_v = 0; ///< Dv in {64, 128, 256}
  int64_t block_size = 64;
  int64_t sub_block_size = 16;  ///< divides block_size
  float delta = 8.0f;           ///< >= 0 or +inf
  float softmax_scale = 0.f;    ///< resolved (default 1/sqrt(D))
  bool use_residual = true;
  DType scale_dtype = DType::kFloat32;   ///< k_scale: float32 or bfloat16
  DType residual_dtype = DType::kE5M2;   ///< k_residual: E5M2 or E4M3
  NibbleOrder nibbles = NibbleOrder::kLowFirst;
  DType v_dtype = DType::kBFloat16;      ///< v: bfloat16, or E4M3 / E5M2 codes read with v_scale
  bool has_seq_lens = false;
  bool has_threshold = false;
  bool has_skip_ratio = false;

  // Element strides (last dimension contiguous).
  int64_t q_stride[3] = {0, 0, 0};   ///< q [B, 1, H_q, D]: {batch, (unused), head}
  int64_t kc_stride[3] = {0, 0, 0};  ///< k_nf4 [B, T, H_kv, D/2]: {batch, token, head} in bytes
  int64_t ks_stride[2] = {0, 0};     ///< k_scale [B, H_kv, D]: {batch, head}
  int64_t kr_stride[3] = {0, 0, 0};  ///< k_residual [B, T, H_kv, D]: {batch, token, head}
  int64_t v_stride[3] = {0, 0, 0};   ///< v [B, T, H_kv, Dv]: {batch, token, head}
  int64_t vs_stride[2] = {0, 0};     ///< v_scale [B, H_kv, Dv] (FP8 v): {batch, head}
  int64_t o_stride[2] = {0, 0};      ///< out [B, H_q, Dv]: {batch, head}
  int64_t sr_stride[2] = {0, 0};     ///< skip_ratio [B, H_kv]: {batch, head}
  /// A paged cache: k_nf4, k_residual and v are [pages, page_size, H_kv, ...] (their strides
  /// {page, row, head}), seqlen = max_pages * page_size and seq_lens is given.
  CachePages pages;

  /// Pruning blocks of a sequence of L tokens.
  LOWBIT_HOST_DEVICE int64_t blocks(int64_t L) const { return (L + block_size - 1) / block_size; }
};

/// The operands of one decode call (device pointers for a kernel, host pointers for the
/// reference). seq_lens / threshold / skip_ratio are null when absent.
struct DecodeNf4Ptrs {
  const uint16_t* q = nullptr;     ///< bf16 bits
  const uint8_t* k_nf4 = nullptr;
  const void* k_scale = nullptr;   ///< float32 or bf16 bits (plan.scale_dtype)
  const uint8_t* k_residual = nullptr;
  const void* v = nullptr;         ///< bf16 bits or FP8 codes (plan.v_dtype)
  const float* v_scale = nullptr;  ///< FP8 v: value = fp8(code) * v_scale[b, h, c]; else null
  const int32_t* seq_lens = nullptr;
  const float* threshold = nullptr;  ///< [B, H_q] contiguous
  uint16_t* out = nullptr;           ///< bf16 bits
  float* skip_ratio = nullptr;
};

/// kproj_rope_nf4_encode: the projection and RoPE, then the cache encode of `cache` (whose k is
/// the fp32 rotated keys, k_out when given, otherwise a buffer the implementation owns).
struct KprojRopePlan {
  int64_t batch = 0, seqlen = 0, hidden = 0, heads_kv = 0, head_dim = 0;
  const void* x = nullptr;
  DType x_dtype = DType::kFloat32;
  int64_t x_stride[3] = {0, 0, 0};
  const void* w = nullptr;
  DType w_dtype = DType::kFloat32;
  int64_t w_stride[2] = {0, 0};
  const void* positions = nullptr;
  bool positions64 = false;
  int64_t p_stride[2] = {0, 0};
  double rope_theta = 10000.0;
  float* k_out = nullptr;  ///< [B, T, H_kv, D] float32 contiguous-last, may be null
  int64_t ko_stride[3] = {0, 0, 0};
  KCachePlan cache;        ///< codes, scale, residual, nibble order (cache.k: set by the implementation)
};

/// nf4_kcache_append: new keys k (cache.k, [B, N, H_kv, D]; cache.T = N) written at
/// lengths[b] + i of the cache tensors (codes / residual strides of the cache, cache_T tokens).
struct KCacheAppendPlan {
  KCachePlan cache;  ///< B, T = N new tokens, H, D; k = k_new; codes / scale / residual = the cache
  int64_t cache_T = 0;  ///< tokens a sequence may hold (paged: max_pages * page_size)
  CachePages pages;     ///< paged: codes / residual are [pages, page_size, H, ...]
  const int32_t* lengths = nullptr;  ///< host copy, each in 0..cache_T - N (validated)
  /// CUDA: the caller's device lengths, which the kernels read (clamped to 0..cache_T - N); the
  /// host copy above was read from them on the same stream and sizes the grid. Null on the CPU.
  const int32_t* lengths_device = nullptr;
};

/// The FP8 V cache (lowbit/vcache.hpp) of fp8_vcache_quantize (v [B, T, H, D] -> codes,
/// scale) and of fp8_vcache_append (v = the new values [B, N, H, D], T = N).
struct VCachePlan {
  int64_t B = 0, T = 0, H = 0, D = 0;
  const void* v = nullptr;               ///< input values
  DType v_dtype = DType::kFloat32;       ///< float32 / float16 / bfloat16
  int64_t v_s[4] = {0, 0, 0, 0};         ///< element strides of v
  uint8_t* codes = nullptr;              ///< [B, T(cache), H, D] FP8 codes
  bool e5m2 = false;                     ///< code format: E5M2, else E4M3
  int64_t c_s[4] = {0, 0, 0, 0};
  float* scale = nullptr;                ///< [B, H, D]
  int64_t s_s[3] = {0, 0, 0};
};

/// fp8_vcache_append: the new values (cache.v, [B, N, H, D]; cache.T = N) written at
/// lengths[b] + i of the cache (cache_T tokens).
struct VCacheAppendPlan {
  VCachePlan cache;
  int64_t cache_T = 0;  ///< tokens a sequence may hold (paged: max_pages * page_size)
  CachePages pages;     ///< paged: codes are [pages, page_size, H, D]
  const int32_t* lengths = nullptr;         ///< host copy, each in 0..cache_T - N (validated)
  const int32_t* lengths_device = nullptr;  ///< CUDA: the caller's device lengths (clamped there)
};

}  // namespace lowbit::detail
