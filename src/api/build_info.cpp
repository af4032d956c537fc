// src/api/build_info.cpp: what this build of lowbit holds (lowbit/ops.hpp build_info).
#include "cuda/common/launch.hpp"  // declarations only: called only in CUDA builds
#include "lowbit/ops.hpp"

namespace lowbit {

BuildInfo build_info() {
  BuildInfo b;
  b.version = LOWBIT_VERSION_STRING;
  // every op has a CUDA path now: cpu_only_ops stays empty (the field remains for the ops to come)
#if LOWBIT_WITH_CUDA
  b.cuda_built = true;
  b.cuda_runtime_version = cuda::runtime_version();
  b.device_count = cuda::device_count();
  if (b.device_count > 0) {
    b.device_name = cuda::device_name(0);
    b.sm = cuda::device_sm(0);
    if (b.sm >= 90)
      b.cuda_ops = {"quantize", "dequantize", "transcode", "cast", "convert_scale_layout", "tensor_amax",
                    "nf4_kcache_quantize", "nf4_kcache_dequantize"};
#if LOWBIT_WITH_CUTLASS
    if (b.sm >= 90)
      for (const char* op : {"nvfp4_dual_gemm_silu", "nvfp4_dual_gemm_prepack", "group_gemm_mxfp4_nt_groupwise",
                             "group_gemm_mxfp4_prepack", "group_gemm_mxfp4_prepack_fp8", "gpt_oss_moe_mlp",
                             "gpt_oss_expert_mlp",
                             "flash_attn_mxfp8",
                             "flash_attn_mxfp8_varlen", "mxfp4_gemm", "nvfp4_gemm", "nvfp4_gemm_prepack", "attn_forward_decode_nf4",
                             "kproj_rope_nf4_encode", "nf4_kcache_append", "fp8_vcache_quantize", "fp8_vcache_append"})
        b.cuda_ops.emplace_back(op);
#endif
  }
#endif
  return b;
}

}  // namespace lowbit
