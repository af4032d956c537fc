// src/cuda/moe/sm90_mxfp4_group_gemm.cu: MXFP4-weight grouped GEMM for MoE on sm_90a, and the
// gpt-oss expert MLP built on it.
//
//   out[m, n] = sum_k A[m, k] * B[g][n, k]      for the rows m of group g (m_indptr)
//
// Exactness. Weights e2m1 * 2^(s-127) and MXFP8 activations e4m3/e5m2 * 2^(s-127) are exact in
// bf16 (bf16 has fp32's exponent range), bf16 x bf16 products are exact in fp32, so a bf16 wgmma
// with fp32 accumulation rounds only in the accumulation, like the fp32 reference.
//  * Weights are decoded in registers as w * 2^-5 = bf16(e2m1 * 2^-126) * bf16(2^(s-6)): one
//    multiply, exact for every scale byte s in [0, 133]; a warp whose K tile holds a larger scale
//    byte decodes that tile with two multiplies (2^(min(s,133)-6), then 2^(max(s,133)-133)), exact
//    for every s in [0, 254] (e2m1 * 2^(s-132) spans 2^-133 .. 1.5 * 2^125, inside bf16's range with
//    its subnormals). The epilogue multiplies the fp32 accumulator by 2^5 (exact). Every finite
//    weight scale byte runs on the tensor cores.
//  * MXFP8 activations: the pre-pass writes each row times 2^ka, ka = max(0, lo - the row's
//    smallest scale byte) (lo = 3 for E4M3, 10 for E5M2), so that every element is a bf16-exact
//    multiple of 2^-133; the epilogue multiplies the row's sums by 2^-ka. Only a row that spans more
//    than bf16's range (a scale byte below lo and values within 2^ka of bf16's top in one row)
//    sends the CTAs of its rows to an exact fp32 CUDA-core recomputation from the original operands.
//  * m_indptr may come from the device and is not validated there: every kernel clamps its bounds
//    to [0, M] (M = activation rows) and stored scale rows to the scale buffer, so a wrong m_indptr
//    gives wrong rows, never an access outside the given buffers.
//  * Activations are dequantized once by a pre-pass into bf16 rows in the kernel's K order.
//
// Design ("swap AB", as the dual GEMM): 128 weight rows per CTA (2 warpgroups x 64, wgmma M),
// NT tokens of one group (wgmma N, 16..128). The weights are read in their plain [G, N, K/2]
// layout: within each 64-wide K tile, thread quad t of a wgmma row pair takes the 8 contiguous
// bytes 8t..8t+7 (K elements 16t..16t+15, all in MX block t/2), and the activation pre-pass puts
// K elements in the matching order (act_pos), so no weight prepack is needed. The grid is a host
// upper bound of (row block, token tile, K split); each CTA finds its (group, tile) from m_indptr
// on the device (no host sync) and exits if it has none. Weights prepacked by
// group_gemm_mxfp4_prepack (lowbit/mxfp4_pack.hpp) decode with fewer instructions; with 16 or 32
// tokens per tile they run the warp-specialized kernel (TMA producer warp, mbarrier stages).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "cuda/gemm/launch_gemm.hpp"
#include "cuda/common/sm90_gemm_common.cuh"
#include "cuda/common/workspace.cuh"
#include "cuda/moe/heuristics.hpp"
#include "lowbit/block_quant.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/mxfp4_pack.hpp"

namespace lowbit::cuda {
using namespace lowbit::detail;
using namespace lowbit::cuda::gemm;

namespace {

constexpr int kRows = moe::kGroupRows;  // weight rows per CTA
/// Weights enter the tensor cores as w * 2^-kWShift (see the file comment); the epilogue undoes it.
constexpr int kWShift = 5;
constexpr float kWUnshift = float(1 << kWShift);
/// Largest scale byte whose 2^(s - 1 - kWShift) is a normal bf16 (one-multiply decode).
constexpr uint32_t kSOne = 127u + 1u + kWShift;  // 133

/// bf16x2 multipliers of scale bytes y (a byte in bits 0..7 and one in 16..23): `one` = 2^(s-6)
/// (valid for s <= 133), `lo` = 2^(min(s,133)-6) and `hi` = 2^(max(s,133)-133), NaN for the NaN
/// byte 255 (lo * hi: every byte).
__device__ __forceinline__ uint32_t scale_one(uint32_t y) { return (y + 0x00010001u * (126u - kWShift)) << 7; }
__device__ __forceinline__ uint32_t scale_lo(uint32_t y) { return scale_one(__vminu2(y, 0x00010001u * kSOne)); }
__device__ __forceinline__ uint32_t scale_hi(uint32_t y) {
  const uint32_t h = (__vmaxu2(y, 0x00010001u * kSOne) - 0x00010001u * (kSOne - 127u)) << 7;
  const uint32_t nan = ((y + 0x00010001u) >> 8) & 0x00010001u;  // 1 in a half holding byte 255
  return h | (nan * 0x7FC0u);
}

/// Position, within its KT-wide block (KT = 64, 128 or 256: the K tile of a pipeline stage) of a
/// kernel activation row, of K element k of the block: in wgmma k16 step j, lane quad t reads the
/// elements t * KT/4 + 4j .. + 3, so each thread's weight bytes of a stage are contiguous.
__host__ __device__ constexpr int act_pos(int k, int KT) {
  const int q = KT / 4, t = k / q, r = k % q, w = r & 3;
  return 16 * (r >> 2) + (w < 2 ? 2 * t + w : 8 + 2 * t + w - 2);
}
/// act_pos of element k of a whole row.
__host__ __device__ constexpr int64_t act_index(int64_t k, int KT) {
  return (k & ~int64_t(KT - 1)) + act_pos(int(k & (KT - 1)), KT);
}

enum EpiMode : int {
  kEpiPlain = 0,   ///< out[m, n] = acc (out dtype)
  kEpiSwiglu = 1,  ///< gpt-oss: rows 2f / 2f+1 are gate / up of feature f; bias, clamped SwiGLU
  kEpiBias = 2,    ///< out[m, n] = acc + bias[g, n] (fp32)
};

struct GroupArgs {
  int64_t M = 0, N = 0, K = 0, G = 0, Kp = 0;  ///< N: weight rows; Kp: act row pitch (K rounded to KT)
  int NT = 16, KT = 64;                          ///< tokens per CTA, K per stage
  const uint8_t* b = nullptr;
  int64_t b_sG = 0, b_sN = 0;
  bool packed = false;  ///< b / bs from group_gemm_mxfp4_prepack (lowbit/mxfp4_pack.hpp; bs row-major)
  const uint8_t* bs = nullptr;  ///< weight scales
  bool bs_blocked = false;      ///< 128x4 (spb) or row-major (bs_sG, bs_sN)
  int64_t bs_sG = 0, bs_sN = 0;
  ScalePlan spb;
  const void* m_indptr = nullptr;
  bool indptr64 = false;
  const uint16_t* act = nullptr;      ///< [M][Kp] bf16 in act_pos order
  const uint8_t* tok_flag = nullptr;  ///< [M][Kp/64]: 1 = a block the bf16 pre-pass could not hold exactly
  const float* tok_scale = nullptr;   ///< [M]: 2^(kWShift - ka) of each row (MXFP8 A; null: 2^kWShift)
  int strip = 1;                      ///< pre-pass: 64-wide K blocks per warp item
  // Exact fallback sources: the original A (MXFP8 codes + scales or bf16); null: read `act`.
  const void* a = nullptr;
  DType a_dtype = DType::kBFloat16;
  int64_t a_sM = 0;
  const uint8_t* a_scale = nullptr;
  ScalePlan spa;
  // Epilogue
  int mode = kEpiPlain;
  void* out = nullptr;
  DType out_dtype = DType::kBFloat16;
  int64_t o_sM = 0;
  bool out_act_layout = false;  ///< kEpiSwiglu: write bf16 in act_pos order (the next GEMM's A)
  int out_kt = 64;              ///< that GEMM's KT
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  int64_t bias_sG = 0;
  float alpha = 1.702f, limit = 7.0f;
  bool pdl = false;  ///< launched behind the activation pre-pass: weights are fetched before waiting for it
  float* ws = nullptr;  ///< split-K partials [splits][M][N]
  int splits = 1;
  int kt_per_split = 0;

  /// m_indptr[g] clamped to [0, M]: a device m_indptr is not validated, the kernels stay in bounds.
  __device__ int64_t bound(int64_t g) const {
    const int64_t v = indptr64 ? static_cast<const int64_t*>(m_indptr)[g] : int64_t(static_cast<const int32_t*>(m_indptr)[g]);
    return v < 0 ? 0 : (v > M ? M : v);
  }
  /// Stored row of activation row m in a_scale, clamped to the rows the caller allocated.
  __device__ int64_t a_scale_row(int64_t m) const {
    const int64_t r = spa.stored_row(m);
    return r < 0 ? 0 : (r >= spa.rows_pad ? spa.rows_pad - 1 : r);
  }
  /// Stored weight row of kernel row R (kEpiSwiglu: rows R, R+8 of each 16 are gate/up of one feature).
  __host__ __device__ int64_t wrow(int64_t R) const {
    if (mode != kEpiSwiglu) return R;
    const int64_t i = R & 15;
    return (R & ~int64_t(15)) + (i < 8 ? 2 * i : 2 * (i - 8) + 1);
  }
  __device__ const uint8_t* wscale_ptr(int64_t g, int64_t n, int64_t c) const {
    return bs_blocked ? bs + spb.offset(g, n, c) : bs + g * bs_sG + n * bs_sN + c;
  }
  __device__ float weight(int64_t g, int64_t n, int64_t k) const {
    const uint32_t code = mxfp4_row_code(b + g * b_sG + n * b_sN, k, packed);
    return decode_e2m1(uint8_t(code)) * decode_ue8m0(*wscale_ptr(g, n, k >> 5));
  }
};

// ------------------------------------------------------------------------------------------
// Activation pre-pass: A (MXFP8 or bf16) -> bf16 [M][Kp] in act_pos order, zero beyond K.

__device__ __forceinline__ uint32_t act_pair_bf16(float v0, float v1) {
  return uint32_t(encode_bf16(v0)) | (uint32_t(encode_bf16(v1)) << 16);
}

/// The row's shift into bf16's range (see the file comment): 2^ka, ka = max(0, lo - the row's
/// smallest scale byte). Warp-wide; the loads are issued together (one round trip for K <= 8192).
__device__ __forceinline__ float act_row_shift(const GroupArgs& A, int64_t srow, int lo, int lane) {
  const int64_t kb = A.K / 32;
  uint32_t mn = 255u;
  for (int64_t c0 = 0; c0 < kb; c0 += 8 * 32) {
    uint32_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = c0 + 32 * i + lane;
      v[i] = c < kb ? A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, c)] : 255u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) mn = v[i] < mn ? v[i] : mn;
  }
  mn = __reduce_min_sync(0xFFFFFFFFu, mn);
  return float(1 << (int(mn) < lo ? lo - int(mn) : 0));
}

/// One warp per (row, strip of A.strip 64-wide K blocks); lane l handles K elements 2l, 2l+1 of
/// each block. MXFP8 rows are multiplied by their shift (exact); tok_scale gets 2^kWShift / shift.
__global__ void act_prepass_kernel(GroupArgs A) {
  griddep_launch_dependents();  // the GEMM may start fetching weights meanwhile
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int64_t kblocks = A.Kp / 64, strips = (kblocks + A.strip - 1) / A.strip;
  const int lo = A.a_dtype == DType::kE4M3 ? 3 : 10;  // bf16 holds e4m3 / e5m2 * 2^(s-127) exactly for s >= lo
  const bool e4 = A.a_dtype == DType::kE4M3;
  auto bf16_inexact = [](float v) { return v == v && decode_bf16(encode_bf16(v)) != v; };
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < A.M * strips; item += warps) {
    const int64_t m = item / strips, b0 = (item % strips) * A.strip;
    const int64_t b1 = b0 + A.strip < kblocks ? b0 + A.strip : kblocks;
    int64_t srow = 0;
    float up = 1.0f;
    if (A.a_scale) {
      srow = A.a_scale_row(m);
      up = act_row_shift(A, srow, lo, lane);
      if (A.tok_scale && b0 == 0 && lane == 0) const_cast<float*>(A.tok_scale)[m] = kWUnshift / up;
    }
    for (int64_t kb = b0; kb < b1; ++kb) {
      const int64_t k = kb * 64 + 2 * lane;
      float v0 = 0.0f, v1 = 0.0f;
      bool inexact = false;
      if (k < A.K) {
        if (A.a_scale) {
          const uint8_t* src = static_cast<const uint8_t*>(A.a) + m * A.a_sM + k;
          const uint8_t s = A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, k >> 5)];
          const float sc = decode_ue8m0(s) * up;  // exact
          v0 = (e4 ? decode_e4m3(src[0]) : decode_e5m2(src[0])) * sc;
          v1 = (e4 ? decode_e4m3(src[1]) : decode_e5m2(src[1])) * sc;
          // NOTE: exact in fp32; NaN stays NaN. bf16 misses it only in a row spanning more than
          // bf16's range (a scale byte below lo and one near the top in the same row).
          inexact = bf16_inexact(v0) || bf16_inexact(v1);
        } else {
          const uint16_t* src = static_cast<const uint16_t*>(A.a) + m * A.a_sM + k;
          v0 = decode_bf16(src[0]);
          v1 = decode_bf16(src[1]);
        }
      }
      reinterpret_cast<uint32_t*>(const_cast<uint16_t*>(A.act) + m * A.Kp)[act_index(k, A.KT) >> 1] = act_pair_bf16(v0, v1);
      // one flag byte per (row, K block): the GEMM checks the blocks of its rows
      inexact = __any_sync(0xFFFFFFFFu, inexact);
      if (A.tok_flag && lane == 0) const_cast<uint8_t*>(A.tok_flag)[m * kblocks + kb] = inexact ? 1 : 0;
    }
  }
}

// ------------------------------------------------------------------------------------------
// Main kernel

/// Warp-wide: the (group, token tile) of work item y, from m_indptr. False: no such item.
__device__ bool find_tile(const GroupArgs& A, int NT, int64_t y, int64_t* grp, int64_t* tile) {
  const int lane = threadIdx.x & 31;
  int64_t base = 0;
  for (int64_t c = 0; c < A.G; c += 32) {
    const int64_t gi = c + lane;
    const int64_t cnt = gi < A.G ? A.bound(gi + 1) - A.bound(gi) : 0;
    const int64_t tiles = cnt > 0 ? (cnt + NT - 1) / NT : 0;
    int64_t inc = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, o);
      if (lane >= o) inc += v;
    }
    const int64_t total = __shfl_sync(0xFFFFFFFFu, inc, 31);
    if (y < base + total) {
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, y < base + inc);
      const int L = __ffs(hit) - 1;
      const int64_t excl = __shfl_sync(0xFFFFFFFFu, inc - tiles, L);
      *grp = c + L;
      *tile = y - base - excl;
      return true;
    }
    base += total;
  }
  return false;
}

/// Exact fp32 recomputation of one accumulator entry (row R, token m) over K elements [k0, k1).
__device__ float exact_dot(const GroupArgs& A, int64_t g, int64_t R, int64_t m, int64_t k0, int64_t k1) {
  const int64_t n = A.wrow(R);
  const int64_t srow = (A.a && A.a_scale) ? A.a_scale_row(m) : 0;
  float acc = 0.0f, sa = 1.0f;
  for (int64_t k = k0; k < k1; ++k) {
    float av;
    if (A.a) {
      if (A.a_scale) {
        if ((k & 31) == 0 || k == k0)
          sa = decode_ue8m0(A.a_scale[scale_offset(A.spa.layout, A.spa.rows_pad, A.spa.cols, srow, k >> 5)]);
        const uint8_t c = static_cast<const uint8_t*>(A.a)[m * A.a_sM + k];
        av = (A.a_dtype == DType::kE4M3 ? decode_e4m3(c) : decode_e5m2(c)) * sa;
      } else {
        av = decode_bf16(static_cast<const uint16_t*>(A.a)[m * A.a_sM + k]);
      }
    } else {
      av = decode_bf16(A.act[m * A.Kp + act_index(k, A.KT)]);
    }
    acc = fmaf(A.weight(g, n, k), av, acc);
  }
  return acc;
}

__device__ __forceinline__ float load_bias(const GroupArgs& A, int64_t g, int64_t n) {
  return load_float(A.bias, A.bias_dtype, g * A.bias_sG + n);
}

/// gpt-oss clamped SwiGLU of one feature (FORMATS.md section 8), as the reference computes it.
__device__ __forceinline__ float swiglu(const GroupArgs& A, float hg, float hu) {
  const float g = hg < A.limit ? hg : A.limit;
  const float u = hu < -A.limit ? -A.limit : (hu > A.limit ? A.limit : hu);
  return g * (1.0f / (1.0f + expf(-A.alpha * g))) * (u + 1.0f);
}

/// Final store of kernel rows (R, R + 8) for token m, group g.
__device__ __forceinline__ void store_pair(const GroupArgs& A, int64_t g, int64_t m, int64_t R, float v0, float v1) {
  if (A.mode == kEpiSwiglu) {
    const int64_t f = (R >> 4) * 8 + (R & 7);  // feature: stored rows 2f (gate) and 2f + 1 (up)
    if (2 * f + 1 >= A.N) return;
    const float y = swiglu(A, v0 + load_bias(A, g, 2 * f), v1 + load_bias(A, g, 2 * f + 1));
    if (A.out_act_layout)
      static_cast<uint16_t*>(A.out)[m * A.o_sM + act_index(f, A.out_kt)] = encode_bf16(y);
    else
      static_cast<float*>(A.out)[m * A.o_sM + f] = y;
    return;
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = R + 8 * h;
    if (n >= A.N) continue;
    const float v = h ? v1 : v0;
    if (A.mode == kEpiBias)
      static_cast<float*>(A.out)[m * A.o_sM + n] = v + load_bias(A, g, n);
    else
      store_float(A.out, A.out_dtype, m * A.o_sM + n, v);
  }
}

/// Byte `idx` (0..11) of three consecutive words.
__device__ __forceinline__ uint32_t pick_byte(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t idx) {
  const uint32_t w = idx < 4 ? w0 : (idx < 8 ? w1 : w2);
  return (w >> (8 * (idx & 3))) & 0xFFu;
}

/// Epilogue of a CTA's tile, run by all its threads: the exactness check (activation blocks the
/// pre-pass flagged), then this thread's accumulator rows rl, rl + 8 for its tokens (consumer
/// false: none), unshifted by 2^kWShift, to the output or the split-K partials.
template <int NT, int KT>
__device__ __forceinline__ void finish_tile(const GroupArgs& A, const float (&acc)[NT / 2], bool consumer,
                                            int tid, int rl, int t, int64_t grp, int64_t m0, int64_t m1, int64_t R0,
                                            int split, int64_t kt0, int64_t kt1) {
  bool bad = false;
  if (A.tok_flag && tid < NT && m0 + tid < m1)
    for (int64_t c = kt0 * (KT / 64); c < kt1 * (KT / 64); ++c) bad |= A.tok_flag[(m0 + tid) * (A.Kp / 64) + c] != 0;
  bad = __syncthreads_or(bad);
  if (!consumer) return;
  const int64_t kb = kt0 * KT, ke = kt1 * KT < A.K ? kt1 * KT : A.K;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + 8 * j + 2 * t + h;
      const int64_t R = R0 + rl;
      if (m >= m1 || R >= A.N) continue;
      const float un = A.tok_scale ? A.tok_scale[m] : kWUnshift;  // a power of two: exact
      float v0 = acc[4 * j + h] * un, v1 = acc[4 * j + 2 + h] * un;
      if (bad) {
        v0 = exact_dot(A, grp, R, m, kb, ke);
        v1 = R + 8 < A.N ? exact_dot(A, grp, R + 8, m, kb, ke) : 0.0f;
      }
      if (A.splits == 1) {
        store_pair(A, grp, m, R, v0, v1);
      } else {
        float* w = A.ws + (int64_t(split) * A.M + m) * A.N;
        w[R] = v0;
        if (R + 8 < A.N) w[R + 8] = v1;
      }
    }
  }
}

template <int KT>
struct StageShape {
  static constexpr int kWRow = KT / 2;                 // FP4 bytes of a row
  static constexpr int kSW = KT == 256 ? 3 : 2;        // scale words of a row
  static constexpr int kWBytes = kRows * kWRow;
  static constexpr int kSBytes = kRows * 4 * kSW;
  static constexpr int kBlocks = KT / 32;              // MX blocks of a row
  /// Stored 16-byte chunk of chunk c of weight row `row` in a stage: XOR-swizzled by the row, so
  /// that the 8 rows a wgmma fragment load touches at once fall in different banks.
  __device__ static constexpr int chunk(int row, int c) { return c ^ (row & (KT / 32 - 1)); }
};

/// PK: weights and scales in the prepacked layout (lowbit/mxfp4_pack.hpp): rows padded to 128 and K
/// to 256 (no bounds checks on them), one mask (and shift) per decoded bf16x2, the scale bytes of a
/// row's K tile in one aligned copy.
template <int NT, int S, int KT, bool PK>
__global__ void __launch_bounds__(256, 2) group_gemm_kernel(GroupArgs A) {
  using SS = StageShape<KT>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kActBytes = NT * KT * 2;  // KT/64 swizzle atoms of NT rows x 128 B
  constexpr int kStageBytes = (kActBytes + SS::kWBytes + SS::kSBytes + 1023) / 1024 * 1024;
  constexpr int kSteps = KT / 16;
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ int64_t s_work[2];

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  if (!A.pdl) griddep_wait();  // m_indptr / weights may come from the previous kernel
  if (tid < 32) {
    int64_t grp = -1, tile = 0;
    if (!find_tile(A, NT, blockIdx.y, &grp, &tile)) grp = -1;
    if (lane == 0) {
      s_work[0] = grp;
      s_work[1] = tile;
    }
  }
  __syncthreads();
  const int64_t grp = s_work[0];
  if (grp < 0) return;
  const int64_t m0 = A.bound(grp) + s_work[1] * NT;
  const int64_t gend = A.bound(grp + 1);
  const int64_t m1 = m0 + NT < gend ? m0 + NT : gend;
  const int64_t R0 = int64_t(blockIdx.x) * kRows;
  const int split = int(blockIdx.z);
  const int64_t kTiles = (A.K + KT - 1) / KT;
  const int64_t KG = A.K / 32;  // MX blocks per row
  const int64_t kt0 = int64_t(split) * A.kt_per_split;
  const int64_t kt1 = kt0 + A.kt_per_split < kTiles ? kt0 + A.kt_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;

  // Producer roles: weight pieces (16 B), scale words (4 B), activation pieces (16 B).
  constexpr int kWPieces = kRows * KT / 32, kWIters = kWPieces / 256;
  const uint8_t* wptr[kWIters];
  uint32_t wdst[kWIters];
  int wk[kWIters];  // K element offset of the piece within the tile
  bool wok[kWIters];
#pragma unroll
  for (int j = 0; j < kWIters; ++j) {
    const int i = tid + 256 * j, row = i / (KT / 32), c = i % (KT / 32);
    const int64_t R = R0 + row;
    wok[j] = PK || R < A.N;  // packed rows are padded to 128
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
  constexpr int kAPieces = NT * KT / 8, kAIters = (kAPieces + 255) / 256;
  const uint16_t* aptr[kAIters];
  uint32_t adst[kAIters];
  bool aok[kAIters], aload[kAIters];
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int i = tid + 256 * j, r = i / (KT / 8), c = i % (KT / 8);
    const int64_t m = m0 + r;
    aload[j] = i < kAPieces;
    aok[j] = m < m1;
    aptr[j] = A.act + (aok[j] ? m : 0) * A.Kp + c * 8;
    adst[j] = uint32_t((c >> 3) * NT * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
  }
  const uint8_t* pk_sptr = PK && tid < kRows ? A.bs + grp * A.bs_sG + A.wrow(R0 + tid) * A.bs_sN : nullptr;
  const uint32_t smem_base = smem_u32(smem);
  auto load_weights = [&](int64_t it) {
    const int64_t kt = kt0 + it;
    const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kWIters; ++j)
      cp_async16(st + wdst[j], wptr[j] + uint32_t(kt) * (KT / 2), wok[j] && (PK || kt * KT + wk[j] < A.K));
    if constexpr (PK) {  // row r's KT/32 scale bytes (KT = 64: the aligned word of two tiles) at r * 8
      if (tid < kRows) {
        const uint32_t d = st + uint32_t(kActBytes + SS::kWBytes + tid * 8);
        if constexpr (KT == 256)
          cp_async8(d, pk_sptr + uint32_t(kt) * 8);
        else
          cp_async4(d, pk_sptr + (KT == 64 ? (uint32_t(kt) >> 1) * 4 : uint32_t(kt) * 4), true);
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
        ok = ok && sw[j] < (KT >= 128 ? KT / 128 : 1) && (blk0 / 4 + sw[j]) * 4 < KG;
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
    const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes);
#pragma unroll
    for (int j = 0; j < kAIters; ++j)
      if (aload[j]) cp_async16(st + adst[j], aptr[j] + uint32_t(kt) * KT, aok[j]);
  };

  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;

  // Prologue: the first stages' weights and scales, then (behind the pre-pass) their activations.
  // Group s holds the activations of stage s (group 0 also every prologue weight).
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < nkt) load_weights(s);
  griddep_wait();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nkt) load_acts(s);
    cp_async_commit();
  }

  // Consumer: rows rl and rl + 8 of this CTA; bytes t*KT/8 .. +KT/8 of each row of a tile.
  const int g = lane >> 2, t = lane & 3;
  const int rl = 64 * wg + 16 * warp + g;
  constexpr int kTB = KT / 8;                       // weight bytes of a thread per row
  constexpr int kTBlk = KT >= 128 ? KT / 128 : 1;   // MX blocks of a thread per row
  const uintptr_t sc_addr0 = reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl < A.N ? A.wrow(R0 + rl) : 0, 0));
  const uintptr_t sc_addr1 =
      reinterpret_cast<uintptr_t>(A.wscale_ptr(grp, R0 + rl + 8 < A.N ? A.wrow(R0 + rl + 8) : 0, 0));
  const uint64_t desc0 = desc_sw128(smem_base);
  for (int64_t it = 0; it < nkt; ++it) {
    cp_async_wait<S - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (it + S - 1 < nkt) {
      load_weights(it + S - 1);
      load_acts(it + S - 1);
    }
    cp_async_commit();

    const int64_t kt = kt0 + it;
    const uint8_t* st = smem + (it % S) * kStageBytes;
    const uint8_t* wt = st + kActBytes;
    uint32_t q0[kTB / 4], q1[kTB / 4];  // this thread's kTB bytes of rows rl and rl + 8 (same swizzle)
    if constexpr (KT == 64) {  // half a chunk
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
    if constexpr (PK) {
      // row r's scale bytes at r * 8: this thread's block b is byte `byte` of word `wi`
      const uint32_t* sp0 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + rl * 8);
      const uint32_t* sp1 = reinterpret_cast<const uint32_t*>(wt + SS::kWBytes + (rl + 8) * 8);
      const int wi = KT == 256 ? (t >> 1) : 0;
      const uint32_t w0 = sp0[wi], w1 = sp1[wi];
#pragma unroll
      for (int b = 0; b < kTBlk; ++b) {
        const uint32_t byte = KT == 256 ? uint32_t(2 * (t & 1) + b) : KT == 128 ? uint32_t(t) : uint32_t(2 * (kt & 1) + (t >> 1));
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
        // this thread's block within the tile: KT = 64: t / 2 (two quads share one); else t * kTBlk + b
        const uint32_t lb = KT == 64 ? uint32_t(t >> 1) : uint32_t(t * kTBlk + b);
        uint32_t base0, base1;
        if (A.bs_blocked) {
          base0 = base1 = KT == 64 ? uint32_t(2 * (kt & 1)) : 0u;
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
        if constexpr (PK) {  // pairs 2(j&1) (K elements +4j, +1) and 2(j&1)+1 (+2, +3) of the word
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
        if constexpr (kWide) {
          a[j][0] = bmul2(a[j][0], E0[bi]);
          a[j][1] = bmul2(a[j][1], E1[bi]);
          a[j][2] = bmul2(a[j][2], E0[bi]);
          a[j][3] = bmul2(a[j][3], E1[bi]);
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
    const uint64_t dstage = desc0 + uint64_t(((it % S) * kStageBytes) >> 4);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int j = 0; j < kSteps; ++j)
      wgmma_call<NT>(a[j], dstage + uint64_t(((j >> 2) * NT * 128 + (j & 3) * 32) >> 4), acc,
                     std::make_index_sequence<NT / 2>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cp_async_wait<0>();

  finish_tile<NT, KT>(A, acc, true, tid, rl, t, grp, m0, m1, R0, split, kt0, kt1);
}

/// Warp-specialized form of the packed kernel at KT = 256 (NT = 16, 32: the decode shapes). Warp 8
/// produces: one TMA per stage for the 128-row x 256-K weight tile (SWIZZLE_128B gives the same
/// shared image as the cp.async kernel: 16-byte chunk c of stored row r at chunk c ^ (r & 7)), KT/64
/// TMA for the activation atoms and one 8-byte cp.async per row for the scale bytes, into S stages
/// guarded by full / empty mbarriers. Warpgroups 0 and 1 consume at their own pace (no CTA barrier
/// in the K loop) and split each stage into Q batches: batch b + 1 is decoded while the wgmma of
/// batch b runs.
template <int NT, int S, int Q>
__global__ void __launch_bounds__(288, 2)
    group_gemm_ws_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_a, GroupArgs A) {
  constexpr int KT = 256;
  using SS = StageShape<KT>;
  constexpr int kActBytes = NT * KT * 2;
  constexpr int kSBytes = kRows * 8;  // scale bytes of the tile: row r at r * 8
  constexpr int kStageBytes = (kActBytes + SS::kWBytes + kSBytes + 1023) / 1024 * 1024;
  constexpr int kSteps = KT / 16, kPer = kSteps / Q;
  static_assert(kSteps % Q == 0, "Q divides the k16 steps of a stage");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ int64_t s_work[2];
  __shared__ __align__(8) uint64_t bars[2 * S];  // full[S], then empty[S]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (!A.pdl) griddep_wait();  // m_indptr / weights may come from the previous kernel
  if (tid < 32) {
    int64_t grp = -1, tile = 0;
    if (!find_tile(A, NT, blockIdx.y, &grp, &tile)) grp = -1;
    if (lane == 0) {
      s_work[0] = grp;
      s_work[1] = tile;
    }
  } else if (tid == 32) {
    for (int s = 0; s < S; ++s) {
      mbar_init(smem_u32(&bars[s]), 1 + 32);  // the producer's expect_tx arrival + 32 lanes' scale copies
      mbar_init(smem_u32(&bars[S + s]), 8);   // the 8 consumer warps
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int64_t grp = s_work[0];
  if (grp < 0) return;
  const int64_t m0 = A.bound(grp) + s_work[1] * NT;
  const int64_t gend = A.bound(grp + 1);
  const int64_t m1 = m0 + NT < gend ? m0 + NT : gend;
  const int64_t R0 = int64_t(blockIdx.x) * kRows;
  const int split = int(blockIdx.z);
  const int64_t kTiles = (A.K + KT - 1) / KT;
  const int64_t kt0 = int64_t(split) * A.kt_per_split;
  const int64_t kt1 = kt0 + A.kt_per_split < kTiles ? kt0 + A.kt_per_split : kTiles;
  const int64_t nkt = kt1 > kt0 ? kt1 - kt0 : 0;
  const uint32_t smem_base = smem_u32(smem);
  const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[S]);

  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
  const int g = lane >> 2, t = lane & 3;
  const int rl = 64 * (warp >> 2) + 16 * (warp & 3) + g;  // consumer rows rl, rl + 8

  if (warp == 8) {  // producer
    const int32_t wy = int32_t(grp * mxfp4_packed_rows(A.N) + R0);
    const uint8_t* srow[kRows / 32];
#pragma unroll
    for (int j = 0; j < kRows / 32; ++j) srow[j] = A.bs + grp * A.bs_sG + (R0 + lane + 32 * j) * A.bs_sN;
    auto weights = [&](int64_t it) {  // the stage's weight TMA (with the whole stage's byte count), scales
      const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes), full = full0 + uint32_t(8 * (it % S));
      if (lane == 0) {
        mbar_arrive_expect_tx(full, uint32_t(SS::kWBytes + kActBytes));
        tma_load_2d(st + kActBytes, &tm_w, int32_t((kt0 + it) * (KT / 2)), wy, full);
      }
#pragma unroll
      for (int j = 0; j < kRows / 32; ++j) cp_async8(st + kActBytes + SS::kWBytes + (lane + 32 * j) * 8, srow[j] + (kt0 + it) * 8);
      mbar_cp_async_arrive(full);
    };
    auto acts = [&](int64_t it) {
      const uint32_t st = smem_base + uint32_t((it % S) * kStageBytes), full = full0 + uint32_t(8 * (it % S));
      if (lane == 0)
#pragma unroll
        for (int c = 0; c < KT / 64; ++c) tma_load_2d(st + c * NT * 128, &tm_a, int32_t((kt0 + it) * KT + 64 * c), int32_t(m0), full);
    };
    const int64_t npro = nkt < S ? nkt : S;
    for (int64_t it = 0; it < npro; ++it) weights(it);
    griddep_wait();  // the activations come from the pre-pass
    for (int64_t it = 0; it < npro; ++it) acts(it);
    for (int64_t it = npro; it < nkt; ++it) {
      mbar_wait(empty0 + uint32_t(8 * (it % S)), uint32_t((it / S - 1) & 1));
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
      const int s = int(it % S);
      mbar_wait(full0 + uint32_t(8 * s), uint32_t((it / S) & 1));
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
      for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
#pragma unroll
      for (int qb = 0; qb < Q; ++qb) {
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
              a[jj][0] = bmul2(a[jj][0], eA);
              a[jj][1] = bmul2(a[jj][1], eB);
              a[jj][2] = bmul2(a[jj][2], eA);
              a[jj][3] = bmul2(a[jj][3], eB);
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
          wgmma_call<NT>(a[jj], dstage + uint64_t(((j >> 2) * NT * 128 + (j & 3) * 32) >> 4), acc,
                         std::make_index_sequence<NT / 2>{});
        }
        cute::warpgroup_commit_batch();
        if (qb > 0 && qb + 1 < Q) cute::warpgroup_wait<1>();  // batch qb - 1 done: its registers are free again
      }
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + uint32_t(8 * s));
    }
    griddep_wait();  // the epilogue reads the pre-pass's flags
  }
  finish_tile<NT, KT>(A, acc, warp < 8, tid, rl, t, grp, m0, m1, R0, split, kt0, kt1);
}

/// Split-K: sums the partials in split order and runs the epilogue (rows of m_indptr[G].. skipped).
__global__ void group_finalize_kernel(GroupArgs A) {
  griddep_wait();
  const int64_t M = A.bound(A.G);
  const int64_t n16 = (A.N + 15) / 16;
  const int64_t items = M * n16 * 8;  // (m, 16-row block, row pair r / r + 8)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / (n16 * 8), R = (i % (n16 * 8)) / 8 * 16 + (i & 7);
    if (R >= A.N) continue;
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < A.splits; ++s) {
      const float* w = A.ws + (int64_t(s) * A.M + m) * A.N;
      v0 += w[R];
      if (R + 8 < A.N) v1 += w[R + 8];
    }
    int64_t grp;
    if (A.indptr64)
      grp = group_of_row(static_cast<const int64_t*>(A.m_indptr), A.G, m);
    else
      grp = group_of_row(static_cast<const int32_t*>(A.m_indptr), A.G, m);
    store_pair(A, grp, m, R, v0, v1);
  }
}

template <int NT, int S, int KT, bool PK>
cudaError_t launch_group_pk(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  using SS = StageShape<KT>;
  constexpr int kStageBytes = (NT * KT * 2 + SS::kWBytes + SS::kSBytes + 1023) / 1024 * 1024;
  constexpr int smem = S * kStageBytes + 1024;
  auto kern = group_gemm_kernel<NT, S, KT, PK>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  dim3 grid(unsigned((a.N + kRows - 1) / kRows), unsigned(max_tiles), unsigned(a.splits));
  return launch_pdl(kern, grid, dim3(256), size_t(smem), st, a);
}
template <int NT, int S, int KT>
cudaError_t launch_group(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  return a.packed ? launch_group_pk<NT, S, KT, true>(a, max_tiles, device, st)
                  : launch_group_pk<NT, S, KT, false>(a, max_tiles, device, st);
}

/// The warp-specialized kernel (packed weights, KT = 256).
template <int NT, int S, int Q>
cudaError_t launch_group_ws(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  constexpr int kStageBytes = (NT * 256 * 2 + StageShape<256>::kWBytes + kRows * 8 + 1023) / 1024 * 1024;
  constexpr int smem = S * kStageBytes + 1024;
  CUtensorMap tw, ta;
  const int64_t Np = mxfp4_packed_rows(a.N);
  if (cudaError_t e = make_tmap_2d(&tw, a.b, CU_TENSOR_MAP_DATA_TYPE_UINT8, uint64_t(a.b_sN), uint64_t(a.G * Np),
                                   uint64_t(a.b_sN), 128, kRows);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = make_tmap_2d(&ta, a.act, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint64_t(a.Kp), uint64_t(a.M),
                                   uint64_t(a.Kp * 2), 64, NT);
      e != cudaSuccess)
    return e;
  auto kern = group_gemm_ws_kernel<NT, S, Q>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kern, smem, device, opted); e != cudaSuccess) return e;
  dim3 grid(unsigned((a.N + kRows - 1) / kRows), unsigned(max_tiles), unsigned(a.splits));
  return launch_pdl(kern, grid, dim3(288), size_t(smem), st, tw, ta, a);
}
/// The packed weights and the activation rows can be read by TMA (moe::ws_eligible).
bool ws_eligible(const GroupArgs& a) {
  return moe::ws_eligible(a.packed, a.NT, a.KT, uint64_t(reinterpret_cast<uintptr_t>(a.b)), a.b_sG, a.b_sN, a.N, a.G,
                          a.M, uint64_t(reinterpret_cast<uintptr_t>(a.act)));
}

/// Tokens per CTA and the K tile that goes with it (moe::pick_tile).
void pick_tile(int64_t rows_bound, int64_t G, int* NT, int* KT) {
  const moe::GroupTile t = moe::pick_tile(rows_bound, G);
  *NT = t.tile_n;
  *KT = t.tile_k;
}

/// Runs the grouped GEMM of `a` (act already in place, a.NT / a.KT from pick_tile): split-K and
/// the finalize.
cudaError_t run_group(GroupArgs a, int64_t rows_bound, cudaMemPool_t pool, cudaStream_t st) {
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  const int NT = a.NT;
  // split K when the tiles do not fill the GPU (moe::group_split)
  const moe::GroupSplit sp = moe::group_split(rows_bound, a.G, a.N, a.K, a.NT, a.KT, sms);
  const int64_t max_tiles = sp.max_tiles;
  const int splits = sp.splits;
  a.splits = splits;
  a.kt_per_split = sp.kt_per_split;
  if (max_tiles <= 0 || a.M == 0) return cudaSuccess;
  cudaError_t e = cudaSuccess;
  if (splits > 1)
    e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a.ws), size_t(splits) * a.M * a.N * sizeof(float), pool, st);
  if (e == cudaSuccess) {
    if (ws_eligible(a)) {
      e = NT == 16 ? launch_group_ws<16, moe::group_ws_stages(16), moe::kGroupWsBatches>(a, max_tiles, dev, st)
                   : launch_group_ws<32, moe::group_ws_stages(32), moe::kGroupWsBatches>(a, max_tiles, dev, st);
    } else
    switch (NT) {
      case 16: e = launch_group<16, moe::group_stages(16), moe::pick_tile(16, 1).tile_k>(a, max_tiles, dev, st); break;
      case 32: e = launch_group<32, moe::group_stages(32), moe::pick_tile(32, 1).tile_k>(a, max_tiles, dev, st); break;
      case 64: e = launch_group<64, moe::group_stages(64), moe::pick_tile(64, 1).tile_k>(a, max_tiles, dev, st); break;
      default: e = launch_group<128, moe::group_stages(128), moe::pick_tile(128, 1).tile_k>(a, max_tiles, dev, st); break;
    }
  }
  if (e == cudaSuccess && splits > 1) {
    a.pdl = false;
    e = launch_pdl(group_finalize_kernel, dim3(unsigned(moe::group_finalize_blocks(a.M, a.N, sms))), dim3(256), 0, st, a);
  }
  if (a.ws) cudaFreeAsync(a.ws, st);
  return e;
}

}  // namespace

int group_gemm_mxfp4(const GroupGemmPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.M == 0) return 0;
  GroupArgs a;
  a.M = p.M; a.N = p.N; a.K = p.K; a.G = p.G;
  pick_tile(p.M, p.G, &a.NT, &a.KT);
  a.Kp = (p.K + a.KT - 1) / a.KT * a.KT;
  a.b = p.b; a.b_sG = p.b_sG; a.b_sN = p.b_sN; a.packed = p.b_packed;
  a.bs = p.b_scale;
  a.bs_blocked = p.spb.layout.kind == ScaleLayoutKind::kBlocked128x4;
  a.bs_sG = p.spb.batch_stride;
  a.bs_sN = p.spb.cols;
  a.spb = p.spb;
  a.m_indptr = p.m_indptr; a.indptr64 = p.indptr64;
  a.a = p.a; a.a_dtype = p.a_dtype; a.a_sM = p.a_sM; a.a_scale = p.a_scale; a.spa = p.spa;
  a.mode = kEpiPlain; a.out = p.out; a.out_dtype = p.out_dtype; a.o_sM = p.o_sM;

  uint16_t* act = nullptr;
  // act [M][Kp] bf16, tok_scale [M] fp32, tok_flag [M][Kp/64] bytes
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&act),
                                          size_t(p.M * a.Kp * 2 + p.M * 4 + p.M * (a.Kp / 64)), pool, st);
  if (e != cudaSuccess) return int(e);
  a.act = act;
  if (p.a_scale) {
    a.tok_scale = reinterpret_cast<const float*>(act + p.M * a.Kp);
    a.tok_flag = reinterpret_cast<const uint8_t*>(a.tok_scale + p.M);
  }
  {
    int dev = 0;
    cudaGetDevice(&dev);
    // strips of K blocks per warp and the grid (moe::prepass_grid)
    const moe::PrepassGrid pg = moe::prepass_grid(p.M, a.Kp, sm_count(dev));
    a.strip = pg.strip;
    act_prepass_kernel<<<unsigned(pg.blocks), 256, 0, st>>>(a);
    e = cudaGetLastError();
    a.pdl = true;  // the GEMM prefetches weights while the pre-pass runs
  }
  if (e == cudaSuccess) e = run_group(a, p.M, pool, st);
  cudaFreeAsync(act, st);
  return int(e);
}

namespace {

/// group_gemm_mxfp4_prepack: one thread per packed 32-bit word (and per packed scale byte).
__global__ void mxfp4_prepack_kernel(Mxfp4PackPlan p, int64_t Np, int64_t Kp) {
  const int64_t words = p.G * Np * (Kp / 8), scales = p.G * Np * (Kp / 32);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words + scales;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (i < words) {
      const int64_t gn = i / (Kp / 8);
      reinterpret_cast<uint32_t*>(p.packed_b)[i] = p.word(gn / Np, gn % Np, i % (Kp / 8));
    } else {
      const int64_t j = i - words, gn = j / (Kp / 32);
      p.packed_scale[j] = p.scale(gn / Np, gn % Np, j % (Kp / 32));
    }
  }
}

}  // namespace

int mxfp4_prepack(const Mxfp4PackPlan& p, void* stream) {
  const int64_t Np = mxfp4_packed_rows(p.N), Kp = mxfp4_packed_k(p.K);
  const int64_t n = p.G * Np * (Kp / 8 + Kp / 32);
  if (n == 0) return 0;
  int dev = 0;
  cudaGetDevice(&dev);
  const int64_t blocks = (n + 255) / 256, cap = 8 * int64_t(sm_count(dev));
  mxfp4_prepack_kernel<<<unsigned(blocks < cap ? blocks : cap), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, Np, Kp);
  return int(cudaGetLastError());
}

namespace {

// ------------------------------------------------------------------------------------------
// gpt-oss MLP: route -> gather (+ activation rounding) -> gate_up GEMM with bias and SwiGLU ->
// (MXFP8 rounding of y) -> down GEMM with bias -> weighted sum per token.

/// One CTA: expert counts, m_indptr, and each routed slot's row in the expert-sorted order. The
/// order of rows inside an expert is not deterministic; nothing downstream depends on it (each
/// row's GEMM result does not depend on its position, the final sum runs in slot order).
__global__ void route_kernel(MoeMlpPlan p, int32_t* indptr, int32_t* pos, int32_t* src_slot) {
  extern __shared__ int32_t s_cnt[];  // [E] counts, then [E] cursors
  const int64_t slots = p.T * p.topk;
  for (int64_t e = threadIdx.x; e < p.E; e += blockDim.x) s_cnt[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t e = p.ids[(s / p.topk) * p.ids_sT + s % p.topk];
    if (e >= 0 && e < p.E) atomicAdd(&s_cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t e = 0; e < p.E; ++e) {
      indptr[e] = run;
      const int32_t c = s_cnt[e];
      s_cnt[p.E + e] = run;
      run += c;
    }
    indptr[p.E] = run;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t e = p.ids[(s / p.topk) * p.ids_sT + s % p.topk];
    int32_t r = -1;
    if (e >= 0 && e < p.E) {
      r = atomicAdd(&s_cnt[p.E + e], 1);
      src_slot[r] = int32_t(s);
    }
    pos[s] = r;
  }
}

/// Kernel activation rows [rows][Kp] (act_pos order, zero beyond K) of the sorted rows r <
/// indptr[E]: from x[token of src_slot[r]] (gather) or from y[r] (fp32 [rows][K]), rounded to bf16
/// or through MXFP8 E4M3 (RCEIL) as the reference's act() does. One warp per (row, 64-wide block).
__global__ void prep_rows_kernel(MoeMlpPlan p, const int32_t* indptr, const int32_t* src_slot, const float* y,
                                 int64_t K, int64_t Kp, int KT, uint16_t* act) {
  griddep_wait();
  const int lane = threadIdx.x & 31;
  const int64_t kblocks = Kp / 64;
  const int64_t items = int64_t(indptr[p.E]) * kblocks;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const BlockFormat f = BlockFormat::mxfp8();
  for (int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); item < items; item += warps) {
    const int64_t r = item / kblocks, k0 = (item % kblocks) * 64, k = k0 + 2 * lane;
    const int64_t t = y ? 0 : src_slot[r] / p.topk;
    float v[2] = {0.0f, 0.0f};
    if (k < K) {
      for (int h = 0; h < 2; ++h) v[h] = y ? y[r * K + k + h] : load_float(p.x, p.x_dtype, t * p.x_sT + k + h);
    }
    if (p.act_mxfp8) {
      // MX block of 32 = 16 lanes: amax over them (bits of |v|, NaN above Inf as the reference)
      const uint32_t m0 = float_bits(v[0]) & 0x7FFFFFFFu, m1 = float_bits(v[1]) & 0x7FFFFFFFu;
      uint32_t am = m0 > m1 ? m0 : m1;
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) {
        const uint32_t u = __shfl_xor_sync(0xFFFFFFFFu, am, o);
        am = u > am ? u : am;
      }
      BlockStats st;
      st.amax_bits = am;
      const BlockScale bs = compute_block_scale(f, st, QuantContext{});
      for (int h = 0; h < 2; ++h) v[h] = decode_element(f, encode_element(f, bs, v[h]), bs.code, 0);
    }
    reinterpret_cast<uint32_t*>(act + r * Kp)[act_index(k, KT) >> 1] = act_pair_bf16(v[0], v[1]);
  }
}

/// out[t] = sum_j w[t, j] * o[pos[t, j]] over the routed slots, in slot order (the reference's).
__global__ void combine_kernel(MoeMlpPlan p, const int32_t* pos, const float* o) {
  griddep_wait();
  const int64_t n = p.T * p.H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.H, h = i % p.H;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.topk; ++j) {
      const int32_t r = pos[t * p.topk + j];
      if (r < 0) continue;
      acc += p.weights[t * p.w_sT + j] * o[int64_t(r) * p.H + h];
    }
    store_float(p.out, p.out_dtype, t * p.o_sT + h, acc);
  }
}

}  // namespace

int gpt_oss_moe_mlp(const MoeMlpPlan& p, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaMemPool_t pool = nullptr;
  if (cudaError_t pe = workspace_pool(&pool); pe != cudaSuccess) return int(pe);
  if (p.T == 0) return 0;
  int dev = 0;
  cudaGetDevice(&dev);
  const int sms = sm_count(dev);
  const int64_t rows = p.T * p.topk;  // upper bound of routed rows
  int NT = 16, KT = 64;
  pick_tile(rows, p.E, &NT, &KT);  // both GEMMs: same rows and groups
  const int64_t Hp = (p.H + KT - 1) / KT * KT, Ip = (p.I + KT - 1) / KT * KT;
  // workspace: indptr [E+1], pos [rows], src_slot [rows] (int32); act1 [rows][Hp], act2 [rows][Ip]
  // (bf16); y [rows][I] (fp32, MXFP8 mode); o [rows][H] (fp32)
  auto al = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t b_idx = al((p.E + 1 + 2 * rows) * 4), b_a1 = al(rows * Hp * 2), b_a2 = al(rows * Ip * 2);
  const int64_t b_y = p.act_mxfp8 ? al(rows * p.I * 4) : 0, b_o = al(rows * p.H * 4);
  uint8_t* wsp = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&wsp), size_t(b_idx + b_a1 + b_a2 + b_y + b_o), pool, st);
  if (e != cudaSuccess) return int(e);
  int32_t* indptr = reinterpret_cast<int32_t*>(wsp);
  int32_t* pos = indptr + p.E + 1;
  int32_t* src_slot = pos + rows;
  uint16_t* act1 = reinterpret_cast<uint16_t*>(wsp + b_idx);
  uint16_t* act2 = reinterpret_cast<uint16_t*>(wsp + b_idx + b_a1);
  float* y = p.act_mxfp8 ? reinterpret_cast<float*>(wsp + b_idx + b_a1 + b_a2) : nullptr;
  float* o = reinterpret_cast<float*>(wsp + b_idx + b_a1 + b_a2 + b_y);
  const int64_t prep_warps = rows * (Hp > Ip ? Hp : Ip) / 64;
  const unsigned prep_grid = unsigned((prep_warps + 7) / 8 < 16 * int64_t(sms) ? (prep_warps + 7) / 8 : 16 * int64_t(sms));

  route_kernel<<<1, 1024, size_t(2 * p.E * 4), st>>>(p, indptr, pos, src_slot);
  e = cudaGetLastError();
  if (e == cudaSuccess) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)src_slot, (const float*)nullptr, p.H, Hp, KT, act1);
  }
  if (e == cudaSuccess && !p.act_mxfp8 && Ip != p.I) e = cudaMemsetAsync(act2, 0, size_t(rows * Ip * 2), st);
  GroupArgs a;
  a.m_indptr = indptr;
  a.indptr64 = false;
  a.G = p.E;
  a.M = rows;
  a.NT = NT;
  a.KT = KT;
  a.out_kt = KT;
  a.bs_blocked = false;
  a.packed = p.packed;
  if (e == cudaSuccess) {  // gate_up: [rows, 2I] -> SwiGLU -> y
    a.N = 2 * p.I; a.K = p.H; a.Kp = Hp;
    a.b = p.w1; a.b_sG = p.w1_sE; a.b_sN = p.w1_sR;
    a.bs = p.w1s; a.bs_sG = p.w1s_sE; a.bs_sN = p.w1s_sR;
    a.act = act1;
    a.mode = kEpiSwiglu;
    a.bias = p.b1; a.bias_dtype = p.b1_dtype; a.bias_sG = p.b1_sE;
    a.alpha = p.alpha; a.limit = p.limit;
    if (p.act_mxfp8) {
      a.out = y; a.o_sM = p.I; a.out_act_layout = false;
    } else {
      a.out = act2; a.o_sM = Ip; a.out_act_layout = true;
    }
    e = run_group(a, rows, pool, st);
  }
  if (e == cudaSuccess && p.act_mxfp8) {
    e = launch_pdl(prep_rows_kernel, dim3(prep_grid), dim3(256), 0, st, p, (const int32_t*)indptr,
                   (const int32_t*)src_slot, (const float*)y, p.I, Ip, KT, act2);
  }
  if (e == cudaSuccess) {  // down: [rows, H] + b2 -> o (fp32)
    a.N = p.H; a.K = p.I; a.Kp = Ip;
    a.b = p.w2; a.b_sG = p.w2_sE; a.b_sN = p.w2_sR;
    a.bs = p.w2s; a.bs_sG = p.w2s_sE; a.bs_sN = p.w2s_sR;
    a.act = act2;
    a.mode = kEpiBias;
    a.bias = p.b2; a.bias_dtype = p.b2_dtype; a.bias_sG = p.b2_sE;
    a.out = o; a.o_sM = p.H; a.out_act_layout = false;
    e = run_group(a, rows, pool, st);
  }
  if (e == cudaSuccess) {
    const int64_t n = p.T * p.H;
    e = launch_pdl(combine_kernel, dim3(unsigned(n / 256 + 1 < 8 * int64_t(sms) ? n / 256 + 1 : 8 * int64_t(sms))),
                   dim3(256), 0, st, p, (const int32_t*)pos, (const float*)o);
  }
  cudaFreeAsync(wsp, st);
  return int(e);
}

}  // namespace lowbit::cuda
