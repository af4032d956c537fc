// tests/cpp/emu/cutlass/arch/reg_reconfig.h: host emulation of CUTLASS's setmaxnreg entry points
// (warpgroup_reg_alloc / warpgroup_reg_dealloc). Registers are not modelled: the calls only check
// the PTX ISA's operand rule (a multiple of 8 in [24, 256]). Shadows CUTLASS's header on the emu
// tests' include path. Test code only.
#pragma once

#include <cstdint>

namespace cutlass::arch {

template <uint32_t RegCount>
inline void warpgroup_reg_alloc() {
  static_assert(RegCount >= 24 && RegCount <= 256 && RegCount % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
}
template <uint32_t RegCount>
inline void warpgroup_reg_dealloc() {
  static_assert(RegCount >= 24 && RegCount <= 256 && RegCount % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
}

}  // namespace cutlass::arch
