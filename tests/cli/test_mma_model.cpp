// `kvlayer mma-probe`'s host arithmetic (tools/kvlayer/mma_model.hpp): the exact dot the GPU's
// tensor-core results are measured against, the declared bound's ratio, and the alignment-
// truncation models.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kvlayer/half.hpp"
#include "mma_model.hpp"

namespace kvlayer::cli {
namespace {

/// A tile of zeros with row 0 / column 0 set from the given products (a_k, b_k) and c.
MmaTile tile_of(std::initializer_list<std::pair<float, float>> products, float c) {
  MmaTile t{};
  int k = 0;
  for (const auto& [a, b] : products) {
    t.a[0][k] = f32_to_f16_bits(a);
    t.b[k][0] = f32_to_f16_bits(b);
    ++k;
  }
  t.c[0][0] = c;
  return t;
}

TEST(MmaModel, ExactDotKeepsEveryBit) {
  // 2^15 · 2^15 + 2^-14 · 2^-10 − 2^30: only the tiny product is left, exactly.
  const MmaTile t = tile_of({{32768.0f, 32768.0f}, {0x1p-14f, 0x1p-10f}}, -0x1p30f);
  const ExactDot d = exact_dot(t, 0, 0);
  EXPECT_EQ(d.value, 0x1p-24L);
  EXPECT_EQ(d.abs_sum, 0x1p31L + 0x1p-24L);
  // An f32 sum in any order would have lost it: RN(2^30 + 2^-24) = 2^30.
  EXPECT_EQ(0x1p30f + 0x1p-24f, 0x1p30f);
}

TEST(MmaModel, ErrorRatioIsInUnitsOfTheAddends) {
  const MmaTile t = tile_of({{1.0f, 1.0f}, {1.0f, 1.0f}}, 0.0f);  // exact 2, Σ|addends| 2
  EXPECT_EQ(error_ratio(t, 0, 0, 2.0f), 0.0);
  // One f32 ulp of 2 (2^-22) against 2^-24 · 2: ratio 2.
  EXPECT_DOUBLE_EQ(error_ratio(t, 0, 0, std::nextafter(2.0f, 4.0f)), 2.0);
  EXPECT_TRUE(std::isinf(error_ratio(t, 0, 0, std::numeric_limits<float>::quiet_NaN())));
}

TEST(MmaModel, TruncationDropsBitsBelowTheAlignmentGrid) {
  // 1 + 2^-30: with 24 bits kept relative to 2^0 the small addend is truncated away; with 40
  // it survives the alignment but not the final 24-bit truncation; 2^-20 survives both.
  const MmaTile t = tile_of({{1.0f, 1.0f}, {0x1p-15f, 0x1p-15f}}, 0.0f);
  EXPECT_EQ(truncation_model(t, 0, 0, 24), 1.0f);
  EXPECT_EQ(truncation_model(t, 0, 0, 40), 1.0f);
  const MmaTile u = tile_of({{1.0f, 1.0f}, {0x1p-10f, 0x1p-10f}}, 0.0f);
  EXPECT_EQ(truncation_model(u, 0, 0, 24), 1.0f + 0x1p-20f);
  // Negative addends truncate toward zero: −1.5·2^-23 is −2^-23 on p = 24's grid (2^-23), and
  // exact on p = 25's (2^-24).
  const MmaTile v = tile_of({{1.0f, 1.0f}, {-0x1p-11f, 0x1p-12f * 1.5f}}, 0.0f);
  EXPECT_EQ(truncation_model(v, 0, 0, 24), 1.0f - 0x1p-23f);
  EXPECT_EQ(truncation_model(v, 0, 0, 25), 1.0f - 3 * 0x1p-24f);
}

TEST(MmaModel, TilesOfEachKind) {
  const std::vector<MmaTile> tiles = make_mma_tiles(2 * kMmaTileKinds, 7);
  for (std::size_t ti = 0; ti < tiles.size(); ++ti)
    for (int i = 0; i < MmaTile::kM; ++i)
      for (int j = 0; j < MmaTile::kN; ++j) {
        const ExactDot d = exact_dot(tiles[ti], i, j);
        switch (ti % kMmaTileKinds) {
          case 0:  // small integers: exact in f32, and every model returns it
            EXPECT_EQ(static_cast<long double>(static_cast<float>(d.value)), d.value);
            EXPECT_EQ(truncation_model(tiles[ti], i, j, 24), static_cast<float>(d.value));
            break;
          case 2:  // cancellation: the result is below an f32 ulp of the products' sum
            EXPECT_LE(std::fabs(d.value), std::ldexp(d.abs_sum, -23));
            break;
          default:
            EXPECT_GT(d.abs_sum, 0);
        }
      }
}

}  // namespace
}  // namespace kvlayer::cli
