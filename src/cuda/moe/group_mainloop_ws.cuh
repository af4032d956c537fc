// src/cuda/moe/group_mainloop_ws.cuh: warp-specialized mainloop kernel of the MXFP4 grouped GEMM
// (prepacked weights, TMA producer warp, mbarrier stages).
#pragma once

#include <utility>

#include "cuda/moe/group_mainloop.cuh"

namespace lowbit::cuda {
namespace {

/// Warp-specialized form of the packed kernel at kTileK = 256 (kTileN = 16, 32: the decode shapes). Warp 8
/// produces: one TMA per stage for the 128-row x 256-K weight tile (SWIZZLE_128B gives the same
/// shared image as the cp.async kernel: 16-byte chunk c of stored row r at chunk c ^ (r & 7)), kTileK/64
/// TMA for the activation atoms and one 8-byte cp.async per row for the scale bytes, into kStages stages
/// guarded by full / empty mbarriers. Warpgroups 0 and 1 consume at their own pace (no CTA barrier
/// in the K loop) and split each stage into kBatches batches: batch b + 1 is decoded while the wgmma of
/// batch b runs. Prims: the TMA load and mbarrier wait (LocalPrims or CutlassPrims,
/// sm90_gemm_common.cuh).
/// kItems: the CTA loops over work items (see group_gemm_kernel); the stages and their barrier
/// phases then run on across the items.
template <int kTileN, int kStages, int kBatches, bool kItems, class Prims = DefaultPrims>
__global__ void __launch_bounds__(288, 2)
    group_gemm_ws_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_a, GroupArgs A) {
  constexpr int kTileK = 256;
  using SS = StageShape<kTileK>;
  constexpr int kActBytes = kTileN * kTileK * 2;
  constexpr int kSBytes = kRows * 8;  // scale bytes of the tile: row r at r * 8
  constexpr int kStageBytes = (kActBytes + SS::kWBytes + kSBytes + 1023) / 1024 * 1024;
  constexpr int kSteps = kTileK / 16, kPer = kSteps / kBatches;
  static_assert(kSteps % kBatches == 0, "kBatches divides the k16 steps of a stage");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ int64_t s_work[3];                        // group, tile, next work item
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[kStages], then empty[kStages]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (!A.pdl) griddep_wait();  // m_indptr / weights may come from the previous kernel
  if (kItems && tid == 0) {
    s_work[2] = blockIdx.y;
  } else if (tid == 32) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bars[s]), 1 + 32);  // the producer's expect_tx arrival + 32 lanes' scale copies
      mbar_init(smem_u32(&bars[kStages + s]), 8);   // the 8 consumer warps
    }
    mbar_init_fence();
  }
  const uint32_t smem_base = smem_u32(smem);
  const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[kStages]);
  const int g = lane >> 2, t = lane & 3;
  const int rl = 64 * (warp >> 2) + 16 * (warp & 3) + g;  // consumer rows rl, rl + 8
  // kItems: work items y = blockIdx.y, + gridDim.y, ... below A.max_tiles. The stages and their
  // barrier phases run on across the items: `pipe` counts the pipeline iterations of the CTA's
  // earlier items (stage = iteration % kStages, phase = iteration / kStages), in the producer and in
  // every consumer alike.
  uint32_t pipe = 0;
  for (;;) {
  if (tid < 32) claim_tile<kItems>(A, kTileN, lane, s_work);
  __syncthreads();
  const int64_t grp = s_work[0];
  if (grp < 0) return;
  const int64_t m0 = A.bound(grp) + s_work[1] * kTileN;
  const int64_t gend = A.bound(grp + 1);
  const int64_t m1 = m0 + kTileN < gend ? m0 + kTileN : gend;
  const int64_t R0 = int64_t(blockIdx.x) * kRows;
  const int split = int(blockIdx.z);
  const int64_t kTiles = (A.K + kTileK - 1) / kTileK;
  const int64_t kt0 = int64_t(split) * A.kt_per_split;
  const int64_t kt1 = kt0 + A.kt_per_split < kTiles ? kt0 + A.kt_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;

  float acc[kTileN / 2];
#pragma unroll
  for (int i = 0; i < kTileN / 2; ++i) acc[i] = 0.0f;

  if (warp == 8) {  // producer
    const int32_t wy = int32_t(grp * mxfp4_packed_rows(A.N) + R0);
    const uint8_t* srow[kRows / 32];
#pragma unroll
    for (int j = 0; j < kRows / 32; ++j) srow[j] = A.bs + grp * A.bs_sG + (R0 + lane + 32 * j) * A.bs_sN;
    // K tile it of this item into pipeline iteration pipe + it
    auto weights = [&](int64_t it) {  // the stage's weight TMA (with the whole stage's byte count), scales
      const uint32_t s = (pipe + uint32_t(it)) % kStages;
      const uint32_t st = smem_base + s * uint32_t(kStageBytes), full = full0 + 8 * s;
      if (lane == 0) {
        mbar_arrive_expect_tx(full, uint32_t(SS::kWBytes + kActBytes));
        Prims::tma_load_2d(st + kActBytes, &tm_w, int32_t((kt0 + it) * (kTileK / 2)), wy, full);
      }
#pragma unroll
      for (int j = 0; j < kRows / 32; ++j) cp_async8(st + kActBytes + SS::kWBytes + (lane + 32 * j) * 8, srow[j] + (kt0 + it) * 8);
      mbar_cp_async_arrive(full);
    };
    auto acts = [&](int64_t it) {
      const uint32_t s = (pipe + uint32_t(it)) % kStages;
      const uint32_t st = smem_base + s * uint32_t(kStageBytes), full = full0 + 8 * s;
      if (lane == 0)
#pragma unroll
        for (int c = 0; c < kTileK / 64; ++c)
          Prims::tma_load_2d(st + c * kTileN * 128, &tm_a, int32_t((kt0 + it) * kTileK + 64 * c), int32_t(m0), full);
    };
    // the CTA's first item: the first stages' weights before waiting for the pre-pass
    const int64_t npro = pipe == 0 ? (nkt < kStages ? nkt : kStages) : 0;
    for (int64_t it = 0; it < npro; ++it) weights(it);
    griddep_wait();  // the activations come from the pre-pass
    for (int64_t it = 0; it < npro; ++it) acts(it);
    for (int64_t it = npro; it < nkt; ++it) {
      const uint32_t gi = pipe + uint32_t(it);  // a stage's earlier use must be consumed first
      if (gi >= uint32_t(kStages)) Prims::mbar_wait(empty0 + 8 * (gi % kStages), (gi / kStages - 1) & 1);
      weights(it);
      acts(it);
    }
  } else {  // consumers
    // stored rows of kernel rows rl, rl + 8 (kEpiSwiglu: gate / up rows of one feature)
    const int sr0 = int(A.wrow(R0 + rl) - R0), sr1 = int(A.wrow(R0 + rl + 8) - R0);
    // offsets in a stage of this thread's scale words (the two MX blocks of a row: bytes 2 (t & 1),
    // + 1 of the row's word t >> 1) and of its weight chunks 2t, 2t + 1 of both rows (swizzled)
    const uint32_t so0 = uint32_t(kActBytes + SS::kWBytes + sr0 * 8 + 4 * (t >> 1));
    const uint32_t so1 = uint32_t(kActBytes + SS::kWBytes + sr1 * 8 + 4 * (t >> 1));
    uint32_t wo0[2], wo1[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      wo0[i] = uint32_t(kActBytes + sr0 * 128 + (((2 * t + i) ^ (sr0 & 7)) << 4));
      wo1[i] = uint32_t(kActBytes + sr1 * 128 + (((2 * t + i) ^ (sr1 & 7)) << 4));
    }
    const uint64_t desc0 = desc_sw128(smem_base);
    for (int64_t it = 0; it < nkt; ++it) {
      const uint32_t gi = pipe + uint32_t(it);
      const int s = int(gi % kStages);
      Prims::mbar_wait(full0 + uint32_t(8 * s), (gi / kStages) & 1);
      const uint8_t* st = smem + s * kStageBytes;
      const uint32_t u0 = *reinterpret_cast<const uint32_t*>(st + so0);
      const uint32_t u1 = *reinterpret_cast<const uint32_t*>(st + so1);
      uint32_t Y0[2], Y1[2];
      bool big = false;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint32_t byte = uint32_t(2 * (t & 1) + b);
        const uint32_t sel = byte | 0x40u | (byte << 8) | 0x4000u;  // the byte in both halves
        Y0[b] = __byte_perm(u0, 0u, sel);
        Y1[b] = __byte_perm(u1, 0u, sel);
        big |= ((Y0[b] & 0xFFu) > kSOne) | ((Y1[b] & 0xFFu) > kSOne);
      }
      const bool wide = __any_sync(0xFFFFFFFFu, big);  // warp-uniform: two-multiply decode of this stage
      uint32_t S0[2], S1[2], E0[2] = {0u, 0u}, E1[2] = {0u, 0u};
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        S0[b] = wide ? scale_lo(Y0[b]) : scale_one(Y0[b]);
        S1[b] = wide ? scale_lo(Y1[b]) : scale_one(Y1[b]);
        if (wide) {
          E0[b] = scale_hi(Y0[b]);
          E1[b] = scale_hi(Y1[b]);
        }
      }
      uint32_t q0[8], q1[8];  // bytes 32t .. 32t + 31 of the two rows (chunks 2t, 2t + 1)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 x0 = *reinterpret_cast<const uint4*>(st + wo0[i]);
        const uint4 x1 = *reinterpret_cast<const uint4*>(st + wo1[i]);
        q0[4 * i] = x0.x; q0[4 * i + 1] = x0.y; q0[4 * i + 2] = x0.z; q0[4 * i + 3] = x0.w;
        q1[4 * i] = x1.x; q1[4 * i + 1] = x1.y; q1[4 * i + 2] = x1.z; q1[4 * i + 3] = x1.w;
      }
      const uint64_t dstage = desc0 + uint64_t((s * kStageBytes) >> 4);
#pragma unroll
      for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
#pragma unroll
      for (int qb = 0; qb < kBatches; ++qb) {
        uint32_t a[kPer][4];
        auto decode = [&](auto wide_t) {
          constexpr bool kWide = decltype(wide_t)::value;
#pragma unroll
          for (int jj = 0; jj < kPer; ++jj) {
            const int j = qb * kPer + jj, q = 2 * (j & 1);
            const uint32_t x0 = q0[j >> 1], x1 = q1[j >> 1], sA = S0[j >> 3], sB = S1[j >> 3];
            a[jj][0] = bmul2(mxfp4_packed_pair(x0, q), sA);
            a[jj][1] = bmul2(mxfp4_packed_pair(x1, q), sB);
            a[jj][2] = bmul2(mxfp4_packed_pair(x0, q + 1), sA);
            a[jj][3] = bmul2(mxfp4_packed_pair(x1, q + 1), sB);
            if constexpr (kWide) {
              const uint32_t eA = E0[j >> 3], eB = E1[j >> 3];
              a[jj][0] = bmul2(bmul2(a[jj][0], eA), kWideUnshift);  // as group_mainloop.cuh
              a[jj][1] = bmul2(bmul2(a[jj][1], eB), kWideUnshift);
              a[jj][2] = bmul2(bmul2(a[jj][2], eA), kWideUnshift);
              a[jj][3] = bmul2(bmul2(a[jj][3], eB), kWideUnshift);
            }
          }
        };
        // NOTE: warp-uniform branch around the decode only: the wgmma below is issued by all four
        // warps of the warpgroup whatever their choice (a wgmma under the branch lost NaN scale bytes)
        if (wide)
          decode(std::true_type{});
        else
          decode(std::false_type{});
        cute::warpgroup_arrive();
#pragma unroll
        for (int jj = 0; jj < kPer; ++jj) {
          const int j = qb * kPer + jj;
          wgmma_call<kTileN>(a[jj], dstage + uint64_t(((j >> 2) * kTileN * 128 + (j & 3) * 32) >> 4), acc,
                         std::make_index_sequence<kTileN / 2>{});
        }
        cute::warpgroup_commit_batch();
        if (qb > 0 && qb + 1 < kBatches) cute::warpgroup_wait<1>();  // batch qb - 1 done: its registers are free again
      }
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + uint32_t(8 * s));
    }
    griddep_wait();  // the epilogue reads the pre-pass's flags
  }
  finish_tile<kTileN, kTileK, kItems>(A, acc, warp < 8, tid, rl, t, grp, m0, m1, R0, split, kt0, kt1);
  if constexpr (!kItems) return;
  pipe += uint32_t(nkt);
  }  // next work item (finish_tile's barrier ended this one's use of s_work)
}

}  // namespace
}  // namespace lowbit::cuda
