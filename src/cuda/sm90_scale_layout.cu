// src/cuda/sm90_scale_layout.cu: conversion between scale layouts (row / col / 128x4 / 8x4 /
// grouped 128x4).
//
// NOTES: one thread per element of the OUTPUT (padding included), so every output byte is
// written exactly once, with coalesced stores: scale_coords() maps the output offset back to
// (stored row, column); the stored row maps to a logical row (grouped: the staged group map,
// -1 for padding rows); data elements gather their value from the input layout, padding gets 0.
#include "cuda/launch.hpp"
#include "cuda/sm90_common.cuh"

namespace lowbit::cuda {
using namespace lowbit::detail;

namespace {

constexpr int kThreads = 256;

template <typename E>
__global__ void __launch_bounds__(kThreads) convert_layout_kernel(const LayoutPlan p) {
  extern __shared__ int64_t smem[];
  const dev::GroupMap gfrom = dev::stage_groups(p.from, smem);
  const dev::GroupMap gto = dev::stage_groups(p.to, smem + (p.from.groups > 0 ? 2 * (p.from.groups + 1) + 1024 : 0));
  const E* in = static_cast<const E*>(p.in);
  E* out = static_cast<E*>(p.out);
  const int64_t bs = p.to.batch_stride;
  const int64_t total = p.L * bs;
  const int64_t R = p.from.rows, C = p.from.cols;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x; o < total; o += stride) {
    const int64_t l = o / bs, off = o - l * bs;
    int64_t sr, c;
    scale_coords(p.to.layout, p.to.rows_pad, C, off, &sr, &c);
    int64_t r = -1;
    if (c < C) r = p.to.groups > 0 ? gto.logical_row(sr) : (sr < R ? sr : -1);
    E v = E(0);
    if (r >= 0) v = in[dev::scale_off(p.from, gfrom, l, r, c)];
    out[o] = v;
  }
}

}  // namespace

int convert_layout(const LayoutPlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t total = p.L * p.to.batch_stride;
  if (total == 0) return cudaSuccess;
  const size_t smem = dev::group_smem_bytes(p.from) + dev::group_smem_bytes(p.to);
  if (smem > 200 * 1024) return cudaErrorNotSupported;
  if (p.elem_bytes == 4) {
    auto k = convert_layout_kernel<uint32_t>;
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (e != cudaSuccess) return e;
    }
    k<<<unsigned(grid_for(k, kThreads, total)), kThreads, smem, s>>>(p);
  } else {
    auto k = convert_layout_kernel<uint8_t>;
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (e != cudaSuccess) return e;
    }
    k<<<unsigned(grid_for(k, kThreads, total)), kThreads, smem, s>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace lowbit::cuda
