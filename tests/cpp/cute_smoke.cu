// A CuTe layout evaluated on the host, compiled by nvcc for sm_90a: checks that the pinned
// CUTLASS/CuTe headers build with this toolkit (the GEMM mainloops depend on them).
#include <cstdio>

#include <cute/layout.hpp>
#include <cute/tensor.hpp>

__global__ void touch(int* out) {
  auto layout = cute::make_layout(cute::make_shape(cute::Int<4>{}, cute::Int<8>{}));
  out[threadIdx.x] = int(layout(threadIdx.x % 4, threadIdx.x / 4));
}

int main() {
  using namespace cute;
  // The 128x4 scale atom: (32 rows, 4 row groups, 4 cols) -> bytes.
  auto atom = make_layout(make_shape(Int<32>{}, Int<4>{}, Int<4>{}), make_stride(Int<16>{}, Int<4>{}, Int<1>{}));
  const int off = int(atom(5, 2, 3));
  if (off != 5 * 16 + 2 * 4 + 3 || size(atom) != 512) {
    std::printf("cute smoke: unexpected layout\n");
    return 1;
  }
  std::printf("cute smoke: ok (offset %d, size %d)\n", off, int(size(atom)));
  return 0;
}
