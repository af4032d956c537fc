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

/// Rank-4 uint8 tensor map of k or v: dims (d, tokens, heads_kv, batch), box (d, kBlockN, 1, 1).
static cudaError_t make_kv_tmap(CUtensorMap* m, const void* base, const detail::AttnMxfp8Plan& pl,
                                const int64_t (&stride)[3], int block_n) {
  const auto enc = tma_encoder();
  if (!enc) return cudaErrorNotSupported;
  const int64_t tokens = pl.varlen ? pl.total_k : pl.seqlen_k;
  const int64_t batch = pl.varlen ? 1 : pl.batch;
  const int64_t far = ((stride[1] * tokens + stride[2] * pl.heads_kv) + 15) / 16 * 16;
  const cuuint64_t dims[4] = {cuuint64_t(pl.head_dim), cuuint64_t(tokens), cuuint64_t(pl.heads_kv), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(stride[1]), cuuint64_t(stride[2]),
                                 cuuint64_t(pl.varlen ? far : stride[0])};
  const cuuint32_t box[4] = {cuuint32_t(pl.head_dim), cuuint32_t(block_n), 1, 1}, estr[4] = {1, 1, 1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/// The one function from the validated plan to the kernel's parameters.
static cudaError_t make_attn_params(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, int block_n,
                                    AttnParams* out) {
  AttnParams& p = *out;
  if (cudaError_t e = make_kv_tmap(&p.tm_k, ptr.k, pl, pl.k_stride, block_n)) return e;
  if (cudaError_t e = make_kv_tmap(&p.tm_v, ptr.v, pl, pl.v_stride, block_n)) return e;
  p.q = ptr.q;
  p.q_scale = ptr.q_scale;
  p.k_scale = ptr.k_scale;
  p.v_scale = ptr.v_scale;
  p.out = ptr.out;
  p.lse = ptr.lse;
  p.cu_seqlens_q = pl.cu_seqlens_q;
  p.cu_seqlens_k = pl.cu_seqlens_k;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = pl.q_stride[i];
    p.o_stride[i] = pl.o_stride[i];
    p.qs_stride[i] = pl.qs_stride[i];
    p.ks_stride[i] = pl.ks_stride[i];
    p.vs_stride[i] = pl.vs_stride[i];
    p.lse_stride[i] = pl.lse_stride[i];
  }
  p.seqlen_q = int(pl.seqlen_q);
  p.seqlen_k = int(pl.seqlen_k);
  p.heads_per_kv = int(pl.heads / pl.heads_kv);
  p.causal = pl.causal ? 1 : 0;
  p.varlen = pl.varlen ? 1 : 0;
  p.scale_log2 = float(double(pl.softmax_scale) * 1.4426950408889634);
  return cudaSuccess;
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = AttnTraits<kD>;
  AttnParams p;
  if (cudaError_t e = make_attn_params(pl, ptr, T::kBlockN, &p)) return e;
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
