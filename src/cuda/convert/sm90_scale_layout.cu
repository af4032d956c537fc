// src/cuda/convert/sm90_scale_layout.cu: conversion between scale layouts (row / col / 128x4 / 8x4 /
// grouped 128x4).
//
// NOTES: one thread per element of the OUTPUT (padding included), so every output byte is
// written exactly once, with coalesced stores: scale_coords() maps the output offset back to
// (stored row, column); the stored row maps to a logical row (grouped: the staged group map,
// -1 for padding rows); data elements gather their value from the input layout, padding gets 0.
#include "cuda/common/launch.hpp"
#include "cuda/common/codecs.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/indexing.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/memory.cuh"
#include "cuda/common/static_switch.hpp"

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

/// 32-bit index math of the ungrouped layouts (every offset < 2^32): run-time divisions by
/// FastDiv multiplies instead of 64-bit divisions.
struct Div32 {
  FastDiv bs;   // batch stride of the output
  FastDiv inner;  // output: C (row-major), Rp (col-major), column quads (blocked)
};

/// (stored row, column) of output offset `off` of an ungrouped layout (= scale_coords).
__device__ __forceinline__ void coords32(const ScaleLayout& l, const FastDiv& inner, uint32_t off, uint32_t& r,
                                         uint32_t& c) {
  switch (l.kind) {
    case ScaleLayoutKind::kRowMajor: r = inner.div(off); c = off - r * inner.d; return;
    case ScaleLayoutKind::kColMajor: c = inner.div(off); r = off - c * inner.d; return;
    case ScaleLayoutKind::kBlocked128x4: {
      const uint32_t atom = off >> 9, in = off & 511u, t = inner.div(atom);
      r = t * 128u + ((in >> 2) & 3u) * 32u + (in >> 4);
      c = (atom - t * inner.d) * 4u + (in & 3u);
      return;
    }
    case ScaleLayoutKind::kBlocked8x4: {
      const uint32_t tile = off >> 5, in = off & 31u, t = inner.div(tile);
      r = t * 8u + (in >> 2);
      c = (tile - t * inner.d) * 4u + (in & 3u);
      return;
    }
  }
}

/// Ungrouped u8 scales, output batch stride a multiple of 4, everything below 2^31: one thread
/// writes 4 consecutive output bytes with one 32-bit store (in the blocked layouts these are
/// 4 columns of one row, so a row-major source gives 4 consecutive bytes).
__global__ void __launch_bounds__(kThreads) convert_layout_u8x4_kernel(const LayoutPlan p, const Div32 d) {
  const uint8_t* in = static_cast<const uint8_t*>(p.in);
  uint32_t* out = static_cast<uint32_t*>(p.out);
  const uint32_t total4 = uint32_t(p.L * p.to.batch_stride / 4);
  const uint32_t R = uint32_t(p.from.rows), C = uint32_t(p.from.cols);
  const uint32_t fbs = uint32_t(p.from.batch_stride), frp = uint32_t(p.from.rows_pad);
  const uint32_t fcp4 = uint32_t(ceil_div(p.from.cols, 4));
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t q = blockIdx.x * kThreads + threadIdx.x; q < total4; q += stride) {
    const uint32_t o = q * 4u;
    const uint32_t l = d.bs.div(o), off = o - l * d.bs.d;
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t r, c;
      coords32(p.to.layout, d.inner, off + uint32_t(k), r, c);
      if (r < R && c < C) {
        uint32_t so;
        switch (p.from.layout.kind) {
          case ScaleLayoutKind::kRowMajor: so = r * C + c; break;
          case ScaleLayoutKind::kColMajor: so = c * frp + r; break;
          case ScaleLayoutKind::kBlocked128x4:
            so = ((r >> 7) * fcp4 + (c >> 2)) * 512u + (r & 31u) * 16u + ((r & 127u) >> 5) * 4u + (c & 3u);
            break;
          default: so = (r >> 3) * fcp4 * 32u + (c >> 2) * 32u + (r & 7u) * 4u + (c & 3u); break;
        }
        word |= uint32_t(__ldg(in + l * fbs + so)) << (8 * k);
      }
    }
    out[q] = word;
  }
}

/// Row-major -> 128x4 blocked, 1-byte scales, no groups (block_scale_interleave): one CTA per
/// (batch, 128-row block, 64-column slab). The slab's 128 x 64 input bytes are staged in shared
/// memory by coalesced row reads; its 16 output atoms (8 KiB, contiguous) are written with
/// coalesced 16-byte stores. Padding rows and columns are written as zeros.
__global__ void __launch_bounds__(256) rm_to_blocked_u8_kernel(const LayoutPlan p, int64_t row_blocks, int64_t slabs) {
  __shared__ __align__(16) uint8_t tile[128][68];  // 68: rows land on different banks for the gathers below
  const int64_t b = blockIdx.x, slab = b % slabs, rb = (b / slabs) % row_blocks, l = b / (slabs * row_blocks);
  const int64_t R = p.from.rows, C = p.from.cols, cp4 = ceil_div(C, 4);
  const uint8_t* in = static_cast<const uint8_t*>(p.in) + l * p.from.batch_stride;
  const int64_t r0 = rb * 128, c0 = slab * 64;
  if ((C & 15) == 0 && (reinterpret_cast<uintptr_t>(in) & 15) == 0) {
    for (int i = threadIdx.x; i < 128 * 4; i += 256) {  // 16-byte pieces: row i/4, columns 16*(i%4)..
      const int rr = i >> 2, cc = (i & 3) * 16;
      const int64_t r = r0 + rr, c = c0 + cc;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < R && c < C) v = *reinterpret_cast<const uint4*>(in + r * C + c);
      uint32_t* t = reinterpret_cast<uint32_t*>(&tile[rr][cc]);  // 68-byte rows: 4-byte aligned
      t[0] = v.x;
      t[1] = v.y;
      t[2] = v.z;
      t[3] = v.w;
    }
  } else {
    for (int i = threadIdx.x; i < 128 * 64; i += 256) {
      const int rr = i >> 6, cc = i & 63;
      const int64_t r = r0 + rr, c = c0 + cc;
      tile[rr][cc] = (r < R && c < C) ? in[r * C + c] : uint8_t(0);
    }
  }
  __syncthreads();
  const int64_t atoms = (cp4 - c0 / 4) < 16 ? (cp4 - c0 / 4) : 16;
  uint8_t* out = static_cast<uint8_t*>(p.out) + l * p.to.batch_stride + (rb * cp4 + c0 / 4) * 512;
  for (int q = threadIdx.x; q < atoms * 32; q += 256) {  // 16-byte chunk q: atom q/32, row (q%32) of its 32-row groups
    const int a = q >> 5, k = q & 31;
    uint32_t w[4];
#pragma unroll
    for (int g = 0; g < 4; ++g)  // bytes 4g..4g+3: row 32g + k, columns 4a..4a+3
      w[g] = uint32_t(tile[32 * g + k][4 * a]) | (uint32_t(tile[32 * g + k][4 * a + 1]) << 8) |
             (uint32_t(tile[32 * g + k][4 * a + 2]) << 16) | (uint32_t(tile[32 * g + k][4 * a + 3]) << 24);
    reinterpret_cast<uint4*>(out)[q] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace

int convert_layout(const LayoutPlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t total = p.L * p.to.batch_stride;
  if (total == 0) return cudaSuccess;
  const size_t smem = dev::group_smem_bytes(p.from) + dev::group_smem_bytes(p.to);
  if (smem > 200 * 1024) return cudaErrorNotSupported;
  if (p.elem_bytes == 1 && p.from.groups == 0 && p.to.groups == 0 &&
      p.from.layout.kind == ScaleLayoutKind::kRowMajor && p.to.layout.kind == ScaleLayoutKind::kBlocked128x4 &&
      reinterpret_cast<uintptr_t>(p.out) % 16 == 0) {
    const int64_t row_blocks = ceil_div(p.from.rows, 128), slabs = ceil_div(round_up(p.from.cols, 4), 64);
    const int64_t blocks = p.L * row_blocks * slabs;
    if (blocks < (int64_t(1) << 31)) {
      rm_to_blocked_u8_kernel<<<unsigned(blocks), 256, 0, s>>>(p, row_blocks, slabs);
      return cudaGetLastError();
    }
  }
  if (p.elem_bytes == 1 && p.from.groups == 0 && p.to.groups == 0 && p.to.batch_stride % 4 == 0 &&
      total < (int64_t(1) << 31) && p.L * p.from.batch_stride < (int64_t(1) << 31) &&
      reinterpret_cast<uintptr_t>(p.out) % 4 == 0) {
    Div32 d;
    d.bs = FastDiv(uint32_t(p.to.batch_stride));
    const ScaleLayoutKind k = p.to.layout.kind;
    const int64_t cp4 = ceil_div(p.to.cols, 4);
    d.inner = FastDiv(uint32_t(k == ScaleLayoutKind::kRowMajor ? p.to.cols
                                                              : (k == ScaleLayoutKind::kColMajor ? p.to.rows_pad : cp4)));
    const int64_t units = total / 4;
    convert_layout_u8x4_kernel<<<unsigned(grid_for(convert_layout_u8x4_kernel, kThreads, units)), kThreads, 0, s>>>(
        p, d);
    return cudaGetLastError();
  }
  if (p.elem_bytes == 4) {
    auto k = convert_layout_kernel<uint32_t>;
    if (const cudaError_t e = opt_in_smem(k, smem); e != cudaSuccess) return e;
    k<<<unsigned(grid_for(k, kThreads, total)), kThreads, smem, s>>>(p);
  } else {
    auto k = convert_layout_kernel<uint8_t>;
    if (const cudaError_t e = opt_in_smem(k, smem); e != cudaSuccess) return e;
    k<<<unsigned(grid_for(k, kThreads, total)), kThreads, smem, s>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace lowbit::cuda
