// lowbit/decode_attention.hpp: decode attention over an NF4 + FP8-residual K cache with block
// pruning, the fused K projection + RoPE + NF4 encode that fills the cache, and the append of
// decode tokens to it (C++ API; docs/decode_attention.md). CPU tensors run the fp64 reference in
// src/ref/ref_decode_attention.cpp and src/ref/ref_kcache_encode.cpp; CUDA tensors run the sm_90a
// kernels (CUDA + CUTLASS builds; otherwise NotSupportedError, never a silent fallback).
//
// The K cache (the element rule of lowbit/kcache.hpp, the layout of nf4_kcache_quantize):
//   k_nf4      [B, T, H_kv, D/2] uint8: two NF4 codes per byte along D; element 2i in the low
//              nibble (NibbleOrder::kLowFirst, the default) or the high one (kHighFirst)
//   k_scale    [B, H_kv, D] float32 (attention also takes bfloat16): one scale per channel,
//              shared by every token
//   k_residual [B, T, H_kv, D] float8_e5m2 or float8_e4m3fn
//   key        k[b, t, h, c] = nf4[code] * k_scale[b, h, c] + residual[b, t, h, c]   (fp32 ops)
//
// Paged caches (the block tables of vLLM / FlashAttention-3): with a block_table int32
// [B, max_pages] (contiguous), k_nf4, k_residual and v (the V codes) are [pages, page_size, H_kv,
// ...] and token t of sequence b is row t % page_size of page block_table[b, t / page_size];
// page_size is the tensors' second dimension, a power of two; a sequence holds at most T =
// max_pages * page_size tokens; the scales stay per sequence ([B, H_kv, D]). The host validates
// every page id a call reads or writes on CPU tensors and in the appends (which copy their
// lengths and table from the device); the CUDA attention does not synchronise: an id outside
// [0, pages) is clamped there (memory stays in bounds; that sequence's result is unspecified).
#pragma once

#include <cstdint>
#include <limits>

#include "lowbit/ops.hpp"

namespace lowbit {

/// Options of attn_forward_decode_nf4.
struct DecodeNf4Args {
  int64_t block_size = 64;      ///< tokens per pruning block (1 .. 2^31-1)
  int64_t sub_block_size = 16;  ///< tokens per sub-block (>= 1, divides block_size): the tiling of
                                ///< the block max; it does not change any result
  /// Threshold margin in natural-log score units (>= 0; +inf turns pruning off). Ignored when a
  /// precomputed threshold is given.
  float delta = 8.0f;
  bool use_fp8_residual = true;  ///< false: keys are nf4[code] * scale (k_residual not read)
  /// Multiplies q . k; NaN (the default) means 1 / sqrt(D). Must be finite and > 0 otherwise.
  float softmax_scale = std::numeric_limits<float>::quiet_NaN();
  NibbleOrder nibbles = NibbleOrder::kLowFirst;
};

/// Decode attention (one query token per sequence) with threshold block pruning, two stages.
///
///   s[h, t]  = softmax_scale * sum_c q[b, 0, h, c] * k[b, t, h / G, c]       (fp64, natural log)
///   L        = seq_lens[b] (T when seq_lens is absent); tokens 0 .. L-1 are attended
///   blocks   j = 0 .. n-1, n = ceil(L / block_size), block j = tokens [j*bs, min((j+1)*bs, L))
///   M[h, j]  = max of s[h, t] over block j (the max of its sub-block maxima)
///   thr[h]   = max(M[h, 0], M[h, n-1]) - delta, or precomputed_threshold[b, h] when given
///   keep[g, j] = j == 0 || j == n-1 || some query head h of KV group g has !(M[h, j] < thr[h])
///   stage 1: per kept block and head, m = M[h, j], l = sum exp(s - m), o = sum exp(s - m) v[t]
///   stage 2: out[b, h] = sum_j exp(m_j - m*) o_j / sum_j exp(m_j - m*) l_j over kept blocks,
///            m* = max_j m_j; rounded once to bfloat16
///   skip_ratio[b, g] = skipped blocks of KV head g / n
/// G = H_q / H_kv. NaN: a block whose max is NaN is never skipped; a NaN or infinite score among
/// the kept tokens of head h makes out[b, h, :] NaN; a NaN v[t, c] makes out[b, h, c] NaN for the
/// heads whose kept blocks hold t. With delta = +inf every block is kept: plain attention.
///
/// Shapes: q [B, 1, H_q, D] bfloat16; k_nf4 / k_scale / k_residual as above (k_residual may be
/// absent when use_fp8_residual is false); v [B, T, H_kv, Dv] bfloat16, or FP8 codes
/// (float8_e4m3fn / float8_e5m2) with v_scale float32 [B, H_kv, Dv] (last dimension contiguous,
/// other strides free, 0 included): v[t, c] = fp8(code) * v_scale[b, h, c] (the FP8 V cache of
/// lowbit/vcache.hpp; any finite scale >= 0 is taken; v_scale must be absent for bf16 v);
/// seq_lens int32 [B]
/// (each in 1..T) or absent (required with block_table: a paged cache, above); precomputed_threshold float32 [B, H_q] or absent; out
/// [B, H_q, Dv] bfloat16; skip_ratio float32 [B, H_kv] or absent. D, Dv in {64, 128, 256};
/// H_q % H_kv == 0; T >= 1. Every tensor's last dimension is contiguous, other strides free;
/// seq_lens and precomputed_threshold contiguous.
void attn_forward_decode_nf4(const TensorView& q, const TensorView& k_nf4, const TensorView& k_scale,
                             const TensorView& k_residual, const TensorView& v, const TensorView& v_scale,
                             const TensorView& seq_lens, const TensorView& block_table,
                             const TensorView& precomputed_threshold, const TensorView& out,
                             const TensorView& skip_ratio, const DecodeNf4Args& args = {}, Stream stream = {});

/// Options of kproj_rope_nf4_encode.
struct KprojRopeArgs {
  double rope_theta = 10000.0;  ///< base of the rotary frequencies (finite, > 0)
  NibbleOrder nibbles = NibbleOrder::kLowFirst;
};

/// Fused K projection + RoPE + NF4 / FP8-residual encode (two passes: the per-channel amax over T,
/// then the encode), writing the whole cache of a prefill:
///
///   p[b, t, h, c]  = sum_i x[b, t, i] * w_k[h*D + c, i]                      (fp64, then fp32)
///   rotate-half (neox / llama) RoPE, for c < D/2, f_c = rope_theta^(-2c / D),
///   a = positions[b, t] * f_c:
///     k[.., c]       = p[.., c] * cos a - p[.., c + D/2] * sin a               (fp64, then fp32)
///     k[.., c + D/2] = p[.., c + D/2] * cos a + p[.., c] * sin a
///   then nf4_kcache_quantize(k): scale = finite amax over T, codes, residual (lowbit/kcache.hpp)
///
/// x [B, T, hidden] float32 / float16 / bfloat16; w_k [H_kv * D, hidden] (torch Linear weight
/// layout) of the same dtypes; positions int32 / int64 [B, T]; outputs k_nf4 [B, T, H_kv, D/2]
/// uint8, k_scale [B, H_kv, D] float32, k_residual [B, T, H_kv, D] float8_e5m2 / e4m3fn, and
/// optionally k_out [B, T, H_kv, D] float32 (the rotated keys before the encode). D even;
/// H_kv is w_k.shape[0] / D, so D is given: head_dim. CUDA: with x and w_k both bf16 or both
/// fp16 (hidden contiguous, a multiple of 8, rows 16-byte aligned) the projection runs on tensor
/// cores with fp32 sums, within hidden x 2^-24 x sum |x_i w_i| of the reference's; otherwise it
/// sums in fp64 in the reference's order (bit-identical). The frequencies are the host's
/// std::pow (D <= 512); the fp64 cos / sin of the device math library may move a rotated key by
/// one fp32 ulp from the host's (very rarely); the cache is exactly nf4_kcache_quantize of the
/// device's keys.
void kproj_rope_nf4_encode(const TensorView& x, const TensorView& w_k, const TensorView& positions,
                           int64_t head_dim, const TensorView& k_nf4, const TensorView& k_scale,
                           const TensorView& k_residual, const TensorView& k_out, const KprojRopeArgs& args = {},
                           Stream stream = {});

/// Appends N new (already rotated) keys per sequence to an NF4 + residual K cache, in place.
/// Sequence b holds lengths[b] tokens; k_new[b, i] becomes token lengths[b] + i
/// (lengths[b] + N <= T). Per (b, h, c), with a = finite amax of the new tokens of that channel
/// and s the stored scale:
///   a <= s: the new tokens are encoded with s (code, residual: the kcache.hpp rule);
///   a >  s: the channel is rescaled: s' = a; each cached token t < lengths[b] is decoded
///           (nf4[code] * s + residual, fp32) and re-encoded with s'; the new tokens with s'.
/// So the scale stays the finite amax of every token written, and every token decodes within
/// one FP8 rounding of its residual (a rescaled token: of each re-encode) of its value.
/// Tokens at or beyond lengths[b] + N are not touched. k_new [B, N, H_kv, D] float32 / float16
/// / bfloat16; lengths int32 [B] (each in 0..T-N); k_scale float32. CUDA: the lengths are
/// copied to the host and validated there (one stream-ordered copy and wait per call).
/// The CUDA result is bit for bit the CPU reference's. block_table (absent: a dense cache): a
/// paged cache (above), the new tokens' pages included in the table.
void nf4_kcache_append(const TensorView& k_new, const TensorView& k_nf4, const TensorView& k_scale,
                       const TensorView& k_residual, const TensorView& lengths, const TensorView& block_table = {},
                       NibbleOrder nibbles = NibbleOrder::kLowFirst, Stream stream = {});

/// The FP8 V cache read by attn_forward_decode_nf4 (FP8 v with v_scale; lowbit/vcache.hpp): from v
/// [B, T, H_kv, Dv] float32 / float16 / bfloat16, codes [B, T, H_kv, Dv] float8_e4m3fn or
/// float8_e5m2 (the codes' dtype picks the format) and scale [B, H_kv, Dv] float32:
///   scale[b, h, c] = the smallest power of two 2^e with amax <= fmax * 2^e (0 when amax = 0),
///                    amax the finite amax of the channel over T, fmax 448 (E4M3) / 57344 (E5M2)
///   codes[b, t, h, c] = fp8(v / scale) (round to nearest even, Saturate::kNone: never overflows)
/// Strides free. The CUDA result is bit for bit the CPU reference's.
void fp8_vcache_quantize(const TensorView& v, const TensorView& codes, const TensorView& scale, Stream stream = {});

/// Appends N new values per sequence to an FP8 V cache, in place: v_new[b, i] becomes token
/// lengths[b] + i (lengths[b] + N <= T). Per (b, h, c), with a = finite amax of the new values of
/// that channel and s the stored scale:
///   a <= fmax * s: the new values are encoded with s;
///   a >  fmax * s: the channel is rescaled: s' = the power-of-two scale of a (as
///                  fp8_vcache_quantize), each cached token t < lengths[b] re-encoded from its
///                  value (fp8(code) * s, fp32) with s', the new values with s'.
/// A cache whose scales are 0 and lengths 0 (an empty cache) becomes fp8_vcache_quantize of the
/// appended values. Tokens at or beyond lengths[b] + N are not touched. v_new [B, N, H_kv, Dv]
/// float32 / float16 / bfloat16; lengths int32 [B] (each in 0..T-N). CUDA: the lengths are copied
/// to the host and validated there (one stream-ordered copy and wait per call). The CUDA result is
/// bit for bit the CPU reference's. block_table (absent: a dense cache): a paged cache (above),
/// codes [pages, page_size, H_kv, Dv].
void fp8_vcache_append(const TensorView& v_new, const TensorView& codes, const TensorView& scale,
                       const TensorView& lengths, const TensorView& block_table = {}, Stream stream = {});

}  // namespace lowbit
