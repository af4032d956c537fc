// tests/cpp/emu/emu_sm90.hpp: host emulation of the sm_90 asynchronous machinery that the GEMM
// kernels use through src/cuda/common/sm90_gemm_common.cuh and CuTe: mbarriers, cp.async with 32-bit
// shared addresses (with zero fill and cp.async.mbarrier.arrive.noinc), 2-D TMA tile loads, bulk
// copies, bf16 x2 multiplies, the proxy fence and the warpgroup MMA (wgmma.mma_async m64nNk16 bf16
// and m64nNk32 E4M3 / E5M2, A from registers and B from shared memory). The shim headers
// cute/arch/*.hpp and cutlass/arch/{barrier,reg_reconfig}.h of this directory forward CuTe's /
// CUTLASS's entry points here; the rewrite of sm90_gemm_common.cuh (tests/cpp/CMakeLists.txt)
// forwards its hand-written PTX here.
//
// What is emulated, and what each rule is taken from:
//  * mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"): a
//    phase with a pending arrival count and a tx-count. init sets the expected count (1 .. 2^20-1);
//    arrive decrements the pending count; expect_tx adds to the tx-count, complete_tx (a TMA's
//    bytes) subtracts; the phase completes when both are zero, then the pending count is reset to
//    the expected count. try_wait.parity(p) is true when the phase of parity p has completed, i.e.
//    when the current phase's parity differs from p. Checked: initialisation before use, the
//    barrier's 8 bytes not overwritten since init, no arrival on a phase with no pending arrival,
//    the tx-count within +-(2^20 - 1). A wait blocks (condition variable); one that sees no progress
//    for 60 s reports a deadlock.
//  * cp.async.{ca,cg}.shared.global [dst], [src], cp-size{, src-size} (PTX ISA "cp.async"): cp-size
//    bytes land at dst, the first src-size from src, the rest zero; dst and src aligned to cp-size
//    (checked). cp.async.commit_group / wait_group N: as cuda/common/cp_async.cuh (landing at issue
//    or at the wait: emu::cp_async_mode). cp.async.mbarrier.arrive.noinc: an arrive-on the barrier
//    once all the thread's earlier cp.async copies have landed (".noinc": the arrival counts
//    against the barrier's expected count).
//  * cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes (PTX ISA
//    "cp.async.bulk.tensor"; the tensor map of cuda.h): the box of box[1] rows x box[0] elements at
//    coordinates (x, y) (x innermost, in elements), out-of-bound elements filled with zeros
//    (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), written densely, row r at byte r * box[0] * elem; the
//    barrier's tx-count is decremented by the whole box's bytes (out-of-bound elements included).
//    The shared destination must be 128-byte aligned (checked). CU_TENSOR_MAP_SWIZZLE_128B
//    ("Swizzle 16B chunks within 128B span", cuda.h's CUtensorMapSwizzle; PTX ISA "Tensor
//    Swizzling Modes"): the 16-byte chunk at address bits 4..6 is XORed with address bits 7..9
//    (the 128-byte row within the 1024-byte repeating pattern), i.e. chunk c of row r of an 8-row
//    atom lands at chunk c ^ (r % 8). The emulation requires 1024-byte aligned destinations for
//    this mode (the pattern is then the same whether the hardware takes it from the address or from
//    the offset in the box) and boxes of exactly 128-byte rows.
//  * cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes (PTX ISA "cp.async.bulk"):
//    size bytes copied as they are; size a multiple of 16, both addresses 16-byte aligned
//    (checked); the barrier's tx-count is decremented by size. Lands as a TMA box does.
//  * fence.proxy.async.shared::cta: counted per thread. Shared memory written by cp.async (the
//    generic proxy) and then read by a wgmma (the async proxy) must see a proxy fence by the
//    writing thread after the copy landed (PTX ISA "Memory consistency model: proxies"); a wgmma
//    that reads such bytes without it fails. (Plain st.shared stores are not tracked.)
//  * mul.rn.bf16x2 (PTX ISA "Half precision floating point instructions: mul"): per half, the exact
//    product rounded to nearest even in bf16, subnormals kept (no flush for bf16), NaN as the
//    canonical 0x7FFF. cvt.rn.f16x2.e4m3x2 and cvt.rn.bf16x2.f32 (PTX ISA "cvt"): exact widening,
//    resp. rounding to nearest even, NaN as the canonical 0x7FFF.
//  * wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 with A in registers (PTX ISA "Asynchronous
//    Warpgroup Level Matrix Multiply-Accumulate", Register Fragments and Shared Memory Layouts):
//    - A (64 x 16) fragment, Figure "WGMMA .m64nNk16 register fragment layout for matrix A": warp w
//      of the warpgroup holds rows 16w .. 16w+15 as mma.m16n8k16's A fragment: with g = lane / 4,
//      t = lane % 4, register 0 = A[g][2t, 2t+1], 1 = A[g+8][2t, 2t+1], 2 = A[g][2t+8, 2t+9],
//      3 = A[g+8][2t+8, 2t+9] (row offsets within the warp's 16 rows; lower index in the low half).
//      (CuTe's ALayout_64x16 of mma_traits_sm90_gmma.hpp says the same.)
//    - D (64 x N, fp32), Figure "WGMMA .m64nNk16 register fragment layout for accumulator D":
//      register i of thread (w, g, t) is D[16w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2t + (i & 1)].
//    - B (16 x N, K-major in shared memory) from the matrix descriptor ("Matrix Descriptor Format";
//      CuTe's GmmaDescriptor of mma_sm90_desc.hpp has the same fields): bits 0-13 start address >> 4,
//      16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51
//      base offset, 62-63 swizzle mode (0 none, 1 128B, 2 64B, 3 32B). For the K-major 128B-swizzled
//      layout ("Shared Memory Matrix Layout": a swizzle atom of 8 rows x 128 bytes) element (n, k)
//      is at start + (n / 8) * SBO + (n % 8) * 128 + 2k, then the 128B swizzle on the address
//      (bits 4..6 ^= bits 7..9); the leading-dimension offset is not used by swizzled K-major
//      layouts (the k16 slice lies inside one 128-byte row: checked). Only this mode, base offset 0,
//      is emulated (anything else fails).
//    - D += A * B with products of the exact bf16 values summed in fp32 in k order (the hardware's
//      fp32 summation order may differ in the last bits).
//  * wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} with A in registers (same
//    sections; CuTe's MMA_64xNx32_F32E4M3E4M3_RS_TN and its kin, N = 8 .. 256):
//    - A (64 x 32, 8-bit), Figure "WGMMA .m64nNk32 register fragment layout for matrix A": warp w
//      holds rows 16w .. 16w+15; with g = lane / 4, t = lane % 4, register 0 = A[g][4t .. 4t+3],
//      1 = A[g+8][4t .. 4t+3], 2 = A[g][16+4t .. 16+4t+3], 3 = A[g+8][16+4t .. 16+4t+3] (lower K
//      in the lower byte). (CuTe's ALayout_64x32 says the same: thread (t, g, w) strides (4 K, 1
//      row, 16 rows), values (4, 2, 2) strides (1 K, 8 rows, 16 K).)
//    - D: the layout of the k16 forms above.
//    - B (32 x N, 8-bit, K-major, 128B-swizzled): element (n, k) at start + (n / 8) * SBO +
//      (n % 8) * 128 + k, then the 128B swizzle; the k32 slice is 32 bytes of one 128-byte row
//      (checked), as the bf16 k16 slice. The same descriptor fields and restrictions as above.
//    - E4M3 (no Inf, NaN S.1111.111) and E5M2 (IEEE-like: Inf S.11111.00, NaN S.11111.xx) codes
//      decoded exactly. D = A * B (+ D with scale-d 1, the default; the scale-d 0 form of the
//      kernels' first MMA per block overwrites D): the 32 products are exact and summed exactly
//      (as integers in units of the two formats' smallest subnormals, 2^-9 / 2^-16 each), then
//      rounded once to fp32, nearest even; with scale-d 1 and a nonzero D the exact sum is added to
//      D in fp64 and rounded to fp32. A NaN or Inf operand gives the IEEE result of the fp64 sum
//      (NaN for NaN codes and for Inf * 0). Hopper's FP8 tensor cores do NOT sum exactly: they
//      align the products to the largest exponent keeping about 13 fraction bits and truncate
//      (docs/design/moe_grouped_gemm.md, "Tolerance and its derivation"); the emulation does not
//      model that reduced-precision accumulator: its results are the exactly rounded ones, so a
//      kernel test on the emulation checks the data movement and the arithmetic around the MMA,
//      not the hardware's accumulation error (which the documented tolerance covers).
//    - Operand negation (scale-a / scale-b -1) is not emulated (refused at compile time).
//    - Asynchrony: each thread's wgmma ops are recorded at issue (A registers and descriptor as
//      issued; D by reference); wgmma.commit_group closes a group; wgmma.wait_group N completes all
//      but the newest N committed groups. emu::wgmma_mode picks when an op computes: kAtWait (when
//      the wait retires its group: its B bytes as they are then; D is stale until then) or kAtIssue
//      (as soon as the 128 threads of the warpgroup have issued it: B as it is at issue). The ops are
//      warpgroup-collective (.sync.aligned): the MMAs and the waits meet at a warpgroup barrier, so
//      all 128 threads must reach them, and they must issue the same shapes, types, scale-d and
//      descriptors and commit the same groups (checked). A wgmma.fence (warpgroup_arrive) must come
//      between a commit and the next MMA (checked: the kernels rewrite the A registers for every
//      group, and the PTX ISA asks for the fence between register writes and the MMA that reads
//      them).
//  Not emulated: timing and overlap, clusters, the L2 cache hint, memory ordering beyond the waits
//  above (the emulator's own locks order everything else).
#pragma once

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "lowbit/codecs.hpp"

namespace emu {

/// When a wgmma computes (see the file comment).
enum class WgmmaMode { kAtWait, kAtIssue };
inline WgmmaMode wgmma_mode = WgmmaMode::kAtWait;

struct MBar {
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t completed = 0;  ///< completed phases (the current phase's parity: completed & 1)
  uint64_t tag = 0;        ///< written into the barrier's 8 bytes at init
};
/// One cp.async copy: size bytes at shared address dst, the first src_size from src, zeros after.
struct CopyPiece {
  uint32_t dst;
  const uint8_t* src;
  uint32_t size, src_size;
};
/// Async copies in flight that an mbarrier counts: a TMA box (image in shared-memory order,
/// complete_tx of its bytes) or a thread's cp.async copies with their noinc arrival.
struct AsyncRecord {
  uint32_t bar = 0;
  bool tma = false;
  uint32_t dst = 0;
  std::vector<uint8_t> image;
  std::vector<CopyPiece> pieces;
  unsigned writer = 0;
};
/// The operand types of a wgmma (A, B): bf16 x bf16 (k16) or one of the 8-bit forms (k32).
enum class WgmmaType : uint8_t { kBf16, kE4M3E4M3, kE4M3E5M2, kE5M2E4M3, kE5M2E5M2 };
struct WgmmaOp {
  uint32_t a[4];
  uint64_t desc;
  float* d;       ///< the thread's n accumulators (contiguous)
  unsigned n;     ///< N / 2
  WgmmaType type;
  bool scale_d;   ///< D = A B + D (true) or D = A B (scale-d 0)
  bool done;
};
/// The wgmma state of one warpgroup (128 threads). Each thread's ops and groups live in rings
/// indexed by absolute counts (nothing moves once written, so other threads may read a slot while
/// its owner goes on): a slot is rewritten kRing ops later, long after every reader passed the
/// warpgroup barrier of the op's completion.
struct WarpGroup {
  static constexpr uint64_t kRing = 64;
  struct Thread {
    WgmmaOp ops[kRing];
    std::atomic<uint64_t> issued{0};  ///< op counts (issued: read by the other threads)
    uint64_t retired = 0;
    uint64_t ends[kRing];              ///< op count at each commit
    uint64_t commits = 0, waited = 0;  ///< groups committed / retired
    uint64_t waits = 0;                ///< wait_group calls
    uint64_t wait_r[kRing];            ///< op count retired by each wait (the threads compare them)
    bool fenced = false;               ///< a wgmma.fence since the last commit
  };
  std::unique_ptr<std::barrier<>> bar;
  Thread th[128];
};
struct Sm90Cta {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint32_t, MBar> bars;
  std::deque<AsyncRecord> inflight;
  std::vector<std::unique_ptr<WarpGroup>> wgs;
  std::unique_ptr<std::atomic<uint32_t>[]> fences;  ///< per thread: fence.proxy.async count
  /// per 16-byte chunk of the window: bit 63 set when last written by a cp.async (generic proxy),
  /// bits 32..47 the writing thread, bits 0..31 its fence count when the bytes landed
  std::unique_ptr<std::atomic<uint64_t>[]> shadow;
};

inline void sm90_finish(Cta& c) {
  Sm90Cta* s = c.sm90.load();
  if (!s) return;
  if (!s->inflight.empty()) fail("the CTA exited with TMA / cp.async copies in flight that no mbarrier wait consumed");
  for (auto& wg : s->wgs)
    for (int t = 0; t < 128; ++t)
      if (wg->th[t].retired != wg->th[t].issued)
        fail("the CTA exited with wgmma operations not retired by a wgmma.wait_group");
  delete s;
  c.sm90.store(nullptr);
}
inline Sm90Cta& s90() {
  Sm90Cta* s = cta->sm90.load(std::memory_order_acquire);
  if (s) return *s;
  std::lock_guard<std::mutex> lock(cta->mu);
  s = cta->sm90.load();
  if (!s) {
    s = new Sm90Cta;
    const unsigned nwg = (blockDim.x + 127) / 128;
    for (unsigned i = 0; i < nwg; ++i) {
      s->wgs.push_back(std::make_unique<WarpGroup>());
      if (blockDim.x >= 128 * (i + 1)) s->wgs.back()->bar = std::make_unique<std::barrier<>>(128);
    }
    s->fences.reset(new std::atomic<uint32_t>[blockDim.x]());
    s->shadow.reset(new std::atomic<uint64_t>[cta->window_bytes / 16]());
    cta->sm90_finish = &sm90_finish;
    cta->sm90.store(s, std::memory_order_release);
  }
  return *s;
}

inline void check_window(uint32_t a, size_t n, const char* what) {
  if (size_t(a) + n > cta->window_bytes) fail(std::string(what) + ": shared address outside the window");
}

// ---- mbarriers (callers hold Sm90Cta::mu) ----
inline MBar& mbar_get(Sm90Cta& s, uint32_t a, const char* op) {
  auto it = s.bars.find(a);
  if (it == s.bars.end()) fail(std::string(op) + " on an mbarrier that was not initialised");
  uint64_t v;
  std::memcpy(&v, cta->window + a, 8);
  if (v != it->second.tag) fail(std::string(op) + ": the mbarrier's 8 bytes were overwritten since its init");
  return it->second;
}
inline void mbar_maybe_complete(Sm90Cta& s, MBar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.completed;
    b.pending = b.expected;
    s.cv.notify_all();
  }
}
inline void mbar_arrive_locked(Sm90Cta& s, uint32_t a, const char* op) {
  MBar& b = mbar_get(s, a, op);
  if (b.pending == 0) fail(std::string(op) + ": arrival on a phase with no pending arrival");
  --b.pending;
  mbar_maybe_complete(s, b);
}
inline void mbar_tx_locked(Sm90Cta& s, uint32_t a, int64_t delta, const char* op) {
  MBar& b = mbar_get(s, a, op);
  b.tx += delta;
  if (b.tx > (int64_t(1) << 20) - 1 || b.tx < -((int64_t(1) << 20) - 1))
    fail(std::string(op) + ": mbarrier tx-count outside +-(2^20 - 1)");
  mbar_maybe_complete(s, b);
}

inline void mbar_init(uint32_t a, uint32_t count) {
  check_window(a, 8, "mbarrier.init");
  if (a % 8 != 0) fail("mbarrier.init: address not 8-byte aligned");
  if (count == 0 || count > (1u << 20) - 1) fail("mbarrier.init: count outside [1, 2^20 - 1]");
  Sm90Cta& s = s90();
  std::lock_guard<std::mutex> lock(s.mu);
  MBar b;
  b.expected = b.pending = count;
  b.tag = 0x4D42415200000000ull ^ (uint64_t(a) << 8) ^ count;
  std::memcpy(cta->window + a, &b.tag, 8);
  s.bars[a] = b;
}
inline void mbar_arrive(uint32_t a) {
  Sm90Cta& s = s90();
  std::lock_guard<std::mutex> lock(s.mu);
  mbar_arrive_locked(s, a, "mbarrier.arrive");
}
inline void mbar_arrive_expect_tx(uint32_t a, uint32_t bytes) {
  Sm90Cta& s = s90();
  std::lock_guard<std::mutex> lock(s.mu);
  mbar_tx_locked(s, a, int64_t(bytes), "mbarrier.arrive.expect_tx");
  mbar_arrive_locked(s, a, "mbarrier.arrive.expect_tx");
}

// ---- landing of async copies ----
inline void shadow_mark(Sm90Cta& s, uint32_t dst, size_t n, bool generic, unsigned writer) {
  const uint64_t v = generic ? (uint64_t(1) << 63) | (uint64_t(writer & 0xFFFFu) << 32) | s.fences[writer].load() : 0;
  for (size_t c = dst / 16; c < (dst + n + 15) / 16; ++c) s.shadow[c].store(v);
}
inline void land_piece(Sm90Cta& s, const CopyPiece& p, unsigned writer) {
  if (p.src_size) std::memcpy(cta->window + p.dst, p.src, p.src_size);
  if (p.size > p.src_size) std::memset(cta->window + p.dst + p.src_size, 0, p.size - p.src_size);
  shadow_mark(s, p.dst, p.size, true, writer);
}
/// Lands a record and applies its barrier update (caller holds mu).
inline void land_record(Sm90Cta& s, const AsyncRecord& r) {
  if (r.tma) {
    std::memcpy(cta->window + r.dst, r.image.data(), r.image.size());
    shadow_mark(s, r.dst, r.image.size(), false, 0);
    mbar_tx_locked(s, r.bar, -int64_t(r.image.size()), "TMA complete_tx");
  } else {
    for (const CopyPiece& p : r.pieces) land_piece(s, p, r.writer);
    mbar_arrive_locked(s, r.bar, "cp.async.mbarrier.arrive.noinc");
  }
}
/// Lands the records in flight that barrier `a` counts (deferred mode; caller holds mu).
inline void land_for(Sm90Cta& s, uint32_t a) {
  for (auto it = s.inflight.begin(); it != s.inflight.end();) {
    if (it->bar == a) {
      const AsyncRecord r = std::move(*it);
      it = s.inflight.erase(it);
      land_record(s, r);
    } else {
      ++it;
    }
  }
}
inline void push_record(Sm90Cta& s, AsyncRecord&& r) {
  std::lock_guard<std::mutex> lock(s.mu);
  mbar_get(s, r.bar, r.tma ? "TMA load" : "cp.async.mbarrier.arrive.noinc");
  if (cp_async_mode == CpAsyncMode::kImmediate) {
    land_record(s, r);
  } else {
    s.inflight.push_back(std::move(r));
    s.cv.notify_all();
  }
}

inline bool mbar_try_wait(uint32_t a, uint32_t parity) {
  Sm90Cta& s = s90();
  std::unique_lock<std::mutex> lock(s.mu);
  land_for(s, a);
  const bool done = (mbar_get(s, a, "mbarrier.try_wait").completed & 1) != (parity & 1);
  lock.unlock();
  if (!done) std::this_thread::yield();
  return done;
}
inline void mbar_wait(uint32_t a, uint32_t parity) {
  Sm90Cta& s = s90();
  std::unique_lock<std::mutex> lock(s.mu);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    land_for(s, a);
    const MBar& b = mbar_get(s, a, "mbarrier.try_wait");
    if ((b.completed & 1) != (parity & 1)) return;
    s.cv.wait_for(lock, std::chrono::milliseconds(20));
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60))
      fail("mbarrier wait for parity " + std::to_string(parity) + " at shared address " + std::to_string(a) +
           ": no progress in 60 s (deadlock); pending " + std::to_string(b.pending) + ", tx " + std::to_string(b.tx) +
           ", completed phases " + std::to_string(b.completed));
  }
}

// ---- cp.async (32-bit shared addresses) ----
struct CpQueue {
  std::deque<std::vector<CopyPiece>> groups;
  std::vector<CopyPiece> open;
};
inline thread_local CpQueue cpq;

inline void cp_async_shared(uint32_t dst, const void* src, uint32_t cp_size, uint32_t src_size) {
  check_window(dst, cp_size, "cp.async");
  if (dst % cp_size != 0 || (src_size && reinterpret_cast<uintptr_t>(src) % cp_size != 0))
    fail("cp.async: shared or global address not aligned to the copy size " + std::to_string(cp_size));
  if (src_size > cp_size) fail("cp.async: src-size above cp-size");
  const CopyPiece p{dst, static_cast<const uint8_t*>(src), cp_size, src_size};
  Sm90Cta& s = s90();
  if (cp_async_mode == CpAsyncMode::kImmediate) {
    std::lock_guard<std::mutex> lock(s.mu);
    land_piece(s, p, threadIdx.x);
  } else {
    cpq.open.push_back(p);
  }
}
inline void cp_async_commit_group() {
  cpq.groups.push_back(std::move(cpq.open));
  cpq.open.clear();
}
inline void cp_async_wait_group(int n) {
  if (cpq.groups.size() <= size_t(n)) return;
  Sm90Cta& s = s90();
  std::lock_guard<std::mutex> lock(s.mu);
  while (cpq.groups.size() > size_t(n)) {
    for (const CopyPiece& p : cpq.groups.front()) land_piece(s, p, threadIdx.x);
    cpq.groups.pop_front();
  }
}
/// cp.async.mbarrier.arrive.noinc: the arrival follows all of this thread's earlier copies
/// (committed or not; those then no longer count for a later cp.async.wait_group).
inline void cp_async_arrive_noinc(uint32_t bar) {
  AsyncRecord r;
  r.bar = bar;
  r.writer = threadIdx.x;
  for (auto& g : cpq.groups) r.pieces.insert(r.pieces.end(), g.begin(), g.end());
  r.pieces.insert(r.pieces.end(), cpq.open.begin(), cpq.open.end());
  cpq.groups.clear();
  cpq.open.clear();
  push_record(s90(), std::move(r));
}
inline void fence_proxy_async() { s90().fences[threadIdx.x].fetch_add(1); }

// ---- TMA ----
inline void tma_load_2d(uint32_t dst, const CUtensorMap* m, int32_t x, int32_t y, uint32_t bar) {
  if (m->magic != kTensorMapMagic) fail("TMA load through a tensor map that cuTensorMapEncodeTiled did not write");
  if (dst % 128 != 0) fail("TMA load: shared destination not 128-byte aligned");
  const uint32_t eb = m->elem_bytes, row = m->box[0] * eb, rows = m->box[1];
  const bool sw128 = m->swizzle == CU_TENSOR_MAP_SWIZZLE_128B;
  if (sw128 && (dst % 1024 != 0 || row != 128))
    fail("TMA load: SWIZZLE_128B is emulated for 1024-byte aligned destinations and 128-byte box rows only");
  check_window(dst, size_t(row) * rows, "TMA load");
  AsyncRecord r;
  r.tma = true;
  r.bar = bar;
  r.dst = dst;
  r.image.assign(size_t(row) * rows, 0);
  for (uint32_t i = 0; i < rows; ++i) {
    const int64_t gy = int64_t(y) + i;
    for (uint32_t e = 0; e < m->box[0]; ++e) {
      const int64_t gx = int64_t(x) + e;
      if (gx < 0 || gy < 0 || uint64_t(gx) >= m->dim[0] || uint64_t(gy) >= m->dim[1]) continue;  // zero fill
      uint32_t off = i * row + e * eb;
      for (uint32_t b = 0; b < eb; ++b) {
        uint32_t o = off + b;
        if (sw128) o ^= ((o >> 7) & 7u) << 4;  // 16-byte chunk ^= row within the 8-row pattern
        r.image[o] = m->base[uint64_t(gy) * m->stride1 + uint64_t(gx) * eb + b];
      }
    }
  }
  push_record(s90(), std::move(r));
}

// ---- bulk copy (non-tensor) ----
/// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar]:
/// size bytes from src to dst (both 16-byte aligned, size a positive multiple of 16: checked),
/// completing size bytes of transactions on the barrier. Lands like a TMA box (emu::cp_async_mode).
inline void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t size, uint32_t bar) {
  if (size == 0 || size % 16 != 0) fail("cp.async.bulk: size not a positive multiple of 16");
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail("cp.async.bulk: shared or global address not 16-byte aligned");
  check_window(dst, size, "cp.async.bulk");
  AsyncRecord r;
  r.tma = true;
  r.bar = bar;
  r.dst = dst;
  r.image.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + size);
  push_record(s90(), std::move(r));
}

// ---- bf16 x2 multiply ----
/// x rounded to nearest even in bf16 (8 significant bits, exponent range of fp32, subnormals
/// down to 2^-133), as bf16 bits.
inline uint16_t bf16_rne(double x) {
  if (x != x) return 0x7FFF;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);                        // a in [2^(e-1), 2^e)
  const int q = std::max(e - 1, -126) - 7;  // the quantum at a's binade (subnormal: 2^-133)
  const double r = std::nearbyint(std::ldexp(a, -q));  // default rounding: to nearest even
  const double v = std::ldexp(r, q);
  if (v >= 0x1p128) return uint16_t(sign | 0x7F80);
  const float f = float(v);  // exact: v is a bf16 value
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(sign | (u >> 16));
}
inline uint32_t mul_rn_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const double x = double(lowbit::decode_bf16(uint16_t(a >> (16 * h)))) * double(lowbit::decode_bf16(uint16_t(b >> (16 * h))));
    d |= uint32_t(bf16_rne(x)) << (16 * h);
  }
  return d;
}

// ---- conversions (PTX ISA "cvt") ----
/// cvt.rn.f16x2.e4m3x2: byte 0 -> the low fp16, byte 1 -> the high one; every E4M3 value is an
/// fp16 value (exact), the E4M3 NaN codes give the canonical fp16 NaN 0x7FFF.
inline uint32_t cvt_rn_f16x2_e4m3x2(uint16_t two) {
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const uint8_t c = uint8_t(two >> (8 * h));
    const float v = lowbit::decode_e4m3(c);
    d |= uint32_t(v != v ? uint16_t(0x7FFF) : lowbit::encode_fp16(v)) << (16 * h);
  }
  return d;
}
/// cvt.rn.bf16x2.f32 d, hi, lo: each rounded to nearest even in bf16 (NaN: the canonical 0x7FFF).
inline uint32_t cvt_rn_bf16x2_f32(float hi, float lo) {
  return uint32_t(bf16_rne(double(lo))) | (uint32_t(bf16_rne(double(hi))) << 16);
}

// ---- wgmma ----
inline WarpGroup& my_wg(unsigned* t, const char* op) {
  Sm90Cta& s = s90();
  const unsigned w = threadIdx.x / 128;
  if (w >= s.wgs.size() || !s.wgs[w]->bar) fail(std::string(op) + " from a thread outside a full warpgroup");
  *t = threadIdx.x % 128;
  return *s.wgs[w];
}
/// Shared address of B element (n, k) of the K-major 128B-swizzled operand of descriptor `desc`,
/// with elements of `eb` bytes (2: bf16, 1: E4M3 / E5M2).
inline uint32_t wgmma_b_addr(uint64_t desc, int n, int k, uint32_t eb = 2) {
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4, sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
  const uint32_t logical = start + uint32_t(n / 8) * sbo + uint32_t(n % 8) * 128u + eb * uint32_t(k);
  return logical ^ (((logical >> 7) & 7u) << 4);
}
/// The descriptor's checks; the K slice of one row (16 x 2 or 32 x 1 bytes) is 32 bytes either way.
inline void wgmma_check_desc(uint64_t desc) {
  if ((desc >> 62) != 1) fail("wgmma: only the 128B swizzle mode of the B descriptor is emulated");
  if (((desc >> 49) & 7u) != 0) fail("wgmma: a non-zero matrix base offset is not emulated");
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
  if ((start & 127u) + 32u > 128u) fail("wgmma: the K slice of a K-major 128B-swizzled B crosses its 128-byte row");
}
/// An 8-bit operand code as an exact multiple of its format's smallest subnormal: *q = value * 2^9
/// (E4M3) or value * 2^16 (E5M2), an integer; false for the NaN and Inf codes.
inline bool fp8_units(uint8_t c, bool e5m2, int64_t* q) {
  const float v = e5m2 ? lowbit::decode_e5m2(c) : lowbit::decode_e4m3(c);
  if (!std::isfinite(v)) return false;
  *q = int64_t(std::ldexp(double(v), e5m2 ? 16 : 9));
  return true;
}
inline float fp8_value(uint8_t c, bool e5m2) { return e5m2 ? lowbit::decode_e5m2(c) : lowbit::decode_e4m3(c); }
/// Thread t's accumulators of its op number i (all threads' A fragments of op i are read).
inline void wgmma_compute(WarpGroup& wg, unsigned t, uint64_t i) {
  WgmmaOp& op = wg.th[t].ops[i % WarpGroup::kRing];
  Sm90Cta& s = s90();
  // every thread compares its op with thread 0's: all 128 issued the same MMA
  const WgmmaOp& o0 = wg.th[0].ops[i % WarpGroup::kRing];
  if (wg.th[0].issued.load(std::memory_order_relaxed) <= i || o0.desc != op.desc || o0.n != op.n ||
      o0.type != op.type || o0.scale_d != op.scale_d)
    fail("wgmma: the threads of the warpgroup issued different MMAs (shape, types, scale-d or B descriptor)");
  wgmma_check_desc(op.desc);
  const unsigned warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  const bool fp8 = op.type != WgmmaType::kBf16;
  const uint32_t eb = fp8 ? 1u : 2u;
  // B element (k, c) of this MMA: its shared address, with the proxy check of its bytes
  auto Baddr = [&](unsigned k, unsigned c) {
    const uint32_t a = wgmma_b_addr(op.desc, int(c), int(k), eb);
    check_window(a, eb, "wgmma B operand");
    const uint64_t sh = s.shadow[a / 16].load(std::memory_order_relaxed);
    if (sh >> 63) {
      const unsigned w = unsigned(sh >> 32) & 0xFFFFu;
      if (s.fences[w].load() <= uint32_t(sh))
        fail("wgmma reads shared memory written by a cp.async of thread " + std::to_string(w) +
             " without a fence.proxy.async by that thread after the copy landed");
    }
    return a;
  };
  if (!fp8) {
    auto Bval = [&](unsigned k, unsigned c) {
      uint16_t h;
      std::memcpy(&h, cta->window + Baddr(k, c), 2);
      return lowbit::decode_bf16(h);
    };
    // A rows g and g + 8 of this warp: A[r][k] is held by lane 4 (r % 8) + (k % 8) / 2 of warp r / 16,
    // register (r % 16) / 8 + 2 (k / 8), half k % 2
    float A[2][16];
    for (unsigned hr = 0; hr < 2; ++hr)
      for (unsigned k = 0; k < 16; ++k) {
        const unsigned th = 32 * warp + 4 * g + (k % 8) / 2, reg = hr + 2 * (k / 8);
        A[hr][k] = lowbit::decode_bf16(uint16_t(wg.th[th].ops[i % WarpGroup::kRing].a[reg] >> (16 * (k % 2))));
      }
    // D register j: D[16 warp + g + 8 ((j >> 1) & 1)][8 (j >> 2) + 2q + (j & 1)]
    float B[16][2];
    for (unsigned j = 0; j < op.n; ++j) {
      const unsigned hr = (j >> 1) & 1, c = 8 * (j >> 2) + 2 * q + (j & 1);
      if ((j & 3) == 0)  // a new column pair: B[k][c], B[k][c + 1]
        for (unsigned k = 0; k < 16; ++k) {
          B[k][0] = Bval(k, c);
          B[k][1] = Bval(k, c + 1);
        }
      float acc = op.d[j];
      for (unsigned k = 0; k < 16; ++k) acc += A[hr][k] * B[k][j & 1];
      op.d[j] = acc;
    }
    op.done = true;
    return;
  }
  // 8-bit forms (k32). A rows g and g + 8 of this warp: A[r][k] is byte k % 4 of register
  // (r % 16) / 8 + 2 (k / 16) of lane 4 (r % 8) + (k % 16) / 4 of warp r / 16
  const bool a5 = op.type == WgmmaType::kE5M2E4M3 || op.type == WgmmaType::kE5M2E5M2;
  const bool b5 = op.type == WgmmaType::kE4M3E5M2 || op.type == WgmmaType::kE5M2E5M2;
  uint8_t A[2][32];
  for (unsigned hr = 0; hr < 2; ++hr)
    for (unsigned k = 0; k < 32; ++k) {
      const unsigned th = 32 * warp + 4 * g + (k % 16) / 4, reg = hr + 2 * (k / 16);
      A[hr][k] = uint8_t(wg.th[th].ops[i % WarpGroup::kRing].a[reg] >> (8 * (k % 4)));
    }
  // the products of codes a * 2^ea and b * 2^eb, summed exactly as integers in units of
  // 2^-(ea + eb) (at most 2^63.6 in all: 128 bits), rounded once to fp32
  const int shift = (a5 ? 16 : 9) + (b5 ? 16 : 9);
  uint8_t B[32][2];
  for (unsigned j = 0; j < op.n; ++j) {
    const unsigned hr = (j >> 1) & 1, c = 8 * (j >> 2) + 2 * q + (j & 1);
    if ((j & 3) == 0)  // a new column pair: B[k][c], B[k][c + 1]
      for (unsigned k = 0; k < 32; ++k) {
        B[k][0] = cta->window[Baddr(k, c)];
        B[k][1] = cta->window[Baddr(k, c + 1)];
      }
    __int128 sum = 0;
    bool special = false;
    for (unsigned k = 0; k < 32; ++k) {
      int64_t x, y;
      if (!fp8_units(A[hr][k], a5, &x) || !fp8_units(B[k][j & 1], b5, &y)) {
        special = true;
        break;
      }
      sum += __int128(x) * y;
    }
    double v;
    if (special) {  // a NaN or Inf operand: IEEE arithmetic (every finite part is exact in fp64)
      v = 0.0;
      for (unsigned k = 0; k < 32; ++k) v += double(fp8_value(A[hr][k], a5)) * double(fp8_value(B[k][j & 1], b5));
      if (op.scale_d) v += double(op.d[j]);
      op.d[j] = float(v);
    } else if (!op.scale_d || op.d[j] == 0.0f) {
      op.d[j] = std::ldexp(static_cast<float>(sum), -shift);  // one rounding (the scaling is exact)
    } else {
      op.d[j] = float(std::ldexp(static_cast<double>(sum), -shift) + double(op.d[j]));
    }
  }
  op.done = true;
}
inline void wgmma_fence() {
  unsigned t;
  WarpGroup& wg = my_wg(&t, "wgmma.fence");
  wg.th[t].fenced = true;
}
inline void wgmma_issue(const uint32_t (&a)[4], uint64_t desc, float* d, unsigned n,
                        WgmmaType type = WgmmaType::kBf16, bool scale_d = true) {
  unsigned t;
  WarpGroup& wg = my_wg(&t, "wgmma.mma_async");
  WarpGroup::Thread& me = wg.th[t];
  if (!me.fenced) fail("wgmma.mma_async without a wgmma.fence (warpgroup_arrive) since the last commit");
  if (me.issued - me.retired >= WarpGroup::kRing / 2) fail("more wgmma operations in flight than the emulation holds");
  WgmmaOp& op = me.ops[me.issued % WarpGroup::kRing];
  std::memcpy(op.a, a, sizeof op.a);
  op.desc = desc;
  op.d = d;
  op.n = n;
  op.type = type;
  op.scale_d = scale_d;
  op.done = false;
  const uint64_t i = me.issued.load(std::memory_order_relaxed);
  me.issued.store(i + 1, std::memory_order_relaxed);
  if (wgmma_mode == WgmmaMode::kAtIssue) {
    wg.bar->arrive_and_wait();  // the 128 threads' op i is in place
    wgmma_compute(wg, t, i);
  }
}
inline void wgmma_commit() {
  unsigned t;
  WarpGroup& wg = my_wg(&t, "wgmma.commit_group");
  WarpGroup::Thread& me = wg.th[t];
  if (me.commits - me.waited >= WarpGroup::kRing) fail("more wgmma groups in flight than the emulation holds");
  me.ends[me.commits++ % WarpGroup::kRing] = me.issued;
  me.fenced = false;
}
inline void wgmma_wait(int n) {
  unsigned t;
  WarpGroup& wg = my_wg(&t, "wgmma.wait_group");
  WarpGroup::Thread& me = wg.th[t];
  // the groups this wait retires: all but the newest n committed ones
  uint64_t r = me.retired;
  if (me.commits > me.waited + uint64_t(n)) {
    r = me.ends[(me.commits - uint64_t(n) - 1) % WarpGroup::kRing];
    me.waited = me.commits - uint64_t(n);
  }
  const uint64_t w = me.waits++;
  me.wait_r[w % WarpGroup::kRing] = r;
  wg.bar->arrive_and_wait();  // every thread's ops and retire count of this wait are in place
  if (wg.th[0].wait_r[w % WarpGroup::kRing] != r)
    fail("wgmma.wait_group: the threads of the warpgroup committed different groups");
  for (uint64_t i = me.retired; i < r; ++i)
    if (!me.ops[i % WarpGroup::kRing].done) wgmma_compute(wg, t, i);
  me.retired = r;
}

}  // namespace emu
