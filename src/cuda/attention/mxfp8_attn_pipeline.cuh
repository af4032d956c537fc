// src/cuda/attention/mxfp8_attn_pipeline.cuh: the parts of a consumer warpgroup shared by both
// paths of the MXFP8 attention forward (mxfp8_attn_consumer.cuh: bf16 wgmma, and
// mxfp8_attn_fp8_consumer.cuh: FP8 wgmma): the wgmma calls and the key-tile schedule. The paths
// differ in their operands (Q', K', V', P), their softmax and epilogue; those come in as callables.
#pragma once

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <utility>

namespace lowbit::cuda::attention {

/// wgmma with both operands in shared memory (descriptors da, db); d: the accumulators.
template <class Op, size_t... I>
__device__ __forceinline__ void gmma_ss(uint64_t da, uint64_t db, float* d, bool accumulate, std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
/// wgmma with A from registers (one fragment of four words) and B in shared memory; accumulates.
template <class Op, size_t... I>
__device__ __forceinline__ void gmma_rs(const uint32_t (&a)[4], uint64_t db, float* d, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <int kN>
__device__ __forceinline__ void fence_acc(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) cute::warpgroup_fence_operand(d[i]);
}

/// The key tiles of one row block: tile 0 alone; then per tile t, S(t) = Q' K'(t)^T and
/// O += P(t-1) V'(t-1) are issued together and the softmax of S(t) runs while the tensor cores do
/// the PV product. K'(t) goes back to the producer as soon as S(t) is ready, V'(t-1) after its
/// product. (No conditional wgmma inside the loop: ptxas serializes wgmma groups it cannot match to
/// their waits.) g: the CTA's pipeline iterations before this row block.
template <int kStages, int kS, int kO, class Smem, class IssueQk, class IssuePv, class Release, class Softmax,
          class PackP, class RescaleO>
__device__ __forceinline__ void run_key_tiles(int n_tiles, uint32_t g, const Smem& sm, float (&o)[kO],
                                              IssueQk&& issue_qk, IssuePv&& issue_pv, Release&& release,
                                              Softmax&& softmax, PackP&& pack_p, RescaleO&& rescale_o) {
  auto phase = [&](uint32_t gt) { return (gt / kStages) & 1; };
  int prev_st = 0;
  uint32_t prev_gt = g;
  if (n_tiles > 0) {
    prev_st = g % kStages;
    cutlass::arch::ClusterBarrier::wait(sm.k_full(prev_st), phase(g));
    float sacc[kS];
    issue_qk(sacc, prev_st);
    cute::warpgroup_wait<0>();
    fence_acc(sacc);
    release(sm.k_empty(prev_st));
    float alpha0, alpha1;
    softmax(sacc, 0, alpha0, alpha1);
    pack_p(sacc);
  }
  for (int t = 1; t < n_tiles; ++t) {
    const uint32_t gt = g + t;
    const int st = gt % kStages;
    cutlass::arch::ClusterBarrier::wait(sm.k_full(st), phase(gt));
    float sacc[kS];
    issue_qk(sacc, st);
    cutlass::arch::ClusterBarrier::wait(sm.v_full(prev_st), phase(prev_gt));
    issue_pv(prev_st);
    cute::warpgroup_wait<1>();  // S(t) is ready; PV(t-1) may still run
    fence_acc(sacc);
    release(sm.k_empty(st));
    float alpha0, alpha1;
    softmax(sacc, t, alpha0, alpha1);
    cute::warpgroup_wait<0>();
    fence_acc(o);
    release(sm.v_empty(prev_st));
    rescale_o(alpha0, alpha1);
    pack_p(sacc);
    prev_st = st;
    prev_gt = gt;
  }
  if (n_tiles > 0) {
    cutlass::arch::ClusterBarrier::wait(sm.v_full(prev_st), phase(prev_gt));
    issue_pv(prev_st);
    cute::warpgroup_wait<0>();
    fence_acc(o);
    release(sm.v_empty(prev_st));
  }
}

}  // namespace lowbit::cuda::attention
