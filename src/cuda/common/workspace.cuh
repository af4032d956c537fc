// src/cuda/common/workspace.cuh: stream-ordered scratch memory for the GEMM launchers.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::cuda {

/// lowbit's own memory pool on the current device (created on first use). Its release threshold
/// is unlimited, so scratch freed with cudaFreeAsync is reused by the next call instead of being
/// unmapped at every synchronisation (the default pool's behaviour), and the caller's default
/// pool settings are left alone. Allocation from it is legal during CUDA graph capture.
cudaError_t workspace_pool(cudaMemPool_t* pool);

}  // namespace lowbit::cuda
