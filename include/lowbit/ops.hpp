// lowbit/ops.hpp: the C++ API of the format and conversion operations.
//
// Every function validates every argument (dtype, shape, strides, device, overlap of outputs
// with inputs) and throws ArgumentError naming the argument and what was expected before it
// touches any output. Tensors on Device::kCPU run the CPU reference (src/ref); tensors on
// Device::kCUDA run the sm_90a kernels (src/cuda) on `stream` with the tensors' device made
// current for the call, or throw NotSupportedError in a build without CUDA. All tensors of one
// call live on one device.
//
// Shapes (L is an optional batch dimension, absent for 2-D inputs):
//   x        [L?, M, K]   float32 / float16 / bfloat16, last dim contiguous, other strides free
//   q        [L?, M, K]   8-bit formats: float8_e4m3fn / float8_e5m2 (uint8 accepted)
//            [L?, M, K/2] 4-bit formats: uint8 or float4_e2m1fn_x2 (E2M1 only)
//   scales   the L stored scale matrices of M x (K/block) in `layout`, one after the other, in
//            a row-major (C-contiguous) tensor of any shape, or in one of the documented views of
//            such storage: the batch-last [.., L] view (the GPU MODE [M, K/16, L] reference
//            scales; its last dimension must be the L matrices) and, for 128x4 blocked scales, the
//            6-D [32,4,M/128,4,K/64,L] GPU MODE view. A tensor of one of these index shapes must
//            have that view's strides (a C-contiguous [M, K/16, L] with L > 1 interleaves its L
//            matrices and is refused); the grouped GEMM's scales ([G, N, K/32], batch first) take
//            no batch-last view.
//            Other strides (e.g. a Fortran-ordered tensor) are refused: the storage is read in
//            memory order, which for them would not be index order;
//            dtype float32 (kF32), float8_e8m0fnu or uint8 (kUE8M0), float8_e4m3fn or uint8 (kE4M3).
//            Padding of the blocked layouts is written with zeros.
//   zeros    UINT4 zero points: uint8, same layout and size as scales.
// K must be a multiple of the block size (refused otherwise: nothing is padded or truncated).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/error.hpp"
#include "lowbit/format.hpp"
#include "lowbit/scale_layout.hpp"
#include "lowbit/tensor.hpp"

namespace lowbit {

/// A CUDA stream handle (cudaStream_t) carried as an opaque pointer; nullptr = legacy default.
struct Stream {
  void* handle = nullptr;
};

/// Optional arguments of quantize / dequantize.
struct QuantArgs {
  TensorView zeros;        ///< UINT4 zero points (required for int4 with zero point)
  TensorView global_amax;  ///< NVFP4: float32 [1]; absent = no per-tensor scale (S_enc = 1)
  bool compute_global_amax = false;  ///< NVFP4 quantize: write the finite amax(|x|) into global_amax first
  /// grouped layouts: int32/int64 [G+1] row boundaries (L must be 1). Host boundaries are
  /// copied once, validated (start at 0, non-decreasing, end at M) and used from that copy;
  /// device-resident ones are trusted, since reading them would synchronize.
  TensorView m_indptr;
};

/// Shape of the scale tensor that quantize expects for a [L, M, K] input (L = 1 for 2-D):
/// {L, rows, cols} of the stored (padded) matrix, rows/cols as the layout stores them
/// (column-major: {L, K/block, Mp}). `groups` > 0 for the grouped layouts.
std::vector<int64_t> scale_shape(const BlockFormat& f, const ScaleLayout& layout, int64_t L, int64_t M, int64_t K,
                                 int64_t groups = 0);

/// q, scales (, zeros) = quantize(x). See format.hpp for the recipes.
void quantize(const TensorView& x, const BlockFormat& f, const ScaleLayout& layout, const TensorView& q,
              const TensorView& scales, const QuantArgs& args = {}, Stream stream = {});

/// out = dequantize(q, scales) as float32 / float16 / bfloat16 / float8_e4m3fn / float8_e5m2
/// (fp32 value rounded to nearest even; 8-bit outputs saturate to the finite range).
void dequantize(const TensorView& q, const TensorView& scales, const BlockFormat& f, const ScaleLayout& layout,
                const TensorView& out, const QuantArgs& args = {}, Stream stream = {});

/// Exact element transcode keeping the scales: INT4 / UINT4 (codes q - zp, zeros given) / E2M1
/// codes -> E4M3 (or E5M2) codes, e.g. MXFP4 -> MXFP8 and INT4 -> FP8 with the same scales.
/// `out` is [L?, M, K] float8_e4m3fn / float8_e5m2.
void transcode(const TensorView& q, const BlockFormat& f, const TensorView& out, const QuantArgs& args = {},
               Stream stream = {});

/// Element casts: out = cast(x) elementwise between float32 / float16 / bfloat16 / float8_e4m3fn /
/// float8_e5m2 (RNE; `sat` decides overflow of the 8-bit targets). Same shape, any strides.
void cast(const TensorView& x, const TensorView& out, Saturate sat = Saturate::kFinite, Stream stream = {});

/// Converts L stored scale matrices (R x C logical) from one layout to another (1- or 4-byte
/// elements, same dtype). Padding of the output is written with zeros.
void convert_scale_layout(const TensorView& in, const ScaleLayout& from, const TensorView& out,
                          const ScaleLayout& to, int64_t R, int64_t C, const TensorView& m_indptr = {},
                          Stream stream = {});

/// max |x| over the finite elements of a whole tensor into out (float32 [1]); NaN and +-Inf are
/// ignored (0 when there is none): the NVFP4 global amax that quantize computes.
void tensor_amax(const TensorView& x, const TensorView& out, Stream stream = {});

// ---------------------------------------------------------------------------------------------
// NF4 K cache with FP8 residual (decode attention over a quantized K cache).
//   k        [B, T, H, D] float32 / float16 / bfloat16 (any strides), D even
//   codes    [B, T, H, D/2] uint8, NF4 codes along D (nibble order as given)
//   scale    [B, H, D] float32: max(|min|, |max|) over T per (batch, head, channel)
//   residual [B, T, H, D] float8_e5m2 (or e4m3): k - nf4[code] * scale, rounded RNE satfinite
// Codes are nf4_encode(k / scale); a zero scale gives code 7 (0.0).
void nf4_kcache_quantize(const TensorView& k, const TensorView& codes, const TensorView& scale,
                         const TensorView& residual, NibbleOrder order = NibbleOrder::kLowFirst, Stream stream = {});
/// out = nf4[code] * scale (+ residual when given).
void nf4_kcache_dequantize(const TensorView& codes, const TensorView& scale, const TensorView& residual,
                           const TensorView& out, NibbleOrder order = NibbleOrder::kLowFirst, Stream stream = {});

// ---------------------------------------------------------------------------------------------
// Build / device information
struct BuildInfo {
  std::string version;
  bool cuda_built = false;       ///< kernels compiled in
  int cuda_runtime_version = 0;  ///< 0 without CUDA
  int device_count = 0;          ///< usable CUDA devices (0 without a driver)
  std::string device_name;       ///< device 0
  int sm = 0;                    ///< device 0 compute capability, e.g. 90
  std::vector<std::string> cuda_ops;  ///< ops that run on the device
  /// ops that have only the CPU reference so far (their CUDA path throws NotSupportedError)
  std::vector<std::string> cpu_only_ops;
};
BuildInfo build_info();

}  // namespace lowbit
