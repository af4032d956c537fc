// lowbit/config.hpp: portability macros shared by host (g++) and device (nvcc) code.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define LOWBIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOWBIT_HOST_DEVICE inline
#endif

#if defined(__CUDA_ARCH__)
#define LOWBIT_UNROLL _Pragma("unroll")
#else
#define LOWBIT_UNROLL
#endif

#define LOWBIT_VERSION_MAJOR 0
#define LOWBIT_VERSION_MINOR 1
#define LOWBIT_VERSION_PATCH 0
#define LOWBIT_VERSION_STRING "0.1.0"
