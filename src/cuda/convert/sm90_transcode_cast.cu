// src/cuda/convert/sm90_transcode_cast.cu: exact 4-bit -> fp8 transcode and elementwise casts.
//
// NOTES:
//  * transcode: one thread per 16 elements (8 B of packed codes in, 16 B of fp8 out); codes
//    decode through a 16-entry shared table, UINT4 subtracts the block's zero point; every value
//    is exact in the target, so the hardware satfinite conversion is exact too.
//  * cast: dimensions that are contiguous in both tensors are merged first; when the last merged
//    dimension is unit-stride in both, a multiple of 16 long and 16-byte aligned, one thread
//    converts 16 elements with 16-byte loads/stores (fast codecs of cuda/common/codecs.cuh, proved equal
//    to the software codecs); anything else runs the scalar kernel over the software codecs.
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

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uint64_t(a) == 0; }

// ---------------------------------------------------------------------------------------------
// transcode

struct TArgs {
  TranscodePlan p;
  int64_t units = 0;
  FastDiv cpr, mdiv, bdiv;
};

template <bool kE5M2>
__global__ void __launch_bounds__(kThreads) transcode_vec_kernel(const TArgs a) {
  __shared__ float tbl[16];
  const TranscodePlan& p = a.p;
  if (threadIdx.x < 16) tbl[threadIdx.x] = decode_code(p.f.elem, uint8_t(threadIdx.x));
  __syncthreads();
  const bool hi_first = p.f.nibbles == NibbleOrder::kHighFirst;
  const int64_t C = p.K / p.f.block;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < a.units; u += stride) {
    const uint32_t uu = uint32_t(u);
    const uint32_t row = a.cpr.div(uu);
    const uint32_t j = uu - row * a.cpr.d;
    const uint32_t l = a.mdiv.div(row);
    const uint32_t m = row - l * a.mdiv.d;
    const float zf = p.zeros ? float(p.zeros[(int64_t(l) * p.M + m) * C + a.bdiv.div(j)]) : 0.0f;
    const uint2 w = dev::ld_stream8(p.q + int64_t(l) * p.q_sL + int64_t(m) * p.q_sM + int64_t(j) * 8);
    uint32_t qw[2] = {w.x, w.y};
    if (hi_first) {
      qw[0] = ((qw[0] >> 4) & 0x0F0F0F0Fu) | ((qw[0] & 0x0F0F0F0Fu) << 4);
      qw[1] = ((qw[1] >> 4) & 0x0F0F0F0Fu) | ((qw[1] & 0x0F0F0F0Fu) << 4);
    }
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = tbl[(qw[i >> 3] >> ((i & 7) * 4)) & 0xFu] - zf;
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = dev::enc_fp8x4_finite<kE5M2>(v + 4 * i);
    dev::st_stream(p.out + int64_t(l) * p.o_sL + int64_t(m) * p.o_sM + int64_t(j) * 16,
                   make_uint4(o[0], o[1], o[2], o[3]));
  }
}

__global__ void __launch_bounds__(kThreads) transcode_generic_kernel(const TranscodePlan p) {
  const bool e5 = p.out_dtype == DType::kE5M2;
  const int64_t total = p.L * p.M * p.K;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t u = int64_t(blockIdx.x) * kThreads + threadIdx.x; u < total; u += stride) {
    const int64_t row = u / p.K, k = u % p.K;
    const int64_t l = row / p.M, m = row % p.M;
    const uint8_t code = unpack_nibble(p.f.nibbles, p.q[l * p.q_sL + m * p.q_sM + k / 2], int(k & 1));
    float v = decode_code(p.f.elem, code);
    if (p.f.elem == Elem::kUInt4) v -= float(p.zeros[p.sp.offset(l, m, k / p.f.block)]);
    p.out[l * p.o_sL + m * p.o_sM + k] = e5 ? encode_e5m2(v) : encode_e4m3(v);
  }
}

// ---------------------------------------------------------------------------------------------
// cast

struct CArgs {
  const void* x = nullptr;
  void* out = nullptr;
  int nouter = 0;                 // outer dims (row index decomposition), innermost last
  int64_t shape[kMaxDims] = {};
  int64_t xs[kMaxDims] = {};
  int64_t os[kMaxDims] = {};
  int64_t units = 0;
  FastDiv cpr;                    // chunks per row (rows of K contiguous elements)
  Saturate sat = Saturate::kFinite;
};

/// 16 raw input elements (16-byte loads).
template <DType T>
struct Raw16 {
  static constexpr int kWords = dtype_bytes(T) * 4;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const void* base, int64_t elem_off) {
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + elem_off * dtype_bytes(T));
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = dev::ld_stream(q + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  }
  __device__ __forceinline__ uint32_t bits(int i) const {
    constexpr int b = dtype_bytes(T);
    if (b == 4) return w[i];
    if (b == 2) return (w[i >> 1] >> ((i & 1) * 16)) & 0xFFFFu;
    return (w[i >> 2] >> ((i & 3) * 8)) & 0xFFu;
  }
  /// Hardware decode; NaN inputs give some NaN (returns true if any value is NaN).
  __device__ __forceinline__ bool decode_fast(float* v) const {
    if (T == DType::kFloat32) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = dev::bitsf(w[i]);
      return false;  // bits are copied exactly, NaN included
    } else if (T == DType::kBFloat16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = dev::bitsf(bits(i) << 16);
      return false;
    } else if (T == DType::kFloat16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = __half2float(__ushort_as_half(uint16_t(bits(i))));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) dev::dec_fp8x2<T == DType::kE5M2>(w[i >> 1] >> ((i & 1) * 16), v + 2 * i);
    }
    float acc = v[0];
#pragma unroll
    for (int i = 1; i < 16; ++i) asm("max.NaN.f32 %0, %0, %1;" : "+f"(acc) : "f"(v[i]));
    return acc != acc;
  }
  /// Exact decode (load_float semantics: canonical NaN with the sign kept).
  __device__ __forceinline__ void decode_exact(float* v) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t b = bits(i);
      if (T == DType::kFloat16) v[i] = dev::dec_f16(uint16_t(b));
      else if (T == DType::kE4M3) v[i] = decode_e4m3(uint8_t(b));
      else if (T == DType::kE5M2) v[i] = decode_e5m2(uint8_t(b));
    }
  }
};

template <DType O>
constexpr int cast_vecs() {
  return O == DType::kFloat32 ? 4 : (O == DType::kBFloat16 || O == DType::kFloat16 ? 2 : 1);
}

/// The output bytes of 16 values as 16-byte vectors (cast_vecs<O>() of them).
template <DType O>
__device__ __forceinline__ void cast_pack16(const float* v, Saturate sat, bool nan, uint4* out) {
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
          asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
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
    for (int i = 0; i < 4; ++i)
      w[i] = sat == Saturate::kFinite ? dev::enc_fp8x4_finite<k5>(v + 4 * i) : dev::enc_fp8x4<k5>(v + 4 * i, sat);
    out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/// One 16-element chunk: hardware path, exact path for chunks that hold a NaN. Stores through
/// st_group (wide outputs), so every lane of the warp calls it; `live` false stores nothing.
template <DType I, DType O>
__device__ __forceinline__ void cast_chunk(const void* x, int64_t xo, void* out, int64_t oo, Saturate sat, bool live) {
  constexpr int kV = cast_vecs<O>();
  uint4 ov[kV];
  char* op = nullptr;
  if (live) {
    Raw16<I> r;
    r.load(x, xo);
    float v[16];
    bool nan = r.decode_fast(v);
    if (nan) r.decode_exact(v);
    if (I == DType::kFloat32 || I == DType::kBFloat16) {  // NaN passes through exactly: still check
      float acc = v[0];
#pragma unroll
      for (int i = 1; i < 16; ++i) asm("max.NaN.f32 %0, %0, %1;" : "+f"(acc) : "f"(v[i]));
      nan = acc != acc;
    }
    cast_pack16<O>(v, sat, nan, ov);
    op = static_cast<char*>(out) + oo * dtype_bytes(O);
  }
  if (kV == 1) {
    if (op) dev::st_stream(op, ov[0]);
  } else {
    dev::st_group<kV>(op, ov);
  }
}

template <DType I, DType O>
__global__ void __launch_bounds__(kThreads) cast_vec_kernel(const CArgs a) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t lane = threadIdx.x & 31;
  for (int64_t u0 = int64_t(blockIdx.x) * kThreads + threadIdx.x - lane; u0 < a.units; u0 += stride) {
    const int64_t u = u0 + lane;
    const bool live = u < a.units;
    const uint32_t uu = uint32_t(live ? u : u0);
    uint32_t row = a.cpr.div(uu);
    const uint32_t j = uu - row * a.cpr.d;
    int64_t xo = int64_t(j) * 16, oo = int64_t(j) * 16;
    for (int d = a.nouter - 1; d >= 0; --d) {
      const int64_t n = a.shape[d];
      const int64_t idx = d == 0 ? int64_t(row) : int64_t(row) % n;
      if (d > 0) row = uint32_t(int64_t(row) / n);
      xo += idx * a.xs[d];
      oo += idx * a.os[d];
    }
    cast_chunk<I, O>(a.x, xo, a.out, oo, a.sat, live);
  }
}

/// Wide flat cast (more than 2^32 chunks is beyond any real tensor, but > 2^31 elements must
/// work): 1-D, 64-bit indices.
template <DType I, DType O>
__global__ void __launch_bounds__(kThreads) cast_flat_kernel(const void* x, void* out, int64_t chunks, Saturate sat) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t lane = threadIdx.x & 31;
  for (int64_t u0 = int64_t(blockIdx.x) * kThreads + threadIdx.x - lane; u0 < chunks; u0 += stride) {
    const int64_t u = u0 + lane;
    cast_chunk<I, O>(x, u * 16, out, u * 16, sat, u < chunks);
  }
}

__global__ void __launch_bounds__(kThreads) cast_generic_kernel(const CastPlan p, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    int64_t rem = i, xo = 0, oo = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % p.shape[d];
      rem /= p.shape[d];
      xo += idx * p.xs[d];
      oo += idx * p.os[d];
    }
    store_float(p.out, p.out_dtype, oo, load_float(p.x, p.x_dtype, xo), p.sat);
  }
}

template <DType I, DType O>
cudaError_t launch_cast_io(const CArgs& a, bool flat, cudaStream_t s) {
  if (flat) {
    const int64_t g = grid_for(cast_flat_kernel<I, O>, kThreads, a.units);
    cast_flat_kernel<I, O><<<unsigned(g), kThreads, 0, s>>>(a.x, a.out, a.units, a.sat);
  } else {
    const int64_t g = grid_for(cast_vec_kernel<I, O>, kThreads, a.units);
    cast_vec_kernel<I, O><<<unsigned(g), kThreads, 0, s>>>(a);
  }
  return cudaGetLastError();
}

template <DType I>
cudaError_t launch_cast_i(DType o, const CArgs& a, bool flat, cudaStream_t s) {
  switch (o) {
    case DType::kFloat32: return launch_cast_io<I, DType::kFloat32>(a, flat, s);
    case DType::kFloat16: return launch_cast_io<I, DType::kFloat16>(a, flat, s);
    case DType::kBFloat16: return launch_cast_io<I, DType::kBFloat16>(a, flat, s);
    case DType::kE4M3: return launch_cast_io<I, DType::kE4M3>(a, flat, s);
    case DType::kE5M2: return launch_cast_io<I, DType::kE5M2>(a, flat, s);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_cast_vec(DType i, DType o, const CArgs& a, bool flat, cudaStream_t s) {
  switch (i) {
    case DType::kFloat32: return launch_cast_i<DType::kFloat32>(o, a, flat, s);
    case DType::kFloat16: return launch_cast_i<DType::kFloat16>(o, a, flat, s);
    case DType::kBFloat16: return launch_cast_i<DType::kBFloat16>(o, a, flat, s);
    case DType::kE4M3: return launch_cast_i<DType::kE4M3>(o, a, flat, s);
    case DType::kE5M2: return launch_cast_i<DType::kE5M2>(o, a, flat, s);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_cast_generic(const CastPlan& p, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const int64_t g = grid_for(cast_generic_kernel, kThreads, n);
  cast_generic_kernel<<<unsigned(g), kThreads, 0, s>>>(p, n);
  return cudaGetLastError();
}

}  // namespace

int transcode(const TranscodePlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t total = p.L * p.M * p.K;
  if (total == 0) return cudaSuccess;
  const int64_t cpr = p.K / 16;
  const bool vec = (p.zeros == nullptr || p.f.block % 16 == 0) && aligned(p.q, 8) && aligned(p.out, 16) && (p.M <= 1 || p.q_sM % 8 == 0) &&
                   (p.L <= 1 || p.q_sL % 8 == 0) && (p.M <= 1 || p.o_sM % 16 == 0) &&
                   (p.L <= 1 || p.o_sL % 16 == 0) && p.L * p.M * cpr < (int64_t(1) << 32);
  if (vec) {
    TArgs a;
    a.p = p;
    a.units = p.L * p.M * cpr;
    a.cpr = FastDiv(uint32_t(cpr));
    a.mdiv = FastDiv(uint32_t(p.M));
    a.bdiv = FastDiv(uint32_t(p.f.block >= 16 ? p.f.block / 16 : 1));
    if (p.out_dtype == DType::kE5M2) {
      const int64_t g = grid_for(transcode_vec_kernel<true>, kThreads, a.units);
      transcode_vec_kernel<true><<<unsigned(g), kThreads, 0, s>>>(a);
    } else {
      const int64_t g = grid_for(transcode_vec_kernel<false>, kThreads, a.units);
      transcode_vec_kernel<false><<<unsigned(g), kThreads, 0, s>>>(a);
    }
    return cudaGetLastError();
  }
  const int64_t g = grid_for(transcode_generic_kernel, kThreads, total);
  transcode_generic_kernel<<<unsigned(g), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

int cast(const CastPlan& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d) n *= p.shape[d];
  if (n == 0) return cudaSuccess;
  // merge dimensions: drop size-1 dims, then fold d into d+1 when contiguous in both tensors
  int nd = 0;
  int64_t sh[kMaxDims], xs[kMaxDims], os[kMaxDims];
  for (int d = 0; d < p.ndim; ++d) {
    if (p.shape[d] == 1) continue;
    if (nd > 0 && xs[nd - 1] == p.xs[d] * p.shape[d] && os[nd - 1] == p.os[d] * p.shape[d]) {
      sh[nd - 1] *= p.shape[d];
      xs[nd - 1] = p.xs[d];
      os[nd - 1] = p.os[d];
      continue;
    }
    sh[nd] = p.shape[d];
    xs[nd] = p.xs[d];
    os[nd] = p.os[d];
    ++nd;
  }
  if (nd == 0) {  // a single element
    sh[0] = 1;
    xs[0] = os[0] = 1;
    nd = 1;
  }
  const int isz = dtype_bytes(p.x_dtype), osz = dtype_bytes(p.out_dtype);
  const bool inner_unit = xs[nd - 1] == 1 && os[nd - 1] == 1;
  const bool al = aligned(p.x, 16) && aligned(p.out, 16);
  if (inner_unit && al && nd == 1) {
    // flat: 16-element chunks, then the tail through the scalar kernel
    CArgs a;
    a.x = p.x;
    a.out = p.out;
    a.units = sh[0] / 16;
    a.sat = p.sat;
    if (a.units > 0) {
      const cudaError_t e = launch_cast_vec(p.x_dtype, p.out_dtype, a, true, s);
      if (e != cudaSuccess) return e;
    }
    const int64_t done = a.units * 16;
    if (done == sh[0]) return cudaSuccess;
    CastPlan t = p;
    t.ndim = 1;
    t.shape[0] = sh[0] - done;
    t.xs[0] = t.os[0] = 1;
    t.x = static_cast<const char*>(p.x) + done * isz;
    t.out = static_cast<char*>(p.out) + done * osz;
    return launch_cast_generic(t, t.shape[0], s);
  }
  bool vec = inner_unit && al && sh[nd - 1] % 16 == 0 && nd - 1 <= kMaxDims;
  for (int d = 0; vec && d < nd - 1; ++d) vec = (xs[d] * isz) % 16 == 0 && (os[d] * osz) % 16 == 0;
  if (vec && n / 16 < (int64_t(1) << 32)) {
    CArgs a;
    a.x = p.x;
    a.out = p.out;
    a.nouter = nd - 1;
    for (int d = 0; d < nd - 1; ++d) {
      a.shape[d] = sh[d];
      a.xs[d] = xs[d];
      a.os[d] = os[d];
    }
    a.units = n / 16;
    a.cpr = FastDiv(uint32_t(sh[nd - 1] / 16));
    a.sat = p.sat;
    return launch_cast_vec(p.x_dtype, p.out_dtype, a, false, s);
  }
  return launch_cast_generic(p, n, s);
}

}  // namespace lowbit::cuda
