// src/cuda/moe/sm90_mxfp4_group_gemm_t128.cu: the MXFP4 grouped GEMM's cp.async kernel for 128
// tokens per CTA (plain and prepacked weights), the heaviest instantiation, in its own translation
// unit (see sm90_mxfp4_group_gemm.cu).
#include "cuda/moe/group_launch.cuh"

namespace lowbit::cuda {

cudaError_t launch_group_t128(const GroupArgs& a, int64_t max_tiles, int device, cudaStream_t st) {
  return launch_group<128, moe::group_stages(128), moe::pick_tile(128, 1).tile_k>(a, max_tiles, device, st);
}

}  // namespace lowbit::cuda
