// src/api/decode_attention.cpp: argument validation and dispatch of the NF4 K-cache decode ops
// (lowbit/decode_attention.hpp): attn_forward_decode_nf4, kproj_rope_nf4_encode,
// nf4_kcache_append, and the FP8 V cache's fp8_vcache_quantize and fp8_vcache_append. Every argument is checked before anything is written; CPU tensors then run
// the reference (src/ref/ref_decode_attention.cpp, src/ref/ref_kcache_encode.cpp), CUDA tensors
// the sm_90a kernels (src/cuda/attention/launch_decode.hpp: sm90_nf4_decode.cu,
// sm90_nf4_encode.cu) through run_on_device (CUDA + CUTLASS builds; NotSupportedError otherwise).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "cuda/attention/launch_decode.hpp"
#include "core/plan_decode.hpp"
#include "lowbit/decode_attention.hpp"
#include "ref/ref_decode_attention.hpp"

namespace lowbit {
using namespace detail;

namespace {

const DTypes kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const DTypes kResidualTypes = {DType::kE5M2, DType::kE4M3};

void check_dim(const Checker& c, const char* arg, const char* name, int64_t d) {
  if (d != 64 && d != 128 && d != 256)
    c.fail(arg, std::string(name) + " = " + std::to_string(d) + " is not supported: expected 64, 128 or 256");
}

/// Each value of a host int32 [B] copy in [lo, hi].
void check_lengths(const Checker& c, const std::vector<int32_t>& v, const char* arg, int64_t B, int64_t lo,
                   int64_t hi) {
  for (int64_t b = 0; b < B; ++b)
    if (v[size_t(b)] < lo || v[size_t(b)] > hi)
      c.fail(arg, "element " + std::to_string(b) + " is " + std::to_string(v[size_t(b)]) + ", expected a value in " +
                      std::to_string(lo) + ".." + std::to_string(hi));
}

/// A host int32 [B] vector copied once (what the reference reads), each value in [lo, hi].
std::vector<int32_t> host_lengths(const Checker& c, const TensorView& t, const char* arg, int64_t B, int64_t lo,
                                  int64_t hi) {
  std::vector<int32_t> v(static_cast<size_t>(B));
  if (B > 0) std::memcpy(v.data(), t.data, size_t(B) * sizeof(int32_t));
  check_lengths(c, v, arg, B, lo, hi);
  return v;
}

/// A paged cache's block table (int32 [B, max_pages], contiguous) and geometry: the cache tensors'
/// first dimension is the page count, their second the page size (a power of two, named after
/// `cache_arg`, the tensor that gives it). Returns the tokens a sequence may hold, max_pages *
/// page_size; `pg` gets the geometry (its table pointer is set by the caller).
int64_t page_geometry(Checker& c, const TensorView& block_table, int64_t B, int64_t pages, int64_t page_size,
                      const char* cache_arg, CachePages& pg) {
  c.require(block_table, Req("block_table").dtypes({DType::kInt32}).rank(2, "[B, max_pages]").contiguous("block_table"));
  if (block_table.shape[0] != B)
    c.fail("block_table", "expected one row per sequence (B = " + std::to_string(B) + "), got " + block_table.describe());
  if (page_size < 1 || page_size > (int64_t(1) << 30) || (page_size & (page_size - 1)) != 0)
    c.fail(cache_arg, "the page size (second dimension) must be a power of two, got " + std::to_string(page_size));
  if (pages < 1) c.fail(cache_arg, "expected at least one page, got " + std::to_string(pages));
  const int64_t max_pages = block_table.shape[1];
  if (max_pages < 1 || max_pages > (int64_t(1) << 40) / page_size)
    c.fail("block_table", "expected 1 .. 2^40 / page_size pages per sequence, got " + block_table.describe());
  pg.table_stride = max_pages;
  pg.pages = pages;
  pg.shift = 0;
  while ((int64_t(1) << pg.shift) < page_size) ++pg.shift;
  return max_pages * page_size;
}

/// Every page a sequence of lens[b] + extra tokens uses (host copies) is a page id in [0, pages).
void check_pages(const Checker& c, const int32_t* table, const CachePages& pg, const std::vector<int32_t>& lens,
                 int64_t extra = 0) {
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t used = (int64_t(lens[b]) + extra + (int64_t(1) << pg.shift) - 1) >> pg.shift;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t id = table[int64_t(b) * pg.table_stride + i];
      if (id < 0 || id >= pg.pages)
        c.fail("block_table", "entry [" + std::to_string(b) + ", " + std::to_string(i) + "] is " + std::to_string(id) +
                                  ", expected a page id in 0.." + std::to_string(pg.pages - 1));
    }
  }
}

/// What an append validates on the host and its CPU path reads: the lengths (each in 0..T-N) and,
/// for a paged cache, the block table (every page of lengths[b] + N tokens a valid id). CUDA
/// tensors are copied from the device first (a stream-ordered copy and a wait each: the appends
/// cannot be captured in a CUDA graph); host tensors are copied once and read from the copies.
struct AppendHost {
  std::vector<int32_t> lens, table;
};
AppendHost append_host(const Checker& c, const TensorView& lengths, const TensorView& block_table, const CachePages& pg,
                       int64_t B, int64_t N, int64_t T, Stream stream) {
  AppendHost h;
  h.lens.resize(static_cast<size_t>(B));
  if (block_table.present()) h.table.resize(static_cast<size_t>(B * pg.table_stride));
  if (c.dev != Device::kCPU) {
    run_on_device<Kernels::kSm90Gemm>(c, [&] {
      int e = B > 0 ? cuda::read_int32(lengths.ptr<const int32_t>(), B, h.lens.data(), stream.handle) : 0;
      if (e == 0 && !h.table.empty())
        e = cuda::read_int32(block_table.ptr<const int32_t>(), int64_t(h.table.size()), h.table.data(), stream.handle);
      return e;
    });
  } else {
    if (B > 0) std::memcpy(h.lens.data(), lengths.data, h.lens.size() * sizeof(int32_t));
    if (!h.table.empty()) std::memcpy(h.table.data(), block_table.data, h.table.size() * sizeof(int32_t));
  }
  check_lengths(c, h.lens, "lengths", B, 0, T - N);
  if (!h.table.empty()) check_pages(c, h.table.data(), pg, h.lens, N);
  return h;
}

}  // namespace

void attn_forward_decode_nf4(const TensorView& q, const TensorView& k_nf4, const TensorView& k_scale,
                             const TensorView& k_residual, const TensorView& v, const TensorView& v_scale,
                             const TensorView& seq_lens, const TensorView& block_table,
                             const TensorView& precomputed_threshold, const TensorView& out,
                             const TensorView& skip_ratio, const DecodeNf4Args& args, Stream stream) {
  Checker c{"attn_forward_decode_nf4"};
  c.require(q, Req("q").dtypes({DType::kBFloat16}).rank(4, "[B, 1, H_q, D]").last_contiguous());
  const int64_t B = q.shape[0], H = q.shape[2], D = q.shape[3];
  if (q.shape[1] != 1) c.fail("q", "expected one query token per sequence ([B, 1, H_q, D]), got " + q.describe());
  check_dim(c, "q", "head dim D", D);
  const bool paged = block_table.present();
  c.require(k_nf4, Req("k_nf4").dtypes({DType::kUInt8}).rank(4, paged ? "[pages, page_size, H_kv, D/2]" : "[B, T, H_kv, D/2]"));
  const int64_t N0 = paged ? k_nf4.shape[0] : B, T1 = k_nf4.shape[1], HK = k_nf4.shape[2];
  c.shape(k_nf4, "k_nf4", {N0, T1, HK, D / 2});
  c.last_contiguous(k_nf4, "k_nf4");
  if (T1 < 1) c.fail("k_nf4", "expected T >= 1 cached tokens, got " + k_nf4.describe());
  CachePages pg;
  const int64_t T = paged ? page_geometry(c, block_table, B, N0, T1, "k_nf4", pg) : T1;
  if (paged && !seq_lens.present())
    c.fail("seq_lens", "is required with a block_table (the lengths of the paged sequences)");
  if (HK < 1) c.fail("k_nf4", "expected at least one KV head, got " + k_nf4.describe());
  if (H < 1 || H % HK != 0)
    c.fail("q", "the query heads H_q = " + std::to_string(H) + " must be a positive multiple of the KV heads H_kv = " +
                    std::to_string(HK));
  c.require(k_scale, Req("k_scale").dtypes({DType::kFloat32, DType::kBFloat16}).shape({B, HK, D}).last_contiguous());
  if (args.use_fp8_residual || k_residual.present())
    c.require(k_residual, Req("k_residual").dtypes(kResidualTypes).shape({N0, T1, HK, D}).last_contiguous());
  c.require(v, Req("v").dtypes({DType::kBFloat16, DType::kE4M3, DType::kE5M2}).rank(4, "[B, T, H_kv, Dv]"));
  const int64_t DV = v.shape[3];
  c.shape(v, "v", {N0, T1, HK, DV});
  check_dim(c, "v", "value head dim Dv", DV);
  c.last_contiguous(v, "v");
  const bool v8 = v.dtype != DType::kBFloat16;
  if (v8)
    c.require(v_scale, Req("v_scale").dtypes({DType::kFloat32}).shape({B, HK, DV}).last_contiguous());
  else if (v_scale.present())
    c.fail("v_scale", "is only taken with FP8 v (float8_e4m3fn / float8_e5m2); v is bfloat16");
  if (seq_lens.present())
    c.require(seq_lens, Req("seq_lens").dtypes({DType::kInt32}).shape({B}).contiguous("seq_lens"));
  if (precomputed_threshold.present())
    c.require(precomputed_threshold, Req("precomputed_threshold")
                                         .dtypes({DType::kFloat32})
                                         .shape({B, H})
                                         .contiguous("precomputed_threshold"));
  c.require(out, Req("out").dtypes({DType::kBFloat16}).shape({B, H, DV}).last_contiguous());
  if (skip_ratio.present()) c.require(skip_ratio, Req("skip_ratio").dtypes({DType::kFloat32}).shape({B, HK}));
  if (args.block_size < 1 || args.block_size > std::numeric_limits<int32_t>::max())
    c.fail("block_size", "expected a value in 1..2^31-1, got " + std::to_string(args.block_size));
  if (args.sub_block_size < 1 || args.block_size % args.sub_block_size != 0)
    c.fail("sub_block_size", "expected a divisor of block_size = " + std::to_string(args.block_size) + ", got " +
                                 std::to_string(args.sub_block_size));
  if (std::isnan(args.delta) || args.delta < 0.0f)
    c.fail("delta", "expected a value >= 0 (+inf: no pruning), got " + std::to_string(args.delta));
  const float scale = resolve_softmax_scale(c, args.softmax_scale, D, "D");
  if (args.nibbles != NibbleOrder::kLowFirst && args.nibbles != NibbleOrder::kHighFirst)
    c.fail("nibbles", "expected NibbleOrder::kLowFirst or kHighFirst");
  c.no_overlap({{"out", &out}, {"skip_ratio", &skip_ratio}},
               {{"q", &q}, {"k_nf4", &k_nf4}, {"k_scale", &k_scale}, {"k_residual", &k_residual}, {"v", &v},
                {"v_scale", &v_scale}, {"seq_lens", &seq_lens}, {"block_table", &block_table},
                {"precomputed_threshold", &precomputed_threshold}});

  DecodeNf4Plan p;
  p.batch = B;
  p.seqlen = T;
  p.heads = H;
  p.heads_kv = HK;
  p.head_dim = D;
  p.head_dim_v = DV;
  p.block_size = args.block_size;
  p.sub_block_size = args.sub_block_size;
  p.delta = args.delta;
  p.softmax_scale = scale;
  p.use_residual = args.use_fp8_residual;
  p.scale_dtype = k_scale.dtype;
  p.residual_dtype = k_residual.present() ? k_residual.dtype : DType::kE5M2;
  p.nibbles = args.nibbles;
  p.v_dtype = v.dtype;
  p.pages = pg;
  if (paged) p.pages.table = block_table.ptr<const int32_t>();
  p.has_seq_lens = seq_lens.present();
  p.has_threshold = precomputed_threshold.present();
  p.has_skip_ratio = skip_ratio.present();
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.strides[i];
    p.kc_stride[i] = k_nf4.strides[i];
    p.kr_stride[i] = k_residual.present() ? k_residual.strides[i] : 0;
    p.v_stride[i] = v.strides[i];
  }
  for (int i = 0; i < 2; ++i) {
    p.ks_stride[i] = k_scale.strides[i];
    p.o_stride[i] = out.strides[i];
    p.sr_stride[i] = skip_ratio.present() ? skip_ratio.strides[i] : 0;
    p.vs_stride[i] = v8 ? v_scale.strides[i] : 0;
  }
  DecodeNf4Ptrs x;
  x.q = q.ptr<const uint16_t>();
  x.k_nf4 = k_nf4.ptr<const uint8_t>();
  x.k_scale = k_scale.data;
  x.k_residual = k_residual.present() ? k_residual.ptr<const uint8_t>() : nullptr;
  x.v = v.data;
  x.v_scale = v8 ? v_scale.ptr<const float>() : nullptr;
  x.threshold = precomputed_threshold.present() ? precomputed_threshold.ptr<const float>() : nullptr;
  x.out = out.ptr<uint16_t>();
  x.skip_ratio = skip_ratio.present() ? skip_ratio.ptr<float>() : nullptr;
  if (c.dev != Device::kCPU) {
    // seq_lens stays on the device (the kernels clamp each length to [0, T]; no host sync)
    x.seq_lens = seq_lens.present() ? seq_lens.ptr<const int32_t>() : nullptr;
    run_on_device<Kernels::kSm90Gemm>(c, [&] { return B == 0 ? 0 : cuda::attn_decode_nf4(p, x, nullptr, 0, stream.handle); });
    return;
  }
  std::vector<int32_t> lens;
  if (seq_lens.present()) {
    lens = host_lengths(c, seq_lens, "seq_lens", B, 1, T);
    x.seq_lens = lens.data();
  }
  std::vector<int32_t> table;  // a host table is copied once, validated and read from the copy
  if (paged) {
    table.assign(p.pages.table, p.pages.table + B * p.pages.table_stride);
    p.pages.table = table.data();
    check_pages(c, table.data(), p.pages, lens);
  }
  if (B > 0) ref::attn_decode_nf4(p, x);
}

void kproj_rope_nf4_encode(const TensorView& x, const TensorView& w_k, const TensorView& positions, int64_t head_dim,
                           const TensorView& k_nf4, const TensorView& k_scale, const TensorView& k_residual,
                           const TensorView& k_out, const KprojRopeArgs& args, Stream stream) {
  Checker c{"kproj_rope_nf4_encode"};
  c.require(x, Req("x").dtypes(kFloatTypes).rank(3, "[B, T, hidden]"));
  const int64_t B = x.shape[0], T = x.shape[1], E = x.shape[2];
  if (head_dim < 2 || head_dim % 2 != 0)
    c.fail("head_dim", "expected an even head dim >= 2 (rotate-half RoPE, two NF4 codes per byte), got " +
                           std::to_string(head_dim));
  c.require(w_k, Req("w_k").dtypes(kFloatTypes).rank(2, "[H_kv * head_dim, hidden]"));
  if (w_k.shape[1] != E)
    c.fail("w_k", "expected hidden = " + std::to_string(E) + " columns (x's last dimension), got " + w_k.describe());
  if (w_k.shape[0] < 1 || w_k.shape[0] % head_dim != 0)
    c.fail("w_k", "the rows must be a positive multiple of head_dim = " + std::to_string(head_dim) + ", got " +
                      w_k.describe());
  const int64_t H = w_k.shape[0] / head_dim, D = head_dim;
  c.require(positions, Req("positions").dtypes({DType::kInt32, DType::kInt64}).shape({B, T}));
  c.require(k_nf4, Req("k_nf4").dtypes({DType::kUInt8}).shape({B, T, H, D / 2}));
  c.require(k_scale, Req("k_scale").dtypes({DType::kFloat32}).shape({B, H, D}));
  c.require(k_residual, Req("k_residual").dtypes(kResidualTypes).shape({B, T, H, D}));
  if (k_out.present()) c.require(k_out, Req("k_out").dtypes({DType::kFloat32}).shape({B, T, H, D}).last_contiguous());
  if (!std::isfinite(args.rope_theta) || !(args.rope_theta > 0.0))
    c.fail("rope_theta", "expected a finite value > 0, got " + std::to_string(args.rope_theta));
  c.no_overlap({{"k_nf4", &k_nf4}, {"k_scale", &k_scale}, {"k_residual", &k_residual}, {"k_out", &k_out}},
               {{"x", &x}, {"w_k", &w_k}, {"positions", &positions}});

  KprojRopePlan p;
  p.batch = B;
  p.seqlen = T;
  p.hidden = E;
  p.heads_kv = H;
  p.head_dim = D;
  p.x = x.data;
  p.x_dtype = x.dtype;
  for (int i = 0; i < 3; ++i) p.x_stride[i] = x.strides[i];
  p.w = w_k.data;
  p.w_dtype = w_k.dtype;
  p.w_stride[0] = w_k.strides[0];
  p.w_stride[1] = w_k.strides[1];
  p.positions = positions.data;
  p.positions64 = positions.dtype == DType::kInt64;
  p.p_stride[0] = positions.strides[0];
  p.p_stride[1] = positions.strides[1];
  p.rope_theta = args.rope_theta;
  if (k_out.present()) {
    p.k_out = k_out.ptr<float>();
    for (int i = 0; i < 3; ++i) p.ko_stride[i] = k_out.strides[i];
  }
  KCachePlan& kc = p.cache;
  kc.B = B; kc.T = T; kc.H = H; kc.D = D;
  kc.codes = k_nf4.ptr<uint8_t>();
  kc.scale = k_scale.ptr<float>();
  kc.residual = k_residual.ptr<uint8_t>();
  kc.r_dtype = k_residual.dtype;
  for (int i = 0; i < 4; ++i) {
    kc.c_s[i] = k_nf4.strides[i];
    kc.r_s[i] = k_residual.strides[i];
  }
  for (int i = 0; i < 3; ++i) kc.s_s[i] = k_scale.strides[i];
  kc.order = args.nibbles;
  if (c.dev != Device::kCPU) {
    run_on_device<Kernels::kSm90Gemm>(
        c, [&] { return B > 0 && T > 0 ? cuda::kproj_rope_nf4_encode(p, stream.handle) : 0; });
    return;
  }
  if (B > 0 && T > 0) ref::kproj_rope_nf4_encode(p);
}

void nf4_kcache_append(const TensorView& k_new, const TensorView& k_nf4, const TensorView& k_scale,
                       const TensorView& k_residual, const TensorView& lengths, const TensorView& block_table,
                       NibbleOrder nibbles, Stream stream) {
  Checker c{"nf4_kcache_append"};
  c.require(k_new, Req("k_new").dtypes(kFloatTypes).rank(4, "[B, N, H_kv, D]"));
  const int64_t B = k_new.shape[0], N = k_new.shape[1], H = k_new.shape[2], D = k_new.shape[3];
  if (D % 2 != 0) c.fail("k_new", "head dim D = " + std::to_string(D) + " must be even (two NF4 codes per byte)");
  const bool paged = block_table.present();
  c.require(k_nf4, Req("k_nf4").dtypes({DType::kUInt8}).rank(4, paged ? "[pages, page_size, H_kv, D/2]" : "[B, T, H_kv, D/2]"));
  const int64_t N0 = paged ? k_nf4.shape[0] : B, T1 = k_nf4.shape[1];
  c.shape(k_nf4, "k_nf4", {N0, T1, H, D / 2});
  KCacheAppendPlan p;
  const int64_t T = paged ? page_geometry(c, block_table, B, N0, T1, "k_nf4", p.pages) : T1;
  if (N > T) c.fail("k_new", "N = " + std::to_string(N) + " new tokens exceed the cache's T = " + std::to_string(T));
  c.require(k_scale, Req("k_scale").dtypes({DType::kFloat32}).shape({B, H, D}));
  c.require(k_residual, Req("k_residual").dtypes(kResidualTypes).shape({N0, T1, H, D}));
  c.require(lengths, Req("lengths").dtypes({DType::kInt32}).shape({B}).contiguous("lengths"));
  if (nibbles != NibbleOrder::kLowFirst && nibbles != NibbleOrder::kHighFirst)
    c.fail("nibbles", "expected NibbleOrder::kLowFirst or kHighFirst");
  c.no_overlap({{"k_nf4", &k_nf4}, {"k_scale", &k_scale}, {"k_residual", &k_residual}},
               {{"k_new", &k_new}, {"lengths", &lengths}, {"block_table", &block_table}});

  KCachePlan& kc = p.cache;
  kc.B = B; kc.T = N; kc.H = H; kc.D = D;
  kc.k = k_new.data;
  kc.k_dtype = k_new.dtype;
  kc.codes = k_nf4.ptr<uint8_t>();
  kc.scale = k_scale.ptr<float>();
  kc.residual = k_residual.ptr<uint8_t>();
  kc.r_dtype = k_residual.dtype;
  for (int i = 0; i < 4; ++i) {
    kc.k_s[i] = k_new.strides[i];
    kc.c_s[i] = k_nf4.strides[i];
    kc.r_s[i] = k_residual.strides[i];
  }
  for (int i = 0; i < 3; ++i) kc.s_s[i] = k_scale.strides[i];
  kc.order = nibbles;
  p.cache_T = T;
  AppendHost h = append_host(c, lengths, block_table, p.pages, B, N, T, stream);
  p.lengths = h.lens.data();
  if (c.dev != Device::kCPU) {
    p.lengths_device = lengths.ptr<const int32_t>();
    if (paged) p.pages.table = block_table.ptr<const int32_t>();
    run_on_device<Kernels::kSm90Gemm>(
        c, [&] { return B > 0 && N > 0 ? cuda::nf4_kcache_append(p, stream.handle) : 0; });
    return;
  }
  if (paged) p.pages.table = h.table.data();
  if (B > 0 && N > 0) ref::nf4_kcache_append(p);
}

namespace {

/// The V cache's codes and scale around `v` ([B, T, H, D] values; v_arg is its name): codes [B,
/// T, H, D], or [pages, page_size, H, D] when paged; *first and *second get the codes' first two
/// dimensions.
VCachePlan vcache_plan(Checker& c, const TensorView& v, const char* v_arg, const TensorView& codes, const TensorView& scale,
                       bool paged, int64_t* first, int64_t* second) {
  c.require(v, Req(v_arg).dtypes(kFloatTypes).rank(4, "[B, T, H_kv, Dv]"));
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], D = v.shape[3];
  c.require(codes, Req("codes").dtypes(kResidualTypes).rank(4, paged ? "[pages, page_size, H_kv, Dv]" : "[B, T, H_kv, Dv]"));
  *first = paged ? codes.shape[0] : B;
  *second = codes.shape[1];
  c.shape(codes, "codes", {*first, *second, H, D});
  c.require(scale, Req("scale").dtypes({DType::kFloat32}).shape({B, H, D}));
  VCachePlan p;
  p.B = B; p.T = N; p.H = H; p.D = D;
  p.v = v.data;
  p.v_dtype = v.dtype;
  p.codes = codes.ptr<uint8_t>();
  p.e5m2 = codes.dtype == DType::kE5M2;
  p.scale = scale.ptr<float>();
  for (int i = 0; i < 4; ++i) {
    p.v_s[i] = v.strides[i];
    p.c_s[i] = codes.strides[i];
  }
  for (int i = 0; i < 3; ++i) p.s_s[i] = scale.strides[i];
  return p;
}

}  // namespace

void fp8_vcache_quantize(const TensorView& v, const TensorView& codes, const TensorView& scale, Stream stream) {
  Checker c{"fp8_vcache_quantize"};
  int64_t B = 0, T = 0;
  const VCachePlan p = vcache_plan(c, v, "v", codes, scale, false, &B, &T);
  if (T != p.T) c.fail("codes", "expected T = " + std::to_string(p.T) + " tokens (v's), got " + codes.describe());
  c.no_overlap({{"codes", &codes}, {"scale", &scale}}, {{"v", &v}});
  if (c.dev != Device::kCPU) {
    run_on_device<Kernels::kSm90Gemm>(c, [&] { return cuda::fp8_vcache_quantize(p, stream.handle); });
    return;
  }
  ref::fp8_vcache_quantize(p);
}

void fp8_vcache_append(const TensorView& v_new, const TensorView& codes, const TensorView& scale,
                       const TensorView& lengths, const TensorView& block_table, Stream stream) {
  Checker c{"fp8_vcache_append"};
  VCacheAppendPlan p;
  const bool paged = block_table.present();
  int64_t N0 = 0;
  p.cache = vcache_plan(c, v_new, "v_new", codes, scale, paged, &N0, &p.cache_T);
  const int64_t B = p.cache.B, N = p.cache.T;
  if (paged) p.cache_T = page_geometry(c, block_table, B, N0, p.cache_T, "codes", p.pages);
  const int64_t T = p.cache_T;
  if (N > T) c.fail("v_new", "N = " + std::to_string(N) + " new tokens exceed the cache's T = " + std::to_string(T));
  c.require(lengths, Req("lengths").dtypes({DType::kInt32}).shape({B}).contiguous("lengths"));
  c.no_overlap({{"codes", &codes}, {"scale", &scale}},
               {{"v_new", &v_new}, {"lengths", &lengths}, {"block_table", &block_table}});
  AppendHost h = append_host(c, lengths, block_table, p.pages, B, N, T, stream);
  p.lengths = h.lens.data();
  if (c.dev != Device::kCPU) {
    p.lengths_device = lengths.ptr<const int32_t>();
    if (paged) p.pages.table = block_table.ptr<const int32_t>();
    run_on_device<Kernels::kSm90Gemm>(c, [&] { return B > 0 && N > 0 ? cuda::fp8_vcache_append(p, stream.handle) : 0; });
    return;
  }
  if (paged) p.pages.table = h.table.data();
  if (B > 0 && N > 0) ref::fp8_vcache_append(p);
}

}  // namespace lowbit
