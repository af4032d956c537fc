// src/cuda/moe/group_fp8_mainloop.cuh: the FP8 tensor-core path of the MXFP4 grouped GEMM
// (GemmPrecision::kFp8TensorCores): a persistent warp-specialized kernel over MXFP8 activations as
// stored and weights in the FP8-path packed layout (lowbit/mxfp4_pack.hpp). The arithmetic (fold,
// decode, multipliers) is in fp8_fold.hpp; the design in docs/design/moe_grouped_gemm.md.
//
// CTA: 384 threads. Warpgroup 0 feeds the pipeline (setmaxnreg down to 104 registers): warp 0 issues
// per K tile of 128 one bulk copy of the 8 KB weight tile, one of its 512 scale bytes and one TMA
// (SWIZZLE_128B) of the 128-token x 128-byte activation tile into a stage (full barrier `wfull`,
// completed by the transaction bytes); warps 1..3 take the stages in turn as converters: from the
// stage's weight scale bytes the per-block fold (smax, spread, fast or slow form), each row's E4M3
// lookup table, and from the activation scale bytes (read from global memory) the fp32 column
// multipliers of the promotion, into the stage (barrier `cfull`, 32 arrivals). Warpgroups 1 and 2
// (setmaxnreg up to 200) consume 64 weight rows each: per MX block of the stage the A fragment is
// decoded in registers (two PRMT lookups per word), one wgmma m64n128k32 (A E4M3 from registers,
// B E4M3 / E5M2 from shared memory, scale-d 0) gives the block's partial sums, and after
// `wait<0>` every partial is added into the fp32 totals with one FFMA by its column multiplier
// (slow blocks: a multiply by the row's 2^(s - 127) first). The next block's decode is issued under
// the wgmma; the two consumer warpgroups overlap each other's promotion and MMA. The stage is
// released with one arrival per consumer warp (`empty`, 8 arrivals). No CTA barrier after the
// start: every role walks the same items (row block x, token tile y: find_tile) and K tiles, so a
// global pipeline iteration counter gives each stage and phase; the producer runs into the next
// item while the consumers store the previous one's totals.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/moe/fp8_fold.hpp"
#include "cuda/moe/group_epilogue.cuh"

namespace lowbit::cuda {
namespace {

/// The FP8 wgmma of one MX block: 64 weight rows x 128 tokens x 32, A E4M3 from registers, B
/// (activations, K-major, 128B-swizzled) E4M3 or E5M2 from shared memory.
template <bool kE5M2>
struct Fp8Wgmma {
  using Op = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct Fp8Wgmma<true> {
  using Op = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E5M2_RS_TN<>;
};
template <bool kE5M2, size_t... I>
__device__ __forceinline__ void fp8_wgmma(const uint32_t (&a)[4], uint64_t desc, float* d, std::index_sequence<I...>) {
  Fp8Wgmma<kE5M2>::Op::fma(a[0], a[1], a[2], a[3], desc, d[I]..., cute::SM90::GMMA::ScaleOut::Zero);
}

/// Shared memory of one pipeline stage of the FP8 path (byte offsets; the stage is 1024-aligned).
struct Fp8Stage {
  static constexpr int kTileN = moe::kFp8TileN, kTileK = moe::kFp8TileK, kBlocks = kTileK / 32;
  static constexpr int kAct = 0;                                   // [128 tokens][128 B], TMA SWIZZLE_128B
  static constexpr int kW = kAct + kTileN * kTileK;                // weight tile, 8 KB (row r at r * 64)
  static constexpr int kWS = kW + int(kMxfp4Fp8TileBytes);         // weight scale bytes (row r's 4 at r * 4)
  static constexpr int kTab = kWS + int(kMxfp4Fp8TileScales);      // tables: row r's 32 B at r * 32, halves swizzled
  static constexpr int kMulT = 36;                                 // floats per lane quad t (32 + 4: no bank conflicts)
  static constexpr int kMulBlock = 4 * kMulT * 4;                  // bytes of one block's multipliers
  static constexpr int kMul = kTab + kRows * 32;                   // [block][t][kMulT] fp32 column multipliers
  static constexpr int kFlags = kMul + kBlocks * kMulBlock;        // uint32: bit b set = block b takes the slow form
  static constexpr int kBytes = (kFlags + 16 + 1023) / 1024 * 1024;
  /// Bytes the producer's copies complete on the stage's full barrier.
  static constexpr uint32_t kTx = uint32_t(kTileN * kTileK + kMxfp4Fp8TileBytes + kMxfp4Fp8TileScales);
  /// Offset of the 16-byte half h (blocks 2h, 2h+1) of row r's tables.
  __host__ __device__ static constexpr int tab(int r, int h) { return kTab + r * 32 + 16 * (h ^ ((r >> 2) & 1)); }
  /// Float index, within a block's multipliers, of token column c (the consumer of lane quad t =
  /// (c >> 1) & 3 reads its 32 columns 8j + 2t + h as one contiguous run).
  __host__ __device__ static constexpr int mul(int c) { return ((c >> 1) & 3) * kMulT + 2 * (c >> 3) + (c & 1); }
};
static_assert(Fp8Stage::kW % 1024 == 0 && Fp8Stage::kTab % 16 == 0 && Fp8Stage::kMul % 16 == 0, "stage layout");

constexpr int kFp8Threads = 384;
/// setmaxnreg of warpgroup 0 (producer, converters) and of the consumer warpgroups: 128 x (104 +
/// 2 x 200) = 65536 registers (the launch gives every thread 168).
constexpr uint32_t kFp8ProducerRegs = 104, kFp8ConsumerRegs = 200;
constexpr int kFp8SmemBytes = moe::kFp8Stages * Fp8Stage::kBytes + 1024;

/// The work item `item` of the persistent loop: row block x, token tile y, its group and rows.
struct Fp8Item {
  int64_t x = 0, grp = -1, m0 = 0, m1 = 0;
  int64_t nkt = 0;  // K tiles
};
/// Warp-wide: item `item` (x = item % nx, y = item / nx; nx = row blocks); grp < 0: no tile at y.
/// 32-bit item indices (the launcher guarantees fewer than 2^31 items; a 64-bit division is a
/// subroutine call whose saved registers spilled in the producer warpgroup).
__device__ __forceinline__ Fp8Item fp8_item(const GroupArgs& A, uint32_t item, uint32_t nx) {
  Fp8Item it;
  it.x = int64_t(item % nx);
  int64_t grp = -1, tile = 0;
  if (!find_tile(A, Fp8Stage::kTileN, int64_t(item / nx), &grp, &tile)) return it;
  it.grp = grp;
  it.m0 = A.bound(grp) + tile * Fp8Stage::kTileN;
  const int64_t gend = A.bound(grp + 1);
  it.m1 = it.m0 + Fp8Stage::kTileN < gend ? it.m0 + Fp8Stage::kTileN : gend;
  it.nkt = (A.K + Fp8Stage::kTileK - 1) / Fp8Stage::kTileK;
  return it;
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t u4_at(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/// Converter (one warp per stage): fold, tables and multipliers of K tile kt of item `it` into the
/// stage at `st` (its weight scale bytes already landed).
__device__ __forceinline__ void fp8_convert(const GroupArgs& A, const Fp8Item& it, int64_t kt, uint8_t* st,
                                            const uint32_t (&sa)[4], int lane) {
  using S = Fp8Stage;
  const int64_t R0 = it.x * kRows, KB = A.K / 32;
  const int64_t nrows = A.N - R0;  // rows of the tile below N (>= 1)
  const uint32_t* ws = reinterpret_cast<const uint32_t*>(st + S::kWS);  // row r's 4 scale bytes: ws[r]
  uint32_t mn = 0xFFFFFFFFu, mx = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ws[lane + 32 * i];
    if (lane + 32 * i < nrows) {
      mn = __vminu4(mn, w);
      mx = __vmaxu4(mx, w);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {  // byte-wise min / max over the warp: every lane gets all four blocks'
    mn = __vminu4(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, o));
    mx = __vmaxu4(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  }
  bool folds[4];
  uint32_t smax[4], slow = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    smax[b] = (mx >> (8 * b)) & 0xFFu;
    // the fast form also needs every column multiplier 2^(smax + sa - 260) of the block to be an
    // fp32 normal (else the slow form's two factors, each exact, keep the products out of
    // fp32's subnormal / overflow range)
    bool out_of_range = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t sab = (sa[i] >> (8 * b)) & 0xFFu;
      out_of_range |= it.m0 + lane + 32 * i < it.m1 && kt * 4 + b < KB && !fp8::col_mult_normal(sab, smax[b]);
    }
    folds[b] = fp8::block_folds((mn >> (8 * b)) & 0xFFu, smax[b]) && !__any_sync(0xFFFFFFFFu, out_of_range);
    slow |= (folds[b] ? 0u : 1u) << b;
  }
  // tables of this lane's rows lane + 32 i: halves (blocks 0, 1) and (2, 3)
  // NOTE: not unrolled, the scale word read again: the converter runs at the producer
  // warpgroup's register budget
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {
    const int r = lane + 32 * i;
    const uint32_t w = ws[r];
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int D = fp8::fold_d((w >> (8 * b)) & 0xFFu, folds[b], smax[b]);
      lo[b] = fp8::fold_lo(D);
      hi[b] = fp8::fold_hi(D);
    }
    *reinterpret_cast<uint4*>(st + S::tab(r, 0)) = make_uint4(lo[0], hi[0], lo[1], hi[1]);
    *reinterpret_cast<uint4*>(st + S::tab(r, 1)) = make_uint4(lo[2], hi[2], lo[3], hi[3]);
  }
  // column multipliers of this lane's tokens lane + 32 i (0 for tokens past the tile's rows and for
  // blocks past K: their products are zero or never stored)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = lane + 32 * i;
    const bool valid = it.m0 + c < it.m1;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const bool in_k = kt * 4 + b < KB;
      const uint32_t bits = valid && in_k ? fp8::col_mult_bits((sa[i] >> (8 * b)) & 0xFFu, folds[b], smax[b]) : 0u;
      reinterpret_cast<uint32_t*>(st + S::kMul + b * S::kMulBlock)[S::mul(c)] = bits;
    }
  }
  if (lane == 0) *reinterpret_cast<uint32_t*>(st + S::kFlags) = slow;
}

/// The activation scale bytes of K tile kt (blocks 4 kt .. 4 kt + 3, byte b of sa[i]) of this
/// converter lane's tokens lane + 32 i; 0 where there is no such row or block (the multiplier is
/// then 0 anyway). In both activation scale layouts (row-major, 128x4 blocked) the four bytes are
/// consecutive: one 32-bit load where aligned and inside K, else byte loads.
/// srow0: the stored scale row of the tile's first row (its tokens are consecutive rows of one
/// group, consecutive stored rows in every layout: row-major, masked, 128x4 with group padding).
__device__ __forceinline__ void fp8_act_scales(const GroupArgs& A, const Fp8Item& it, int64_t srow0, int64_t kt,
                                               int lane, uint32_t (&sa)[4]) {
  const int64_t KB = A.K / 32, kb0 = kt * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = it.m0 + lane + 32 * i;
    sa[i] = 0u;
    if (m >= it.m1) continue;
    int64_t srow = srow0 + (m - it.m0);  // clamped to the rows the caller allocated (as a_scale_row)
    srow = srow < 0 ? 0 : (srow >= A.spa.rows_pad ? A.spa.rows_pad - 1 : srow);
    // scale_offset of the two layouts the API takes (row-major, 128x4 blocked), written out: with
    // the generic switch ptxas kept every layout's row term of all four tokens live (spills)
    const int64_t off = A.spa.layout.kind == ScaleLayoutKind::kBlocked128x4
                            ? ((srow >> 7) * ((A.spa.cols + 3) >> 2) + kt) * 512 + (srow & 31) * 16 + ((srow & 127) >> 5) * 4
                            : srow * A.spa.cols + kb0;
    const uint8_t* p = A.a_scale + off;
    if (kb0 + 3 < KB && (reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
      sa[i] = *reinterpret_cast<const uint32_t*>(p);
    } else {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        if (kb0 + b < KB) sa[i] |= uint32_t(p[b]) << (8 * b);
    }
  }
}

/// The FP8 path's kernel (kE5M2: E5M2 activation codes, else E4M3). tm_a: the activation rows
/// [rows of a][K] bytes, boxes of 128 bytes x 128 rows, SWIZZLE_128B. Grid: moe::fp8_grid CTAs,
/// looping over the A.max_tiles x ceil(N / 128) items. Prims: the TMA load and mbarrier wait.
template <bool kE5M2, int kStages, class Prims = DefaultPrims>
__global__ void __launch_bounds__(kFp8Threads, 1)
    group_gemm_fp8_kernel(const __grid_constant__ CUtensorMap tm_a, GroupArgs A) {
  using S = Fp8Stage;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ __align__(8) uint64_t bars[3 * kStages];  // wfull[kStages], cfull[kStages], empty[kStages]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bars[s]), 1);                // the producer's expect_tx arrival (+ the bytes)
      mbar_init(smem_u32(&bars[kStages + s]), 32);     // the converting warp's lanes
      mbar_init(smem_u32(&bars[2 * kStages + s]), 8);  // the 8 consumer warps
    }
    mbar_init_fence();
  }
  __syncthreads();
  griddep_wait();  // m_indptr / the activations may come from the previous kernel
  const uint32_t smem_base = smem_u32(smem);
  const uint32_t wfull0 = smem_u32(&bars[0]), cfull0 = smem_u32(&bars[kStages]), empty0 = smem_u32(&bars[2 * kStages]);
  const uint32_t nx = uint32_t((A.N + kRows - 1) / kRows);
  const uint32_t items = uint32_t(int64_t(nx) * A.max_tiles);  // < 2^31 (group_gemm_mxfp4_fp8)
  const int64_t Np = mxfp4_packed_rows(A.N), Kq = mxfp4_fp8_packed_k(A.K);
  const int64_t ktiles = Kq / S::kTileK;
  uint32_t gi = 0;  // pipeline iteration: stage gi % kStages, phase gi / kStages (every role alike)

  if (warp < 4) {  // warpgroup 0: producer (warp 0) and converters (warps 1..3)
    cutlass::arch::warpgroup_reg_dealloc<kFp8ProducerRegs>();
    for (uint32_t item = blockIdx.x; item < items; item += gridDim.x) {
      const Fp8Item it = fp8_item(A, item, nx);
      if (it.grp < 0) continue;
      const int64_t tile0 = (it.grp * (Np / kRows) + it.x) * ktiles;  // the item's first packed tile
      // converters: the stored activation scale row of the tile's first row (one search of the
      // group bounds per item, not per token and K tile)
      const int64_t srow0 = warp > 0 ? A.spa.stored_row(A.a_row(it.grp, it.m0)) : 0;
      for (int64_t kt = 0; kt < it.nkt; ++kt, ++gi) {
        const uint32_t s = gi % kStages, ph = gi / kStages;
        uint8_t* st = smem + s * S::kBytes;
        if (warp == 0) {
          if (gi >= uint32_t(kStages)) Prims::mbar_wait(empty0 + 8 * s, (ph - 1) & 1);
          if (lane == 0) {
            const uint32_t full = wfull0 + 8 * s;
            mbar_arrive_expect_tx(full, S::kTx);
            cute::SM90_BULK_COPY_G2S::copy(A.b + (tile0 + kt) * kMxfp4Fp8TileBytes, bar_ptr(full), st + S::kW,
                                           int32_t(kMxfp4Fp8TileBytes));
            cute::SM90_BULK_COPY_G2S::copy(A.bs + (tile0 + kt) * kMxfp4Fp8TileScales, bar_ptr(full), st + S::kWS,
                                           int32_t(kMxfp4Fp8TileScales));
            Prims::tma_load_2d(smem_base + s * S::kBytes + S::kAct, &tm_a, int32_t(kt * S::kTileK),
                               int32_t(A.a_row(it.grp, it.m0)), full);
          }
        } else if (int(gi % 3u) == warp - 1) {
          uint32_t sa[4];
          fp8_act_scales(A, it, srow0, kt, lane, sa);  // global loads, issued before the waits
          if (gi >= uint32_t(kStages)) Prims::mbar_wait(empty0 + 8 * s, (ph - 1) & 1);
          Prims::mbar_wait(wfull0 + 8 * s, ph & 1);
          fp8_convert(A, it, kt, st, sa, lane);
          mbar_arrive(cfull0 + 8 * s);
        }
      }
    }
    return;
  }

  // consumers: warpgroups 1, 2; rows rl, rl + 8 of the tile; this lane quad's K positions t
  cutlass::arch::warpgroup_reg_alloc<kFp8ConsumerRegs>();
  const int cw = (warp - 4) >> 2, g = lane >> 2, t = lane & 3;
  const int rl = 64 * cw + 16 * (warp & 3) + g;
  // this thread's offsets in a stage: weight words of row rl (row rl + 8: + 512), the two table
  // halves of row rl (row rl + 8: + 256, same swizzle), its lane quad's multipliers
  // NOTE: through an empty asm so that ptxas keeps them in registers instead of recomputing them
  // from the thread index in every K tile (40 instructions per stage otherwise)
  int wo = S::kW + rl * 64 + 16 * t, to0 = S::tab(rl, 0), to1 = S::tab(rl, 1), mo = S::kMul + t * S::kMulT * 4;
  asm volatile("" : "+r"(wo), "+r"(to0), "+r"(to1), "+r"(mo));
  static_assert(S::tab(8, 0) - S::tab(0, 0) == 256 && S::tab(8, 1) - S::tab(0, 1) == 256, "row rl + 8's tables");
  const uint64_t desc0 = desc_sw128(smem_base + S::kAct);
  float tot[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) part[i] = 0.0f;  // written by every wgmma (scale-d 0), read only after
  for (uint32_t item = blockIdx.x; item < items; item += gridDim.x) {
    const Fp8Item it = fp8_item(A, item, nx);
    if (it.grp < 0) continue;
#pragma unroll
    for (int i = 0; i < 64; ++i) tot[i] = 0.0f;
    for (int64_t kt = 0; kt < it.nkt; ++kt, ++gi) {
      const uint32_t s = gi % kStages, ph = gi / kStages;
      Prims::mbar_wait(wfull0 + 8 * s, ph & 1);
      Prims::mbar_wait(cfull0 + 8 * s, ph & 1);
      const uint8_t* st = smem + s * S::kBytes;
      const uint4 W0 = lds128(st + wo), W1 = lds128(st + wo + 512);  // words of blocks 0..3, rows rl, rl + 8
      const uint4 T00 = lds128(st + to0), T01 = lds128(st + to1), T10 = lds128(st + to0 + 256),
                  T11 = lds128(st + to1 + 256);
      const uint32_t slow = *reinterpret_cast<const uint32_t*>(st + S::kFlags);
      const uint64_t dstage = desc0 + uint64_t((s * S::kBytes) >> 4);
      uint32_t a[2][4];
      auto decode = [&](int b, uint32_t(&f)[4]) {
        const uint32_t x0 = u4_at(W0, b), x1 = u4_at(W1, b);
        const uint4& Ta = b < 2 ? T00 : T01;
        const uint4& Tb = b < 2 ? T10 : T11;
        const uint32_t lo0 = u4_at(Ta, 2 * (b & 1)), hi0 = u4_at(Ta, 2 * (b & 1) + 1);
        const uint32_t lo1 = u4_at(Tb, 2 * (b & 1)), hi1 = u4_at(Tb, 2 * (b & 1) + 1);
        f[0] = fp8::decode_a(x0, lo0, hi0);  // row g, K 4t .. 4t+3
        f[1] = fp8::decode_a(x1, lo1, hi1);  // row g + 8
        f[2] = fp8::decode_b(x0, lo0, hi0);  // row g, K 16+4t .. 16+4t+3
        f[3] = fp8::decode_b(x1, lo1, hi1);  // row g + 8
      };
      decode(0, a[0]);
#pragma unroll
      for (int b = 0; b < S::kBlocks; ++b) {
#pragma unroll
        for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(part[i]);
#pragma unroll
        for (int i = 0; i < 4; ++i) cute::warpgroup_fence_operand(a[b & 1][i]);
        cute::warpgroup_arrive();
        fp8_wgmma<kE5M2>(a[b & 1], dstage + uint64_t(2 * b), part, std::make_index_sequence<64>{});
        cute::warpgroup_commit_batch();
        if (b + 1 < S::kBlocks) {  // under the wgmma: the fence keeps the decode before the wait
          decode(b + 1, a[(b + 1) & 1]);
#pragma unroll
          for (int i = 0; i < 4; ++i) cute::warpgroup_fence_operand(a[(b + 1) & 1][i]);
        }
        cute::warpgroup_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(part[i]);
        const float* mp = reinterpret_cast<const float*>(st + mo + b * S::kMulBlock);
        if (!((slow >> b) & 1u)) {  // CTA-uniform: the fold holds for the whole block
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const float4 m = *reinterpret_cast<const float4*>(mp + 4 * q);
            const int j = 8 * q;  // accumulators of token columns 16q + 2t (+1) and 16q + 8 + 2t (+1)
            tot[j + 0] = __fmaf_rn(part[j + 0], m.x, tot[j + 0]);
            tot[j + 1] = __fmaf_rn(part[j + 1], m.y, tot[j + 1]);
            tot[j + 2] = __fmaf_rn(part[j + 2], m.x, tot[j + 2]);
            tot[j + 3] = __fmaf_rn(part[j + 3], m.y, tot[j + 3]);
            tot[j + 4] = __fmaf_rn(part[j + 4], m.z, tot[j + 4]);
            tot[j + 5] = __fmaf_rn(part[j + 5], m.w, tot[j + 5]);
            tot[j + 6] = __fmaf_rn(part[j + 6], m.z, tot[j + 6]);
            tot[j + 7] = __fmaf_rn(part[j + 7], m.w, tot[j + 7]);
          }
        } else {  // slow form: the rows' own 2^(s - 127) first
          const float r0 = __uint_as_float(fp8::row_mult_bits(st[S::kWS + rl * 4 + b]));
          const float r1 = __uint_as_float(fp8::row_mult_bits(st[S::kWS + (rl + 8) * 4 + b]));
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const float4 m = *reinterpret_cast<const float4*>(mp + 4 * q);
            const int j = 8 * q;
            tot[j + 0] = __fmaf_rn(__fmul_rn(part[j + 0], r0), m.x, tot[j + 0]);
            tot[j + 1] = __fmaf_rn(__fmul_rn(part[j + 1], r0), m.y, tot[j + 1]);
            tot[j + 2] = __fmaf_rn(__fmul_rn(part[j + 2], r1), m.x, tot[j + 2]);
            tot[j + 3] = __fmaf_rn(__fmul_rn(part[j + 3], r1), m.y, tot[j + 3]);
            tot[j + 4] = __fmaf_rn(__fmul_rn(part[j + 4], r0), m.z, tot[j + 4]);
            tot[j + 5] = __fmaf_rn(__fmul_rn(part[j + 5], r0), m.w, tot[j + 5]);
            tot[j + 6] = __fmaf_rn(__fmul_rn(part[j + 6], r1), m.z, tot[j + 6]);
            tot[j + 7] = __fmaf_rn(__fmul_rn(part[j + 7], r1), m.w, tot[j + 7]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
    // epilogue: this thread's rows R, R + 8 for its tokens 8j + 2t + h (bf16 / fp16, the plain
    // grouped GEMM's epilogue: the FP8 path has no bias or SwiGLU mode)
    const int64_t R = it.x * kRows + rl;
    const bool ok0 = R < A.N, ok1 = R + 8 < A.N, bf16 = A.out_dtype == DType::kBFloat16;
    uint16_t* out = static_cast<uint16_t*>(A.out) + R + A.o_offset(it.grp) * A.o_sM;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = it.m0 + 8 * j + 2 * t + h;
        if (m >= it.m1) continue;
        const float v0 = tot[4 * j + h], v1 = tot[4 * j + 2 + h];
        if (ok0) out[m * A.o_sM] = bf16 ? encode_bf16(v0) : encode_fp16(v0);
        if (ok1) out[m * A.o_sM + 8] = bf16 ? encode_bf16(v1) : encode_fp16(v1);
      }
    }
  }
}

}  // namespace
}  // namespace lowbit::cuda
