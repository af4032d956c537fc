// src/api/attention.cpp: argument validation and CPU/CUDA dispatch of the MXFP8 flash-attention
// forward (lowbit/attention.hpp): fixed length and varlen. Every argument is checked before
// anything is written; the plan (src/core/plan_attention.hpp) then goes to the fp64 CPU
// reference (src/ref/ref_attention.cpp) or the sm_90a kernel (src/cuda/attention/).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "core/plan_attention.hpp"
#include "lowbit/attention.hpp"
#include "ref/ref_attention.hpp"
#include "cuda/attention/launch_attention.hpp"  // declarations only: called (and defined) only in CUDA + CUTLASS builds

namespace lowbit {
using namespace detail;

namespace {

const DTypes kCodeTypes = {DType::kE4M3, DType::kUInt8};
const DTypes kScaleTypes = {DType::kUE8M0, DType::kUInt8};
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

void check_head_dim(const Checker& c, int64_t d) {
  if (d != 64 && d != 128 && d != 256)
    c.fail("q", "head dim d = " + std::to_string(d) + " is not supported: expected 64, 128 or 256");
}

/// h >= 1, h_kv >= 1 and h % h_kv == 0 (GQA / MQA).
void check_heads(const Checker& c, int64_t h, int64_t h_kv) {
  if (h < 1) c.fail("q", "expected at least one query head, got h = " + std::to_string(h));
  if (h_kv < 1) c.fail("k", "expected at least one KV head, got h_kv = " + std::to_string(h_kv));
  if (h % h_kv != 0)
    c.fail("k", "the query heads h = " + std::to_string(h) + " must be a multiple of the KV heads h_kv = " +
                    std::to_string(h_kv));
}

/// args.precision: one of the AttnPrecision values (true when it asks for the FP8 path).
bool resolve_precision(const Checker& c, AttnPrecision prec) {
  if (prec != AttnPrecision::kExact && prec != AttnPrecision::kFp8)
    c.fail("precision", "expected AttnPrecision::kExact or kFp8, got " + std::to_string(int(prec)));
  return prec == AttnPrecision::kFp8;
}

/// The plan's sizes (varlen: sq, sk the longest sequences) and options, as both entry points set them.
AttnMxfp8Plan plan_sizes(const Checker& c, int64_t batch, int64_t sq, int64_t sk, int64_t h, int64_t h_kv, int64_t d,
                         const AttnArgs& args) {
  AttnMxfp8Plan p;
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads = h;
  p.heads_kv = h_kv;
  p.head_dim = d;
  p.causal = args.causal;
  p.softmax_scale = resolve_softmax_scale(c, args.softmax_scale, d, "d");
  p.fp8 = resolve_precision(c, args.precision);
  return p;
}

/// CUDA: the kernel loads Q, K and V tiles with TMA, which needs a 16-byte aligned base address
/// and strides (bytes) that are multiples of 16 on every dimension of size > 1 but the last.
void require_tma_aligned(const Checker& c, const TensorView& t, const char* arg) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d + 1 < t.ndim; ++d) ok = ok && (t.shape[d] <= 1 || t.strides[d] % 16 == 0);
  if (!ok)
    c.fail(arg, "the CUDA kernel reads it with TMA: it needs a 16-byte aligned base address and strides that are "
                "multiples of 16 bytes (the last dimension excepted), got " + t.describe());
}

/// CUDA: the sizes the kernel indexes with 32-bit integers.
void require_int32(const Checker& c, const char* arg, const char* what, int64_t v) {
  if (v > kInt32Max) c.fail(arg, std::string(what) + " = " + std::to_string(v) + " must be below 2^31 on CUDA");
}

void fill_ptrs(AttnMxfp8Ptrs* x, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& qs,
               const TensorView& ks, const TensorView& vs, const TensorView& out, const TensorView& lse) {
  x->q = q.ptr<const uint8_t>();
  x->k = k.ptr<const uint8_t>();
  x->v = v.ptr<const uint8_t>();
  x->q_scale = qs.ptr<const uint8_t>();
  x->k_scale = ks.ptr<const uint8_t>();
  x->v_scale = vs.ptr<const uint8_t>();
  x->out = out.ptr<uint16_t>();
  x->lse = lse.ptr<float>();
}

/// The checks both entry points end with: outputs that overlap nothing, CUDA-only constraints,
/// then the run.
void run(Checker& c, const AttnMxfp8Plan& p, const AttnMxfp8Ptrs& x, const TensorView& q, const TensorView& k,
         const TensorView& v, const TensorView& qs, const TensorView& ks, const TensorView& vs, const TensorView& out,
         const TensorView& lse, const TensorView* cu_q, const TensorView* cu_k, Stream stream) {
  Checker::Named ins = {{"q", &q}, {"k", &k}, {"v", &v}, {"q_scale", &qs}, {"k_scale", &ks}, {"v_scale", &vs}};
  if (cu_q != nullptr) {
    ins.emplace_back("cu_seqlens_q", cu_q);
    ins.emplace_back("cu_seqlens_k", cu_k);
  }
  c.no_overlap({{"out", &out}, {"lse", &lse}}, ins);
  if (c.dev == Device::kCPU) {
    if (p.fp8)
      ref::flash_attn_mxfp8_fp8(p, x);
    else
      ref::flash_attn_mxfp8(p, x);
    return;
  }
  if (kBuiltSm90Gemm) {
    require_tma_aligned(c, q, "q");
    require_tma_aligned(c, k, "k");
    require_tma_aligned(c, v, "v");
    require_int32(c, "q", p.varlen ? "total_q" : "s_q", p.varlen ? p.total_q : p.seqlen_q);
    require_int32(c, "k", p.varlen ? "total_k" : "s_k", p.varlen ? p.total_k : p.seqlen_k);
    // the kernel's grid: (row blocks, heads, batch)
    if (p.heads > 65535) c.fail("q", "the CUDA kernel takes at most 65535 query heads, got " + std::to_string(p.heads));
    if (p.batch > 65535)
      c.fail(p.varlen ? "cu_seqlens_q" : "q",
             "the CUDA kernel takes at most 65535 sequences, got " + std::to_string(p.batch));
  }
  const bool empty = p.batch == 0 || (p.varlen && p.total_q == 0);
  run_on_device<Kernels::kSm90Gemm>(c, [&] {
    if (empty) return 0;
    return p.fp8 ? cuda::attn_mxfp8_fp8_fwd(p, x, stream.handle) : cuda::attn_mxfp8_fwd(p, x, stream.handle);
  });
}

}  // namespace

void flash_attn_mxfp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_scale,
                      const TensorView& k_scale, const TensorView& v_scale, const TensorView& out,
                      const TensorView& lse, const AttnArgs& args, Stream stream) {
  Checker c{"flash_attn_mxfp8"};
  c.require(q, Req("q").dtypes(kCodeTypes).rank(4, "[b, s_q, h, d]").last_contiguous());
  const int64_t B = q.shape[0], SQ = q.shape[1], H = q.shape[2], D = q.shape[3];
  check_head_dim(c, D);
  if (SQ < 1) c.fail("q", "expected s_q >= 1, got " + q.describe());
  c.require(k, Req("k").dtypes(kCodeTypes).rank(4, "[b, s_k, h_kv, d]"));
  const int64_t SK = k.shape[1], HK = k.shape[2];
  c.shape(k, "k", {B, SK, HK, D});
  c.last_contiguous(k, "k");
  if (SK < 1) c.fail("k", "expected s_k >= 1, got " + k.describe());
  check_heads(c, H, HK);
  c.require(v, Req("v").dtypes(kCodeTypes).shape({B, SK, HK, D}).last_contiguous());
  c.require(q_scale, Req("q_scale").dtypes(kScaleTypes).shape({B, H, SQ, D / 32}).last_contiguous());
  c.require(k_scale, Req("k_scale").dtypes(kScaleTypes).shape({B, HK, SK, D / 32}).last_contiguous());
  c.require(v_scale, Req("v_scale").dtypes(kScaleTypes).shape({B, HK, SK, D / 32}).last_contiguous());
  c.require(out, Req("out").dtypes({DType::kBFloat16}).shape({B, SQ, H, D}).last_contiguous());
  c.require(lse, Req("lse").dtypes({DType::kFloat32}).shape({B, H, SQ}).contiguous("lse"));

  AttnMxfp8Plan p = plan_sizes(c, B, SQ, SK, H, HK, D, args);
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.strides[i];
    p.k_stride[i] = k.strides[i];
    p.v_stride[i] = v.strides[i];
    p.o_stride[i] = out.strides[i];
    p.qs_stride[i] = q_scale.strides[i];
    p.ks_stride[i] = k_scale.strides[i];
    p.vs_stride[i] = v_scale.strides[i];
    p.lse_stride[i] = lse.strides[i];
  }
  AttnMxfp8Ptrs x;
  fill_ptrs(&x, q, k, v, q_scale, k_scale, v_scale, out, lse);
  run(c, p, x, q, k, v, q_scale, k_scale, v_scale, out, lse, nullptr, nullptr, stream);
}

void flash_attn_mxfp8_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& q_scale, const TensorView& k_scale, const TensorView& v_scale,
                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, const TensorView& out, const TensorView& lse,
                             const AttnArgs& args, Stream stream) {
  Checker c{"flash_attn_mxfp8_varlen"};
  c.require(q, Req("q").dtypes(kCodeTypes).rank(3, "[total_q, h, d]").last_contiguous());
  const int64_t TQ = q.shape[0], H = q.shape[1], D = q.shape[2];
  check_head_dim(c, D);
  c.require(k, Req("k").dtypes(kCodeTypes).rank(3, "[total_k, h_kv, d]"));
  const int64_t TK = k.shape[0], HK = k.shape[1];
  c.shape(k, "k", {TK, HK, D});
  c.last_contiguous(k, "k");
  check_heads(c, H, HK);
  c.require(v, Req("v").dtypes(kCodeTypes).shape({TK, HK, D}).last_contiguous());
  c.require(q_scale, Req("q_scale").dtypes(kScaleTypes).shape({H, TQ, D / 32}).last_contiguous());
  c.require(k_scale, Req("k_scale").dtypes(kScaleTypes).shape({HK, TK, D / 32}).last_contiguous());
  c.require(v_scale, Req("v_scale").dtypes(kScaleTypes).shape({HK, TK, D / 32}).last_contiguous());
  c.require(cu_seqlens_q,
            Req("cu_seqlens_q").dtypes({DType::kInt32}).rank(1, "a 1-D [batch + 1] tensor").contiguous("cu_seqlens_q"));
  if (cu_seqlens_q.shape[0] < 1) c.fail("cu_seqlens_q", "expected batch + 1 >= 1 boundaries, got " + cu_seqlens_q.describe());
  const int64_t batch = cu_seqlens_q.shape[0] - 1;
  c.require(cu_seqlens_k, Req("cu_seqlens_k").dtypes({DType::kInt32}).shape({batch + 1}).contiguous("cu_seqlens_k"));
  if (max_seqlen_q < 1) c.fail("max_seqlen_q", "expected >= 1, got " + std::to_string(max_seqlen_q));
  if (max_seqlen_k < 1) c.fail("max_seqlen_k", "expected >= 1, got " + std::to_string(max_seqlen_k));
  if (max_seqlen_q > kInt32Max) c.fail("max_seqlen_q", "expected < 2^31 (int32 offsets), got " + std::to_string(max_seqlen_q));
  if (max_seqlen_k > kInt32Max) c.fail("max_seqlen_k", "expected < 2^31 (int32 offsets), got " + std::to_string(max_seqlen_k));
  if (TQ > kInt32Max) c.fail("q", "total_q = " + std::to_string(TQ) + " rows exceed the int32 offsets of cu_seqlens_q");
  if (TK > kInt32Max) c.fail("k", "total_k = " + std::to_string(TK) + " rows exceed the int32 offsets of cu_seqlens_k");
  c.require(out, Req("out").dtypes({DType::kBFloat16}).shape({TQ, H, D}).last_contiguous());
  c.require(lse, Req("lse").dtypes({DType::kFloat32}).shape({H, TQ}).contiguous("lse"));

  AttnMxfp8Plan p = plan_sizes(c, batch, max_seqlen_q, max_seqlen_k, H, HK, D, args);
  p.varlen = true;
  p.total_q = TQ;
  p.total_k = TK;
  p.cu_seqlens_q = cu_seqlens_q.ptr<const int32_t>();
  p.cu_seqlens_k = cu_seqlens_k.ptr<const int32_t>();
  // varlen: no batch dimension (stride 0), rows and heads from the packed tensors
  const TensorView* rows_first[] = {&q, &k, &v, &out};
  int64_t* rows_first_strides[] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride};
  for (int t = 0; t < 4; ++t) {
    rows_first_strides[t][0] = 0;
    rows_first_strides[t][1] = rows_first[t]->strides[0];
    rows_first_strides[t][2] = rows_first[t]->strides[1];
  }
  const TensorView* heads_first[] = {&q_scale, &k_scale, &v_scale};
  int64_t* heads_first_strides[] = {p.qs_stride, p.ks_stride, p.vs_stride};
  for (int t = 0; t < 3; ++t) {
    heads_first_strides[t][0] = 0;
    heads_first_strides[t][1] = heads_first[t]->strides[0];
    heads_first_strides[t][2] = heads_first[t]->strides[1];
  }
  p.lse_stride[0] = 0;
  p.lse_stride[1] = lse.strides[0];
  p.lse_stride[2] = lse.strides[1];

  // host boundaries: copied once, validated, and the copy is what the reference reads (whatever
  // another thread does to the caller's array meanwhile); device boundaries are trusted (no sync)
  std::vector<int32_t> host_q, host_k;
  if (c.dev == Device::kCPU) {
    const struct {
      const TensorView* t;
      const char* arg;
      int64_t total;
      std::vector<int32_t>* copy;
    } cus[] = {{&cu_seqlens_q, "cu_seqlens_q", TQ, &host_q}, {&cu_seqlens_k, "cu_seqlens_k", TK, &host_k}};
    for (const auto& cu : cus) {
      cu.copy->resize(size_t(batch + 1));
      std::memcpy(cu.copy->data(), cu.t->data, size_t(batch + 1) * sizeof(int32_t));
      int64_t prev = 0;
      for (int64_t b = 0; b <= batch; ++b) {
        const int64_t val = (*cu.copy)[size_t(b)];
        if ((b == 0 && val != 0) || val < prev)
          c.fail(cu.arg, "must start at 0 and be non-decreasing (element " + std::to_string(b) + " is " +
                             std::to_string(val) + ")");
        prev = val;
      }
      if (prev != cu.total)
        c.fail(cu.arg, "the last boundary must equal the rows of the packed tensor, " + std::to_string(cu.total) +
                           ", got " + std::to_string(prev));
    }
    p.cu_seqlens_q = host_q.data();
    p.cu_seqlens_k = host_k.data();
  }
  AttnMxfp8Ptrs x;
  fill_ptrs(&x, q, k, v, q_scale, k_scale, v_scale, out, lse);
  run(c, p, x, q, k, v, q_scale, k_scale, v_scale, out, lse, &cu_seqlens_q, &cu_seqlens_k, stream);
}

}  // namespace lowbit
