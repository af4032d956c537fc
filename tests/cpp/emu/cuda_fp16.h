// tests/cpp/emu/cuda_fp16.h: host emulation: nothing of cuda_fp16.h is used by the emulated
// sources that include it (the fp16 codecs are the library's software ones). Test code only.
#pragma once
#include <cuda_runtime.h>
