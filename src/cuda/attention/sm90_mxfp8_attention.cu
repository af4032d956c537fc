// src/cuda/attention/sm90_mxfp8_attention.cu: block-scaled FP8 (MXFP8) flash-attention forward on
// sm_90a. Composition: mxfp8_attn_params (parameters, tiles, shared-memory map), _schedule (rows and
// key tiles of a CTA), _producer (TMA + operand conversion), _consumer (wgmma mainloop, online
// softmax, epilogue). One instantiation per head dimension; causal and varlen are runtime flags.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/attention/launch_attention.hpp"
#include "cuda/attention/mxfp8_attn_consumer.cuh"
#include "cuda/attention/mxfp8_attn_kernel.cuh"
#include "cuda/common/device_info.cuh"
#include "cuda/common/tma.cuh"

namespace lowbit::cuda {
namespace attention {

template <int kD>
__global__ void __launch_bounds__(384, 1) attn_mxfp8_fwd_kernel(const __grid_constant__ AttnParams p) {
  using T = AttnTraits<kD>;
  attn_fwd_kernel_body<T, scan_kv_scales<T>, produce_row_block<T>, consume_row_block<T>>(p);
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = AttnTraits<kD>;
  return launch_attn_fwd<T, attn_mxfp8_fwd_kernel<kD>>(pl, ptr, int(pl.head_dim), CU_TENSOR_MAP_SWIZZLE_NONE, st);
}

}  // namespace attention

int attn_mxfp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream) {
  return attention::run_attn_fwd(plan, ptrs, stream, attention::launch<64>, attention::launch<128>, attention::launch<256>);
}

}  // namespace lowbit::cuda
