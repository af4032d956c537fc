// tests/cpp/emu/cuda.h: host emulation of the CUDA driver pieces that src/cuda/common/tma.cuh uses:
// the tensor-map types and cuTensorMapEncodeTiled, reached as on a GPU machine through the
// runtime's driver entry-point query (cudaGetDriverEntryPointByVersion, defined here because it
// hands out the emulated driver function). The emulated CUtensorMap holds the encode arguments;
// the TMA loads of emu_sm90.hpp read them. The encoder checks the requirements that the driver
// API documents for cuTensorMapEncodeTiled (CUDA 13 cuda.h) and refuses what the emulation does
// not model (rank other than 2, element strides, interleave, the NaN OOB fill). Test code only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 } CUresult;
typedef enum CUtensorMapDataType_enum {
  CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
  CU_TENSOR_MAP_DATA_TYPE_UINT16,
  CU_TENSOR_MAP_DATA_TYPE_UINT32,
  CU_TENSOR_MAP_DATA_TYPE_INT32,
  CU_TENSOR_MAP_DATA_TYPE_UINT64,
  CU_TENSOR_MAP_DATA_TYPE_INT64,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ
} CUtensorMapDataType;
typedef enum CUtensorMapInterleave_enum {
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_INTERLEAVE_16B,
  CU_TENSOR_MAP_INTERLEAVE_32B
} CUtensorMapInterleave;
typedef enum CUtensorMapSwizzle_enum {
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B,
  CU_TENSOR_MAP_SWIZZLE_64B,
  CU_TENSOR_MAP_SWIZZLE_128B
} CUtensorMapSwizzle;
typedef enum CUtensorMapL2promotion_enum {
  CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
  CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B
} CUtensorMapL2promotion;
typedef enum CUtensorMapFloatOOBfill_enum {
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
} CUtensorMapFloatOOBfill;

/// The emulated tensor map: the arguments of the encode (2-D tiled maps only).
typedef struct CUtensorMap_st {
  alignas(64) uint32_t magic;
  CUtensorMapDataType dtype;
  uint32_t elem_bytes;
  const uint8_t* base;
  uint64_t dim[2];     ///< elements, innermost first
  uint64_t stride1;    ///< bytes between consecutive rows (dimension 1)
  uint32_t box[2];     ///< elements, innermost first
  CUtensorMapSwizzle swizzle;
} CUtensorMap;

namespace emu {
constexpr uint32_t kTensorMapMagic = 0x544D4150u;  // "TMAP"

inline uint32_t tensor_map_elem_bytes(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
  }
  return 0;
}

inline CUresult tensor_map_refuse(const char* why) {
  std::fprintf(stderr, "emu: cuTensorMapEncodeTiled: %s\n", why);
  return CUDA_ERROR_INVALID_VALUE;
}

/// cuTensorMapEncodeTiled. The requirements checked are those of the driver API's documentation of
/// this function: 64-byte aligned map, 16-byte aligned global address, dimensions in [1, 2^32],
/// strides multiples of 16 below 2^40, box dimensions in [1, 256] with an inner extent that is a
/// multiple of 16 bytes and, with a swizzle, at most the swizzle span (128 bytes for
/// CU_TENSOR_MAP_SWIZZLE_128B).
inline CUresult tensor_map_encode_tiled(CUtensorMap* m, CUtensorMapDataType dt, cuuint32_t rank, void* base,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* estr, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                        CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
  if (reinterpret_cast<uintptr_t>(m) % 64 != 0) return tensor_map_refuse("tensorMap not 64-byte aligned");
  const uint32_t eb = tensor_map_elem_bytes(dt);
  if (eb == 0) return tensor_map_refuse("unknown data type");
  if (rank != 2) return tensor_map_refuse("only rank 2 is emulated");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return tensor_map_refuse("globalAddress not 16-byte aligned");
  for (int i = 0; i < 2; ++i)
    if (dims[i] == 0 || dims[i] > (uint64_t(1) << 32)) return tensor_map_refuse("globalDim outside [1, 2^32]");
  if (strides[0] % 16 != 0 || strides[0] >= (uint64_t(1) << 40))
    return tensor_map_refuse("globalStrides not a multiple of 16 below 2^40");
  if (strides[0] < dims[0] * eb) return tensor_map_refuse("globalStrides[0] below the row's bytes");
  for (int i = 0; i < 2; ++i)
    if (box[i] == 0 || box[i] > 256) return tensor_map_refuse("boxDim outside [1, 256]");
  if (box[0] * eb % 16 != 0) return tensor_map_refuse("boxDim[0] x element size not a multiple of 16 bytes");
  for (int i = 0; i < 2; ++i)
    if (estr[i] != 1) return tensor_map_refuse("element strides other than 1 are not emulated");
  if (il != CU_TENSOR_MAP_INTERLEAVE_NONE) return tensor_map_refuse("interleaved layouts are not emulated");
  if (oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) return tensor_map_refuse("the NaN out-of-bound fill is not emulated");
  const uint32_t span = sw == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : sw == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                        : sw == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : 0;
  if (span && box[0] * eb > span) return tensor_map_refuse("the box's inner extent exceeds the swizzle span");
  if (sw != CU_TENSOR_MAP_SWIZZLE_NONE && sw != CU_TENSOR_MAP_SWIZZLE_128B)
    return tensor_map_refuse("only SWIZZLE_NONE and SWIZZLE_128B are emulated");
  std::memset(static_cast<void*>(m), 0, sizeof(*m));
  m->magic = kTensorMapMagic;
  m->dtype = dt;
  m->elem_bytes = eb;
  m->base = static_cast<const uint8_t*>(base);
  m->dim[0] = dims[0];
  m->dim[1] = dims[1];
  m->stride1 = strides[0];
  m->box[0] = box[0];
  m->box[1] = box[1];
  m->swizzle = sw;
  return CUDA_SUCCESS;
}
}  // namespace emu

enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2
};
enum { cudaEnableDefault = 0 };
/// The runtime's driver entry-point query: the emulated cuTensorMapEncodeTiled, nothing else.
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* q) {
  if (std::strcmp(symbol, "cuTensorMapEncodeTiled") != 0) {
    *fn = nullptr;
    if (q) *q = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
  }
  *fn = reinterpret_cast<void*>(&emu::tensor_map_encode_tiled);
  if (q) *q = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
