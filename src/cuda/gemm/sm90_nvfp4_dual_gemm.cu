// src/cuda/gemm/sm90_nvfp4_dual_gemm.cu: NVFP4 dual GEMM with fused SiLU on sm_90a.
//
//   C[m, n] = silu(sum_k A[m,k] B1[n,k]) * (sum_k A[m,k] B2[n,k])      (per batch l)
//
// Hopper has no FP4 or block-scaled MMA, and E2M1 x E4M3 products are not exact in E4M3, so the
// exact path is bf16 wgmma (every NVFP4 value e2m1 * e4m3 has <= 6 significant bits and lies in
// [2^-10, 2688]: exact in bf16; bf16 x bf16 products are exact in fp32; only the fp32
// accumulation rounds).
//
// Design ("swap AB", weights in registers):
//  * The 2N weight rows are the wgmma M side (64 rows per warpgroup), tokens are wgmma N (16..128).
//    Gate and up rows are interleaved in groups of 8, so the accumulator rows r and r+8 a thread
//    owns are gate and up of one feature: SiLU * up happens in registers.
//  * Weights are prepacked once (nvfp4_dual_gemm_prepack): per 64-row block and 64-wide K tile,
//    each thread's wgmma A fragments (4 k16 steps x 8 FP4 codes) are 16 contiguous bytes, with the
//    nibbles ordered so that one shift + two masks give a bf16x2 of e2m1 * 2^-126; the 64 rows x 4
//    E4M3 block scales follow. One multiply by bf16(scale * 2^64) per bf16x2 gives the exact value
//    times 2^-62, undone in the epilogue (all powers of two: exact).
//  * Activations (NVFP4) are dequantized exactly to bf16 by a pre-pass and read by wgmma from
//    128B-swizzled shared memory (K-major B operand).
//  * A multi-stage cp.async pipeline feeds shared memory; split-K with a deterministic reduction
//    fills the GPU when M is small.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "cuda/gemm/launch_gemm.hpp"
#include "cuda/common/sm90_gemm_common.cuh"
#include "cuda/common/workspace.cuh"
#include "cuda/gemm/heuristics.hpp"
#include "lowbit/block_quant.hpp"
#include "lowbit/gemm.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;
using namespace lowbit::cuda::gemm;

namespace {

constexpr int kTileK = kDualTileK;         // K per pipeline stage (4 wgmma k16 steps)
constexpr int kRowsPerWG = 64;             // weight rows per warpgroup
constexpr int kChunkData = 128 * 16;       // fragment bytes per (64-row block, k tile)
constexpr int kChunkBytes = kChunkData + 64 * 4;  // + 64 rows x 4 E4M3 scales (see nvfp4_dual_gemm_packed_bytes)
constexpr float kBiasOut = 4.611686018427387904e18f;  // 2^62: undoes e2m1 * 2^-126 * (s * 2^64)

// ------------------------------------------------------------------------------------------
// Prepack: B1, B2 -> [L][2N/64][K/64][chunk]

/// Interleaved row R (0..2N) -> (matrix 0 = B1 / 1 = B2, source row).
__device__ __forceinline__ void interleaved_source(int64_t R, int* mat, int64_t* row) {
  const int64_t blk = R >> 4, within = R & 15;
  *mat = within >= 8 ? 1 : 0;
  *row = blk * 8 + (within & 7);
}

__global__ void prepack_kernel(DualGemmPlan p, uint8_t* out) {
  const int64_t kTiles = p.K / kTileK, rowBlocks = 2 * p.N / kRowsPerWG;
  const int64_t chunk = blockIdx.x;  // (l, rb, kt)
  const int64_t kt = chunk % kTiles, rb = (chunk / kTiles) % rowBlocks, l = chunk / (kTiles * rowBlocks);
  const int tid = threadIdx.x;  // 128 threads
  uint8_t* dst = out + chunk * kChunkBytes;
  const int warp = tid >> 5, lane = tid & 31, g = 16 * warp + (lane >> 2), t = lane & 3;
  auto code = [&](int r, int k) -> uint32_t {  // FP4 code of (row r of the block, k of the tile)
    int mat;
    int64_t src;
    interleaved_source(rb * kRowsPerWG + r, &mat, &src);
    const uint8_t* base = mat ? p.b2 + l * p.b2_sL + src * p.b2_sN : p.b1 + l * p.b1_sL + src * p.b1_sN;
    const int64_t kk = kt * kTileK + k;
    return (base[kk >> 1] >> ((kk & 1) * 4)) & 0xFu;
  };
  uint32_t words[4];
  for (int s = 0; s < 4; ++s) {
    const int k0 = 16 * s + 2 * t;
    // fragment element i: e0,e1 (g, k0..k0+1) e2,e3 (g+8, ...) e4,e5 (g, k0+8..) e6,e7 (g+8, k0+8..)
    uint32_t e[8] = {code(g, k0), code(g, k0 + 1), code(g + 8, k0), code(g + 8, k0 + 1),
                     code(g, k0 + 8), code(g, k0 + 9), code(g + 8, k0 + 8), code(g + 8, k0 + 9)};
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j) w |= (e[2 * j] << (4 * j)) | (e[2 * j + 1] << (4 * (j + 4)));
    words[s] = w;
  }
  reinterpret_cast<uint4*>(dst)[tid] = make_uint4(words[0], words[1], words[2], words[3]);
  if (tid < kRowsPerWG) {
    int mat;
    int64_t src;
    interleaved_source(rb * kRowsPerWG + tid, &mat, &src);
    const uint8_t* sf = mat ? p.sfb2 : p.sfb1;
    uint32_t w = 0;
    for (int s = 0; s < 4; ++s) w |= uint32_t(sf[p.spb.offset(l, src, kt * 4 + s)]) << (8 * s);
    reinterpret_cast<uint32_t*>(dst + kChunkData)[tid] = w;
  }
}

// ------------------------------------------------------------------------------------------
// Activations: NVFP4 -> bf16 [L][M][K], exact.

__global__ void dequant_act_kernel(DualGemmPlan p, uint16_t* out) {
  const int64_t blocks = p.L * p.M * (p.K / 16);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < blocks; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % (p.K / 16), m = (i / (p.K / 16)) % p.M, l = i / ((p.K / 16) * p.M);
    const uint8_t* src = p.a + l * p.a_sL + m * p.a_sM + c * 8;
    const float s = decode_e4m3(p.sfa[p.spa.offset(l, m, c)]);
    uint32_t w[8];
    for (int j = 0; j < 8; ++j) {
      const uint8_t b = src[j];
      const uint16_t lo = encode_bf16(decode_e2m1(b & 0xF) * s), hi = encode_bf16(decode_e2m1(b >> 4) * s);
      w[j] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    uint4* d = reinterpret_cast<uint4*>(out + (l * p.M + m) * p.K + c * 16);
    d[0] = make_uint4(w[0], w[1], w[2], w[3]);
    d[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// ------------------------------------------------------------------------------------------
// Main kernel

/// bf16x2 of two E4M3 scale bytes, each times 2^64 (exact).
__device__ __forceinline__ uint32_t scale_pair_bf16(uint32_t two_e4m3 /* low 16 bits */) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(uint16_t(two_e4m3)));
  const float f0 = __half2float(__ushort_as_half(uint16_t(h2))) * 1.8446744073709551616e19f;
  const float f1 = __half2float(__ushort_as_half(uint16_t(h2 >> 16))) * 1.8446744073709551616e19f;
  uint32_t b2;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(b2) : "f"(f1), "f"(f0));
  return b2;
}

struct MainArgs {
  DualGemmPlan p;
  const uint8_t* packed;
  const uint16_t* act;  // [L][M][K] bf16
  float* ws;            // split-K partials [splits][L][M][2N] (null when splits == 1)
  int splits;
  int k_tiles_per_split;
};

template <int NT>
__device__ __forceinline__ void epilogue_store(const MainArgs& A, const float (&acc)[NT / 2], int64_t l, int64_t bx,
                                               int64_t tok0, int wg, int warp, int lane, int split) {
  const DualGemmPlan& p = A.p;
  const int64_t feature = 64 * bx + 32 * wg + 8 * warp + (lane >> 2);
  const int t = lane & 3;
  float ag = kBiasOut, au = kBiasOut;
  if (A.splits == 1) {
    const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
    ag *= sda * (p.amax_b1 ? nvfp4_global_decode_scale(*p.amax_b1) : 1.0f);
    au *= sda * (p.amax_b2 ? nvfp4_global_decode_scale(*p.amax_b2) : 1.0f);
  }
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t tok = tok0 + 8 * j + 2 * t + h;
      if (tok >= p.M) continue;
      const float g = acc[4 * j + h], u = acc[4 * j + 2 + h];
      if (A.splits == 1) {
        const float gs = g * ag, us = u * au;
        store_float(p.c, p.c_dtype, l * p.c_sL + tok * p.c_sM + feature, gs / (1.0f + __expf(-gs)) * us);
      } else {
        float2* w = reinterpret_cast<float2*>(A.ws + (((int64_t(split) * p.L + l) * p.M + tok) * p.N + feature) * 2);
        *w = make_float2(g, u);
      }
    }
  }
}

/// Dequantizes one warpgroup's A fragments of a k tile (4 k16 steps x 4 bf16x2 registers).
__device__ __forceinline__ void dequant_fragments(const uint8_t* chunk, int wtid, int g, uint32_t (&a)[4][4]) {
  const uint4 q = reinterpret_cast<const uint4*>(chunk)[wtid];
  const uint32_t sg = reinterpret_cast<const uint32_t*>(chunk + kChunkData)[g];
  const uint32_t sg8 = reinterpret_cast<const uint32_t*>(chunk + kChunkData)[g + 8];
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    // scales of rows g and g+8 for k16 step s, as bf16 (x 2^64), each broadcast to both halves
    const uint32_t pair = scale_pair_bf16(((sg >> (8 * s)) & 0xFF) | (((sg8 >> (8 * s)) & 0xFF) << 8));
    const uint32_t s_g = __byte_perm(pair, 0, 0x1010), s_g8 = __byte_perm(pair, 0, 0x3232);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t y = qw[s] >> (4 * j);
      const uint32_t v = e2m1x2_to_bf16x2_tiny(y);
      a[s][j] = bmul2(v, (j & 1) ? s_g8 : s_g);
    }
  }
}

template <int NT, int S>
__global__ void __launch_bounds__(256) dual_gemm_kernel(MainArgs A) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kActBytes = NT * 128;
  constexpr int kStageBytes = kActBytes + ((2 * kChunkBytes + 1023) / 1024) * 1024;
  // NOTE: offset, not a uintptr_t round trip, so the compiler keeps the shared address space (LDS)
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);

  const DualGemmPlan& p = A.p;
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int64_t bx = blockIdx.x, tok0 = int64_t(blockIdx.y) * NT;
  const int split = int(blockIdx.z % A.splits);
  const int64_t l = blockIdx.z / A.splits;
  const int64_t kTiles = p.K / kTileK;
  const int64_t kt0 = int64_t(split) * A.k_tiles_per_split;
  const int64_t kt1 = kt0 + A.k_tiles_per_split < kTiles ? kt0 + A.k_tiles_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;
  const int64_t rowBlocks = 2 * p.N / kRowsPerWG;
  const uint8_t* wsrc = A.packed + ((l * rowBlocks + 2 * bx) * kTiles) * kChunkBytes;
  const uint16_t* asrc = A.act + (l * p.M) * p.K;

  // Each thread's cp.async pieces of a stage: sources advance by a fixed stride per k tile.
  constexpr int kWPieces = 2 * kChunkBytes / 16;            // weight pieces per stage
  constexpr int kWIters = (kWPieces + 255) / 256;
  constexpr int kAIters = (NT * 8 + 255) / 256;               // activation pieces per stage
  const uint8_t* wptr[kWIters];
  uint32_t wdst[kWIters];
  bool wok[kWIters];
#pragma unroll
  for (int j = 0; j < kWIters; ++j) {
    const int i = tid + 256 * j, c = i / (kChunkBytes / 16), off = (i % (kChunkBytes / 16)) * 16;
    wok[j] = i < kWPieces;
    wptr[j] = wsrc + (int64_t(c) * kTiles + kt0) * kChunkBytes + off;
    wdst[j] = uint32_t(kActBytes + c * kChunkBytes + off);
  }
  const uint16_t* aptr[kAIters];
  uint32_t adst[kAIters];
  bool aok[kAIters], aload[kAIters];
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int i = tid + 256 * j, r = i >> 3, c = i & 7;
    const int64_t tok = tok0 + r;
    aload[j] = i < NT * 8;
    aok[j] = tok < p.M;
    aptr[j] = aok[j] ? asrc + tok * p.K + kt0 * kTileK + c * 8 : asrc;
    adst[j] = uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
  }
  const uint32_t smem_base = smem_u32(smem);
  auto load_stage = [&](int64_t it) {
    const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      if (wok[j]) cp_async16(st + wdst[j], wptr[j] + it * kChunkBytes, true);
#pragma unroll
    for (int j = 0; j < kAIters; ++j)
      if (aload[j]) cp_async16(st + adst[j], aok[j] ? aptr[j] + it * kTileK : aptr[j], aok[j]);
  };

  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nkt) load_stage(s);
    cp_async_commit();
  }
  const int g = 16 * warp + (lane >> 2);
  for (int64_t it = 0; it < nkt; ++it) {
    cp_async_wait<S - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (it + S - 1 < nkt) load_stage(it + S - 1);
    cp_async_commit();

    const uint8_t* st = smem + (it % S) * kStageBytes;
    uint32_t a[4][4];
    dequant_fragments(st + kActBytes + wg * kChunkBytes, wtid, g, a);
    const uint32_t abase = smem_u32(st);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int s = 0; s < 4; ++s)
      wgmma_call<NT>(a[s], desc_sw128(abase + s * 32), acc, std::make_index_sequence<NT / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cp_async_wait<0>();
  epilogue_store<NT>(A, acc, l, bx, tok0, wg, warp, lane, split);
}

/// Split-K finalize: sum the partials in split order, then SiLU * up.
__global__ void finalize_kernel(DualGemmPlan p, const float* ws, int splits) {
  const int64_t n = p.L * p.M * p.N;
  const float sda = p.amax_a ? nvfp4_global_decode_scale(*p.amax_a) : 1.0f;
  const float ag = kBiasOut * sda * (p.amax_b1 ? nvfp4_global_decode_scale(*p.amax_b1) : 1.0f);
  const float au = kBiasOut * sda * (p.amax_b2 ? nvfp4_global_decode_scale(*p.amax_b2) : 1.0f);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float g = 0.0f, u = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float2 v = reinterpret_cast<const float2*>(ws)[s * n + i];
      g += v.x;
      u += v.y;
    }
    const int64_t f = i % p.N, m = (i / p.N) % p.M, l = i / (p.N * p.M);
    const float gs = g * ag, us = u * au;
    store_float(p.c, p.c_dtype, l * p.c_sL + m * p.c_sM + f, gs / (1.0f + __expf(-gs)) * us);
  }
}

template <int NT, int S>
cudaError_t launch_main(const MainArgs& a, int device, cudaStream_t st) {
  constexpr int kStageBytes = NT * 128 + ((2 * kChunkBytes + 1023) / 1024) * 1024;
  constexpr int smem = S * kStageBytes + 1024;  // stages + alignment slack
  auto kern = dual_gemm_kernel<NT, S>;
  // the shared-memory opt-in is a per-device function attribute: set it once per device
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  const DualGemmPlan& p = a.p;
  dim3 grid(unsigned(p.N / 64), unsigned((p.M + NT - 1) / NT), unsigned(p.L * a.splits));
  kern<<<grid, 256, smem, st>>>(a);
  return cudaGetLastError();
}

}  // namespace

int nvfp4_dual_gemm_prepack(const DualGemmPlan& p, uint8_t* packed, void* stream) {
  const int64_t chunks = p.L * (2 * p.N / kRowsPerWG) * (p.K / kTileK);
  prepack_kernel<<<unsigned(chunks), 128, 0, static_cast<cudaStream_t>(stream)>>>(p, packed);
  return int(cudaGetLastError());
}

int nvfp4_dual_gemm(const DualGemmPlan& p, const uint8_t* packed, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  cudaError_t e = cudaSuccess;
  uint8_t* own_packed = nullptr;
  uint16_t* act = nullptr;
  float* ws = nullptr;
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);

  // tokens per CTA and split-K (gemm::dual_config)
  const DualConfig cfg = dual_config(p.M, p.N, p.K, p.L, sms);
  const int NT = cfg.tile_n;
  const int splits = cfg.splits;
  const int per = cfg.kt_per_split;

  if (!packed) {
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&own_packed), size_t(lowbit::nvfp4_dual_gemm_packed_bytes(p.N, p.K, p.L)), pool, st);
    if (e == cudaSuccess) e = cudaError_t(nvfp4_dual_gemm_prepack(p, own_packed, stream));
    packed = own_packed;
  }
  if (e == cudaSuccess) e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&act), size_t(p.L * p.M * p.K * 2), pool, st);
  if (e == cudaSuccess) {
    const int64_t blocks = p.L * p.M * (p.K / 16);
    const unsigned grid = unsigned(blocks / 256 + 1 < 4 * int64_t(sms) * 8 ? blocks / 256 + 1 : 4 * int64_t(sms) * 8);
    dequant_act_kernel<<<grid, 256, 0, st>>>(p, act);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ws), size_t(splits) * p.L * p.M * p.N * 2 * sizeof(float), pool, st);
  if (e == cudaSuccess) {
    MainArgs a{p, packed, act, ws, splits, per};
    switch (NT) {
      case 16: e = launch_main<16, dual_stages(16)>(a, dev, st); break;
      case 32: e = launch_main<32, dual_stages(32)>(a, dev, st); break;
      case 64: e = launch_main<64, dual_stages(64)>(a, dev, st); break;
      default: e = launch_main<128, dual_stages(128)>(a, dev, st); break;
    }
  }
  if (e == cudaSuccess && splits > 1) {
    const int64_t n = p.L * p.M * p.N;
    finalize_kernel<<<unsigned(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535), 256, 0, st>>>(p, ws, splits);
    e = cudaGetLastError();
  }
  if (ws) cudaFreeAsync(ws, st);
  if (act) cudaFreeAsync(act, st);
  if (own_packed) cudaFreeAsync(own_packed, st);
  return int(e);
}

}  // namespace lowbit::cuda
