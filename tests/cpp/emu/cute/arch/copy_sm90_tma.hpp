// tests/cpp/emu/cute/arch/copy_sm90_tma.hpp: host emulation of CuTe's 2-D TMA load entry point
// (cute::SM90_TMA_LOAD_2D::copy with an L2 cache hint) and of its bulk copy into shared memory
// (cute::SM90_BULK_COPY_G2S::copy), forwarded to the TMA / bulk-copy emulation of emu_sm90.hpp (the
// hint has no effect there). Shadows CuTe's header on the emu tests' include path. Test code only.
#pragma once

#include <cstdint>

#include "emu_sm90.hpp"

namespace cute {
namespace TMA {
enum class CacheHintSm90 : uint64_t {
  EVICT_NORMAL = 0x1000000000000000ull,
  EVICT_FIRST = 0x12F0000000000000ull,
  EVICT_LAST = 0x14F0000000000000ull,
};
}  // namespace TMA

struct SM90_TMA_LOAD_2D {
  static void copy(void const* desc_ptr, uint64_t* mbar_ptr, uint64_t /*cache_hint*/, void* smem_ptr,
                   int32_t const& crd0, int32_t const& crd1) {
    emu::tma_load_2d(uint32_t(__cvta_generic_to_shared(smem_ptr)), static_cast<const CUtensorMap*>(desc_ptr), crd0,
                     crd1, uint32_t(__cvta_generic_to_shared(mbar_ptr)));
  }
};
/// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.
struct SM90_BULK_COPY_G2S {
  static void copy(void const* gmem_ptr, uint64_t* mbar_ptr, void* smem_ptr, int32_t load_bytes) {
    if (load_bytes <= 0) emu::fail("cp.async.bulk: size not a positive multiple of 16");
    emu::bulk_copy_g2s(uint32_t(__cvta_generic_to_shared(smem_ptr)), gmem_ptr, uint32_t(load_bytes),
                       uint32_t(__cvta_generic_to_shared(mbar_ptr)));
  }
};
}  // namespace cute
