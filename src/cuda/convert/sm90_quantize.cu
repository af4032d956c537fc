// src/cuda/convert/sm90_quantize.cu: quantize (every block format, every scale layout). The amax
// pass of NVFP4 with compute_global_amax is tensor_amax (sm90_tensor_amax.cu).
//
// NOTES:
//  * Vector kernel: one thread owns 16 consecutive elements of a row (one 16-element chunk:
//    64 B of fp32 or 32 B of fp16/bf16 through 16-byte loads); a block of B elements is owned
//    by B/16 consecutive lanes (1 for NVFP4, 2 for MX, 8 for groups of 128), so the block
//    reduction is register + shuffle only. The lane that owns a block's first chunk writes its
//    scale (and zero point) straight into the requested layout; the lane of a row's last block
//    writes the blocked layouts' zero column padding, and extra work items after the data
//    write the zero padding rows (grouped layouts: every stored row that belongs to no group).
//    No memset pass, no shared-memory staging of the data.
//  * Generic kernel (blocks that are not 16 * 2^k <= 256 elements, unaligned pointers or
//    strides): one thread per block, scalar loads. Same scale/padding code.
//  * NVFP4 with compute_global_amax: cudaMemsetAsync + amax kernel (sm90_tensor_amax.cu) +
//    quantize kernel on one stream (no host sync); the quantize kernel reads the amax from
//    device memory.
//  * Element math is lowbit/block_quant.hpp's: compute_block_scale per block; per element the
//    hardware fp8 conversions (proved equal to encode_e4m3/e5m2 by the exhaustive self-test) or
//    the fast 4-bit encoders of cuda/common/codecs.cuh. A division by a UE8M0 (power-of-two) scale is
//    replaced by the product with its exact reciprocal: both are the correctly rounded x*2^-e.
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

struct QArgs {
  QuantPlan p;
  int64_t C = 0;            // scale columns
  int64_t data_units = 0;   // work items of the data
  int64_t pad_rows = 0;     // candidate padding rows per batch
  int64_t pad_row0 = 0;     // first candidate row
  int64_t pad_units = 0;    // L * pad_rows
  // vector kernel
  FastDiv cpr;              // chunks per row
  FastDiv mdiv;             // M
  int tpb_log2 = 0;         // log2(lanes per block)
  // generic kernel
  int64_t units_per_row = 0;
};

__device__ __forceinline__ float load_global_amax_scale(const QuantPlan& p) {
  if (p.f.rule == ScaleRule::kNvfp4 && p.global_amax) return nvfp4_global_encode_scale(*p.global_amax);
  return 1.0f;
}

__device__ __forceinline__ void store_code(void* base, ScaleType t, int64_t off, uint32_t code) {
  if (t == ScaleType::kF32) static_cast<uint32_t*>(base)[off] = code;
  else static_cast<uint8_t*>(base)[off] = uint8_t(code);
}

/// Scale (and zero point) of block (l, m, c), plus the blocked layouts' column padding when c
/// is the row's last block.
__device__ __forceinline__ void write_block_scale(const QArgs& a, const dev::GroupMap& gm, int64_t l, int64_t m,
                                                  int64_t c, const BlockScale& b) {
  const QuantPlan& p = a.p;
  const ScalePlan& sp = p.sp;
  const int64_t sr = sp.groups > 0 ? gm.stored_row(m) : m;
  const int64_t base = l * sp.batch_stride;
  const int64_t off = base + scale_offset(sp.layout, sp.rows_pad, sp.cols, sr, c);
  store_code(p.scales, p.f.scale_type, off, b.code);
  if (p.zeros) p.zeros[off] = b.zero;
  if (c == a.C - 1) {
    const int64_t Cp = scale_cols_padded(sp.layout, a.C);
    for (int64_t cc = a.C; cc < Cp; ++cc) {
      const int64_t o = base + scale_offset(sp.layout, sp.rows_pad, sp.cols, sr, cc);
      store_code(p.scales, p.f.scale_type, o, 0u);
      if (p.zeros) p.zeros[o] = 0;
    }
  }
}

/// Padding work item pu. Plain layouts: zero one padding row (all padded columns). Grouped
/// layouts: zero the entries of the aligned quad of offsets [4 pu, 4 pu + 4) that hold no data
/// (the quads tile the whole buffer, so rows of an incomplete last tile are covered too).
__device__ __forceinline__ void write_pad_row(const QArgs& a, const dev::GroupMap& gm, int64_t pu) {
  const QuantPlan& p = a.p;
  const ScalePlan& sp = p.sp;
  if (sp.groups > 0) {
    const int64_t o0 = pu * 4;
    int64_t sr, c0;
    scale_coords(sp.layout, sp.rows_pad, sp.cols, o0, &sr, &c0);
    const bool data = gm.logical_row(sr) >= 0;
    for (int k = 0; k < 4 && o0 + k < sp.batch_stride; ++k) {
      if (data && c0 + k < a.C) continue;
      store_code(p.scales, p.f.scale_type, o0 + k, 0u);
      if (p.zeros) p.zeros[o0 + k] = 0;
    }
    return;
  }
  const int64_t Cp = scale_cols_padded(sp.layout, a.C);
  const int64_t cq = (Cp + 3) / 4;  // column quads per padding row
  const int64_t quad = pu % cq, lr = pu / cq;
  const int64_t l = lr / a.pad_rows;
  const int64_t s = a.pad_row0 + lr % a.pad_rows;
  const int64_t base = l * sp.batch_stride;
  for (int64_t c = quad * 4; c < quad * 4 + 4 && c < Cp; ++c) {
    const int64_t o = base + scale_offset(sp.layout, sp.rows_pad, sp.cols, s, c);
    store_code(p.scales, p.f.scale_type, o, 0u);
    if (p.zeros) p.zeros[o] = 0;
  }
}

__device__ __forceinline__ void merge_shfl(BlockStats& st, unsigned mask, int width, bool minmax) {
  for (int o = 1; o < width; o <<= 1) {
    BlockStats t;
    t.amax_bits = __shfl_xor_sync(mask, st.amax_bits, o);
    if (minmax) {
      t.min = __shfl_xor_sync(mask, st.min, o);
      t.max = __shfl_xor_sync(mask, st.max, o);
      st.merge(t);
    } else {
      st.amax_bits = t.amax_bits > st.amax_bits ? t.amax_bits : st.amax_bits;
    }
  }
}

template <Elem E>
__device__ __forceinline__ void setup_tables(float* nf4t) {
  if (E == Elem::kNF4 && threadIdx.x < 16)
    nf4t[threadIdx.x] = threadIdx.x < 15 ? nf4_threshold(int(threadIdx.x)) : bits_float(0x7F800000u);
}

/// Codes of 16 scaled values v[] (already x*factor or x/factor).
template <Elem E>
__device__ __forceinline__ void encode16(const float* v, const float* nf4t, const BlockScale& b, bool checked,
                                         uint32_t* out /* 4 words (8-bit) or 2 words (4-bit) */) {
  if (E == Elem::kE4M3 || E == Elem::kE5M2) {
    constexpr bool k5 = E == Elem::kE5M2;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[i] = checked ? dev::enc_fp8x4<k5>(v + 4 * i, Saturate::kFinite) : dev::enc_fp8x4_finite<k5>(v + 4 * i);
  } else {
    uint32_t c[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (E == Elem::kE2M1) c[i] = dev::enc_e2m1(v[i]);
      else if (E == Elem::kNF4) c[i] = dev::enc_nf4(v[i], nf4t);
      else if (E == Elem::kInt4) c[i] = dev::enc_int4(v[i]);
      else c[i] = encode_uint4_zp(v[i], b);  // UINT4
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; j += 2) word |= (c[8 * w + j] | (c[8 * w + j + 1] << 4)) << (4 * j);
      out[w] = word;
    }
  }
}

/// How a block's elements are scaled on the fast path (the recipe's arithmetic, fixed at
/// compile time): kPow2 = times a power of two (MX rules, UE8M0 group scales); kDiv = divided
/// by an fp32 scale (F32 group scales, zero-point recipe); kMul = times an arbitrary fp32
/// factor (NVFP4, NF4 absmax).
enum class QMode : int { kPow2, kDiv, kMul };

template <DType T, Elem E, QMode M>
struct VecQuant {
  static constexpr bool kMinMax = E == Elem::kUInt4;
  static constexpr bool kPacked = elem_bits(E) == 4;
  static constexpr bool k16 = T != DType::kFloat32;

  const QArgs& a;
  const dev::GroupMap& gm;
  const float* nf4t;
  const dev::NF4Cell* cells;
  QuantContext ctx;
  float s_enc6 = 1.0f, s_dec = 1.0f;  // NVFP4: s_enc * (1/6), 1 / s_enc
  int tpb;
  unsigned gmask;

  __device__ __forceinline__ void coords(int64_t u, uint32_t& l, uint32_t& m, uint32_t& j) const {
    const uint32_t uu = uint32_t(u);
    const uint32_t row = a.cpr.div(uu);
    j = uu - row * a.cpr.d;
    l = a.mdiv.div(row);
    m = row - l * a.mdiv.d;
  }
  __device__ __forceinline__ const char* src(uint32_t l, uint32_t m, uint32_t j) const {
    const QuantPlan& p = a.p;
    return static_cast<const char*>(p.x) + (int64_t(l) * p.x_sL + int64_t(m) * p.x_sM + int64_t(j) * 16) * (k16 ? 2 : 4);
  }

  /// |x| of element i from the raw chunk and (16-bit types) the masked words aw.
  __device__ __forceinline__ float absval(const dev::Chunk16<T>& ch, const uint32_t* aw, int i) const {
    if (T == DType::kBFloat16) return dev::bitsf(i & 1 ? (aw[i >> 1] & 0xFFFF0000u) : (aw[i >> 1] << 16));
    if (T == DType::kFloat16) return __half2float(__ushort_as_half(uint16_t(aw[i >> 1] >> ((i & 1) * 16))));
    return fabsf(dev::bitsf(ch.w[i]));
  }

  /// NVFP4 block scale (= compute_block_scale for kNvfp4 on a finite block) with the per-tensor
  /// terms hoisted and the E4M3 conversions in hardware (both proved equal by the self-test).
  __device__ __forceinline__ BlockScale nvfp4_scale(uint32_t amax_bits) const {
    BlockScale b;
    uint32_t sb = dev::hw_e4m3x2(dev::bitsf(amax_bits) * s_enc6, 0.0f) & 0xFFu;
    const ZeroScale z = a.p.f.zero_scale;
    if (sb == 0) sb = z == ZeroScale::kMinSubnormal ? 0x01 : (z == ZeroScale::kOne ? 0x38 : 0x00);
    float d[2];
    dev::dec_fp8x2<false>(sb, d);
    b.code = sb;
    const float m = 1.0f / (d[0] * s_dec);
    b.factor = m < kFltMax ? m : kFltMax;
    return b;
  }

  /// UE8M0 code of a finite block of the kPow2 recipes (= compute_block_scale: MX FLOOR / RCEIL,
  /// amax group recipe with UE8M0 scales).
  __device__ __forceinline__ uint32_t pow2_code(uint32_t amax_bits) const {
    const BlockFormat& f = a.p.f;
    if (f.rule == ScaleRule::kMxFloor) {
      int e = int((amax_bits >> 23) & 0xFFu) - 127 - elem_emax(E);
      e = e < -127 ? -127 : (e > 127 ? 127 : e);
      return uint32_t(e + 127);
    }
    float am = dev::bitsf(amax_bits);
    if (f.rule == ScaleRule::kAmax) am = am > f.eps ? am : f.eps;
    return encode_ue8m0_rceil(am / elem_max(E));
  }

  __device__ __forceinline__ void process(const dev::Chunk16<T>& ch, uint32_t l, uint32_t m, uint32_t j) const {
    const QuantPlan& p = a.p;
    // ---- block statistics
    uint32_t aw[8];  // 16-bit types: the words with both sign bits cleared
    BlockStats st;
    if (k16) {
#pragma unroll
      for (int i = 0; i < 8; ++i) aw[i] = ch.w[i] & 0x7FFF7FFFu;
      uint32_t h = __vimax3_u16x2(__vimax3_u16x2(aw[0], aw[1], aw[2]), __vimax3_u16x2(aw[3], aw[4], aw[5]),
                                  __vmaxu2(aw[6], aw[7]));
      h = max(h >> 16, h & 0xFFFFu);
      st.amax_bits = T == DType::kBFloat16 ? h << 16 : dev::fbits(dev::dec_f16(uint16_t(h)));
      if (kMinMax) {
        // packed min / max over the 16-bit pairs (exact; NaN blocks are caught by amax_bits, and
        // the sign of a zero min / max does not matter, see below)
        uint32_t mn2 = ch.w[0], mx2 = ch.w[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) {
          mn2 = dev::minmax16x2<T == DType::kBFloat16, false>(mn2, ch.w[i]);
          mx2 = dev::minmax16x2<T == DType::kBFloat16, true>(mx2, ch.w[i]);
        }
        const dev::Chunk16<T> mm{{mn2, mx2}};
        st.min = fminf(mm.get(0), mm.get(1));
        st.max = fmaxf(mm.get(2), mm.get(3));
      }
    } else if (kMinMax) {
      float mn = ch.get(0), mx = mn;
      uint32_t am = dev::fbits(mn) & 0x7FFFFFFFu;
#pragma unroll
      for (int i = 1; i < 16; ++i) {
        const float x = ch.get(i);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
        am = max(am, dev::fbits(x) & 0x7FFFFFFFu);
      }
      // fminf / fmaxf order ties of +-0 differently from the reference; the zero point and
      // scale do not depend on the sign of a zero min / max (eps > 0), and a NaN block is
      // caught by amax_bits.
      st.amax_bits = am;
      st.min = mn;
      st.max = mx;
    } else {
      uint32_t am = 0;
#pragma unroll
      for (int i = 0; i < 16; ++i) am = max(am, ch.w[i] & 0x7FFFFFFFu);
      st.amax_bits = am;
    }
    merge_shfl(st, gmask, tpb, kMinMax);

    // ---- scale and codes
    BlockScale b;
    uint32_t out[4];
    bool fast = st.finite();
    if (!fast) {
      b = compute_block_scale(p.f, st, ctx);
      const uint32_t fill = E == Elem::kNF4 ? 0x77777777u : 0u;
      out[0] = out[1] = out[2] = out[3] = fill;
    } else if (M == QMode::kPow2) {
      b.code = pow2_code(st.amax_bits);
      const int e = 127 - int(b.code);  // every kPow2 recipe multiplies by 2^(127 - code)
      const float mul = exp2i(e);
      if (E == Elem::kE2M1) {
        const float c2 = exp2i(e - 3), c1 = c2 * 2.0f, c0 = c2 * 4.0f;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          uint32_t acc = 0;
#pragma unroll
          for (int i = 7; i >= 0; --i) acc = acc * 16u + dev::e2m1_biased(absval(ch, aw, 8 * w + i), c0, c1, c2);
          out[w] = (acc - dev::kE2M1Bias * 0x11111111u) | dev::nibble_signs8<!k16>(ch.w + (k16 ? 4 : 8) * w);
        }
      } else if (E == Elem::kInt4) {
        // |x * mul| <= 7 (the scale is rounded up), so no clamp; the FMA rounds x * 2^k once
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          uint32_t acc = 0;
#pragma unroll
          for (int i = 7; i >= 0; --i) acc = acc * 16u + dev::fbits(fmaf(ch.get(8 * w + i), mul, dev::kInt4Magic));
          out[w] = (acc - dev::kInt4Bias * 0x11111111u) ^ 0x88888888u;
        }
      } else {
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = ch.get(i) * mul;
        encode16<E>(v, nf4t, b, false, out);
      }
    } else if (M == QMode::kDiv) {
      if (kMinMax) {
        b = compute_block_scale(p.f, st, ctx);
      } else {  // = compute_block_scale for kAmax with F32 scales
        const float am = dev::bitsf(st.amax_bits);
        b.factor = (am > p.f.eps ? am : p.f.eps) / elem_max(E);
        b.code = dev::fbits(b.factor);
        b.divide = true;
      }
      const float s = b.factor;
      fast = dev::fast_div_ok(st.amax_bits, dev::fbits(s));
      if (fast) {
        const float y = 1.0f / s;
        float q[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = dev::div_by_recip(ch.get(i), s, y);
        if (E == Elem::kInt4) {
          // |x / s| <= 7 * (1 + 2^-23): s = RN(max(amax, eps) / 7) >= amax / 7 * (1 - 2^-24)
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            uint32_t acc = 0;
#pragma unroll
            for (int i = 7; i >= 0; --i) acc = acc * 16u + dev::fbits(q[8 * w + i] + dev::kInt4Magic);
            out[w] = (acc - dev::kInt4Bias * 0x11111111u) ^ 0x88888888u;
          }
        } else if (E == Elem::kUInt4) {
          // clamp(rint(q) + zp, qlo, qhi): bits(q + 1.5 * 2^23) = kInt4Bias + rint(q) (monotone;
          // negative sums are negative ints), clamped to [bias - zp + qlo, bias - zp + qhi]
          const int base = int(dev::kInt4Bias) - int(b.zero);
          const int lo = base + int(b.qlo), hi = base + int(b.qhi);
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            uint32_t acc = 0;
#pragma unroll
            for (int i = 7; i >= 0; --i)
              acc = acc * 16u + uint32_t(min(max(int(dev::fbits(q[8 * w + i] + 12582912.0f)), lo), hi));
            out[w] = acc - uint32_t(base) * 0x11111111u;
          }
        } else {
          encode16<E>(q, nf4t, b, false, out);
        }
      }
    } else {  // kMul
      if (E == Elem::kE2M1) {
        b = nvfp4_scale(st.amax_bits);
      } else {  // = compute_block_scale for kAbsmax
        b.code = st.amax_bits;
        b.factor = 1.0f / dev::bitsf(st.amax_bits);
      }
      const float f = b.factor;
      if (E == Elem::kE2M1) {
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          uint32_t acc = 0;
#pragma unroll
          for (int i = 7; i >= 0; --i)
            acc = acc * 16u + dev::e2m1_biased(absval(ch, aw, 8 * w + i) * f, 0.5f, 0.25f, 0.125f);
          out[w] = (acc - dev::kE2M1Bias * 0x11111111u) | dev::nibble_signs8<!k16>(ch.w + (k16 ? 4 : 8) * w);
        }
      } else {  // NF4: f = 1 / amax; an infinite f (amax < 2^-128) takes the reference path
        fast = dev::fbits(f) < 0x7F800000u;
        if (!fast && st.amax_bits != 0) {  // = compute_block_scale: divide by amax
          b.divide = true;
          b.factor = dev::bitsf(st.amax_bits);
        }
        if (fast) {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            uint32_t acc = 0;
#pragma unroll
            for (int i = 7; i >= 0; --i) acc = acc * 16u + dev::nf4_cell_code(ch.get(8 * w + i) * f, cells);
            out[w] = acc;
          }
        }
      }
    }
    if (!fast && st.finite()) {  // rare blocks: the reference arithmetic element by element
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = b.divide ? ch.get(i) / b.factor : ch.get(i) * b.factor;
      encode16<E>(v, nf4t, b, true, out);
    }
    uint8_t* qp = p.q + int64_t(l) * p.q_sL + int64_t(m) * p.q_sM;
    if (kPacked) {
      uint2 w;
      w.x = out[0];
      w.y = out[1];
      if (p.f.nibbles == NibbleOrder::kHighFirst) {
        w.x = ((w.x >> 4) & 0x0F0F0F0Fu) | ((w.x & 0x0F0F0F0Fu) << 4);
        w.y = ((w.y >> 4) & 0x0F0F0F0Fu) | ((w.y & 0x0F0F0F0Fu) << 4);
      }
      dev::st_stream8(qp + int64_t(j) * 8, w);
    } else {
      dev::st_stream(qp + int64_t(j) * 16, make_uint4(out[0], out[1], out[2], out[3]));
    }
    if ((j & uint32_t(tpb - 1)) == 0) write_block_scale(a, gm, l, m, j >> a.tpb_log2, b);
  }
};

template <DType T, Elem E, QMode M>
__global__ void __launch_bounds__(kThreads) quantize_vec_kernel(const QArgs a) {
  extern __shared__ int64_t smem[];
  __shared__ float nf4t[16];
  __shared__ dev::NF4Cell cells[dev::kNF4Cells];
  setup_tables<E>(nf4t);
  if (E == Elem::kNF4 && threadIdx.x < dev::kNF4Cells) cells[threadIdx.x] = dev::nf4_cell_init(int(threadIdx.x));
  if (E == Elem::kNF4) __syncthreads();
  const QuantPlan& p = a.p;
  const dev::GroupMap gm = dev::stage_groups(p.sp, smem);
  const int tpb = 1 << a.tpb_log2;
  const unsigned lane = threadIdx.x & 31u;
  VecQuant<T, E, M> w{a, gm, nf4t, cells, QuantContext{}, 1.0f, 1.0f, tpb,
                      tpb >= 32 ? 0xFFFFFFFFu : ((1u << tpb) - 1u) << (lane & ~unsigned(tpb - 1))};
  w.ctx.s_enc = load_global_amax_scale(p);
  w.s_enc6 = w.ctx.s_enc * (1.0f / 6.0f);
  w.s_dec = 1.0f / w.ctx.s_enc;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  // NOTE: software pipeline over the grid-stride loop: chunk i + 2 is loaded before chunk i is
  // processed, so each thread has two chunks of loads in flight while it computes (measured
  // +1-4 % on the 4-bit quantizers; a branch-free form that re-read a valid chunk past the end
  // measured 4-8 % slower than this one). data_units is a multiple of the block's lanes, so the
  // loop bounds are uniform over the lanes that shuffle together.
  uint32_t l0 = 0, m0 = 0, j0 = 0, l1 = 0, m1 = 0, j1 = 0;
  dev::Chunk16<T> c0, c1;
  if (first < a.data_units) {
    w.coords(first, l0, m0, j0);
    c0.load(w.src(l0, m0, j0));
    c1 = c0;  // defined contents when there is no second chunk (never processed then)
  }
  if (first + stride < a.data_units) {
    w.coords(first + stride, l1, m1, j1);
    c1.load(w.src(l1, m1, j1));
  }
  for (int64_t u = first; u < a.data_units; u += stride) {
    uint32_t l2 = 0, m2 = 0, j2 = 0;
    dev::Chunk16<T> c2;
    if (u + 2 * stride < a.data_units) {
      w.coords(u + 2 * stride, l2, m2, j2);
      c2.load(w.src(l2, m2, j2));
    } else {
      c2 = c1;  // past the end: a defined copy that is never processed
    }
    w.process(c0, l0, m0, j0);
    c0 = c1;
    l0 = l1;
    m0 = m1;
    j0 = j1;
    c1 = c2;
    l1 = l2;
    m1 = m2;
    j1 = j2;
  }
  for (int64_t pu = first; pu < a.pad_units; pu += stride) write_pad_row(a, gm, pu);
}

// Generic: one thread per block, scalar loads (any block size, alignment or stride).
__global__ void __launch_bounds__(kThreads) quantize_generic_kernel(const QArgs a) {
  extern __shared__ int64_t smem[];
  const QuantPlan& p = a.p;
  const BlockFormat& f = p.f;
  const dev::GroupMap gm = dev::stage_groups(p.sp, smem);
  QuantContext ctx;
  ctx.s_enc = load_global_amax_scale(p);
  const int64_t total = a.data_units + a.pad_units;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < total; u += stride) {
    if (u >= a.data_units) {
      write_pad_row(a, gm, u - a.data_units);
      continue;
    }
    const int64_t row = u / a.C, c = u % a.C;
    const int64_t l = row / p.M, m = row % p.M;
    const int64_t xrow = l * p.x_sL + m * p.x_sM;
    const int64_t k0 = c * f.block;
    BlockStats st = block_stats_init(load_float(p.x, p.x_dtype, xrow + k0));
    for (int64_t k = 1; k < f.block; ++k) st.add(load_float(p.x, p.x_dtype, xrow + k0 + k));
    const BlockScale b = compute_block_scale(f, st, ctx);
    uint8_t* qrow = p.q + l * p.q_sL + m * p.q_sM;
    uint8_t even = 0;
    for (int64_t k = 0; k < f.block; ++k) {
      const uint8_t code = encode_element(f, b, load_float(p.x, p.x_dtype, xrow + k0 + k));
      if (!f.packed()) {
        qrow[k0 + k] = code;
      } else if ((k & 1) == 0) {
        even = code;
      } else {
        qrow[(k0 + k) / 2] = pack_nibbles(f.nibbles, even, code);
      }
    }
    write_block_scale(a, gm, l, m, c, b);
  }
}

template <typename Kernel>
cudaError_t launch_q(Kernel k, const QArgs& a, int64_t units, size_t smem, cudaStream_t s) {
  if (const cudaError_t e = opt_in_smem(k, smem); e != cudaSuccess) return e;
  const int64_t g = grid_for(k, kThreads, units);
  k<<<unsigned(g), kThreads, smem, s>>>(a);
  return cudaGetLastError();
}

template <DType T>
cudaError_t launch_vec_t(const QArgs& a, int64_t units, size_t smem, cudaStream_t s) {
  const BlockFormat& f = a.p.f;
  const bool div = f.scale_type == ScaleType::kF32 && (f.rule == ScaleRule::kAmax || f.rule == ScaleRule::kMinMax);
  switch (f.elem) {
    case Elem::kE4M3:
      return div ? launch_q(quantize_vec_kernel<T, Elem::kE4M3, QMode::kDiv>, a, units, smem, s)
                 : launch_q(quantize_vec_kernel<T, Elem::kE4M3, QMode::kPow2>, a, units, smem, s);
    case Elem::kE5M2:
      return div ? launch_q(quantize_vec_kernel<T, Elem::kE5M2, QMode::kDiv>, a, units, smem, s)
                 : launch_q(quantize_vec_kernel<T, Elem::kE5M2, QMode::kPow2>, a, units, smem, s);
    case Elem::kE2M1:
      return f.rule == ScaleRule::kNvfp4 ? launch_q(quantize_vec_kernel<T, Elem::kE2M1, QMode::kMul>, a, units, smem, s)
                                         : launch_q(quantize_vec_kernel<T, Elem::kE2M1, QMode::kPow2>, a, units, smem, s);
    case Elem::kInt4:
      return div ? launch_q(quantize_vec_kernel<T, Elem::kInt4, QMode::kDiv>, a, units, smem, s)
                 : launch_q(quantize_vec_kernel<T, Elem::kInt4, QMode::kPow2>, a, units, smem, s);
    case Elem::kUInt4: return launch_q(quantize_vec_kernel<T, Elem::kUInt4, QMode::kDiv>, a, units, smem, s);
    case Elem::kNF4: return launch_q(quantize_vec_kernel<T, Elem::kNF4, QMode::kMul>, a, units, smem, s);
  }
  return cudaErrorInvalidValue;
}

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uint64_t(a) == 0; }

}  // namespace

int quantize(const QuantPlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const BlockFormat& f = p.f;
  if (f.rule == ScaleRule::kNvfp4 && p.global_amax && p.compute_global_amax) {
    // NOTE: the amax pass (sm90_tensor_amax.cu) zeroes *global_amax and runs first on the same stream.
    const int e = tensor_amax(p.x, p.x_dtype, p.L, p.M, p.K, p.x_sL, p.x_sM, p.global_amax, stream);
    if (e != 0) return e;
  }
  QArgs a;
  a.p = p;
  a.C = p.K / f.block;
  const ScalePlan& sp = p.sp;
  if (sp.groups > 0) {
    a.pad_row0 = 0;
    a.pad_rows = sp.rows_pad;
  } else {
    a.pad_row0 = p.M;
    a.pad_rows = sp.rows_pad - p.M;
  }
  a.pad_units = a.pad_rows > 0 ? p.L * a.pad_rows * ((scale_cols_padded(sp.layout, a.C) + 3) / 4) : 0;
  if (sp.groups > 0) a.pad_units = (sp.batch_stride + 3) / 4;
  const size_t smem = dev::group_smem_bytes(sp);
  if (smem > 200 * 1024) return cudaErrorNotSupported;

  const int esz = p.x_dtype == DType::kFloat32 ? 4 : 2;
  const int qal = f.packed() ? 8 : 16;
  const int64_t tpb = f.block / 16;
  const int64_t cpr = p.K / 16;
  const bool vec = f.block % 16 == 0 && tpb <= 16 && (tpb & (tpb - 1)) == 0 && aligned(p.x, 16) &&
                   (p.M <= 1 || (p.x_sM * esz) % 16 == 0) && (p.L <= 1 || (p.x_sL * esz) % 16 == 0) &&
                   aligned(p.q, qal) && (p.M <= 1 || p.q_sM % qal == 0) && (p.L <= 1 || p.q_sL % qal == 0) &&
                   p.L * p.M * cpr < (int64_t(1) << 32) && cpr > 0;
  if (vec) {
    a.data_units = p.L * p.M * cpr;
    a.cpr = FastDiv(uint32_t(cpr));
    a.mdiv = FastDiv(uint32_t(p.M > 0 ? p.M : 1));
    int lg = 0;
    while ((int64_t(1) << lg) < tpb) ++lg;
    a.tpb_log2 = lg;
    const int64_t units = a.data_units + a.pad_units;
    if (units == 0) return cudaSuccess;
    return with_float_dtype(p.x_dtype, [&](auto t) { return launch_vec_t<decltype(t)::value>(a, units, smem, s); });
  }
  a.data_units = p.L * p.M * a.C;
  const int64_t units = a.data_units + a.pad_units;
  if (units == 0) return cudaSuccess;
  return launch_q(quantize_generic_kernel, a, units, smem, s);
}

}  // namespace lowbit::cuda
