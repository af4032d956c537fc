// src/cuda/attention/sm90_mxfp8_attention.cu: block-scaled FP8 (MXFP8) flash-attention forward on
// sm_90a. Composition: mxfp8_attn_params (parameters, tiles, shared-memory map), _schedule (rows and
// key tiles of a CTA), _producer (TMA + operand conversion), _consumer (wgmma mainloop, online
// softmax, epilogue). One instantiation per head dimension; causal and varlen are runtime flags.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cutlass/arch/reg_reconfig.h>

#include <atomic>
#include <cmath>

#include "cuda/attention/launch_attention.hpp"
#include "cuda/attention/mxfp8_attn_consumer.cuh"
#include "cuda/attention/mxfp8_attn_host.hpp"
#include "cuda/common/device_info.cuh"
#include "cuda/common/launch_utils.cuh"
#include "cuda/common/tma.cuh"

namespace lowbit::cuda {
namespace attention {

template <int kD>
__global__ void __launch_bounds__(384, 1) attn_mxfp8_fwd_kernel(const __grid_constant__ AttnParams p) {
  using T = AttnTraits<kD>;
  extern __shared__ uint8_t smem_dyn[];
  // Aligned to 1024 bytes (128B-swizzle atoms) by an offset from smem_dyn, so that the compiler
  // still knows every derived pointer is shared memory (LDS / STS rather than generic LD / ST).
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
  if (wg == 0) scan_kv_scales<T>(p, s, b, hk, sm);
  __syncthreads();

  uint32_t g = 0;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    for (int mb = blockIdx.x; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      produce_row_block<T>(p, s, b, hk, n_tiles, g, sm);
      g += n_tiles;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
    for (int mb = blockIdx.x; mb < n_blocks; mb += gridDim.x) {
      const int n_tiles = key_tiles<T::kBlockM, T::kBlockN>(p, s, mb * T::kBlockM);
      consume_row_block<T>(p, s, b, h, mb * T::kBlockM, n_tiles, g, wg - 1, sm);
      g += n_tiles;
    }
  }
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = AttnTraits<kD>;
  AttnParams p;
  if (cudaError_t e = make_attn_params(pl, ptr, int(pl.head_dim), T::kBlockN, CU_TENSOR_MAP_SWIZZLE_NONE, &p)) return e;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(attn_mxfp8_fwd_kernel<kD>, T::kSmemBytes, device, opted)) return e;
  const int64_t row_blocks = (pl.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const dim3 grid(unsigned(row_blocks), unsigned(pl.heads), unsigned(pl.batch));
  attn_mxfp8_fwd_kernel<kD><<<grid, T::kThreads, T::kSmemBytes, st>>>(p);
  return cudaGetLastError();
}

}  // namespace attention

int attn_mxfp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream) {
  if (plan.batch == 0 || plan.seqlen_q == 0 || plan.heads == 0) return cudaSuccess;
  if (plan.batch > 65535 || plan.heads > 65535 || (plan.seqlen_q + 127) / 128 > 0x7FFFFFFF)
    return cudaErrorInvalidConfiguration;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (plan.head_dim) {
    case 64: return attention::launch<64>(plan, ptrs, st);
    case 128: return attention::launch<128>(plan, ptrs, st);
    case 256: return attention::launch<256>(plan, ptrs, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace lowbit::cuda
