// lowbit/format.hpp: block-format descriptors (which codes, which scales, which recipe).
//
// A BlockFormat quantizes the last ("K") dimension of a matrix in blocks of `block`
// consecutive elements, one scale (and for UINT4 one zero point) per block:
//
//   name            elem   block  scale   rule                      decode
//   mxfp8_e4m3/e5m2 E4M3/  32     UE8M0   MX RCEIL (default)/FLOOR  q * 2^(s-127)
//                   E5M2
//   mxfp4           E2M1   32     UE8M0   MX RCEIL (default)/FLOOR  q * 2^(s-127)
//   nvfp4           E2M1   16     E4M3    TransformerEngine NVFP4   q * s * S_dec (per-tensor)
//   fp8 group G     E4M3   G      F32 or  s = max(amax,eps)/448     q * s
//                                 UE8M0   (UE8M0: s rounded up to a power of two)
//   int4 group G    INT4   G      F32/UE8M0 s = max(amax,eps)/7     q * s
//   uint4 group G   UINT4  G      F32     s = max((max-min)/15,eps),(q - zp) * s
//                                         zp = clamp(rne(-min/s),0,15)
//   nf4 block B     NF4    B      F32     s = absmax (bitsandbytes) nf4[q] * s
//
// Packed 4-bit codes: two per byte, element 2i in the low nibble by default
// (NibbleOrder::kLowFirst: torch float4_e2m1fn_x2, FlashInfer, gpt-oss, torchao);
// NibbleOrder::kHighFirst reproduces bitsandbytes.
#pragma once

#include <string>

#include "lowbit/codecs.hpp"
#include "lowbit/config.hpp"

namespace lowbit {

enum class Elem : uint8_t { kE4M3, kE5M2, kE2M1, kInt4, kUInt4, kNF4 };
enum class ScaleType : uint8_t { kF32, kUE8M0, kE4M3 };
enum class ScaleRule : uint8_t {
  kAmax,     ///< s = max(amax, eps) / qmax; UE8M0 scales round s up to a power of two
  kMinMax,   ///< asymmetric UINT4 with zero point
  kMxFloor,  ///< OCP MX spec / torchao: 2^(floor(log2 amax) - emax_elem)
  kMxRceil,  ///< NVIDIA (TE, cuBLAS, FlashInfer): amax / max_elem rounded up to a power of two
  kNvfp4,    ///< TransformerEngine NVFP4 two-level scaling
  kAbsmax,   ///< NF4 (bitsandbytes): s = absmax, codes of x * (1/s)
};
enum class NibbleOrder : uint8_t { kLowFirst, kHighFirst };
/// NVFP4: what to store when a block scale rounds to zero in E4M3 (zero blocks, tiny blocks).
enum class ZeroScale : uint8_t {
  kZero,          ///< scale 0, codes saturated/0 (TransformerEngine, FlashInfer)
  kMinSubnormal,  ///< scale 2^-9 (torchao clamps the block scale)
  kOne,           ///< scale 1.0 (ModelOpt)
};

LOWBIT_HOST_DEVICE constexpr int elem_bits(Elem e) { return (e == Elem::kE4M3 || e == Elem::kE5M2) ? 8 : 4; }

/// Largest finite element magnitude (qmax of the scale rules).
LOWBIT_HOST_DEVICE constexpr float elem_max(Elem e) {
  switch (e) {
    case Elem::kE4M3: return 448.0f;
    case Elem::kE5M2: return 57344.0f;
    case Elem::kE2M1: return 6.0f;
    case Elem::kInt4: return 7.0f;
    case Elem::kUInt4: return 15.0f;
    case Elem::kNF4: return 1.0f;
  }
  return 0.0f;
}

/// Exponent of the element type's largest power of two (OCP emax_elem).
LOWBIT_HOST_DEVICE constexpr int elem_emax(Elem e) {
  return e == Elem::kE4M3 ? 8 : e == Elem::kE5M2 ? 15 : e == Elem::kE2M1 ? 2 : 0;
}

struct BlockFormat {
  Elem elem = Elem::kE4M3;
  int32_t block = 32;
  ScaleType scale_type = ScaleType::kUE8M0;
  ScaleRule rule = ScaleRule::kMxRceil;
  NibbleOrder nibbles = NibbleOrder::kLowFirst;
  ZeroScale zero_scale = ZeroScale::kZero;
  float eps = 1e-10f;  ///< floor of amax for the group recipes (vLLM / SGLang)

  LOWBIT_HOST_DEVICE constexpr int bits() const { return elem_bits(elem); }
  LOWBIT_HOST_DEVICE constexpr bool packed() const { return elem_bits(elem) == 4; }
  LOWBIT_HOST_DEVICE constexpr bool has_zero_point() const { return rule == ScaleRule::kMinMax; }
  LOWBIT_HOST_DEVICE constexpr bool has_global_scale() const { return rule == ScaleRule::kNvfp4; }
  LOWBIT_HOST_DEVICE constexpr int scale_bytes() const { return scale_type == ScaleType::kF32 ? 4 : 1; }

  static constexpr BlockFormat mxfp8(Elem e = Elem::kE4M3, bool floor = false) {
    return {e, 32, ScaleType::kUE8M0, floor ? ScaleRule::kMxFloor : ScaleRule::kMxRceil};
  }
  static constexpr BlockFormat mxfp4(bool floor = false) {
    return {Elem::kE2M1, 32, ScaleType::kUE8M0, floor ? ScaleRule::kMxFloor : ScaleRule::kMxRceil};
  }
  static constexpr BlockFormat nvfp4(ZeroScale z = ZeroScale::kZero) {
    return {Elem::kE2M1, 16, ScaleType::kE4M3, ScaleRule::kNvfp4, NibbleOrder::kLowFirst, z};
  }
  static constexpr BlockFormat fp8_group(int group = 128, Elem e = Elem::kE4M3, ScaleType st = ScaleType::kF32) {
    return {e, group, st, ScaleRule::kAmax};
  }
  static constexpr BlockFormat int4_group(int group = 128, bool zero_point = false, ScaleType st = ScaleType::kF32) {
    return {zero_point ? Elem::kUInt4 : Elem::kInt4, group, st, zero_point ? ScaleRule::kMinMax : ScaleRule::kAmax};
  }
  static constexpr BlockFormat nf4(int block = 64, NibbleOrder order = NibbleOrder::kLowFirst) {
    return {Elem::kNF4, block, ScaleType::kF32, ScaleRule::kAbsmax, order};
  }
};

/// Throws ArgumentError(op, arg, ...) if the combination of fields is not one lowbit implements.
void validate_format(const BlockFormat& f, const char* op, const char* arg = "format");
std::string format_name(const BlockFormat& f);

}  // namespace lowbit
