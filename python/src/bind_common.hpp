// python/src/bind_common.hpp: what the binding files of lowbit._C share: the conversion of
// DLPack arrays (any producer, CPU or CUDA) plus an explicit lowbit DType into
// lowbit::TensorView, the output / input holders, the BlockFormat / ScaleLayout / Stream builders,
// and the one registration function per family that bindings.cpp calls.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "lowbit/attention.hpp"
#include "lowbit/error.hpp"
#include "lowbit/format.hpp"
#include "lowbit/gemm.hpp"
#include "lowbit/ops.hpp"

namespace lowbit_bind {

namespace nb = nanobind;

using Array = nb::ndarray<nb::ro>;  // any dtype, any device, read-only accepted
using OptArray = std::optional<Array>;

template <typename Arr>
lowbit::TensorView to_view(const Arr& a, lowbit::DType t, const char* op, const char* arg) {
  lowbit::TensorView v;
  const auto dt = a.dtype();
  const int64_t item_bits = int64_t(dt.bits) * int64_t(dt.lanes);
  if (item_bits != 8 * int64_t(lowbit::dtype_bytes(t)))
    throw lowbit::ArgumentError(op, arg,
                                std::string("the array's element size (") + std::to_string(item_bits) +
                                    " bits) does not match the declared dtype " + lowbit::dtype_name(t));
  if (a.ndim() > size_t(lowbit::kMaxDims))
    throw lowbit::ArgumentError(op, arg, "has more than 8 dimensions");
  if (dt.code == uint8_t(nb::dlpack::dtype_code::Bool) || dt.code == uint8_t(nb::dlpack::dtype_code::Complex))
    throw lowbit::ArgumentError(op, arg,
                                std::string("a ") + (dt.code == uint8_t(nb::dlpack::dtype_code::Bool) ? "bool" : "complex") +
                                    " array is not " + lowbit::dtype_name(t) + " data");
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = t;
  v.ndim = int32_t(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    v.shape[d] = int64_t(a.shape(d));
    v.strides[d] = int64_t(a.stride(d));
  }
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value || dev == nb::device::cuda_host::value) {
    v.device = lowbit::Device::kCPU;
    v.device_id = 0;
  } else if (dev == nb::device::cuda::value || dev == nb::device::cuda_managed::value) {
    v.device = lowbit::Device::kCUDA;
    v.device_id = a.device_id();
  } else {
    throw lowbit::ArgumentError(op, arg, "expected a CPU or CUDA array, got DLPack device type " + std::to_string(dev));
  }
  return v;
}

/// A float32 argument whose own type must be float32 (to_view checks the element size only, so
/// an int32 / uint32 array would be reinterpreted as floats).
template <typename Arr>
lowbit::TensorView float32_view(const Arr& a, const char* op, const char* arg) {
  const auto dt = a.dtype();
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Float) || dt.bits != 32 || dt.lanes != 1)
    throw lowbit::ArgumentError(op, arg,
                                "expected float32, got DLPack dtype (code " + std::to_string(int(dt.code)) + ", bits " +
                                    std::to_string(int(dt.bits)) + ")");
  return to_view(a, lowbit::DType::kFloat32, op, arg);
}

/// The lowbit dtype of an array from its DLPack type (for arguments of standard dtypes).
template <typename Arr>
lowbit::DType infer_dtype(const Arr& a, const char* op, const char* arg) {
  const auto dt = a.dtype();
  lowbit::DType t;
  if (!lowbit::from_dlpack({dt.code, dt.bits, dt.lanes}, &t))
    throw lowbit::ArgumentError(op, arg,
                                "unsupported DLPack dtype (code " + std::to_string(int(dt.code)) + ", bits " +
                                    std::to_string(int(dt.bits)) + ", lanes " + std::to_string(int(dt.lanes)) + ")");
  return t;
}

inline lowbit::TensorView opt_view(const OptArray& a, const char* op, const char* arg) {
  if (!a) return {};
  return to_view(*a, infer_dtype(*a, op, arg), op, arg);
}

/// An array the call writes. Outputs are taken as plain objects and converted here, so that a
/// read-only array (a read-only NumPy array or np.memmap, a DLPack export flagged read-only) is
/// refused with an ArgumentError naming the argument instead of being written (or faulting).
/// The holder keeps the converted array alive for the call; None gives an absent view.
struct Out {
  nb::ndarray<> arr;
  lowbit::TensorView v;
};

inline Out out_array(nb::handle h, std::optional<lowbit::DType> t, const char* op, const char* arg) {
  Out o;
  if (h.is_none()) return o;
  if (!nb::try_cast(h, o.arr, false)) {
    Array ro;
    if (nb::try_cast(h, ro, false))
      throw lowbit::ArgumentError(op, arg, "is read-only: an output must be a writable array");
    throw lowbit::ArgumentError(op, arg,
                                std::string("expected an array (DLPack or buffer protocol), got ") + nb::inst_name(h).c_str());
  }
  o.v = to_view(o.arr, t ? *t : infer_dtype(o.arr, op, arg), op, arg);
  return o;
}

/// An array the call only reads, given as a plain object (None: absent).
struct In {
  Array arr;
  lowbit::TensorView v;
};

inline In in_array(nb::handle h, const char* op, const char* arg) {
  In i;
  if (h.is_none()) return i;
  if (!nb::try_cast(h, i.arr, false))
    throw lowbit::ArgumentError(op, arg,
                                std::string("expected an array (DLPack or buffer protocol), got ") + nb::inst_name(h).c_str());
  i.v = to_view(i.arr, infer_dtype(i.arr, op, arg), op, arg);
  return i;
}

inline lowbit::BlockFormat make_format(lowbit::Elem elem, int32_t block, lowbit::ScaleType scale_type, lowbit::ScaleRule rule,
                                lowbit::NibbleOrder nibbles, lowbit::ZeroScale zero_scale, float eps) {
  lowbit::BlockFormat f;
  f.elem = elem;
  f.block = block;
  f.scale_type = scale_type;
  f.rule = rule;
  f.nibbles = nibbles;
  f.zero_scale = zero_scale;
  f.eps = eps;
  return f;
}

inline lowbit::ScaleLayout make_layout(lowbit::ScaleLayoutKind kind, int32_t row_align, lowbit::GroupPad pad) {
  lowbit::ScaleLayout l;
  l.kind = kind;
  l.row_align = row_align;
  l.group_pad = pad;
  return l;
}

inline lowbit::Stream make_stream(uintptr_t s) { return lowbit::Stream{reinterpret_cast<void*>(s)}; }

// One registration function per family (bind_<family>.cpp), called by NB_MODULE in bindings.cpp.
void bind_formats(nb::module_& m);  // format functions, quantize / dequantize / transcode, cast, scale layouts, amax
void bind_kcache(nb::module_& m);   // NF4 + residual K cache
void bind_gemm(nb::module_& m);     // NVFP4 dual GEMM
void bind_moe(nb::module_& m);      // MXFP4 grouped GEMM, its prepack, the gpt-oss expert MLP
void bind_attention(nb::module_& m);  // MXFP8 flash attention (fixed length, varlen)
void bind_decode_attention(nb::module_& m);  // NF4 K-cache decode attention, K encode, cache append
void bind_linear(nb::module_& m);     // dense MXFP4 / NVFP4 linears (mxfp4_gemm, nvfp4_gemm)

}  // namespace lowbit_bind
