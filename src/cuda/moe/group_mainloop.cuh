// src/cuda/moe/group_mainloop.cuh: cp.async mainloop kernel of the MXFP4 grouped GEMM (plain or
// prepacked weights).
#pragma once

#include <utility>

#include "cuda/moe/group_epilogue.cuh"

namespace lowbit::cuda {
namespace {

template <int kTileK>
struct StageShape {
  static constexpr int kWRow = kTileK / 2;                 // FP4 bytes of a row
  static constexpr int kSW = kTileK == 256 ? 3 : 2;        // scale words of a row
  static constexpr int kWBytes = kRows * kWRow;
  static constexpr int kSBytes = kRows * 4 * kSW;
  static constexpr int kBlocks = kTileK / 32;              // MX blocks of a row
  /// Stored 16-byte chunk of chunk c of weight row `row` in a stage: XOR-swizzled by the row, so
  /// that the 8 rows a wgmma fragment load touches at once fall in different banks.
  __device__ static constexpr int chunk(int row, int c) { return c ^ (row & (kTileK / 32 - 1)); }
};

/// kPackedB: weights and scales in the prepacked layout (lowbit/mxfp4_pack.hpp): rows padded to 128 and K
/// to 256 (no bounds checks on them), one mask (and shift) per decoded bf16x2, the scale bytes of a
/// row's K tile in one aligned copy. kItems: the CTA loops over work items blockIdx.y, + gridDim.y,
/// ... below A.max_tiles (a capped grid, GroupArgs::cap_grid); without it a CTA takes the one item
/// blockIdx.y and the code has no item loop (a separate instantiation: the item loop costs the
/// decode path registers and instructions that the single item does not need).
template <int kTileN, int kStages, int kTileK, bool kPackedB, bool kItems>
__global__ void __launch_bounds__(256, 2) group_gemm_kernel(GroupArgs A) {
  using SS = StageShape<kTileK>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kActBytes = kTileN * kTileK * 2;  // kTileK/64 swizzle atoms of kTileN rows x 128 B
  constexpr int kStageBytes = (kActBytes + SS::kWBytes + SS::kSBytes + 1023) / 1024 * 1024;
  constexpr int kSteps = kTileK / 16;
  __shared__ int64_t s_work[3];  // group, tile, next work item (kItems)

  if (!A.pdl) griddep_wait();  // m_indptr / weights may come from the previous kernel
  // kItems: the next work item lives in shared memory, not in a register across the tile (the
  // kernel is at its register bound).
  if (kItems && threadIdx.x == 0) s_work[2] = blockIdx.y;
  for (;;) {
  // NOTE (kItems): the thread and block indices pass through an empty asm per item, so that nothing
  // derived from them is hoisted out of the item loop and kept live across the K loop: with the
  // hoisting, ptxas spilled inside the K loop of 4 of the 6 tile shapes.
  int tid_l = int(threadIdx.x), bx_l = int(blockIdx.x), bz_l = int(blockIdx.z);
  if constexpr (kItems) asm volatile("" : "+r"(tid_l), "+r"(bx_l), "+r"(bz_l));
  const int tid = tid_l, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  if (tid < 32) claim_tile<kItems>(A, kTileN, lane, s_work);
  __syncthreads();
  const int64_t grp = s_work[0];
  if (grp < 0) return;
  const int64_t m0 = A.bound(grp) + s_work[1] * kTileN;
  const int64_t gend = A.bound(grp + 1);
  const int64_t m1 = m0 + kTileN < gend ? m0 + kTileN : gend;
  const int64_t R0 = int64_t(bx_l) * kRows;
  const int split = bz_l;
  const int64_t kTiles = (A.K + kTileK - 1) / kTileK;
  const int64_t KG = A.K / 32;  // MX blocks per row
  const int64_t kt0 = int64_t(split) * A.kt_per_split;
  const int64_t kt1 = kt0 + A.kt_per_split < kTiles ? kt0 + A.kt_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;

  // Producer roles: weight pieces (16 B), scale words (4 B), activation pieces (16 B).
  constexpr int kWPieces = kRows * kTileK / 32, kWIters = kWPieces / 256;
  const uint8_t* wptr[kWIters];
  uint32_t wdst[kWIters];
  int wk[kWIters];  // K element offset of the piece within the tile
  bool wok[kWIters];
#pragma unroll
  for (int j = 0; j < kWIters; ++j) {
    const int i = tid + 256 * j, row = i / (kTileK / 32), c = i % (kTileK / 32);
    const int64_t R = R0 + row;
    wok[j] = kPackedB || R < A.N;  // packed rows are padded to 128
    wptr[j] = A.b + grp * A.b_sG + (wok[j] ? A.wrow(R) : 0) * A.b_sN + c * 16;
    wdst[j] = uint32_t(kActBytes + row * SS::kWRow + SS::chunk(row, c) * 16);
    wk[j] = c * 32;
  }
  constexpr int kSPieces = kRows * SS::kSW, kSIters = (kSPieces + 255) / 256;
  const uint8_t* sptr[kSIters];  // the row's scale byte of MX block 0
  uint32_t sdst[kSIters];
  int sw[kSIters];
  bool sok[kSIters];
#pragma unroll
  for (int j = 0; j < kSIters; ++j) {
    const int i = tid + 256 * j, row = i / SS::kSW;
    sw[j] = i % SS::kSW;
    const int64_t R = R0 + row;
    sok[j] = i < kSPieces && R < A.N;
    sptr[j] = A.wscale_ptr(grp, sok[j] ? A.wrow(R) : 0, 0);
    sdst[j] = uint32_t(kActBytes + SS::kWBytes + row * 4 * SS::kSW + sw[j] * 4);
  }
  constexpr int kAPieces = kTileN * kTileK / 8, kAIters = (kAPieces + 255) / 256;
  const uint16_t* aptr[kAIters];
  uint32_t adst[kAIters];
  bool aok[kAIters], aload[kAIters];
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int i = tid + 256 * j, r = i / (kTileK / 8), c = i % (kTileK / 8);
    const int64_t m = m0 + r;
    aload[j] = i < kAPieces;
    aok[j] = m < m1;
    aptr[j] = A.act + (aok[j] ? m : 0) * A.Kp + c * 8;
    adst[j] = uint32_t((c >> 3) * kTileN * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
  }
  const uint8_t* pk_sptr = kPackedB && tid < kRows ? A.bs + grp * A.bs_sG + A.wrow(R0 + tid) * A.bs_sN : nullptr;
  const uint32_t smem_base = smem_u32(smem);
  auto load_weights = [&](int64_t it) {
    const int64_t kt = kt0 + it;
    const uint32_t st = smem_base + uint32_t((it % kStages) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      cp_async16(st + wdst[j], wptr[j] + uint32_t(kt) * (kTileK / 2), wok[j] && (kPackedB || kt * kTileK + wk[j] < A.K));
    if constexpr (kPackedB) {  // row r's kTileK/32 scale bytes (kTileK = 64: the aligned word of two tiles) at r * 8
      if (tid < kRows) {
        const uint32_t d = st + uint32_t(kActBytes + SS::kWBytes + tid * 8);
        if constexpr (kTileK == 256)
          cp_async8(d, pk_sptr + uint32_t(kt) * 8);
        else
          cp_async4(d, pk_sptr + (kTileK == 64 ? (uint32_t(kt) >> 1) * 4 : uint32_t(kt) * 4), true);
      }
      return;
    }
    const int64_t blk0 = kt * SS::kBlocks;  // first MX block of the tile
#pragma unroll
    for (int j = 0; j < kSIters; ++j) {
      const uint8_t* src;
      bool ok = sok[j];
      if (A.bs_blocked) {  // 4 blocks of a row per aligned word, words of consecutive 4-block groups 512 B apart
        src = sptr[j] + (blk0 / 4 + sw[j]) * 512;
        ok = ok && sw[j] < (kTileK >= 128 ? kTileK / 128 : 1) && (blk0 / 4 + sw[j]) * 4 < KG;
      } else {  // the aligned words covering bytes a .. a + blocks - 1
        const uintptr_t a = reinterpret_cast<uintptr_t>(sptr[j] + blk0);
        const int64_t nvalid = KG - blk0 < SS::kBlocks ? KG - blk0 : SS::kBlocks;
        const uintptr_t w = (a & ~uintptr_t(3)) + 4 * sw[j];
        src = reinterpret_cast<const uint8_t*>(w);
        ok = ok && w <= a + nvalid - 1;
      }
      cp_async4(st + sdst[j], ok ? src : sptr[j], ok);
    }
  };
  auto load_acts = [&](int64_t it) {
    const int64_t kt = kt0 + it;
    const uint32_t st = smem_base + uint32_t((it % kStages) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kAIters; ++j)
      if (aload[j]) cp_async16(st + adst[j], aptr[j] + uint32_t(kt) * kTileK, aok[j]);
  };

  float acc[kTileN / 2];
#pragma unroll
  for (int i = 0; i < kTileN / 2; ++i) acc[i] = 0.0f;

  // Prologue: the first stages' weights and scales, then (behind the pre-pass) their activations.
  // Group s holds the activations of stage s (group 0 also every prologue weight).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < nkt) load_weights(s);
  griddep_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkt) load_acts(s);
    cp_async_commit();
  }

  // Consumer: rows rl and rl + 8 of this CTA; bytes t*kTileK/8 .. +kTileK/8 of each row of a tile.
  const int g = lane >> 2, t = lane & 3;
  const int rl = 64 * wg + 16 * warp + g;
  constexpr int kTB = kTileK / 8;                       // weight bytes of a thread per row
  constexpr int kTBlk = kTileK >= 128 ? kTileK / 128 : 1;   // MX blocks of a thread per row
  const uintptr_t sc_addr0 = reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl < A.N ? A.wrow(R0 + rl) : 0, 0));
  const uintptr_t sc_addr1 =
      reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl + 8 < A.N ? A.wrow(R0 + rl + 8) : 0, 0));
  const uint64_t desc0 = desc_sw128(smem_base);
  for (int64_t it = 0; it < nkt; ++it) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    if (it + kStages - 1 < nkt) {
      load_weights(it + kStages - 1);
      load_acts(it + kStages - 1);
    }
    cp_async_commit();

    const int64_t kt = kt0 + it;
    const uint8_t* st = smem + (it % kStages) * kStageBytes;
    const uint8_t* wt = st + kActBytes;
    uint32_t q0[kTB / 4], q1[kTB / 4];  // this thread's kTB bytes of rows rl and rl + 8 (same swizzle)
    if constexpr (kTileK == 64) {  // half a chunk
      const int off = SS::chunk(rl, t >> 1) * 16 + (t & 1) * 8;
      const uint2 x0 = *reinterpret_cast<const uint2*>(wt + rl * SS::kWRow + off);
      const uint2 x1 = *reinterpret_cast<const uint2*>(wt + (rl + 8) * SS::kWRow + off);
      q0[0] = x0.x; q0[1] = x0.y;
      q1[0] = x1.x; q1[1] = x1.y;
    } else {
#pragma unroll
      for (int i = 0; i < kTB / 16; ++i) {
        const int off = SS::chunk(rl, (kTB / 16) * t + i) * 16;
        const uint4 x0 = *reinterpret_cast<const uint4*>(wt + rl * SS::kWRow + off);
        const uint4 x1 = *reinterpret_cast<const uint4*>(wt + (rl + 8) * SS::kWRow + off);
        q0[4 * i] = x0.x; q0[4 * i + 1] = x0.y; q0[4 * i + 2] = x0.z; q0[4 * i + 3] = x0.w;
        q1[4 * i] = x1.x; q1[4 * i + 1] = x1.y; q1[4 * i + 2] = x1.z; q1[4 * i + 3] = x1.w;
      }
    }
    uint32_t Y0[kTBlk], Y1[kTBlk];  // scale bytes of this thread's MX blocks, in both halves
    if constexpr (kPackedB) {
      // row r's scale bytes at r * 8: this thread's block b is byte `byte` of word `wi`
      const uint32_t* sp0 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + rl * 8);
      const uint32_t* sp1 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + (rl + 8) * 8);
      const int wi = kTileK == 256 ? (t >> 1) : 0;
      const uint32_t w0 = sp0[wi], w1 = sp1[wi];
#pragma unroll
      for (int b = 0; b < kTBlk; ++b) {
        const uint32_t byte = kTileK == 256 ? uint32_t(2 * (t & 1) + b) : kTileK == 128 ? uint32_t(t) : uint32_t(2 * (kt & 1) + (t >> 1));
        const uint32_t sel = byte | 0x40u | (byte << 8) | 0x4000u;  // the byte in both halves
        Y0[b] = __byte_perm(w0, 0u, sel);
        Y1[b] = __byte_perm(w1, 0u, sel);
      }
    } else {
      // scale bytes of this thread's MX blocks (kTBlk per row)
      const uint32_t* sw0 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + rl * 4 * SS::kSW);
      const uint32_t* sw1 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + (rl + 8) * 4 * SS::kSW);
      const uint32_t u00 = sw0[0], u01 = sw0[1], u02 = SS::kSW > 2 ? sw0[SS::kSW - 1] : 0u;
      const uint32_t u10 = sw1[0], u11 = sw1[1], u12 = SS::kSW > 2 ? sw1[SS::kSW - 1] : 0u;
      const int64_t blk0 = kt * SS::kBlocks;
#pragma unroll
      for (int b = 0; b < kTBlk; ++b) {
        // this thread's block within the tile: kTileK = 64: t / 2 (two quads share one); else t * kTBlk + b
        const uint32_t lb = kTileK == 64 ? uint32_t(t >> 1) : uint32_t(t * kTBlk + b);
        uint32_t base0, base1;
        if (A.bs_blocked) {
          base0 = base1 = kTileK == 64 ? uint32_t(2 * (kt & 1)) : 0u;
        } else {
          base0 = uint32_t((sc_addr0 + blk0) & 3);
          base1 = uint32_t((sc_addr1 + blk0) & 3);
        }
        uint32_t sb0 = pick_byte(u00, u01, u02, base0 + lb), sb1 = pick_byte(u10, u11, u12, base1 + lb);
        if (blk0 + lb >= KG) sb0 = sb1 = 0;  // K tail: zero weights, any finite scale
        Y0[b] = sb0 * 0x10001u;
        Y1[b] = sb1 * 0x10001u;
      }
    }
    // NOTE: warp-uniform choice of the decode: one multiply unless a scale byte of the warp's
    // tile is above kSOne.
    bool big = false;
#pragma unroll
    for (int b = 0; b < kTBlk; ++b) big |= ((Y0[b] & 0xFFu) > kSOne) | ((Y1[b] & 0xFFu) > kSOne);

    uint32_t a[kSteps][4];
    auto decode = [&](auto wide) {
      constexpr bool kWide = decltype(wide)::value;
      uint32_t S0[kTBlk], S1[kTBlk], E0[kTBlk], E1[kTBlk];
#pragma unroll
      for (int b = 0; b < kTBlk; ++b) {
        S0[b] = kWide ? scale_lo(Y0[b]) : scale_one(Y0[b]);
        S1[b] = kWide ? scale_lo(Y1[b]) : scale_one(Y1[b]);
        if constexpr (kWide) {
          E0[b] = scale_hi(Y0[b]);
          E1[b] = scale_hi(Y1[b]);
        }
      }
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        const uint32_t x0 = q0[j >> 1], x1 = q1[j >> 1];
        const int bi = (j * kTBlk) / kSteps;
        const uint32_t sA = S0[bi], sB = S1[bi];
        uint32_t p0, p1, p2, p3;
        if constexpr (kPackedB) {  // pairs 2(j&1) (K elements +4j, +1) and 2(j&1)+1 (+2, +3) of the word
          const int q = 2 * (j & 1);
          p0 = mxfp4_packed_pair(x0, q);
          p1 = mxfp4_packed_pair(x1, q);
          p2 = mxfp4_packed_pair(x0, q + 1);
          p3 = mxfp4_packed_pair(x1, q + 1);
        } else {
          const uint32_t b = 2 * (j & 1);  // byte of K elements +4j, +1; byte b + 1: +2, +3
          const uint32_t lo_sel = b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12);
          const uint32_t hi_sel = lo_sel + 0x1111u;
          p0 = e2m1x2_to_bf16x2_tiny(__byte_perm(x0, x0 >> 4, lo_sel));
          p1 = e2m1x2_to_bf16x2_tiny(__byte_perm(x1, x1 >> 4, lo_sel));
          p2 = e2m1x2_to_bf16x2_tiny(__byte_perm(x0, x0 >> 4, hi_sel));
          p3 = e2m1x2_to_bf16x2_tiny(__byte_perm(x1, x1 >> 4, hi_sel));
        }
        a[j][0] = bmul2(p0, sA);
        a[j][1] = bmul2(p1, sB);
        a[j][2] = bmul2(p2, sA);
        a[j][3] = bmul2(p3, sB);
        if constexpr (kWide) {  // the weight itself (Inf past fp32's range), then * 2^-kWShift
          a[j][0] = bmul2(bmul2(a[j][0], E0[bi]), kWideUnshift);
          a[j][1] = bmul2(bmul2(a[j][1], E1[bi]), kWideUnshift);
          a[j][2] = bmul2(bmul2(a[j][2], E0[bi]), kWideUnshift);
          a[j][3] = bmul2(bmul2(a[j][3], E1[bi]), kWideUnshift);
        }
      }
    };
    // NOTE: the choice is warp-uniform, not warpgroup-uniform: only the decode may sit under it;
    // every wgmma stays in code that all four warps of the warpgroup execute.
    if (__any_sync(0xFFFFFFFFu, big))
      decode(std::true_type{});
    else
      decode(std::false_type{});
    // descriptor of this stage's activation tile: the stage-0 descriptor plus the stage offset in
    // its 16-byte address field (no carry out of the field: shared addresses are below 2^18)
    const uint64_t dstage = desc0 + uint64_t(((it % kStages) * kStageBytes) >> 4);
#pragma unroll
    for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int j = 0; j < kSteps; ++j)
      wgmma_call<kTileN>(a[j], dstage + uint64_t(((j >> 2) * kTileN * 128 + (j & 3) * 32) >> 4), acc,
                     std::make_index_sequence<kTileN / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < kTileN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cp_async_wait<0>();

  finish_tile<kTileN, kTileK, kItems>(A, acc, true, tid, rl, t, grp, m0, m1, R0, split, kt0, kt1);
  if constexpr (!kItems) return;
  }  // next work item (finish_tile's barrier ended this one's use of shared memory and of s_work)
}

}  // namespace
}  // namespace lowbit::cuda
