// tests/cpp/emu/cudaTypedefs.h: host emulation: the driver function-pointer type that
// src/cuda/common/tma.cuh takes cuTensorMapEncodeTiled as (emulated in cuda.h). Test code only.
#pragma once
#include <cuda.h>
typedef CUresult (*PFN_cuTensorMapEncodeTiled_v12000)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                                       const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                                       const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                                       CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
