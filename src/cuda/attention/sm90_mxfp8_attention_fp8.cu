// src/cuda/attention/sm90_mxfp8_attention_fp8.cu: the FP8 tensor-core path of the MXFP8
// flash-attention forward on sm_90a (precision kFp8, opt-in): QK^T and PV on FP8 wgmma (E4M3 x
// E4M3, fp32 accumulators) with every block scale applied through E4M3 operands re-rounded to
// per-block head references (mxfp8_attn_fp8_*.cuh; docs/design/mxfp8_attention.md, "FP8
// tensor-core path (opt-in)"). Composition: fp8 traits (tiles, registers, shared-memory map),
// the exact path's params and schedule, fp8 producer (scan, TMA, K re-rounding, V transpose), fp8
// consumer (Q', wgmma mainloop, softmax with P in E4M3, epilogue). One instantiation per head
// dimension; causal and varlen are runtime flags.
#include <cuda.h>
#include <cuda_runtime.h>


#include "cuda/attention/launch_attention.hpp"
#include "cuda/attention/mxfp8_attn_fp8_consumer.cuh"
#include "cuda/attention/mxfp8_attn_kernel.cuh"

namespace lowbit::cuda {
namespace attention::fp8 {

template <int kD>
__global__ void __launch_bounds__(384, 1) attn_mxfp8_fp8_fwd_kernel(const __grid_constant__ AttnParams p) {
  using T = Traits<kD>;
  attn_fwd_kernel_body<T, fp8::scan_kv_block_scales<T>, fp8::produce_row_block<T>, fp8::consume_row_block<T>>(p);
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = Traits<kD>;
  return launch_attn_fwd<T, attn_mxfp8_fp8_fwd_kernel<kD>>(pl, ptr, T::kWQK, T::kWQK == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, st);
}

}  // namespace attention::fp8

int attn_mxfp8_fp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream) {
  return attention::run_attn_fwd(plan, ptrs, stream, attention::fp8::launch<64>, attention::fp8::launch<128>, attention::fp8::launch<256>);
}

}  // namespace lowbit::cuda
