// tests/cpp/attn_fp8_layout.cu: host checks of the FP8 tensor-core attention path's layouts and
// element arithmetic (src/cuda/attention/mxfp8_attn_fp8_*.cuh), compiled by nvcc and run on the
// CPU (ctest label cpu; no GPU needed):
//   1. P fragment <-> S accumulator <-> V'^T token order, against CuTe's 8-bit A layout
//      (ALayout_64x32) and fp32 accumulator layout (CLayout_64xN) of sm90 wgmma;
//   2. the swizzled K-major byte offsets against CuTe's Swizzle<3,4,3> / <2,4,3> atoms;
//   3. the E4M3 re-rounding chain (E4M3 -> f16 -> x 2^-k -> E4M3) against exact nearest-even
//      rounding, for every code and shift, NaN codes and NaN scales;
//   4. one key tile of the producer per head dimension: every K chunk and every V transpose unit
//      as the kernel indexes them, the K' and V'^T images checked element by element (token order,
//      scale factors; keys past the sequence: raw V rows zeroed as the kernel's last tile does, V'^T
//      zeros there, K' unchecked there since their scores are masked), and the shared-memory bank
//      wavefronts of the transpose's reads and writes.
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "cuda/attention/mxfp8_attn_fp8_prep.cuh"
#include "lowbit/codecs.hpp"

namespace fp8 = lowbit::cuda::attention::fp8;

static int g_fail = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      if (g_fail < 20) std::printf(__VA_ARGS__);  \
      ++g_fail;                                   \
    }                                             \
  } while (0)

/// Nearest-even E4M3 value of x (|x| <= 448), exactly.
static double round_e4m3(double x) {
  if (std::isnan(x) || x == 0) return x;
  int e = 0;
  (void)std::frexp(x, &e);
  const double q = std::ldexp(1.0, std::max(e, -5) - 4);
  return std::nearbyint(x / q) * q;
}
static double e4m3(uint8_t c) { return double(lowbit::decode_e4m3(c)); }
static bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

template <int kN>
static void check_fragments() {
  using namespace cute;
  auto A = SM90::GMMA::ALayout_64x32{};
  auto C = SM90::GMMA::CLayout_64xN<kN>{};
  for (int thr = 0; thr < 128; ++thr) {
    std::vector<int> cidx(64 * kN, -1);  // (m, n) -> accumulator index of this thread
    for (int v = 0; v < kN / 2; ++v) {
      const int mn = C(thr, v);
      cidx[(mn % 64) * kN + mn / 64] = v;
    }
    for (int kc = 0; kc < kN / 32; ++kc)
      for (int v = 0; v < 16; ++v) {
        const int mk = A(thr, v), m = mk % 64, k = mk / 64;
        const int key = kc * 32 + fp8::v_key_of_k(k);
        const int want = 16 * kc + fp8::p_frag_src(v / 4, v % 4);
        CHECK(cidx[m * kN + key] == want, "fragment N%d: thread %d chunk %d value %d: (m %d, key %d) is S[%d], packed S[%d]\n",
              kN, thr, kc, v, m, key, cidx[m * kN + key], want);
      }
  }
}

static void check_swizzle() {
  auto sw128 = cute::Swizzle<3, 4, 3>{};
  auto sw64 = cute::Swizzle<2, 4, 3>{};
  for (int rows : {64, 128})
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 256; ++c) {
        const int base = (c / 128) * rows * 128;  // atoms along the row
        CHECK(int(fp8::sw_offset<128>(rows, r, c)) == base + int(sw128(r * 128 + c % 128)), "sw128 r %d c %d\n", r, c);
      }
      for (int c = 0; c < 128; ++c) {
        const int base = (c / 64) * rows * 64;
        CHECK(int(fp8::sw_offset<64>(rows, r, c)) == base + int(sw64(r * 64 + c % 64)), "sw64 r %d c %d\n", r, c);
      }
    }
}

static void check_rescale() {
  for (int code = 0; code < 256; ++code)
    for (int k = 0; k <= 40; ++k) {
      const uint32_t f = fp8::f16_factor(127 - k, 127) * 0x10001u;
      const uint32_t w = uint32_t(code) * 0x01010101u;
      const uint32_t r = fp8::rescale_e4m3x4(w, f);
      const double want = round_e4m3(e4m3(uint8_t(code)) * std::ldexp(1.0, -k));
      for (int i = 0; i < 4; ++i) {
        const double got = e4m3(uint8_t(r >> (8 * i)));
        CHECK(same(got, want) && (std::isnan(want) || std::signbit(got) == std::signbit(want)), "rescale code 0x%02x k %d: got %g want %g\n",
              code, k, got, want);
      }
    }
  // a NaN scale byte makes every element NaN (zeros included)
  const uint32_t r = fp8::rescale_e4m3x4(0x00403800u, fp8::f16_factor(255, 127) * 0x10001u);
  for (int i = 0; i < 4; ++i) CHECK(std::isnan(e4m3(uint8_t(r >> (8 * i)))), "NaN scale byte %d\n", i);
}

/// Wavefronts of one warp-wide shared-memory access: addresses of `bytes` each (4, 8 or 16).
static int wavefronts(const std::vector<uint32_t>& addr, int bytes) {
  // 128 bytes per wavefront; lanes touching the same 4-byte word share it
  std::vector<std::set<uint32_t>> bank(32);
  for (uint32_t a : addr)
    for (int w = 0; w < bytes / 4; ++w) bank[((a / 4) + w) % 32].insert(a / 4 + w);
  size_t m = 0;
  for (auto& s : bank) m = std::max(m, s.size());
  return int(m);
}

template <int kD>
static void check_producer_tile(std::mt19937& rng) {
  using T = fp8::Traits<kD>;
  constexpr int kN = T::kBlockN, kVC = T::kVC, kCPR = kD / 16;
  const int len = kN - 5;  // the last 5 keys are past the sequence
  std::vector<uint8_t> k(kN * kD), v(kN * kD), rawk(kN * kD), rawv(kN * kD), kp(kN * kD, 0xEE), vt(kN * kD, 0xEE);
  std::vector<int> ks(kN * T::kBlocks), vs(kN * T::kBlocks), ak(T::kBlocks, -1), av(T::kBlocks, -1);
  std::uniform_int_distribution<int> byte(0, 255), sc(100, 127);
  for (auto& x : k) x = uint8_t(byte(rng));
  for (auto& x : v) x = uint8_t(byte(rng));
  for (auto& x : ks) x = sc(rng);
  for (auto& x : vs) x = sc(rng);
  for (int c = 0; c < kD; ++c) v[(kN - 1) * kD + c] = 0x7F;  // NaN codes past the sequence
  ks[3 * T::kBlocks + 1] = 255;  // NaN scales
  vs[7 * T::kBlocks] = 255;
  for (int t = 0; t < len; ++t)
    for (int b = 0; b < T::kBlocks; ++b) {
      if (ks[t * T::kBlocks + b] != 255) ak[b] = std::max(ak[b], ks[t * T::kBlocks + b]);
      if (vs[t * T::kBlocks + b] != 255) av[b] = std::max(av[b], vs[t * T::kBlocks + b]);
    }
  // the TMA image: token t, byte c at sw_offset<kWQK>(kN, t, c)
  for (int t = 0; t < kN; ++t)
    for (int c = 0; c < kD; ++c) {
      rawk[fp8::sw_offset<T::kWQK>(kN, t, c)] = k[t * kD + c];
      rawv[fp8::sw_offset<T::kWQK>(kN, t, c)] = v[t * kD + c];
    }
  auto factor = [&](const std::vector<int>& s, const std::vector<int>& ref, int t, int b) {
    return t < len ? fp8::f16_factor(s[t * T::kBlocks + b], ref[b]) : fp8::f16_factor(0, ref[b]);
  };
  // K' as the pre-pass writes it (attn_fp8_prep_kv_kernel): row-major 16-byte chunks c = tid +
  // 128 i, zeros past the sequence (TMA later lays it out as sw_offset<kWQK>, the consumers' layout)
  std::vector<int> kseen(kN * kCPR, 0);
  for (int tid = 0; tid < 128; ++tid)
    for (int c = tid; c < kN * kCPR; c += 128) {
      const int tok = c / kCPR, c16 = c % kCPR;
      ++kseen[tok * kCPR + c16];
      const uint32_t f = factor(ks, ak, tok, c16 / 2) * 0x10001u;
      for (int wd = 0; wd < 4; ++wd) {
        uint32_t w = 0;
        if (tok < len) {
          std::memcpy(&w, &k[tok * kD + c16 * 16 + 4 * wd], 4);
          w = fp8::rescale_e4m3x4(w, f);
        }
        std::memcpy(&kp[tok * kD + c16 * 16 + 4 * wd], &w, 4);
      }
    }
  for (int x : kseen) CHECK(x == 1, "d%d: a K chunk converted %d times\n", kD, x);
  for (int t = 0; t < kN; ++t)
    for (int c = 0; c < kD; ++c) {
      const double got = e4m3(kp[t * kD + c]);
      const int s = t < len ? ks[t * T::kBlocks + c / 32] : 0;
      const double want = t >= len ? 0.0 : s == 255 ? NAN : round_e4m3(e4m3(k[t * kD + c]) * std::ldexp(1.0, s - ak[c / 32]));
      CHECK(same(got, want), "d%d K'[%d, %d] = %g, want %g\n", kD, t, c, got, want);
    }
  // V transpose units over the raw V rows staged in shared memory (sw_offset<kWQK>, rows past the
  // sequence zeros); their output V'^T goes to global memory, where row c, byte k lands (by TMA)
  // at sw_offset<kWV>(kD, c, k) of the consumers' stage: checked through vu.wr
  for (int t = len; t < kN; ++t)
    for (int c = 0; c < kD; ++c) rawv[fp8::sw_offset<T::kWQK>(kN, t, c)] = 0;
  std::vector<int> vseen(kN * kD, 0);
  std::vector<std::vector<uint32_t>> rd(4 * 8);  // per (warp, access)
  for (int tid = 0; tid < 128; ++tid) {
    const fp8::VUnit<T> vu(tid);
    const int warp = tid / 32, vblk = vu.cg * kVC / 32;
    uint32_t raw[8][kVC / 4], fp[4];
    for (int e = 0; e < 8; ++e) {
      const int tok = fp8::unit_token(vu.kc, e);
      CHECK(tok == fp8::v_key_of_k(8 * vu.kc + e), "unit token order\n");
      CHECK(vu.rd(e) == fp8::sw_offset<T::kWQK>(kN, tok, vu.cg * kVC), "d%d tid %d slot %d: read offset\n", kD, tid, e);
      rd[warp * 8 + e].push_back(vu.rd(e));
      std::memcpy(raw[e], &rawv[vu.rd(e)], kVC);
      for (int j = 0; j < kVC; ++j) ++vseen[tok * kD + vu.cg * kVC + j];
    }
    for (int E = 0; E < 4; ++E)
      fp[E] = factor(vs, av, fp8::unit_token(vu.kc, 2 * E), vblk) |
              (factor(vs, av, fp8::unit_token(vu.kc, 2 * E + 1), vblk) << 16);
    for (int q = 0; q < kVC / 4; ++q) {
      uint32_t out[4][2];
      fp8::transpose_group<kVC / 4>(raw, q, fp, out);
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * q + i;
        CHECK(vu.wr(j) == fp8::sw_offset<T::kWV>(kD, vu.cg * kVC + j, 8 * vu.kc), "d%d tid %d: write offset\n", kD, tid);
        std::memcpy(&vt[vu.wr(j)], out[i], 8);
      }
    }
  }
  for (int x : vseen) CHECK(x == 1, "d%d: a V element transposed %d times\n", kD, x);
  for (int c = 0; c < kD; ++c)
    for (int kk = 0; kk < kN; ++kk) {
      const int t = fp8::v_key_of_k(kk);
      const double got = e4m3(vt[fp8::sw_offset<T::kWV>(kD, c, kk)]);
      const int s = vs[t * T::kBlocks + c / 32];
      const double want = t >= len ? 0.0 : s == 255 ? NAN : round_e4m3(e4m3(v[t * kD + c]) * std::ldexp(1.0, s - av[c / 32]));
      CHECK(same(got, want), "d%d V'^T[%d, k %d] (token %d) = %g, want %g\n", kD, c, kk, t, got, want);
    }
  // bank wavefronts of the transpose's shared-memory reads (the minimum: 32 lanes x bytes / 128)
  int rd_max = 0;
  for (auto& a : rd) rd_max = std::max(rd_max, wavefronts(a, kVC));
  std::printf("d%d: V transpose: raw reads %d wavefronts (minimum %d)\n", kD, rd_max, 32 * kVC / 128);
  CHECK(rd_max <= 2 * (32 * kVC / 128), "d%d: bank conflicts beyond 2x\n", kD);
}

/// The pre-pass's workspace rows (prep_token_offset, prep_width): for ragged batches (fixed length
/// and varlen, empty sequences too) every sequence's rows up to its zero-padded last tile lie
/// inside [0, W), start 16-byte aligned and overlap no other sequence's.
static void check_prep_rows(std::mt19937& rng) {
  for (int block_n : {64, 128})
    for (int trial = 0; trial < 200; ++trial) {
      const int batch = 1 + int(rng() % 9);
      const bool varlen = trial % 2;
      std::vector<int64_t> len(batch), start(batch + 1, 0);
      const int64_t fixed = 1 + int64_t(rng() % 700);
      for (int b = 0; b < batch; ++b) {
        len[b] = varlen ? int64_t(rng() % 4 == 0 ? 0 : rng() % 700) : fixed;
        start[b + 1] = start[b] + len[b];
      }
      const int64_t W = fp8::prep_width(start[batch], batch, block_n);
      CHECK(W % 16 == 0, "W %% 16\n");
      int64_t prev_end = 0;
      for (int b = 0; b < batch; ++b) {
        const int64_t row0 = fp8::prep_token_offset(start[b], b, block_n);
        const int64_t end = row0 + (len[b] + block_n - 1) / block_n * block_n;  // the zero-padded last tile
        CHECK(row0 % 16 == 0, "block_n %d b %d: row0 %lld not 16-aligned\n", block_n, b, (long long)row0);
        CHECK(row0 >= prev_end, "block_n %d b %d: rows overlap the previous sequence\n", block_n, b);
        CHECK(end <= W, "block_n %d b %d: rows past W\n", block_n, b);
        prev_end = end;
      }
    }
}

int main() {
  check_fragments<128>();
  check_fragments<64>();
  check_swizzle();
  check_rescale();
  std::mt19937 rng(7);
  check_producer_tile<64>(rng);
  check_producer_tile<128>(rng);
  check_producer_tile<256>(rng);
  check_prep_rows(rng);
  if (g_fail) {
    std::printf("attn fp8 layout: %d failures\n", g_fail);
    return 1;
  }
  std::printf("attn fp8 layout: ok\n");
  return 0;
}
