// src/api/moe.cpp: validation and dispatch of the gpt-oss MoE MLPs (lowbit/moe.hpp): the routed one
// (gpt_oss_moe_mlp) and the one over expert-grouped rows (gpt_oss_expert_mlp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "api/group_gemm.hpp"
#include "lowbit/moe.hpp"
#include "ref/ref_moe.hpp"
#include "cuda/moe/launch_moe.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds

namespace lowbit {
using namespace detail;

namespace {

/// Checks the expert weights and biases of an MLP call (MoeMlpArgs / ExpertMlpArgs) for hidden size
/// H; returns the experts E and the intermediate size I.
template <typename Args>
void check_mlp_weights(Checker& c, const Args& x, int64_t H, int64_t* E_out, int64_t* I_out) {
  c.require(x.w1, Req("w1").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}));
  if (x.packed) {  // E and I from b1 [E, 2I]
    c.present(x.b1, "b1");
    if (x.b1.ndim != 2 || x.b1.shape[1] % 2 != 0) c.fail("b1", "expected [E, 2I], got " + x.b1.describe());
  } else if (x.w1.ndim != 3 || x.w1.shape[2] != H / 2 || x.w1.shape[1] % 2 != 0) {
    c.fail("w1", "expected [E, 2I, " + std::to_string(H / 2) + "] (gate/up rows interleaved), got " + x.w1.describe());
  }
  c.last_contiguous(x.w1, "w1");
  const int64_t E = x.packed ? x.b1.shape[0] : x.w1.shape[0], I = x.packed ? x.b1.shape[1] / 2 : x.w1.shape[1] / 2;
  if (I % 32 != 0 || I == 0)
    c.fail(x.packed ? "b1" : "w1", "intermediate size I = " + std::to_string(I) + " must be a positive multiple of 32");
  ScalePlan unused;
  if (x.packed) {
    check_packed_weights(c, x.w1, "w1", x.w1_scale, "w1_scale", E, 2 * I, H, &unused);
    check_packed_weights(c, x.w2, "w2", x.w2_scale, "w2_scale", E, H, I, &unused);
  } else {
    const DTypes ue8m0 = {DType::kUE8M0, DType::kUInt8};
    c.require(x.w1_scale, Req("w1_scale").dtypes(ue8m0).shape({E, 2 * I, H / 32}).last_contiguous());
    c.require(x.w2, Req("w2").dtypes({DType::kUInt8, DType::kFloat4E2M1x2}).shape({E, H, I / 2}).last_contiguous());
    c.require(x.w2_scale, Req("w2_scale").dtypes(ue8m0).shape({E, H, I / 32}).last_contiguous());
  }
  const DTypes bias = {DType::kFloat32, DType::kBFloat16};
  c.require(x.b1, Req("b1").dtypes(bias).shape({E, 2 * I}).last_contiguous());
  c.require(x.b2, Req("b2").dtypes(bias).shape({E, H}).last_contiguous());
  *E_out = E;
  *I_out = I;
}

/// The weight, bias, activation and SwiGLU fields of the plan (arguments checked).
template <typename Args>
void plan_mlp_weights(const Args& x, MoeMlpPlan* pp) {
  MoeMlpPlan& p = *pp;
  p.w1 = static_cast<const uint8_t*>(x.w1.data); p.w1_sE = x.w1.strides[0]; p.w1_sR = x.w1.strides[1];
  p.w1s = static_cast<const uint8_t*>(x.w1_scale.data); p.w1s_sE = x.w1_scale.strides[0]; p.w1s_sR = x.w1_scale.strides[1];
  p.w2 = static_cast<const uint8_t*>(x.w2.data); p.w2_sE = x.w2.strides[0]; p.w2_sR = x.w2.strides[1];
  p.w2s = static_cast<const uint8_t*>(x.w2_scale.data); p.w2s_sE = x.w2_scale.strides[0]; p.w2s_sR = x.w2_scale.strides[1];
  p.b1 = x.b1.data; p.b1_dtype = x.b1.dtype; p.b1_sE = x.b1.strides[0];
  p.b2 = x.b2.data; p.b2_dtype = x.b2.dtype; p.b2_sE = x.b2.strides[0];
  p.alpha = x.alpha; p.limit = x.limit; p.act_mxfp8 = x.act == ActQuant::kMXFP8; p.packed = x.packed;
}

#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
/// The CUDA kernels' alignment of the expert weights (16-byte rows) and of packed scales (8 bytes).
template <typename Args>
void require_weight_alignment(const Checker& c, const Args& x, const MoeMlpPlan& p) {
  require_aligned16(c, x.w1, "w1", {p.w1_sE, p.w1_sR});
  require_aligned16(c, x.w2, "w2", {p.w2_sE, p.w2_sR});
  if (x.packed && (reinterpret_cast<uintptr_t>(p.w1s) % 8 != 0 || reinterpret_cast<uintptr_t>(p.w2s) % 8 != 0))
    c.fail("w1_scale", "the CUDA kernel needs 8-byte aligned packed scales");
}
#endif

}  // namespace

void gpt_oss_moe_mlp(const MoeMlpArgs& x, Stream stream) {
  Checker c{"gpt_oss_moe_mlp"};
  c.require(x.x, Req("x").dtypes({DType::kBFloat16, DType::kFloat32}).rank(2, "[T, H]").last_contiguous());
  const int64_t T = x.x.shape[0], H = x.x.shape[1];
  if (H % 32 != 0 || H == 0) c.fail("x", "hidden size H = " + std::to_string(H) + " must be a positive multiple of 32");
  int64_t E = 0, I = 0;
  check_mlp_weights(c, x, H, &E, &I);
  c.present(x.topk_ids, "topk_ids");
  if (x.topk_ids.dtype == DType::kInt64)
    c.fail("topk_ids", "expected dtype int32 expert ids, got int64 (convert torch.topk's int64 indices to int32; "
                       "the Python API does this itself)");
  c.dtype(x.topk_ids, "topk_ids", {DType::kInt32});
  if (x.topk_ids.ndim != 2 || x.topk_ids.shape[0] != T) c.fail("topk_ids", "expected [" + std::to_string(T) + ", k], got " + x.topk_ids.describe());
  c.last_contiguous(x.topk_ids, "topk_ids");
  const int64_t k = x.topk_ids.shape[1];
  c.require(x.topk_weights, Req("topk_weights").dtypes({DType::kFloat32}).shape({T, k}).last_contiguous());
  c.require(x.out, Req("out").dtypes({DType::kBFloat16, DType::kFloat32}).shape({T, H}).last_contiguous());
  if (!(x.limit > 0.0f)) c.fail("limit", "expected limit > 0, got " + std::to_string(x.limit));
  if (!std::isfinite(x.alpha)) c.fail("alpha", "expected a finite alpha, got " + std::to_string(x.alpha));
  MoeMlpPlan p;
  p.T = T; p.H = H; p.I = I; p.E = E; p.topk = k;
  p.x = x.x.data; p.x_dtype = x.x.dtype; p.x_sT = x.x.strides[0];
  p.ids = x.topk_ids.ptr<int32_t>(); p.ids_sT = x.topk_ids.strides[0];
  p.weights = x.topk_weights.ptr<float>(); p.w_sT = x.topk_weights.strides[0];
  plan_mlp_weights(x, &p);
  p.out = x.out.data; p.out_dtype = x.out.dtype; p.o_sT = x.out.strides[0];
  c.no_overlap({{"out", &x.out}}, {{"x", &x.x}, {"topk_ids", &x.topk_ids}, {"topk_weights", &x.topk_weights},
                                   {"w1", &x.w1}, {"w1_scale", &x.w1_scale}, {"b1", &x.b1}, {"w2", &x.w2},
                                   {"w2_scale", &x.w2_scale}, {"b2", &x.b2}});
  std::vector<int32_t> ids_copy;  // host ids: the one copy that is validated and used
  if (x.topk_ids.device == Device::kCPU) {
    ids_copy.resize(size_t(c.mul("topk_ids", T, k)));
    const int32_t* ids = x.topk_ids.ptr<int32_t>();
    if (k > 0)
      for (int64_t t = 0; t < T; ++t) std::memcpy(&ids_copy[size_t(t * k)], ids + t * x.topk_ids.strides[0], size_t(k) * 4);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids_copy[size_t(t * k + j)];
        if (e < -1 || e >= E)
          c.fail("topk_ids", "expert id " + std::to_string(e) + " at [" + std::to_string(t) + ", " + std::to_string(j) +
                                 "] is outside [-1, " + std::to_string(E) + ")");
      }
    p.ids = ids_copy.data();
    p.ids_sT = k;
  }
  if (c.dev == Device::kCPU) {
    ref::gpt_oss_moe_mlp(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  require_weight_alignment(c, x, p);
  if (E > 4096) c.fail("w1", "the CUDA MLP routes at most 4096 experts, got E = " + std::to_string(E));
  if (T * k >= (int64_t(1) << 31)) c.fail("topk_ids", "T * k must be below 2^31 routed rows");
#endif
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::gpt_oss_moe_mlp(p, stream.handle); });
}

void gpt_oss_expert_mlp(const ExpertMlpArgs& x, Stream stream) {
  Checker c{"gpt_oss_expert_mlp"};
  c.require(x.x, Req("x").dtypes({DType::kBFloat16, DType::kFloat32, DType::kE4M3})
                     .rank(2, 3, "[M, H] (contiguous layout) or [E, max_tokens, H] (masked layout)").last_contiguous());
  const GroupedRows xr = grouped_rows(c, x.x, "x");
  const int64_t H = xr.cols, max_tokens = xr.max_tokens, M = xr.rows;  // M: rows of x
  if (H % 32 != 0 || H == 0) c.fail("x", "hidden size H = " + std::to_string(H) + " must be a positive multiple of 32");
  const int64_t x_sT = uniform_row_stride(c, x.x, "x");
  int64_t E = 0, I = 0;
  check_mlp_weights(c, x, H, &E, &I);
  check_batch_per_group(c, x.x, "x", xr, E, "expert");
  check_group_counts(c, x.m_counts, E, "expert");
  const bool mx = x.x.dtype == DType::kE4M3;
  if (mx) {
    c.require(x.x_scale, Req("x_scale").dtypes({DType::kUE8M0, DType::kUInt8}).contiguous("x_scale"));
    const int64_t want = c.mul("x_scale", M, H / 32);
    if (x.x_scale.numel() != want)
      c.fail("x_scale", "expected " + std::to_string(want) + " scale bytes (one per 32 elements of every row of x, "
                        "row-major), got " + x.x_scale.describe());
  } else if (x.x_scale.present()) {
    c.fail("x_scale", "only MXFP8 x (float8_e4m3fn codes) takes scales");
  }
  if (x.expected_m < 0) c.fail("expected_m", "expected a count >= 0 (0: max_tokens), got " + std::to_string(x.expected_m));
  const int64_t o_sT = check_grouped_out(c, x.out, {DType::kBFloat16, DType::kFloat32}, xr, E, H);
  if (!(x.limit > 0.0f)) c.fail("limit", "expected limit > 0, got " + std::to_string(x.limit));
  if (!std::isfinite(x.alpha)) c.fail("alpha", "expected a finite alpha, got " + std::to_string(x.alpha));
  MoeMlpPlan p;
  p.T = M; p.H = H; p.I = I; p.E = E; p.topk = 0;
  p.x = x.x.data; p.x_dtype = x.x.dtype; p.x_sT = x_sT;
  if (mx) {
    p.x_scale = x.x_scale.ptr<uint8_t>();
    p.xs_sT = H / 32;
  }
  plan_mlp_weights(x, &p);
  p.out = x.out.data; p.out_dtype = x.out.dtype; p.o_sT = o_sT;
  p.expert_rows = true;
  p.max_tokens = max_tokens;
  p.expected_m = x.expected_m;
  c.no_overlap({{"out", &x.out}}, {{"x", &x.x}, {"x_scale", &x.x_scale}, {"m_counts", &x.m_counts}, {"w1", &x.w1},
                                   {"w1_scale", &x.w1_scale}, {"b1", &x.b1}, {"w2", &x.w2}, {"w2_scale", &x.w2_scale},
                                   {"b2", &x.b2}});
  std::vector<int64_t> bounds;  // host counts: the one copy that is validated and used
  if (x.m_counts.device == Device::kCPU) {
    bounds = host_count_bounds(c, x.m_counts, "m_counts", E, M, max_tokens);
    p.row_indptr = bounds.data();
  } else {
    p.counts = x.m_counts.data;
    p.counts64 = x.m_counts.dtype == DType::kInt64;
  }
  if (c.dev == Device::kCPU) {
    ref::gpt_oss_expert_mlp(p);
    return;
  }
#if LOWBIT_WITH_CUDA && LOWBIT_WITH_CUTLASS
  require_weight_alignment(c, x, p);
  if (M >= (int64_t(1) << 31)) c.fail("x", "the CUDA MLP takes fewer than 2^31 rows, got " + std::to_string(M));
#endif
  run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::gpt_oss_expert_mlp(p, stream.handle); });
}

}  // namespace lowbit
