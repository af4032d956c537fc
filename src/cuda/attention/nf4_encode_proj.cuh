// src/cuda/attention/nf4_encode_proj.cuh: the projection + RoPE + amax kernels of
// kproj_rope_nf4_encode (sm90_nf4_encode.cu, the only includer): the shared constants and
// parameters of the encode, the tile's tables, the RoPE / amax epilogue and the two mainloops
// (CUDA-core fp64; mma.sync tensor cores for bf16 / fp16 operands). The algorithm, the exactness
// argument and the exact compile flags are described at the top of sm90_nf4_encode.cu.
// tests/cpp/emu compiles this header for the host emulation of that file (its namespace renamed
// like the file's).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/plan_decode.hpp"
#include "cuda/common/codecs.cuh"
#include "cuda/common/indexing.cuh"
#include "cuda/common/memory.cuh"
#include "cuda/common/mma_sync.cuh"

namespace lowbit::cuda {
namespace kenc {
namespace {

using detail::KCacheAppendPlan;
using detail::KCachePlan;
using detail::KprojRopePlan;
using detail::load_float;
using detail::store_float;

constexpr int kThreads = 256;
constexpr int kBM = 128;  ///< token rows (b, t) per projection tile
constexpr int kBP = 32;   ///< channel pairs (c, c + D/2) per projection tile: 64 output channels
constexpr int kBK = 16;   ///< hidden elements per shared-memory stage
constexpr int kRows = kBM / 16, kPairs = kBP / 16;  ///< per thread: 8 rows x 2 pairs x 2 halves
constexpr int kAS = kBM + 1, kBS = 2 * kBP + 1;     ///< padded shared rows (fp64)
constexpr int kSmemBytes = kBM * 2 * kBP * 4;       ///< A / B stages, then the amax tile (32 KiB)
static_assert(kBK * (kAS + kBS) * 8 <= kSmemBytes, "stages fit the amax tile's bytes");

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uint64_t(a) == 0; }

constexpr int kMaxHostFreq = 256;  ///< D/2 up to this: the rotary frequencies come from the host

struct ProjParams {
  KprojRopePlan p;
  /// f_c = rope_theta^(-2c / D) computed on the host with std::pow, as the reference computes
  /// them (so the angles are the reference's), when D/2 <= kMaxHostFreq; else on the device
  double inv_freq[kMaxHostFreq];
  bool host_freq = false;
  float* k = nullptr;   ///< rotated keys [B, T, H, D] (k_out or scratch), last dimension contiguous
  int64_t ks[3] = {};   ///< element strides of k
  int64_t M = 0;        ///< B * T rows
  int64_t P = 0;        ///< H * D / 2 pairs
  int64_t half = 0;     ///< D / 2
};

static_assert(sizeof(ProjParams) <= 4000, "the projection's parameters fit the 4 KiB kernel parameter space");

// ---------------------------------------------------------------------------------------------
// projection + RoPE + amax: the tile's tables, the epilogue, and the two mainloops (CUDA-core fp64;
// tensor cores for bf16 / fp16 operands)

/// The rows, columns and rotary frequencies of one projection tile (128 token rows x 32 pairs).
struct ProjTile {
  double inv_freq[kBP];
  int64_t row_x[kBM];     ///< x offset of the row (-1: past the last row)
  int64_t row_b[kBM], row_t[kBM];
  int64_t col_w[2 * kBP];  ///< w_k offset of column pl (pair pl's c) and kBP + pl (its c + D/2); -1: none
};

/// Fills the tile's tables (threads 0 .. kBM + 3 kBP - 1); the caller synchronises.
__device__ __forceinline__ void proj_tile_setup(const ProjParams& q, ProjTile& s, int64_t m0, int64_t p0) {
  const KprojRopePlan& p = q.p;
  const int tid = int(threadIdx.x);
  if (tid < kBM) {
    const int64_t m = m0 + tid, b = m / p.seqlen, t = m - b * p.seqlen;
    s.row_x[tid] = m < q.M ? b * p.x_stride[0] + t * p.x_stride[1] : -1;
    s.row_b[tid] = b;
    s.row_t[tid] = t;
  } else if (tid < kBM + 2 * kBP) {  // the tile's columns: rows of w_k (pair pp, half j)
    const int col = tid - kBM, j = col / kBP;
    const int64_t pp = p0 + col % kBP, h = pp / q.half, c = pp - h * q.half;
    s.col_w[col] = pp < q.P ? (h * 2 * q.half + c + j * q.half) * p.w_stride[0] : -1;
  } else if (tid < kBM + 2 * kBP + kBP) {  // f_c = rope_theta^(-2c / D) of the tile's pairs
    const int i = tid - kBM - 2 * kBP;
    const int64_t c = (p0 + i) % q.half;
    s.inv_freq[i] = q.host_freq ? q.inv_freq[c] : pow(p.rope_theta, -double(2 * c) / double(p.head_dim));
  }
}

/// RoPE in fp64 of the projections acc[r][j][half] (row ty + 16 r, pair tx + 16 j, each already an
/// fp32 value), the fp32 keys out, their finite |k| bits folded into the scales through the amax tile
/// `am` (smem, [kBM][2 kBP]; the caller's mainloop is done with the memory it aliases).
__device__ __forceinline__ void rope_amax_epilogue(const ProjParams& q, const ProjTile& s, uint32_t* am,
                                                   const double (&acc)[kRows][kPairs][2], int64_t p0) {
  const KprojRopePlan& p = q.p;
  const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = ty + 16 * r;
    const bool rin = s.row_x[row] >= 0;
    const int64_t b = s.row_b[row], t = s.row_t[row];
    double pos = 0.0;
    if (rin) {
      const int64_t po = b * p.p_stride[0] + t * p.p_stride[1];
      pos = p.positions64 ? double(static_cast<const int64_t*>(p.positions)[po])
                          : double(static_cast<const int32_t*>(p.positions)[po]);
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int pl = tx + 16 * j;
      const int64_t pp = p0 + pl;
      uint32_t a0 = 0, a1 = 0;
      if (rin && pp < q.P) {
        const double ang = pos * s.inv_freq[pl];
        const double cs = cos(ang), sn = sin(ang);
        const double x0 = double(float(acc[r][j][0])), x1 = double(float(acc[r][j][1]));
        const float k0 = float(x0 * cs - x1 * sn), k1 = float(x1 * cs + x0 * sn);
        const int64_t h = pp / q.half, c = pp - h * q.half;
        float* kp = q.k + b * q.ks[0] + t * q.ks[1] + h * q.ks[2] + c;
        kp[0] = k0;
        kp[q.half] = k1;
        a0 = finite_abs_bits(k0);  // NaN / Inf ignored
        a1 = finite_abs_bits(k1);
      }
      am[row * 2 * kBP + pl] = a0;
      am[row * 2 * kBP + kBP + pl] = a1;
    }
  }
  __syncthreads();
  // column maxima over runs of rows of one sequence: 4 threads per column, 32 rows each
  const int col = tid % (2 * kBP), part = tid / (2 * kBP);
  const int64_t pp = p0 + col % kBP;
  if (pp >= q.P) return;
  const int64_t h = pp / q.half, ch = pp - h * q.half + (col >= kBP ? q.half : 0);
  const KCachePlan& c = p.cache;
  unsigned* sbase = reinterpret_cast<unsigned*>(c.scale) + h * c.s_s[1] + ch * c.s_s[2];
  int64_t cur = -1;
  uint32_t run = 0;
  for (int row = part * (kBM / 4); row < (part + 1) * (kBM / 4) && s.row_x[row] >= 0; ++row) {
    if (s.row_b[row] != cur) {
      if (run) atomicMax(sbase + cur * c.s_s[0], run);
      cur = s.row_b[row];
      run = 0;
    }
    const uint32_t v = am[row * 2 * kBP + col];
    run = v > run ? v : run;
  }
  if (run) atomicMax(sbase + cur * c.s_s[0], run);
}

// CUDA cores, fp64: bit for bit the reference's projection (any dtypes and strides)
__global__ void __launch_bounds__(kThreads) kproj_rope_amax(const ProjParams q) {
  __shared__ __align__(16) unsigned char smem[kSmemBytes];
  __shared__ ProjTile tile;
  double(*As)[kAS] = reinterpret_cast<double(*)[kAS]>(smem);                 // [kBK][kAS]
  double(*Bs)[kBS] = reinterpret_cast<double(*)[kBS]>(smem + kBK * kAS * 8);  // [kBK][kBS]
  const KprojRopePlan& p = q.p;
  const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, p0 = int64_t(blockIdx.y) * kBP;
  proj_tile_setup(q, tile, m0, p0);
  __syncthreads();

  double acc[kRows][kPairs][2];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kPairs; ++j) acc[r][j][0] = acc[r][j][1] = 0.0;
  // this thread stages hidden element k0 + tx of rows ty + 16 l and columns ty + 16 l; the next
  // stage's loads are issued before the current stage's products (registers, then shared)
  float xr[kRows], wr[2 * kBP / 16];
  auto fetch = [&](int64_t k0) {
    const int64_t kk = k0 + tx;
    const bool kin = kk < p.hidden;
#pragma unroll
    for (int l = 0; l < kRows; ++l) {
      const int64_t xo = tile.row_x[ty + 16 * l];
      xr[l] = kin && xo >= 0 ? load_float(p.x, p.x_dtype, xo + kk * p.x_stride[2]) : 0.0f;
    }
#pragma unroll
    for (int l = 0; l < 2 * kBP / 16; ++l) {
      const int64_t wo = tile.col_w[ty + 16 * l];
      wr[l] = kin && wo >= 0 ? load_float(p.w, p.w_dtype, wo + kk * p.w_stride[1]) : 0.0f;
    }
  };
  if (p.hidden > 0) fetch(0);
  for (int64_t k0 = 0; k0 < p.hidden; k0 += kBK) {
#pragma unroll
    for (int l = 0; l < kRows; ++l) As[tx][ty + 16 * l] = double(xr[l]);
#pragma unroll
    for (int l = 0; l < 2 * kBP / 16; ++l) Bs[tx][ty + 16 * l] = double(wr[l]);
    __syncthreads();
    if (k0 + kBK < p.hidden) fetch(k0 + kBK);
#pragma unroll
    for (int i = 0; i < kBK; ++i) {
      double a[kRows], lo[kPairs], hi[kPairs];
#pragma unroll
      for (int r = 0; r < kRows; ++r) a[r] = As[i][ty + 16 * r];
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        lo[j] = Bs[i][tx + 16 * j];
        hi[j] = Bs[i][kBP + tx + 16 * j];
      }
      // exact products: fma == the reference's x * w then + (one rounding each step)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          acc[r][j][0] = fma(a[r], lo[j], acc[r][j][0]);
          acc[r][j][1] = fma(a[r], hi[j], acc[r][j][1]);
        }
    }
    __syncthreads();
  }
  rope_amax_epilogue(q, tile, reinterpret_cast<uint32_t*>(smem), acc, p0);
}

// Tensor cores (mma.sync m16n8k16, fp32 accumulators) for bf16 / fp16 x and w_k with contiguous
// hidden and 16-byte aligned rows (tc_ok): the same tile and epilogue; 8 warps of 32 rows x 32
// columns; stages of 32 hidden elements in padded shared rows (conflict-free fragment loads), the
// next stage's 16-byte loads issued before the current stage's products.
constexpr int kTK = 32;                           ///< hidden elements per tensor-core stage
constexpr int kTPitch = kTK + 8;                  ///< elements per staged row (80 bytes)
constexpr int kCPitch = 2 * kBP + 4;              ///< floats per row of the accumulator tile
constexpr int kTcSmem = kBM * kCPitch * 4;        ///< the accumulator tile (the largest use)
static_assert((kBM + 2 * kBP) * kTPitch * 2 <= kTcSmem && kSmemBytes <= kTcSmem, "tensor-core smem uses");

template <bool kFp16>
__global__ void __launch_bounds__(kThreads) kproj_rope_amax_tc(const ProjParams q) {
  __shared__ __align__(16) unsigned char smem[kTcSmem];
  __shared__ ProjTile tile;
  uint16_t* As = reinterpret_cast<uint16_t*>(smem);  // [kBM][kTPitch]
  uint16_t* Bs = As + kBM * kTPitch;                 // [2 kBP][kTPitch]: row n = w_k row col_w[n]
  const KprojRopePlan& p = q.p;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int wm = warp % 4, wn = warp / 4;  // this warp: rows [32 wm, 32 wm + 32), columns [32 wn, 32 wn + 32)
  const int64_t m0 = int64_t(blockIdx.x) * kBM, p0 = int64_t(blockIdx.y) * kBP;
  proj_tile_setup(q, tile, m0, p0);
  __syncthreads();
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  const uint16_t* w = static_cast<const uint16_t*>(p.w);
  // chunks of 8 elements: A 128 rows x 4 (two per thread), B 64 rows x 4 (one per thread)
  uint4 ra[2], rb;
  auto fetch = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ch = tid + kThreads * i, row = ch / 4;
      const int64_t kk = k0 + 8 * (ch % 4), xo = tile.row_x[row];
      ra[i] = xo >= 0 && kk < p.hidden ? *reinterpret_cast<const uint4*>(x + xo + kk) : make_uint4(0, 0, 0, 0);
    }
    const int64_t kk = k0 + 8 * (tid % 4), wo = tile.col_w[tid / 4];
    rb = wo >= 0 && kk < p.hidden ? *reinterpret_cast<const uint4*>(w + wo + kk) : make_uint4(0, 0, 0, 0);
  };
  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  if (p.hidden > 0) fetch(0);
  for (int64_t k0 = 0; k0 < p.hidden; k0 += kTK) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ch = tid + kThreads * i;
      *reinterpret_cast<uint4*>(As + (ch / 4) * kTPitch + 8 * (ch % 4)) = ra[i];
    }
    *reinterpret_cast<uint4*>(Bs + (tid / 4) * kTPitch + 8 * (tid % 4)) = rb;
    __syncthreads();
    if (k0 + kTK < p.hidden) fetch(k0 + kTK);
#pragma unroll
    for (int ks = 0; ks < kTK; ks += 16) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint16_t* r0 = As + (32 * wm + 16 * mi + g) * kTPitch + ks + 2 * t4;
        a[mi][0] = *reinterpret_cast<const uint32_t*>(r0);
        a[mi][1] = *reinterpret_cast<const uint32_t*>(r0 + 8 * kTPitch);
        a[mi][2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
        a[mi][3] = *reinterpret_cast<const uint32_t*>(r0 + 8 * kTPitch + 8);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const uint16_t* c0 = Bs + (32 * wn + 8 * ni + g) * kTPitch + ks + 2 * t4;
        b[ni][0] = *reinterpret_cast<const uint32_t*>(c0);
        b[ni][1] = *reinterpret_cast<const uint32_t*>(c0 + 8);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816<kFp16>(acc[mi][ni], a[mi], b[ni]);
    }
    __syncthreads();
  }
  // the accumulators through shared memory into the epilogue's layout (row ty + 16 r, pair tx + 16 j)
  float* Cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int row = 32 * wm + 16 * mi + g, col = 32 * wn + 8 * ni + 2 * t4;
      Cs[row * kCPitch + col] = acc[mi][ni][0];
      Cs[row * kCPitch + col + 1] = acc[mi][ni][1];
      Cs[(row + 8) * kCPitch + col] = acc[mi][ni][2];
      Cs[(row + 8) * kCPitch + col + 1] = acc[mi][ni][3];
    }
  __syncthreads();
  const int tx = tid % 16, ty = tid / 16;
  double accd[kRows][kPairs][2];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      accd[r][j][0] = double(Cs[(ty + 16 * r) * kCPitch + tx + 16 * j]);
      accd[r][j][1] = double(Cs[(ty + 16 * r) * kCPitch + kBP + tx + 16 * j]);
    }
  __syncthreads();  // the epilogue's amax tile reuses the memory
  rope_amax_epilogue(q, tile, reinterpret_cast<uint32_t*>(smem), accd, p0);
}

/// The tensor-core projection applies: x and w_k both bf16 or both fp16, hidden contiguous and a
/// multiple of 8, every row 16-byte aligned.
bool tc_ok(const KprojRopePlan& p) {
  if (p.x_dtype != p.w_dtype || (p.x_dtype != DType::kBFloat16 && p.x_dtype != DType::kFloat16)) return false;
  return p.hidden % 8 == 0 && p.x_stride[2] == 1 && p.w_stride[1] == 1 && aligned(p.x, 16) && aligned(p.w, 16) &&
         p.x_stride[0] % 8 == 0 && p.x_stride[1] % 8 == 0 && p.w_stride[0] % 8 == 0;
}

}  // namespace
}  // namespace kenc
}  // namespace lowbit::cuda
