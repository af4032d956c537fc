// Nibble packing and scale-factor layouts (include/lowbit/scale_layout.hpp): the blocked
// layouts against an independent transcription of torchao's to_blocked, bijectivity and
// inversion of every layout, the GPU MODE 6-D view, per-group (MoE) padding rules and
// convert_scale_layout round trips.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "lowbit/block_quant.hpp"
#include "lowbit/error.hpp"
#include "lowbit/ops.hpp"
#include "lowbit/scale_layout.hpp"
#include "ref_formats.hpp"

using namespace lowbit;

namespace {

int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// torchao to_blocked, written as the sequence of tensor ops on explicit index arithmetic:
//   padded P [Rp, Cp] -> view(nrb,128,ncb,4) -> permute(0,2,1,3) -> reshape(-1,4,32,4)
//   -> transpose(1,2) -> reshape(-1,32,16) -> flatten.
// Returns, for every output position, the row-major index r*C+c of the logical element it
// holds, or -1 for padding.
std::vector<int64_t> to_blocked_ref(int64_t R, int64_t C) {
  const int64_t Rp = rup(R, 128), Cp = rup(C, 4), nrb = Rp / 128, ncb = Cp / 4;
  std::vector<int64_t> P(size_t(Rp * Cp), -1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) P[size_t(r * Cp + c)] = r * C + c;
  // A = P.view(nrb,128,ncb,4).permute(0,2,1,3).contiguous(): A[i][j][r][c]
  std::vector<int64_t> A(P.size());
  for (int64_t i = 0; i < nrb; ++i)
    for (int64_t j = 0; j < ncb; ++j)
      for (int64_t r = 0; r < 128; ++r)
        for (int64_t c = 0; c < 4; ++c)
          A[size_t(((i * ncb + j) * 128 + r) * 4 + c)] = P[size_t((i * 128 + r) * Cp + j * 4 + c)];
  // B = A.reshape(-1,4,32,4): same memory, B[b][a][t][c] with r = a*32 + t
  // T = B.transpose(1,2).contiguous(): T[b][t][a][c]
  std::vector<int64_t> T(A.size());
  const int64_t nb = nrb * ncb;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t a = 0; a < 4; ++a)
      for (int64_t t = 0; t < 32; ++t)
        for (int64_t c = 0; c < 4; ++c)
          T[size_t(((b * 32 + t) * 4 + a) * 4 + c)] = A[size_t(((b * 4 + a) * 32 + t) * 4 + c)];
  return T;  // reshape(-1,32,16) and flatten keep the memory order
}

const ScaleLayout kAllLayouts[] = {ScaleLayout::row_major(),     ScaleLayout::col_major(1), ScaleLayout::col_major(4),
                                   ScaleLayout::col_major(16),   ScaleLayout::blocked128x4(), ScaleLayout::blocked8x4()};

TensorView u8(void* p, std::initializer_list<int64_t> d) { return TensorView(p, DType::kUInt8, d); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Nibble packing

TEST(Packing, TorchaoVectorLowFirst) {
  const float v[2][4] = {{0.0f, 0.5f, 4.0f, -0.0f}, {-0.0f, 1.0f, -6.0f, 3.0f}};
  const uint8_t want[2][2] = {{0x10, 0x86}, {0x28, 0x5F}};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 2; ++i) {
      const uint8_t b = pack_nibbles(NibbleOrder::kLowFirst, encode_e2m1(v[r][2 * i]), encode_e2m1(v[r][2 * i + 1]));
      EXPECT_EQ(b, want[r][i]) << r << "," << i;
      const uint8_t bh = pack_nibbles(NibbleOrder::kHighFirst, encode_e2m1(v[r][2 * i]), encode_e2m1(v[r][2 * i + 1]));
      EXPECT_EQ(bh, uint8_t((want[r][i] >> 4) | (want[r][i] << 4))) << "high-first swaps nibbles";
      EXPECT_EQ(unpack_nibble(NibbleOrder::kLowFirst, b, 0), encode_e2m1(v[r][2 * i]));
      EXPECT_EQ(unpack_nibble(NibbleOrder::kLowFirst, b, 1), encode_e2m1(v[r][2 * i + 1]));
      EXPECT_EQ(unpack_nibble(NibbleOrder::kHighFirst, bh, 0), encode_e2m1(v[r][2 * i]));
      EXPECT_EQ(unpack_nibble(NibbleOrder::kHighFirst, bh, 1), encode_e2m1(v[r][2 * i + 1]));
    }
}

// The same vector through the public API: an MXFP4 block whose amax is 6 has RCEIL scale 2^0
// (byte 127), so the codes are those of the values themselves.
TEST(Packing, TorchaoVectorThroughQuantize) {
  for (NibbleOrder order : {NibbleOrder::kLowFirst, NibbleOrder::kHighFirst}) {
    std::vector<float> x(2 * 32, 0.0f);
    const float v[2][4] = {{0.0f, 0.5f, 4.0f, -0.0f}, {-0.0f, 1.0f, -6.0f, 3.0f}};
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 4; ++i) x[size_t(r * 32 + i)] = v[r][i];
    x[31] = 6.0f;  // row 0 amax 6 too
    std::vector<uint8_t> q(2 * 16, 0xAA), s(2, 0xAA);
    BlockFormat f = BlockFormat::mxfp4();
    f.nibbles = order;
    quantize(TensorView(x.data(), DType::kFloat32, {2, 32}), f, ScaleLayout::row_major(),
             TensorView(q.data(), DType::kFloat4E2M1x2, {2, 16}), TensorView(s.data(), DType::kUE8M0, {2, 1}));
    EXPECT_EQ(s[0], 127);
    EXPECT_EQ(s[1], 127);
    const uint8_t want[2][2] = {{0x10, 0x86}, {0x28, 0x5F}};
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 2; ++i) {
        const uint8_t w = order == NibbleOrder::kLowFirst ? want[r][i] : uint8_t((want[r][i] >> 4) | (want[r][i] << 4));
        EXPECT_EQ(q[size_t(r * 16 + i)], w) << r << "," << i;
      }
    EXPECT_EQ(q[15], order == NibbleOrder::kLowFirst ? 0x70 : 0x07);  // elements 30 (0) and 31 (6)
  }
}

// ---------------------------------------------------------------------------------------------
// Offsets

TEST(ScaleLayout, Blocked128x4MatchesTorchaoToBlocked) {
  for (int64_t R : {1, 7, 128, 129, 300})
    for (int64_t C : {1, 3, 4, 5, 9}) {
      const std::vector<int64_t> ref = to_blocked_ref(R, C);
      const ScaleLayout l = ScaleLayout::blocked128x4();
      const int64_t Rp = scale_rows_padded(l, R);
      ASSERT_EQ(Rp, rup(R, 128));
      ASSERT_EQ(scale_size(l, R, C), int64_t(ref.size()));
      std::vector<int64_t> pos(size_t(R * C), -1);
      for (size_t p = 0; p < ref.size(); ++p)
        if (ref[p] >= 0) pos[size_t(ref[p])] = int64_t(p);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(scale_offset(l, Rp, C, r, c), pos[size_t(r * C + c)]) << "R=" << R << " C=" << C << " r=" << r << " c=" << c;
    }
}

TEST(ScaleLayout, Blocked8x4Formula) {
  for (int64_t R : {1, 7, 8, 9, 40})
    for (int64_t C : {1, 3, 4, 5, 9}) {
      const ScaleLayout l = ScaleLayout::blocked8x4();
      const int64_t Rp = rup(R, 8), Cp = rup(C, 4);
      ASSERT_EQ(scale_rows_padded(l, R), Rp);
      ASSERT_EQ(scale_size(l, R, C), Rp * Cp);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          // tiles of 8 rows x 4 cols, 32 bytes each, column tiles inner; inside: row-major 8x4
          const int64_t tile = (r / 8) * (Cp / 4) + c / 4;
          ASSERT_EQ(scale_offset(l, Rp, C, r, c), tile * 32 + (r % 8) * 4 + c % 4) << r << "," << c;
        }
    }
}

TEST(ScaleLayout, RowAndColumnMajor) {
  for (int align : {1, 4, 16}) {
    const ScaleLayout l = ScaleLayout::col_major(align);
    const int64_t R = 13, C = 3, Rp = rup(R, align);
    ASSERT_EQ(scale_rows_padded(l, R), Rp);
    ASSERT_EQ(scale_size(l, R, C), Rp * C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(scale_offset(l, Rp, C, r, c), c * Rp + r);
  }
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 7; ++c) ASSERT_EQ(scale_offset(ScaleLayout::row_major(), 5, 7, r, c), r * 7 + c);
}

// Every layout is a bijection between the padded R x C matrix and [0, size), and scale_coords
// inverts scale_offset.
TEST(ScaleLayout, BijectiveAndInvertible) {
  for (const ScaleLayout& l : kAllLayouts)
    for (int64_t R : {1, 7, 8, 128, 129, 300})
      for (int64_t C : {1, 3, 4, 5, 9}) {
        const int64_t Rp = scale_rows_padded(l, R), Cp = scale_cols_padded(l, C), n = scale_size(l, R, C);
        ASSERT_EQ(n, Rp * Cp);
        std::vector<int> hit(size_t(n), 0);
        // padded rows / cols are addressable too (the layout stores them as zeros)
        const int64_t cmax = (l.kind == ScaleLayoutKind::kRowMajor || l.kind == ScaleLayoutKind::kColMajor) ? C : Cp;
        for (int64_t r = 0; r < Rp; ++r)
          for (int64_t c = 0; c < cmax; ++c) {
            const int64_t o = scale_offset(l, Rp, C, r, c);
            ASSERT_GE(o, 0);
            ASSERT_LT(o, n);
            ++hit[size_t(o)];
            int64_t rr = -1, cc = -1;
            scale_coords(l, Rp, C, o, &rr, &cc);
            ASSERT_EQ(rr, r) << int(l.kind) << " R=" << R << " C=" << C;
            ASSERT_EQ(cc, c) << int(l.kind) << " R=" << R << " C=" << C;
          }
        for (int64_t o = 0; o < n; ++o) ASSERT_EQ(hit[size_t(o)], 1) << int(l.kind) << " offset " << o;
      }
}

// ---------------------------------------------------------------------------------------------
// GPU MODE 6-D view [32, 4, R/128, 4, Cp/4, L]: a permute(3,4,1,5,2,0) view of contiguous
// (L, R/128, Cp/4, 32, 4, 4) storage. Quantize writes through it; the storage must equal the
// plain [L, Rp, Cp] 128x4 tensor byte for byte, and match row-major scales element for element.
TEST(ScaleLayout, GpuMode6DViewThroughQuantize) {
  const int64_t L = 3, M = 130, K = 32 * 5, C = K / 32;
  const int64_t RB = rup(M, 128) / 128, CB = rup(C, 4) / 4;
  std::vector<float> x = reftest::randn(size_t(L * M * K), 7);
  std::vector<uint8_t> q1(size_t(L * M * K)), q2(q1.size()), q3(q1.size());
  std::vector<uint8_t> plain(size_t(L * RB * CB * 512), 0xCD), six(plain.size(), 0xEE), rm(size_t(L * M * C));
  const BlockFormat f = BlockFormat::mxfp8();
  const TensorView xv(x.data(), DType::kFloat32, {L, M, K});
  quantize(xv, f, ScaleLayout::blocked128x4(), TensorView(q1.data(), DType::kE4M3, {L, M, K}),
           TensorView(plain.data(), DType::kUE8M0, {L, RB * 128, CB * 4}));
  // storage (L, RB, CB, 32, 4, 4) strides:
  const int64_t sL = RB * CB * 512, sRB = CB * 512, sCB = 512, s32 = 16, s4a = 4, s4c = 1;
  const TensorView v6(six.data(), DType::kUE8M0, {32, 4, RB, 4, CB, L}, {s32, s4a, sRB, s4c, sCB, sL});
  ASSERT_FALSE(v6.is_contiguous());
  ASSERT_TRUE(v6.is_dense());
  quantize(xv, f, ScaleLayout::blocked128x4(), TensorView(q2.data(), DType::kE4M3, {L, M, K}), v6);
  EXPECT_EQ(plain, six);
  EXPECT_EQ(q1, q2);
  // The [M, C, L] reference view of row-major scales (GPU MODE's sf reference layout).
  quantize(xv, f, ScaleLayout::row_major(), TensorView(q3.data(), DType::kE4M3, {L, M, K}),
           TensorView(rm.data(), DType::kUE8M0, {M, C, L}, {C, 1, M * C}));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t rb = 0; rb < RB; ++rb)
      for (int64_t cb = 0; cb < CB; ++cb)
        for (int64_t t = 0; t < 32; ++t)
          for (int64_t a = 0; a < 4; ++a)
            for (int64_t c4 = 0; c4 < 4; ++c4) {
              // element [t, a, rb, c4, cb, l] of the 6-D view
              const uint8_t got = six[size_t(t * s32 + a * s4a + rb * sRB + c4 * s4c + cb * sCB + l * sL)];
              const int64_t r = rb * 128 + a * 32 + t, c = cb * 4 + c4;
              const uint8_t want = (r < M && c < C) ? rm[size_t((l * M + r) * C + c)] : 0;
              ASSERT_EQ(got, want) << "l=" << l << " r=" << r << " c=" << c;
            }
  // all real scales are nonzero here, so the comparison above is not vacuous
  for (uint8_t b : rm) ASSERT_NE(b, 0);
}

// ---------------------------------------------------------------------------------------------
// Grouped (MoE) padding

namespace {
std::vector<int64_t> fi_starts(const std::vector<int64_t>& ind) {  // FlashInfer test's rule
  std::vector<int64_t> s;
  for (size_t g = 0; g < ind.size(); ++g) s.push_back((ind[g] + int64_t(g) * 127) / 128 * 128);
  return s;
}
std::vector<int64_t> cumsum_starts(const std::vector<int64_t>& ind) {  // torchao's rule
  std::vector<int64_t> s{0};
  for (size_t g = 0; g + 1 < ind.size(); ++g) s.push_back(s.back() + (ind[g + 1] - ind[g] + 127) / 128 * 128);
  return s;
}
}  // namespace

TEST(GroupPad, Rules) {
  // sizes (127, 127): the two rules agree on the starts but not on the end
  {
    const std::vector<int64_t> ind = {0, 127, 254};
    EXPECT_EQ(fi_starts(ind), (std::vector<int64_t>{0, 128, 384}));
    EXPECT_EQ(cumsum_starts(ind), (std::vector<int64_t>{0, 128, 256}));
  }
  const std::vector<std::vector<int64_t>> cases = {
      {0, 127, 254}, {0, 0, 5, 5, 135}, {0, 128, 256}, {0, 1}, {0, 0}, {0, 300, 301, 301, 700}, {0, 129, 129, 258, 259}};
  for (const auto& ind : cases) {
    const int64_t G = int64_t(ind.size()) - 1, M = ind.back();
    std::vector<int32_t> ind32(ind.begin(), ind.end());
    const auto fi = fi_starts(ind), cs = cumsum_starts(ind);
    for (int64_t g = 0; g <= G; ++g) {
      EXPECT_EQ(group_padded_start(GroupPad::kFlashInfer, ind.data(), g), fi[size_t(g)]);
      EXPECT_EQ(group_padded_start(GroupPad::kFlashInfer, ind32.data(), g), fi[size_t(g)]);
      EXPECT_EQ(group_padded_start(GroupPad::kCumsum, ind.data(), g), cs[size_t(g)]);
      EXPECT_EQ(group_padded_start(GroupPad::kCumsum, ind32.data(), g), cs[size_t(g)]);
      EXPECT_EQ(group_padded_start(GroupPad::kNone, ind.data(), g), ind[size_t(g)]);
    }
    for (const auto* s : {&fi, &cs})
      for (int64_t g = 0; g < G; ++g) {
        const int64_t mg = ind[size_t(g + 1)] - ind[size_t(g)];
        EXPECT_EQ((*s)[size_t(g)] % 128, 0);
        EXPECT_LE((*s)[size_t(g)] + mg, (*s)[size_t(g + 1)]) << "groups overlap";  // no overlap
      }
    // the allocation that needs no look at m_indptr covers both rules
    EXPECT_EQ(grouped_rows_alloc(GroupPad::kFlashInfer, M, G), fi.back());
    EXPECT_GE(grouped_rows_alloc(GroupPad::kCumsum, M, G), cs.back());
    // group_of_row
    for (int64_t r = 0; r < M; ++r) {
      const int64_t g = group_of_row(ind.data(), G, r);
      EXPECT_TRUE(ind[size_t(g)] <= r && r < ind[size_t(g + 1)]) << r;
    }
  }
}

TEST(GroupPad, QuantizeWritesEachGroupAtItsPaddedStart) {
  const std::vector<int64_t> ind = {0, 0, 127, 254, 254, 390};  // empty groups, (127,127), 136
  const int64_t G = int64_t(ind.size()) - 1, M = ind.back(), K = 64, C = 2, Cp = 4;
  std::vector<float> x = reftest::randn(size_t(M * K), 11);
  std::vector<uint8_t> qr(size_t(M * K)), rm(size_t(M * C));
  const BlockFormat f = BlockFormat::mxfp8();
  quantize(TensorView(x.data(), DType::kFloat32, {M, K}), f, ScaleLayout::row_major(),
           TensorView(qr.data(), DType::kE4M3, {M, K}), TensorView(rm.data(), DType::kUE8M0, {M, C}));
  for (GroupPad p : {GroupPad::kFlashInfer, GroupPad::kCumsum})
    for (bool i64 : {false, true}) {
      std::vector<int32_t> ind32(ind.begin(), ind.end());
      const TensorView indv = i64 ? TensorView(const_cast<int64_t*>(ind.data()), DType::kInt64, {G + 1})
                                  : TensorView(ind32.data(), DType::kInt32, {G + 1});
      const std::vector<int64_t> shp = scale_shape(f, ScaleLayout::blocked128x4(p), 1, M, K, G);
      ASSERT_EQ(shp.size(), 3u);
      ASSERT_EQ(shp[1], grouped_rows_alloc(p, M, G));
      ASSERT_EQ(shp[2], Cp);
      std::vector<uint8_t> sg(size_t(shp[1] * shp[2]), 0xEE), q(size_t(M * K));
      QuantArgs a;
      a.m_indptr = indv;
      quantize(TensorView(x.data(), DType::kFloat32, {M, K}), f, ScaleLayout::blocked128x4(p),
               TensorView(q.data(), DType::kE4M3, {M, K}), TensorView(sg.data(), DType::kUE8M0, {shp[1], shp[2]}), a);
      EXPECT_EQ(q, qr);
      const auto starts = p == GroupPad::kFlashInfer ? fi_starts(ind) : cumsum_starts(ind);
      std::vector<int> used(sg.size(), 0);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t r = ind[size_t(g)]; r < ind[size_t(g + 1)]; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t sr = starts[size_t(g)] + (r - ind[size_t(g)]);
            // 128x4 tile arithmetic on the stored row
            const int64_t off = ((sr / 128) * (Cp / 4) + c / 4) * 512 + (sr % 32) * 16 + ((sr % 128) / 32) * 4 + c % 4;
            ASSERT_EQ(sg[size_t(off)], rm[size_t(r * C + c)]) << "g=" << g << " r=" << r;
            used[size_t(off)] = 1;
          }
      for (size_t o = 0; o < sg.size(); ++o)
        if (!used[o]) ASSERT_EQ(sg[o], 0) << "padding must be zero at " << o;
      // and dequantize reads the same places back
      std::vector<float> y1(size_t(M * K)), y2(size_t(M * K));
      dequantize(TensorView(q.data(), DType::kE4M3, {M, K}), TensorView(sg.data(), DType::kUE8M0, {shp[1], shp[2]}), f,
                 ScaleLayout::blocked128x4(p), TensorView(y1.data(), DType::kFloat32, {M, K}), a);
      dequantize(TensorView(qr.data(), DType::kE4M3, {M, K}), TensorView(rm.data(), DType::kUE8M0, {M, C}), f,
                 ScaleLayout::row_major(), TensorView(y2.data(), DType::kFloat32, {M, K}));
      EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
    }
}

// ---------------------------------------------------------------------------------------------
// convert_scale_layout round trips, bit exact, with zero padding.

namespace {
// Places a row-major [L, R, C] matrix into `l` using independent formulas (zeros elsewhere).
template <typename T>
std::vector<T> place(const std::vector<T>& rm, int64_t L, int64_t R, int64_t C, const ScaleLayout& l) {
  const int64_t Rp = l.kind == ScaleLayoutKind::kRowMajor ? R
                     : l.kind == ScaleLayoutKind::kColMajor ? rup(R, l.row_align)
                     : l.kind == ScaleLayoutKind::kBlocked128x4 ? rup(R, 128) : rup(R, 8);
  const int64_t Cp = (l.kind == ScaleLayoutKind::kBlocked128x4 || l.kind == ScaleLayoutKind::kBlocked8x4) ? rup(C, 4) : C;
  std::vector<T> out(size_t(L * Rp * Cp), T(0));
  std::vector<int64_t> blk;
  if (l.kind == ScaleLayoutKind::kBlocked128x4) {
    const auto ref = to_blocked_ref(R, C);
    blk.assign(size_t(R * C), 0);
    for (size_t p = 0; p < ref.size(); ++p)
      if (ref[p] >= 0) blk[size_t(ref[p])] = int64_t(p);
  }
  for (int64_t b = 0; b < L; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        int64_t o = 0;
        switch (l.kind) {
          case ScaleLayoutKind::kRowMajor: o = r * C + c; break;
          case ScaleLayoutKind::kColMajor: o = c * Rp + r; break;
          case ScaleLayoutKind::kBlocked128x4: o = blk[size_t(r * C + c)]; break;
          case ScaleLayoutKind::kBlocked8x4: o = (r / 8 * (Cp / 4) + c / 4) * 32 + (r % 8) * 4 + c % 4; break;
        }
        out[size_t(b * Rp * Cp + o)] = rm[size_t((b * R + r) * C + c)];
      }
  return out;
}

template <typename T>
void round_trip(DType dt, int64_t L, int64_t R, int64_t C) {
  std::vector<T> rm(size_t(L * R * C));
  std::mt19937 g(uint32_t(R * 31 + C));
  for (auto& v : rm) {
    const uint32_t bits = g() | 1u;  // never zero, so padding is distinguishable
    if constexpr (sizeof(T) == 1) v = T(1 + bits % 255);
    else std::memcpy(&v, &bits, sizeof(T));
  }
  const ScaleLayout chain[] = {ScaleLayout::row_major(), ScaleLayout::col_major(4), ScaleLayout::blocked128x4(),
                               ScaleLayout::blocked8x4(), ScaleLayout::col_major(16), ScaleLayout::row_major()};
  std::vector<T> cur = rm;
  for (size_t i = 0; i + 1 < sizeof(chain) / sizeof(chain[0]); ++i) {
    const std::vector<T> want = place(rm, L, R, C, chain[i + 1]);
    std::vector<T> out(want.size());
    std::memset(out.data(), 0x5A, out.size() * sizeof(T));
    convert_scale_layout(TensorView(cur.data(), dt, {int64_t(cur.size())}), chain[i],
                         TensorView(out.data(), dt, {int64_t(out.size())}), chain[i + 1], R, C);
    ASSERT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(T))) << "step " << i << " R=" << R << " C=" << C;
    cur = out;
  }
  EXPECT_EQ(cur, rm);
}
}  // namespace

TEST(ConvertScaleLayout, RoundTripsBytes) {
  for (int64_t R : {1, 7, 129, 300})
    for (int64_t C : {1, 3, 5, 9}) round_trip<uint8_t>(DType::kUE8M0, 2, R, C);
}
TEST(ConvertScaleLayout, RoundTripsFloat32) {
  for (int64_t R : {7, 129})
    for (int64_t C : {3, 5}) round_trip<uint32_t>(DType::kFloat32, 3, R, C);
}

TEST(ConvertScaleLayout, GroupedRoundTrip) {
  const std::vector<int32_t> ind = {0, 127, 254, 254, 300};
  const int64_t G = 4, R = 300, C = 5, Cp = 8;
  std::vector<uint8_t> rm(size_t(R * C));
  for (size_t i = 0; i < rm.size(); ++i) rm[i] = uint8_t(1 + i % 251);
  for (GroupPad p : {GroupPad::kFlashInfer, GroupPad::kCumsum}) {
    const int64_t rows = grouped_rows_alloc(p, R, G);
    std::vector<uint8_t> grouped(size_t(rows * Cp), 0x77), back(rm.size(), 0x77), blocked(size_t(rup(R, 128) * Cp));
    const TensorView indv(const_cast<int32_t*>(ind.data()), DType::kInt32, {G + 1});
    convert_scale_layout(u8(rm.data(), {R, C}), ScaleLayout::row_major(), u8(grouped.data(), {rows, Cp}),
                         ScaleLayout::blocked128x4(p), R, C, indv);
    std::vector<int64_t> ind64(ind.begin(), ind.end());
    const auto starts = p == GroupPad::kFlashInfer ? fi_starts(ind64) : cumsum_starts(ind64);
    std::vector<int> used(grouped.size(), 0);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = ind[size_t(g)]; r < ind[size_t(g + 1)]; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t sr = starts[size_t(g)] + r - ind[size_t(g)];
          const int64_t off = ((sr / 128) * (Cp / 4) + c / 4) * 512 + (sr % 32) * 16 + ((sr % 128) / 32) * 4 + c % 4;
          ASSERT_EQ(grouped[size_t(off)], rm[size_t(r * C + c)]);
          used[size_t(off)] = 1;
        }
    for (size_t o = 0; o < grouped.size(); ++o)
      if (!used[o]) ASSERT_EQ(grouped[o], 0) << o;
    // grouped -> plain 128x4 -> row-major
    convert_scale_layout(u8(grouped.data(), {rows, Cp}), ScaleLayout::blocked128x4(p), u8(blocked.data(), {int64_t(blocked.size())}),
                         ScaleLayout::blocked128x4(), R, C, indv);
    EXPECT_EQ(blocked, place(rm, 1, R, C, ScaleLayout::blocked128x4()));
    convert_scale_layout(u8(blocked.data(), {int64_t(blocked.size())}), ScaleLayout::blocked128x4(), u8(back.data(), {R, C}),
                         ScaleLayout::row_major(), R, C);
    EXPECT_EQ(back, rm);
  }
}

// Grouped -> grouped: FlashInfer padding to cumsum padding and back, bit-exact, padding zero.
TEST(LayoutsGrouped, FlashInferToCumsumRoundTrip) {
  using namespace lowbit;
  const std::vector<int32_t> ind = {0, 127, 254, 254, 300};
  const int64_t M = 300, C = 3, G = 4;
  std::vector<uint8_t> rm(static_cast<size_t>(M * C));
  for (size_t i = 0; i < rm.size(); ++i) rm[i] = uint8_t(1 + i % 251);
  const TensorView iv(const_cast<int32_t*>(ind.data()), DType::kInt32, {G + 1});
  const int64_t Cp = 4;
  std::vector<uint8_t> fi(static_cast<size_t>(grouped_rows_alloc(GroupPad::kFlashInfer, M, G) * Cp), 0xEE);
  std::vector<uint8_t> cs(static_cast<size_t>(grouped_rows_alloc(GroupPad::kCumsum, M, G) * Cp), 0xEE);
  std::vector<uint8_t> back(rm.size(), 0xEE);
  convert_scale_layout(TensorView(rm.data(), DType::kUInt8, {M, C}), ScaleLayout::row_major(),
                       TensorView(fi.data(), DType::kUInt8, {int64_t(fi.size())}),
                       ScaleLayout::blocked128x4(GroupPad::kFlashInfer), M, C, iv);
  convert_scale_layout(TensorView(fi.data(), DType::kUInt8, {int64_t(fi.size())}),
                       ScaleLayout::blocked128x4(GroupPad::kFlashInfer), TensorView(cs.data(), DType::kUInt8, {int64_t(cs.size())}),
                       ScaleLayout::blocked128x4(GroupPad::kCumsum), M, C, iv);
  convert_scale_layout(TensorView(cs.data(), DType::kUInt8, {int64_t(cs.size())}), ScaleLayout::blocked128x4(GroupPad::kCumsum),
                       TensorView(back.data(), DType::kUInt8, {M, C}), ScaleLayout::row_major(), M, C, iv);
  EXPECT_EQ(back, rm);
  // every byte of the cumsum layout is either a scale of some (r, c) or zero padding
  int64_t nonzero = 0;
  for (uint8_t b : cs) nonzero += b != 0;
  EXPECT_EQ(nonzero, M * C);
}
