// src/cuda/attention/sm90_mxfp8_attention_fp8.cu: the FP8 tensor-core path of the MXFP8
// flash-attention forward on sm_90a (precision kFp8, opt-in): QK^T and PV on FP8 wgmma (E4M3 x
// E4M3, fp32 accumulators) with every block scale applied through E4M3 operands re-rounded to
// per-block head references (mxfp8_attn_fp8_*.cuh; docs/design/mxfp8_attention.md, "FP8
// tensor-core path (opt-in)"). One call = the operand pre-pass (prep: per-block references, then
// K' and V'^T once per (sequence, KV head) into stream-ordered workspace) + the attention kernel:
// fp8 traits (tiles, registers, shared-memory map), the exact path's params and schedule, fp8
// producer (TMA of K' and V'^T), fp8 consumer (Q', wgmma mainloop, softmax with P in E4M3,
// epilogue). One instantiation per head dimension; causal and varlen are runtime flags.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/launch_attention.hpp"
#include "cuda/attention/mxfp8_attn_fp8_consumer.cuh"
#include "cuda/attention/mxfp8_attn_kernel.cuh"
#include "cuda/common/workspace.cuh"

namespace lowbit::cuda {
namespace attention::fp8 {

template <int kD>
__global__ void __launch_bounds__(384, 1) attn_mxfp8_fp8_fwd_kernel(const __grid_constant__ AttnParams p) {
  using T = Traits<kD>;
  attn_fwd_kernel_body<T, fp8::load_block_refs<T>, fp8::produce_row_block<T>, fp8::consume_row_block<T>>(p);
}

/// Rank-3 uint8 tensor map over the workspace: dims (inner, middle, heads_kv), rows `pitch` bytes
/// apart, heads `head_stride` bytes apart, boxes of box_inner x box_mid.
static cudaError_t make_ws_tmap(CUtensorMap* m, const void* base, int64_t inner, int64_t mid, int64_t heads,
                                int64_t pitch, int64_t head_stride, int box_inner, int box_mid,
                                CUtensorMapSwizzle swizzle) {
  const auto enc = tma_encoder();
  if (!enc) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(mid), cuuint64_t(heads)};
  const cuuint64_t strides[2] = {cuuint64_t(pitch), cuuint64_t(head_stride)};
  const cuuint32_t box[3] = {cuuint32_t(box_inner), cuuint32_t(box_mid), 1}, estr[3] = {1, 1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

static constexpr CUtensorMapSwizzle swizzle_of(int w) {
  return w == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

template <int kD>
static cudaError_t launch(const detail::AttnMxfp8Plan& pl, const detail::AttnMxfp8Ptrs& ptr, cudaStream_t st) {
  using T = Traits<kD>;
  constexpr auto kKernel = attn_mxfp8_fp8_fwd_kernel<kD>;
  AttnParams p;
  make_attn_params(pl, ptr, &p);  // tm_k / tm_v: the workspace's K' and V'^T, below
  const int64_t total_k = pl.varlen ? pl.total_k : pl.batch * pl.seqlen_k;
  const int64_t W = prep_width(total_k, pl.batch, T::kBlockN);
  if (W > int64_t(0x7FFFFFFF) - T::kBlockN) return cudaErrorInvalidValue;  // TMA coordinates are int32
  const int64_t tiles = (pl.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  if (tiles > 0x7FFFFFFF || pl.heads_kv > 65535) return cudaErrorInvalidConfiguration;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return e;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_smem(kKernel, T::kSmemBytes, device, opted)) return e;

  // workspace: refs [batch][heads_kv][16] int32 | K' [heads_kv][W][d] | V'^T [heads_kv][d][W]
  const size_t ref_b = (size_t(pl.batch * pl.heads_kv) * 16 * 4 + 1023) / 1024 * 1024;
  const size_t op_b = size_t(pl.heads_kv) * size_t(W) * size_t(kD);
  cudaMemPool_t pool;
  if (cudaError_t e = workspace_pool(&pool)) return e;
  void* ws = nullptr;
  if (cudaError_t e = cudaMallocFromPoolAsync(&ws, ref_b + 2 * op_b, pool, st)) return e;
  PrepParams q;
  q.k = ptr.k;
  q.v = ptr.v;
  q.k_scale = ptr.k_scale;
  q.v_scale = ptr.v_scale;
  for (int i = 0; i < 3; ++i) {
    q.k_stride[i] = pl.k_stride[i];
    q.v_stride[i] = pl.v_stride[i];
    q.ks_stride[i] = pl.ks_stride[i];
    q.vs_stride[i] = pl.vs_stride[i];
  }
  q.cu_seqlens_k = pl.cu_seqlens_k;
  q.seqlen_k = int(pl.seqlen_k);
  q.varlen = pl.varlen ? 1 : 0;
  q.width = W;
  q.refs = static_cast<int32_t*>(ws);
  q.kp = static_cast<uint8_t*>(ws) + ref_b;
  q.vt = q.kp + op_b;
  p.kv_ref = q.refs;
  cudaError_t e = make_ws_tmap(&p.tm_k, q.kp, kD, W, pl.heads_kv, kD, W * kD, T::kWQK, T::kBlockN,
                               swizzle_of(T::kWQK));
  if (e == cudaSuccess)
    e = make_ws_tmap(&p.tm_v, q.vt, W, kD, pl.heads_kv, W, W * kD, T::kWV, kD, swizzle_of(T::kWV));
  // every (sequence, KV head) gets its references, also one without keys (-1: read as 127)
  if (e == cudaSuccess) e = cudaMemsetAsync(q.refs, 0xFF, size_t(pl.batch * pl.heads_kv) * 16 * 4, st);
  if (e == cudaSuccess && tiles > 0) {
    const int64_t chunks = (pl.seqlen_k + kRefTokens - 1) / kRefTokens;
    attn_fp8_prep_refs_kernel<T::kBlocks>
        <<<dim3(unsigned(chunks), unsigned(pl.heads_kv), unsigned(pl.batch)), kPrepThreads, 0, st>>>(q);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
      attn_fp8_prep_kv_kernel<T>
          <<<dim3(unsigned(tiles), unsigned(pl.heads_kv), unsigned(pl.batch)), kPrepThreads, 0, st>>>(q);
      e = cudaGetLastError();
    }
  }
  if (e == cudaSuccess) {
    // kRowsPerCta > 1: a CTA takes row blocks x, x + gridDim.x, ... (its producer loads the next
    // row block's tiles while the consumers finish the last one)
    const int64_t row_blocks = (pl.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const dim3 grid(unsigned((row_blocks + T::kRowsPerCta - 1) / T::kRowsPerCta), unsigned(pl.heads),
                    unsigned(pl.batch));
    kKernel<<<grid, T::kThreads, T::kSmemBytes, st>>>(p);
    e = cudaGetLastError();
  }
  const cudaError_t f = cudaFreeAsync(ws, st);
  return e != cudaSuccess ? e : f;
}

}  // namespace attention::fp8

int attn_mxfp8_fp8_fwd(const detail::AttnMxfp8Plan& plan, const detail::AttnMxfp8Ptrs& ptrs, void* stream) {
  return attention::run_attn_fwd(plan, ptrs, stream, attention::fp8::launch<64>, attention::fp8::launch<128>,
                                 attention::fp8::launch<256>);
}

}  // namespace lowbit::cuda
