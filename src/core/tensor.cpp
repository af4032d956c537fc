// src/core/tensor.cpp: TensorView helpers and format descriptors.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "lowbit/error.hpp"
#include "lowbit/format.hpp"
#include "lowbit/tensor.hpp"

namespace lowbit {

bool TensorView::is_dense() const {
  if (ndim < 0) return false;
  int idx[kMaxDims];
  int n = 0;
  for (int d = 0; d < ndim; ++d)
    if (shape[d] != 1) idx[n++] = d;
  for (int i = 1; i < n; ++i)  // insertion sort by stride (n <= 8)
    for (int j = i; j > 0 && strides[idx[j]] < strides[idx[j - 1]]; --j) {
      const int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  int64_t expect = 1;
  for (int i = 0; i < n; ++i) {
    if (shape[idx[i]] == 0) return true;
    if (strides[idx[i]] != expect) return false;
    expect *= shape[idx[i]];
  }
  return true;
}

void TensorView::byte_extent(int64_t* lo, int64_t* hi) const {
  int64_t a = 0, b = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) {
      *lo = *hi = 0;
      return;
    }
    const int64_t span = (shape[d] - 1) * strides[d];
    if (span < 0) a += span; else b += span;
  }
  *lo = a * dtype_bytes(dtype);
  *hi = (b + 1) * dtype_bytes(dtype);
}

std::string TensorView::describe() const {
  if (!present()) return "<absent>";
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] (strides [";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << strides[d];
  os << "]) on " << (device == Device::kCPU ? "cpu" : "cuda:" + std::to_string(device_id));
  return os.str();
}

void validate_format(const BlockFormat& f, const char* op, const char* arg) {
  auto fail = [&](const std::string& w) { throw ArgumentError(op, arg, w); };
  if (f.block <= 0) fail("block size must be positive, got " + std::to_string(f.block));
  if (f.bits() == 4 && f.block % 2 != 0) fail("4-bit formats need an even block size, got " + std::to_string(f.block));
  // eps floors the block amax (scale) of the group recipes; the other recipes ignore it, but an
  // eps given to them must still be valid: finite and > 0 (0 turns an all-zero FP8 group into
  // 0/0 = NaN, inf every scale into inf and every code into NaN).
  if (!(std::isfinite(f.eps) && f.eps > 0.0f)) {
    std::ostringstream os;
    os << "eps must be finite and > 0, got " << f.eps;
    throw ArgumentError(op, "eps", os.str());
  }
  switch (f.rule) {
    case ScaleRule::kAmax:
      if (!(f.elem == Elem::kE4M3 || f.elem == Elem::kE5M2 || f.elem == Elem::kInt4))
        fail("the amax group recipe takes E4M3, E5M2 or INT4 elements");
      if (!(f.scale_type == ScaleType::kF32 || f.scale_type == ScaleType::kUE8M0))
        fail("the amax group recipe stores float32 or UE8M0 scales");
      break;
    case ScaleRule::kMinMax:
      if (f.elem != Elem::kUInt4 || f.scale_type != ScaleType::kF32)
        fail("the zero-point recipe takes UINT4 elements and float32 scales");
      break;
    case ScaleRule::kMxFloor:
    case ScaleRule::kMxRceil:
      if (!(f.elem == Elem::kE4M3 || f.elem == Elem::kE5M2 || f.elem == Elem::kE2M1))
        fail("MX formats take E4M3, E5M2 or E2M1 elements");
      if (f.scale_type != ScaleType::kUE8M0) fail("MX formats store UE8M0 scales");
      break;
    case ScaleRule::kNvfp4:
      if (f.elem != Elem::kE2M1 || f.scale_type != ScaleType::kE4M3)
        fail("NVFP4 takes E2M1 elements and E4M3 scales");
      break;
    case ScaleRule::kAbsmax:
      if (f.elem != Elem::kNF4 || f.scale_type != ScaleType::kF32) fail("NF4 takes NF4 codes and float32 absmax scales");
      break;
  }
}

std::string format_name(const BlockFormat& f) {
  const char* e[] = {"e4m3", "e5m2", "e2m1", "int4", "uint4", "nf4"};
  const char* s[] = {"f32", "ue8m0", "e4m3"};
  std::ostringstream os;
  switch (f.rule) {
    case ScaleRule::kMxFloor:
    case ScaleRule::kMxRceil:
      os << (f.elem == Elem::kE2M1 ? "mxfp4" : (f.elem == Elem::kE4M3 ? "mxfp8_e4m3" : "mxfp8_e5m2"))
         << (f.rule == ScaleRule::kMxFloor ? "(floor)" : "(rceil)");
      return os.str();
    case ScaleRule::kNvfp4: return "nvfp4";
    case ScaleRule::kAbsmax: os << "nf4/b" << f.block; return os.str();
    default: os << e[int(f.elem)] << "/g" << f.block << "/" << s[int(f.scale_type)]; return os.str();
  }
}

}  // namespace lowbit
