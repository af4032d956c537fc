// lowbit/dtype.hpp: storage dtypes of tensors lowbit reads and writes.
//
// A DType is what one *byte-addressable element* of a tensor holds. Packed 4-bit data (E2M1,
// INT4, UINT4, NF4: two codes per byte) is stored as kFloat4E2M1x2 or kUInt8 bytes; which
// codes a byte holds, and in which nibble order, is described by a BlockFormat (format.hpp).
#pragma once

#include "lowbit/config.hpp"

namespace lowbit {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kE4M3,          // float8_e4m3fn
  kE5M2,          // float8_e5m2
  kUE8M0,         // float8_e8m0fnu
  kFloat4E2M1x2,  // float4_e2m1fn_x2: two E2M1 codes per byte, element 2i in the low nibble
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
};

LOWBIT_HOST_DEVICE constexpr int dtype_bytes(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    default: return 1;
  }
}

inline constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kE4M3: return "float8_e4m3fn";
    case DType::kE5M2: return "float8_e5m2";
    case DType::kUE8M0: return "float8_e8m0fnu";
    case DType::kFloat4E2M1x2: return "float4_e2m1fn_x2";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "?";
}

/// DLPack (v1.1) type codes, so TensorView maps 1:1 to DLTensor without including dlpack.h.
namespace dlpack_code {
constexpr uint8_t kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kFloat8_e4m3fn = 10, kFloat8_e5m2 = 12,
                  kFloat8_e8m0fnu = 14, kFloat4_e2m1fn = 17;
}

struct DLPackType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

/// The DLPack (code, bits, lanes) of a lowbit DType. float4_e2m1fn_x2 is (kFloat4_e2m1fn, 4, 2).
inline constexpr DLPackType to_dlpack(DType t) {
  switch (t) {
    case DType::kFloat32: return {dlpack_code::kFloat, 32, 1};
    case DType::kFloat16: return {dlpack_code::kFloat, 16, 1};
    case DType::kBFloat16: return {dlpack_code::kBfloat, 16, 1};
    case DType::kFloat64: return {dlpack_code::kFloat, 64, 1};
    case DType::kE4M3: return {dlpack_code::kFloat8_e4m3fn, 8, 1};
    case DType::kE5M2: return {dlpack_code::kFloat8_e5m2, 8, 1};
    case DType::kUE8M0: return {dlpack_code::kFloat8_e8m0fnu, 8, 1};
    case DType::kFloat4E2M1x2: return {dlpack_code::kFloat4_e2m1fn, 4, 2};
    case DType::kUInt8: return {dlpack_code::kUInt, 8, 1};
    case DType::kInt8: return {dlpack_code::kInt, 8, 1};
    case DType::kInt16: return {dlpack_code::kInt, 16, 1};
    case DType::kInt32: return {dlpack_code::kInt, 32, 1};
    case DType::kInt64: return {dlpack_code::kInt, 64, 1};
  }
  return {0, 0, 0};
}

/// Inverse of to_dlpack; returns false for a type lowbit does not handle.
inline constexpr bool from_dlpack(DLPackType d, DType* out) {
  const DType all[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kE4M3,
                       DType::kE5M2,    DType::kUE8M0,   DType::kFloat4E2M1x2, DType::kUInt8, DType::kInt8,
                       DType::kInt16,   DType::kInt32,   DType::kInt64};
  for (DType t : all) {
    DLPackType e = to_dlpack(t);
    if (e.code == d.code && e.bits == d.bits && e.lanes == d.lanes) {
      *out = t;
      return true;
    }
  }
  // A float4 tensor exported with one lane per byte-pair index is also accepted.
  if (d.code == dlpack_code::kFloat4_e2m1fn && d.bits == 8 && d.lanes == 1) {
    *out = DType::kFloat4E2M1x2;
    return true;
  }
  return false;
}

}  // namespace lowbit
