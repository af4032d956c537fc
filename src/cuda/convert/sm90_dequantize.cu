// src/cuda/convert/sm90_dequantize.cu: dequantize (every block format and scale layout) to fp32 / fp16 /
// bf16 / e4m3 / e5m2.
//
// NOTES:
//  * Vector kernel: one thread per 16 output elements (16 B of fp8 codes or 8 B of packed
//    4-bit codes in; 64 / 32 / 16 B out through 16-byte stores); each thread reads its block's
//    scale (a cached scalar load, shared by the block's lanes) from any layout, grouped ones
//    through the shared-memory group map.
//  * fp8 codes decode through cvt.rn.f16x2.e{4m3,5m2}x2 (exact); 4-bit codes through a
//    16-entry shared table of decode_code values.
//  * NaN: the fast path multiplies on the GPU; a chunk with any NaN product is recomputed with
//    the software decoders and the x86 NaN rules of the CPU reference (x86_mul), so NaN
//    payloads and signs of fp32 / bf16 outputs match the reference too.
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

struct DArgs {
  DequantPlan p;
  int64_t C = 0;
  int64_t units = 0;
  FastDiv cpr, mdiv;
  int block_log2_chunks = 0;  // log2(block / 16) when a power of two, else -1
  FastDiv bdiv;               // block / 16 chunks per block
};

/// The reference's decode_element with x86 NaN rules.
__device__ __forceinline__ float dequant_exact(const BlockFormat& f, uint8_t c, float s, uint8_t zp, float s_dec) {
  if (f.elem == Elem::kUInt4) return dev::x86_mul(float(c & 0xF) - float(zp), s);
  const float v = dev::x86_mul(decode_code(f.elem, c), s);
  return f.rule == ScaleRule::kNvfp4 ? dev::x86_mul(v, s_dec) : v;
}

/// The output bytes of 16 values: fp32 4 vectors, fp16 / bf16 2, fp8 1.
template <DType O>
constexpr int out_vecs() {
  return O == DType::kFloat32 ? 4 : (O == DType::kBFloat16 || O == DType::kFloat16 ? 2 : 1);
}

template <DType O>
__device__ __forceinline__ void pack16(const float* v, bool nan, uint4* out) {
  if (O == DType::kFloat32) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[i] = make_uint4(dev::fbits(v[4 * i]), dev::fbits(v[4 * i + 1]), dev::fbits(v[4 * i + 2]),
                          dev::fbits(v[4 * i + 3]));
  } else if (O == DType::kBFloat16 || O == DType::kFloat16) {
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (O == DType::kBFloat16) {
        if (nan) {
          w[i] = dev::enc_bf16x2(v[2 * i], v[2 * i + 1]);
        } else {
          uint32_t r;
          asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
          w[i] = r;
        }
      } else {
        w[i] = nan ? uint32_t(dev::enc_f16(v[2 * i])) | (uint32_t(dev::enc_f16(v[2 * i + 1])) << 16)
                   : uint32_t(__half_as_ushort(__float2half_rn(v[2 * i]))) |
                         (uint32_t(__half_as_ushort(__float2half_rn(v[2 * i + 1]))) << 16);
      }
    }
    out[0] = make_uint4(w[0], w[1], w[2], w[3]);
    out[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
    constexpr bool k5 = O == DType::kE5M2;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = dev::enc_fp8x4<k5>(v + 4 * i, Saturate::kFinite);
    out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Decode classes: 0 = E4M3 codes, 1 = E5M2 codes, 2 = 4-bit codes (shared table).
template <int kDec, DType O>
__global__ void __launch_bounds__(kThreads) dequantize_vec_kernel(const DArgs a) {
  extern __shared__ int64_t smem[];
  __shared__ float tbl[16];
  const DequantPlan& p = a.p;
  const BlockFormat& f = p.f;
  if (kDec == 2 && threadIdx.x < 16) tbl[threadIdx.x] = decode_code(f.elem, uint8_t(threadIdx.x));
  if (kDec == 2) __syncthreads();
  const dev::GroupMap gm = dev::stage_groups(p.sp, smem);
  const float s_dec =
      (f.rule == ScaleRule::kNvfp4 && p.global_amax) ? nvfp4_global_decode_scale(*p.global_amax) : 1.0f;
  const bool nvfp4 = f.rule == ScaleRule::kNvfp4;
  const bool is_u4 = f.elem == Elem::kUInt4;
  const bool hi_first = f.nibbles == NibbleOrder::kHighFirst;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  constexpr int kV = out_vecs<O>();
  // NOTE: warp-uniform loop (the wide outputs store through st_group, which needs every lane).
  // 8-bit codes are software-pipelined: the codes and scale of the chunk one stride ahead are
  // loaded before the current chunk is decoded and stored (measured +3 %); for 4-bit codes
  // (8 bytes per chunk) the same pipeline measured 0-2 % slower, so they load and store in turn.
  const int64_t lane = threadIdx.x & 31;
  struct Loaded {
    uint32_t qw[4];
    uint32_t code;
    uint8_t zp;
    uint32_t l, m, j;
    bool live;
  };
  auto fetch = [&](int64_t u) {
    Loaded t{};
    t.live = u < a.units;
    if (t.live) {
      const uint32_t uu = uint32_t(u);
      const uint32_t row = a.cpr.div(uu);
      t.j = uu - row * a.cpr.d;
      t.l = a.mdiv.div(row);
      t.m = row - t.l * a.mdiv.d;
      const uint32_t c = a.block_log2_chunks >= 0 ? (t.j >> a.block_log2_chunks) : a.bdiv.div(t.j);
      const int64_t so = dev::scale_off(p.sp, gm, t.l, t.m, c);
      t.code = load_scale_code(p.scales, f.scale_type, so);
      t.zp = p.zeros ? p.zeros[so] : 0;
      const uint8_t* qrow = p.q + int64_t(t.l) * p.q_sL + int64_t(t.m) * p.q_sM;
      if (kDec == 2) {
        const uint2 w = dev::ld_stream8(qrow + int64_t(t.j) * 8);
        t.qw[0] = w.x;
        t.qw[1] = w.y;
      } else {
        const uint4 w = dev::ld_stream(qrow + int64_t(t.j) * 16);
        t.qw[0] = w.x;
        t.qw[1] = w.y;
        t.qw[2] = w.z;
        t.qw[3] = w.w;
      }
    }
    return t;
  };
  auto emit = [&](Loaded& t) {
    uint4 ov[kV];
    char* op = nullptr;
    if (t.live) {
      const float s = decode_scale(f.scale_type, t.code);
      const uint8_t zp = t.zp;
      uint32_t* qw = t.qw;
      if (kDec == 2 && hi_first) {
        qw[0] = ((qw[0] >> 4) & 0x0F0F0F0Fu) | ((qw[0] & 0x0F0F0F0Fu) << 4);
        qw[1] = ((qw[1] >> 4) & 0x0F0F0F0Fu) | ((qw[1] & 0x0F0F0F0Fu) << 4);
      }
      float v[16];
      bool nan = false;
      if (kDec == 2) {
        const float zf = float(zp);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint32_t cd = (qw[i >> 3] >> ((i & 7) * 4)) & 0xFu;
          float d = tbl[cd];
          if (is_u4) d = d - zf;
          v[i] = d * s;
          if (nvfp4) v[i] = v[i] * s_dec;
          nan |= v[i] != v[i];
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          dev::dec_fp8x2<kDec == 1>(qw[i >> 1] >> ((i & 1) * 16), v + 2 * i);
          v[2 * i] = v[2 * i] * s;
          v[2 * i + 1] = v[2 * i + 1] * s;
          nan |= (v[2 * i] != v[2 * i]) | (v[2 * i + 1] != v[2 * i + 1]);
        }
      }
      if (nan) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint8_t cd = kDec == 2 ? uint8_t((qw[i >> 3] >> ((i & 7) * 4)) & 0xFu)
                                       : uint8_t((qw[i >> 2] >> ((i & 3) * 8)) & 0xFFu);
          v[i] = dequant_exact(f, cd, s, zp, s_dec);
        }
      }
      const int64_t oo = int64_t(t.l) * p.o_sL + int64_t(t.m) * p.o_sM + int64_t(t.j) * 16;
      pack16<O>(v, nan, ov);
      op = static_cast<char*>(p.out) + oo * dtype_bytes(O);
    }
    // fp32: through st_group (measured 0.41 -> 0.88 of copy); fp16 / bf16 store directly
    // (st_group<2> measured slower here: 4-bit dequantize 0.71-0.75 -> 0.65-0.70)
    if (kV == 4) {
      dev::st_group<4>(op, ov);
    } else if (op) {
#pragma unroll
      for (int i = 0; i < kV; ++i) dev::st_stream(op + 16 * i, ov[i]);
    }
  };
  const int64_t u0 = int64_t(blockIdx.x) * kThreads + threadIdx.x - lane;
  if (kDec != 2) {
    Loaded cur = fetch(u0 + lane);
    for (int64_t w0 = u0; w0 < a.units; w0 += stride) {
      Loaded next = fetch(w0 + stride + lane);
      emit(cur);
      cur = next;
    }
  } else {
    for (int64_t w0 = u0; w0 < a.units; w0 += stride) {
      Loaded cur = fetch(w0 + lane);
      emit(cur);
    }
  }
}

// Generic: one thread per output element.
__global__ void __launch_bounds__(kThreads) dequantize_generic_kernel(const DArgs a) {
  extern __shared__ int64_t smem[];
  const DequantPlan& p = a.p;
  const BlockFormat& f = p.f;
  const dev::GroupMap gm = dev::stage_groups(p.sp, smem);
  const float s_dec =
      (f.rule == ScaleRule::kNvfp4 && p.global_amax) ? nvfp4_global_decode_scale(*p.global_amax) : 1.0f;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < a.units; u += stride) {
    const int64_t row = u / p.K, k = u % p.K;
    const int64_t l = row / p.M, m = row % p.M;
    const int64_t so = dev::scale_off(p.sp, gm, l, m, k / f.block);
    const uint32_t sc = load_scale_code(p.scales, f.scale_type, so);
    const uint8_t zp = p.zeros ? p.zeros[so] : 0;
    const uint8_t* qrow = p.q + l * p.q_sL + m * p.q_sM;
    const uint8_t code = f.packed() ? unpack_nibble(f.nibbles, qrow[k / 2], int(k & 1)) : qrow[k];
    const float v = dequant_exact(f, code, decode_scale(f.scale_type, sc), zp, s_dec);
    store_float(p.out, p.out_dtype, l * p.o_sL + m * p.o_sM + k, v);
  }
}

template <typename Kernel>
cudaError_t launch_d(Kernel k, const DArgs& a, size_t smem, cudaStream_t s) {
  if (const cudaError_t e = opt_in_smem(k, smem); e != cudaSuccess) return e;
  const int64_t g = grid_for(k, kThreads, a.units);
  k<<<unsigned(g), kThreads, smem, s>>>(a);
  return cudaGetLastError();
}

template <int kDec>
cudaError_t launch_vec(const DArgs& a, size_t smem, cudaStream_t s) {
  switch (a.p.out_dtype) {
    case DType::kFloat32: return launch_d(dequantize_vec_kernel<kDec, DType::kFloat32>, a, smem, s);
    case DType::kFloat16: return launch_d(dequantize_vec_kernel<kDec, DType::kFloat16>, a, smem, s);
    case DType::kBFloat16: return launch_d(dequantize_vec_kernel<kDec, DType::kBFloat16>, a, smem, s);
    case DType::kE4M3: return launch_d(dequantize_vec_kernel<kDec, DType::kE4M3>, a, smem, s);
    case DType::kE5M2: return launch_d(dequantize_vec_kernel<kDec, DType::kE5M2>, a, smem, s);
    default: return cudaErrorInvalidValue;
  }
}

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uint64_t(a) == 0; }

}  // namespace

int dequantize(const DequantPlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const BlockFormat& f = p.f;
  DArgs a;
  a.p = p;
  a.C = p.K / f.block;
  const size_t smem = dev::group_smem_bytes(p.sp);
  if (smem > 200 * 1024) return cudaErrorNotSupported;
  if (p.L * p.M * p.K == 0) return cudaSuccess;
  const int osz = dtype_bytes(p.out_dtype);
  const int qal = f.packed() ? 8 : 16;
  const int64_t cpr = p.K / 16;
  const bool vec = f.block % 16 == 0 && aligned(p.out, 16) && (p.M <= 1 || (p.o_sM * osz) % 16 == 0) &&
                   (p.L <= 1 || (p.o_sL * osz) % 16 == 0) && aligned(p.q, qal) && (p.M <= 1 || p.q_sM % qal == 0) &&
                   (p.L <= 1 || p.q_sL % qal == 0) && p.L * p.M * cpr < (int64_t(1) << 32);
  if (vec) {
    a.units = p.L * p.M * cpr;
    a.cpr = FastDiv(uint32_t(cpr));
    a.mdiv = FastDiv(uint32_t(p.M));
    const int64_t bc = f.block / 16;
    a.bdiv = FastDiv(uint32_t(bc));
    a.block_log2_chunks = -1;
    for (int lg = 0; lg < 31; ++lg)
      if ((int64_t(1) << lg) == bc) a.block_log2_chunks = lg;
    if (f.elem == Elem::kE4M3) return launch_vec<0>(a, smem, s);
    if (f.elem == Elem::kE5M2) return launch_vec<1>(a, smem, s);
    return launch_vec<2>(a, smem, s);
  }
  a.units = p.L * p.M * p.K;
  return launch_d(dequantize_generic_kernel, a, smem, s);
}

}  // namespace lowbit::cuda
