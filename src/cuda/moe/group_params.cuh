// src/cuda/moe/group_params.cuh: kernel parameters of the MXFP4 grouped GEMM (GroupArgs), its
// constants, the weight-scale multipliers and the activation K order (act_pos). The design and the
// exactness argument: sm90_mxfp4_group_gemm.cu.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/sm90_gemm_common.cuh"
#include "cuda/moe/heuristics.hpp"
#include "cuda/moe/launch_moe.hpp"
#include "lowbit/block_quant.hpp"
#include "lowbit/moe.hpp"
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
/// (valid for s <= 133), `lo` = 2^(min(s,133)-6) and `hi` = 2^(max(s,133)-128), NaN for the NaN
/// byte 255. The two-multiply decode of a tile with a byte above 133 is
/// ((bf16(e2m1 * 2^-126) * lo) * hi) * 2^-kWShift (kWideUnshift): the product before the last
/// multiply is the weight itself, e2m1 * 2^(s-127), +-Inf where that is 2^128 or more (the fp32
/// decode's rule, docs/formats.md: bytes 253 and 254 with the larger codes), every other value
/// exact (e2m1 has two significant bits; scaling by powers of two within range is exact).
__device__ __forceinline__ uint32_t scale_one(uint32_t y) { return (y + 0x00010001u * (126u - kWShift)) << 7; }
__device__ __forceinline__ uint32_t scale_lo(uint32_t y) { return scale_one(__vminu2(y, 0x00010001u * kSOne)); }
constexpr uint32_t kWideUnshift = 0x3D003D00u;  // bf16x2 of 2^-kWShift (2^-5)
static_assert(kWShift == 5, "kWideUnshift holds 2^-5");
__device__ __forceinline__ uint32_t scale_hi(uint32_t y) {
  const uint32_t h = (__vmaxu2(y, 0x00010001u * kSOne) - 0x00010001u * (kSOne - 127u - kWShift)) << 7;
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

}  // namespace

/// Kernel parameters. Outside the anonymous namespace: the kernels of 128 tokens per CTA are
/// instantiated in their own translation unit (sm90_mxfp4_group_gemm_t128.cu).
enum EpiMode : int {
  kEpiPlain = 0,   ///< out[m, n] = acc (out dtype)
  kEpiSwiglu = 1,  ///< gpt-oss: rows 2f / 2f+1 are gate / up of feature f; bias, clamped SwiGLU
  kEpiBias = 2,    ///< out[m, n] = acc + bias[g, n] (sum in fp32, stored as out_dtype)
};

/// The gpt-oss MLP's epilogue (kEpiSwiglu, kEpiBias): make_mlp_params sets it; the plain grouped
/// GEMM leaves the defaults, the dense mxfp4_gemm sets only the bias (kEpiBias).
struct MlpEpilogue {
  bool out_act_layout = false;  ///< kEpiSwiglu: write bf16 in act_pos order (the next GEMM's A)
  int out_kt = 64;              ///< that GEMM's KT
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  int64_t bias_sG = 0;
  float alpha = 1.702f, limit = 7.0f;
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
  MlpEpilogue mlp;
  bool pdl = false;  ///< launched behind the activation pre-pass: weights are fetched before waiting for it
  float* ws = nullptr;  ///< split-K partials [splits][M][N]
  int splits = 1;
  int kt_per_split = 0;
  // Row layouts (cuda/moe/group_layout.cuh). M, act, tok_scale / tok_flag, the tiles and split-K
  // address compact rows; a_pitch / o_pitch map compact row m of group g to its row of the original
  // A (pre-pass source, exact fallback) / of out: g * pitch + (m - bound(g)), or m itself (pitch 0).
  int64_t a_pitch = 0;
  int64_t o_pitch = 0;
  /// The pre-pass converts only the compact rows of the groups (m < bound(G)), not all M: the
  /// m_counts layouts, whose M is an upper bound of the rows.
  bool group_rows_only = false;
  /// Host bound of the (group, tile) work items of one column block and split. A CTA takes the
  /// items blockIdx.y, + gridDim.y, ... below it: one item unless the launch gave fewer CTAs
  /// than items (cap_grid).
  int64_t max_tiles = 0;
  /// M is a loose bound (masked layout: G x max_tokens rows for typically far fewer): launch at
  /// most a few waves of CTAs, each looping over its items (moe::group_grid_y).
  bool cap_grid = false;

  /// m_indptr[g] clamped to [0, M]: a device m_indptr is not validated, the kernels stay in bounds.
  __device__ int64_t bound(int64_t g) const {
    const int64_t v = indptr64 ? static_cast<const int64_t*>(m_indptr)[g] : int64_t(static_cast<const int32_t*>(m_indptr)[g]);
    return v < 0 ? 0 : (v > M ? M : v);
  }
  /// The group of compact row m (m < bound(G); m_indptr non-decreasing, as the m_counts layouts' bounds are).
  __device__ int64_t group_of(int64_t m) const {
    return indptr64 ? group_of_row(static_cast<const int64_t*>(m_indptr), G, m)
                    : group_of_row(static_cast<const int32_t*>(m_indptr), G, m);
  }
  /// Row of the original A of compact row m of group g.
  __device__ int64_t a_row(int64_t g, int64_t m) const { return a_pitch ? g * a_pitch + (m - bound(g)) : m; }
  /// Output row of compact row m is m + o_offset(g).
  __device__ int64_t o_offset(int64_t g) const { return o_pitch ? g * o_pitch - bound(g) : 0; }
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

/// The grouped GEMM's parameters of a validated plan: sizes, the tile (moe::pick_tile), weights,
/// groups, the row layout, the original A (the exact fallback's source) and the plain epilogue.
/// The launch fills in the rest: the device bounds of m_counts (m_indptr), act / tok_scale /
/// tok_flag / strip / pdl (the activation pre-pass) and ws / splits / kt_per_split / max_tiles
/// (run_group).
inline GroupArgs make_group_params(const GroupGemmPlan& p) {
  GroupArgs a;
  a.M = p.M;
  a.N = p.N;
  a.K = p.K;
  a.G = p.G;
  moe::GroupTile t = moe::call_tile(p.M, p.G, p.K, p.max_tokens, p.expected_m, p.max_tokens <= 0 && !p.counts);
  if (const int tune = group_tile_for_tuning(); tune > 0 && p.max_tokens <= 0) t = moe::pick_tile(tune, 1);
  a.NT = t.tile_n;
  a.KT = t.tile_k;
  a.Kp = (p.K + a.KT - 1) / a.KT * a.KT;
  a.a_pitch = a.o_pitch = p.max_tokens;
  a.cap_grid = p.max_tokens > 0;
  a.group_rows_only = p.counts != nullptr;
  a.b = p.b;
  a.b_sG = p.b_sG;
  a.b_sN = p.b_sN;
  a.packed = p.b_packed;
  a.bs = p.b_scale;
  a.bs_blocked = p.spb.layout.kind == ScaleLayoutKind::kBlocked128x4;
  a.bs_sG = p.spb.batch_stride;
  a.bs_sN = p.spb.cols;
  a.spb = p.spb;
  a.m_indptr = p.m_indptr;
  a.indptr64 = p.indptr64;
  a.a = p.a;
  a.a_dtype = p.a_dtype;
  a.a_sM = p.a_sM;
  a.a_scale = p.a_scale;
  a.spa = p.spa;
  a.mode = kEpiPlain;
  if (p.bias) {  // the dense mxfp4_gemm's bias (one group: bias_sG unused)
    a.mode = kEpiBias;
    a.mlp.bias = p.bias;
    a.mlp.bias_dtype = p.bias_dtype;
    a.mlp.bias_sG = 0;
  }
  a.out = p.out;
  a.out_dtype = p.out_dtype;
  a.o_sM = p.o_sM;
  return a;
}

/// The gpt-oss MLP's two grouped GEMMs.
enum class MlpGemm {
  kGateUp,  ///< [rows, H] x w1 -> 2I rows of gate / up, + b1, SwiGLU (kEpiSwiglu)
  kDown,    ///< [rows, I] x w2 -> H, + b2 (kEpiBias)
};

/// Parameters of one of the gpt-oss MLP's GEMMs over the expert-sorted rows (`indptr`: int32 [E+1]
/// on the device, `rows` an upper bound of indptr[E]), tile NT x KT (both GEMMs share it), A from
/// `act` (act_pos order, no exact-fallback source), weights and scales row-major from the plan,
/// output `out` with row pitch `o_sM` (kGateUp: bf16 in the down GEMM's act_pos order when
/// `out_act_layout`, else fp32; kDown: fp32). The launch fills in ws / splits / kt_per_split.
inline GroupArgs make_mlp_params(const MoeMlpPlan& p, MlpGemm gemm, const int32_t* indptr, int64_t rows, int NT,
                                 int KT, const uint16_t* act, void* out, int64_t o_sM, bool out_act_layout) {
  const bool up = gemm == MlpGemm::kGateUp;
  GroupArgs a;
  a.m_indptr = indptr;
  a.indptr64 = false;
  a.G = p.E;
  a.M = rows;
  a.NT = NT;
  a.KT = KT;
  a.bs_blocked = false;
  a.packed = p.packed;
  a.N = up ? 2 * p.I : p.H;
  a.K = up ? p.H : p.I;
  a.Kp = (a.K + KT - 1) / KT * KT;
  a.b = up ? p.w1 : p.w2;
  a.b_sG = up ? p.w1_sE : p.w2_sE;
  a.b_sN = up ? p.w1_sR : p.w2_sR;
  a.bs = up ? p.w1s : p.w2s;
  a.bs_sG = up ? p.w1s_sE : p.w2s_sE;
  a.bs_sN = up ? p.w1s_sR : p.w2s_sR;
  a.act = act;
  a.mode = up ? kEpiSwiglu : kEpiBias;
  a.out = out;
  a.out_dtype = DType::kFloat32;  // kDown's partial outputs o; kGateUp stores by out_act_layout
  a.o_sM = o_sM;
  a.mlp.out_act_layout = out_act_layout;
  a.mlp.out_kt = KT;
  a.mlp.bias = up ? p.b1 : p.b2;
  a.mlp.bias_dtype = up ? p.b1_dtype : p.b2_dtype;
  a.mlp.bias_sG = up ? p.b1_sE : p.b2_sE;
  a.mlp.alpha = p.alpha;
  a.mlp.limit = p.limit;
  return a;
}

/// A weight prepack of p: kKernel(p, Np, Kx) over the G Np rows of Kx packed K bytes (a thread per
/// packed 32-bit word and per scale byte; 256 threads a CTA, at most 8 CTAs per SM).
template <auto kKernel>
int launch_prepack(const Mxfp4PackPlan& p, int64_t Np, int64_t Kx, void* stream) {
  const int64_t n = p.G * Np * (Kx / 8 + Kx / 32);
  if (n == 0) return 0;
  int dev = 0;
  cudaGetDevice(&dev);
  const int64_t blocks = (n + 255) / 256, cap = 8 * int64_t(sm_count(dev));
  kKernel<<<unsigned(blocks < cap ? blocks : cap), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, Np, Kx);
  return int(cudaGetLastError());
}

}  // namespace lowbit::cuda
