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

#include <cutlass/arch/reg_reconfig.h>

#include <atomic>

#include "cuda/attention/launch_attention.hpp"
#include "cuda/attention/mxfp8_attn_fp8_consumer.cuh"
#include "cuda/attention/mxfp8_attn_host.hpp"
#include "cuda/common/launch_utils.cuh"

namespace lowbit::cuda {
namespace attention::fp8 {

template <int kD>
__global__ void __launch_bounds__(384, 1) attn_mxfp8_fp8_fwd_kernel(const __grid_constant__ AttnParams p) {
  using T = Traits<kD>;
  extern __shared__ uint8_t smem_dyn[];
  // Aligned to 1024 bytes (swizzle atoms) by an offset from smem_dyn, so that the compiler still
  // knows every derived pointer is shared memory (LDS / STS rather than generic LD / ST).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)) & 1023u;
  uint8_t* base = smem_dyn + ((1024u - misalign) & 1023u);
  const AttnSmem<T> sm(base);
  const int b = blockIdx.z, h = blockIdx.y, hk = h / p.heads_per_kv;
  const SeqBounds s = seq_bounds(p, b);
  const int n_blocks = (s.len_q + T::kBlockM - 1) / T::kBlockM;
  if (int(blockIdx.x) >= n_blocks) return;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int st = 0; st < T::kStages; ++st) {
      cutlass::arch::ClusterTransactionBarrier::init(sm.raw_full(st), 1);
      cutlass::arch::ClusterBarrier::init(sm.k_full(st), 128);
      cutlass::arch::ClusterBarrier::init(sm.k_empty(st), 8);
      cutlass::arch::ClusterBarrier::init(sm.v_full(st), 128);
      cutlass::arch::ClusterBarrier::init(sm.v_empty(st), 8);
    }
    cutlass::arch::fence_barrier_init();
  }
  if (wg == 0) fp8::scan_kv_block_scales<T>(p, s, b, hk, sm);
  __syncthreads();

  uint32_t g = 0;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    for (int mb = blockIdx.x; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      fp8::produce_row_block<T>(p, s, b, hk, n_tiles, g, sm);
      g += n_tiles;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
    for (int mb = blockIdx.x; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      fp8::consume_row_block<T>(p, s, b, h, mb * T::kBlockM, n_tiles, g, wg - 1, sm);
      g += n_tiles;
    }
  }
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = Traits<kD>;
  AttnParams p;
  const CUtensorMapSwizzle sw = T::kWQK == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  if (cudaError_t e = make_attn_params(pl, ptr, T::kWQK, T::kBlockN, sw, &p)) return e;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(attn_mxfp8_fp8_fwd_kernel<kD>, T::kSmemBytes, device, opted)) return e;
  const int64_t row_blocks = (pl.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const dim3 grid(unsigned(row_blocks), unsigned(pl.heads), unsigned(pl.batch));
  attn_mxfp8_fp8_fwd_kernel<kD><<<grid, T::kThreads, T::kSmemBytes, st>>>(p);
  return cudaGetLastError();
}

}  // namespace attention::fp8

int attn_mxfp8_fp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream) {
  if (plan.batch == 0 || plan.seqlen_q == 0 || plan.heads == 0) return cudaSuccess;
  if (plan.batch > 65535 || plan.heads > 65535 || (plan.seqlen_q + 127) / 128 > 0x7FFFFFFF)
    return cudaErrorInvalidConfiguration;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (plan.head_dim) {
    case 64: return attention::fp8::launch<64>(plan, ptrs, st);
    case 128: return attention::fp8::launch<128>(plan, ptrs, st);
    case 256: return attention::fp8::launch<256>(plan, ptrs, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace lowbit::cuda
