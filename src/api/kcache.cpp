// src/api/kcache.cpp: argument validation and CPU/CUDA dispatch of the NF4 + residual K-cache
// ops (lowbit/ops.hpp).
#include <vector>

#include "api/check.hpp"
#include "api/device.hpp"
#include "lowbit/ops.hpp"
#include "ref/ref.hpp"

namespace lowbit {
using namespace detail;

namespace {
/// `k` is the float tensor: the input of nf4_kcache_quantize ("k"), the output of
/// nf4_kcache_dequantize ("out"); k_arg is the name errors give it.
KCachePlan kcache_plan(Checker& c, const TensorView& k, const char* k_arg, const TensorView& codes,
                       const TensorView& scale, const TensorView& residual, bool residual_required, NibbleOrder order) {
  c.require(k, Req(k_arg).dtypes({DType::kFloat32, DType::kFloat16, DType::kBFloat16}).rank(4, "[B, T, H, D]"));
  const int64_t B = k.shape[0], T = k.shape[1], H = k.shape[2], D = k.shape[3];
  if (D % 2 != 0) c.fail(k_arg, "head dim D = " + std::to_string(D) + " must be even (two NF4 codes per byte)");
  c.require(codes, Req("codes").dtypes({DType::kUInt8}).shape({B, T, H, D / 2}));
  c.require(scale, Req("scale").dtypes({DType::kFloat32}).shape({B, H, D}));
  KCachePlan p;
  p.B = B; p.T = T; p.H = H; p.D = D;
  p.k = k.data;
  p.k_dtype = k.dtype;
  p.codes = codes.ptr<uint8_t>();
  p.scale = scale.ptr<float>();
  for (int i = 0; i < 4; ++i) {
    p.k_s[i] = k.strides[i];
    p.c_s[i] = codes.strides[i];
  }
  for (int i = 0; i < 3; ++i) p.s_s[i] = scale.strides[i];
  if (residual.present() || residual_required) {
    c.require(residual, Req("residual").dtypes({DType::kE5M2, DType::kE4M3}).shape({B, T, H, D}));
    p.residual = residual.ptr<uint8_t>();
    p.r_dtype = residual.dtype;
    for (int i = 0; i < 4; ++i) p.r_s[i] = residual.strides[i];
  }
  p.order = order;
  return p;
}
}  // namespace

void nf4_kcache_quantize(const TensorView& k, const TensorView& codes, const TensorView& scale, const TensorView& residual,
                         NibbleOrder order, Stream stream) {
  Checker c{"nf4_kcache_quantize"};
  KCachePlan p = kcache_plan(c, k, "k", codes, scale, residual, true, order);
  c.no_overlap({{"codes", &codes}, {"scale", &scale}, {"residual", &residual}}, {{"k", &k}});
  dispatch(c, p, &ref::kcache_quantize, [&] { return cuda::kcache_quantize(p, stream.handle); });
}

void nf4_kcache_dequantize(const TensorView& codes, const TensorView& scale, const TensorView& residual,
                           const TensorView& out, NibbleOrder order, Stream stream) {
  Checker c{"nf4_kcache_dequantize"};
  KCachePlan p = kcache_plan(c, out, "out", codes, scale, residual, false, order);
  c.no_overlap({{"out", &out}}, {{"codes", &codes}, {"scale", &scale}, {"residual", &residual}});
  dispatch(c, p, &ref::kcache_dequantize, [&] { return cuda::kcache_dequantize(p, stream.handle); });
}

}  // namespace lowbit
