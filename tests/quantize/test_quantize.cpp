// Reference quantizers (SPEC §2–4): hand-computed blocks, the canonical bad block, and random
// blocks against an oracle transcribed in this file from ggml's quantize_row_q8_0_ref /
// quantize_row_q5_1_ref plus SPEC §3's rules for degenerate and unrepresentable blocks.
// NOTE: compiled with -ffp-contract=off (CMakeLists.txt) so the oracle's q5_1 multiply and add
// stay separate, exactly as SPEC §3 demands of the code under test.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvlayer/half.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "testbed.hpp"

namespace {

using kvlayer::f16_bits_to_f32;
using kvlayer::f32_to_f16_bits;
using kvlayer::kBlockValues;
using kvlayer::kQ5_1BlockBytes;
using kvlayer::kQ8_0BlockBytes;
using Block = std::array<float, kBlockValues>;
using Q8 = std::array<std::uint8_t, kQ8_0BlockBytes>;
using Q5 = std::array<std::uint8_t, kQ5_1BlockBytes>;

// ---- initialize / run helpers ---------------------------------------------------------------

struct Q8Result {
  Q8 bytes;
  std::optional<float> bad;
};
struct Q5Result {
  Q5 bytes;
  std::optional<float> bad;
};

Q8Result run_q8(const Block& x) {
  Q8Result r;
  r.bytes.fill(0xAB);  // poison: every byte must be written
  r.bad = kvlayer::ref::quantize_q8_0_block(x, r.bytes);
  return r;
}
Q5Result run_q5(const Block& x) {
  Q5Result r;
  r.bytes.fill(0xAB);
  r.bad = kvlayer::ref::quantize_q5_1_block(x, r.bytes);
  return r;
}

std::uint16_t u16(const std::uint8_t* p) {
  return std::uint16_t(p[0] | (p[1] << 8));
}

// ---- the oracle -----------------------------------------------------------------------------

bool finite_block(const Block& x) {
  for (float v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

Q8 bad_q8() {
  Q8 b{};
  b[1] = 0x7E;  // d = 0x7E00, little-endian
  return b;
}
Q5 bad_q5() {
  Q5 b{};
  b[1] = 0x7E;
  b[3] = 0x7E;
  return b;
}

/// ggml quantize_row_q8_0_ref for one block, plus SPEC §3 (degenerate id, bad blocks).
Q8 oracle_q8(const Block& x) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float d = amax / ((1 << 7) - 1);
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (!std::isfinite(id)) id = 0.0f;
  const std::uint16_t dh = f32_to_f16_bits(d);
  if (!finite_block(x) || (dh & 0x7FFF) == 0x7C00) return bad_q8();
  Q8 b{};
  b[0] = std::uint8_t(dh);
  b[1] = std::uint8_t(dh >> 8);
  for (int j = 0; j < kBlockValues; ++j) b[2 + j] = std::uint8_t(std::int8_t(roundf(x[j] * id)));
  return b;
}

/// ggml quantize_row_q5_1_ref for one block, plus SPEC §3. `fused` computes the quant with an
/// FMA instead, to show that the difference is observable.
Q5 oracle_q5(const Block& x, bool fused = false) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (float v : x) {
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const float d = (max - min) / ((1 << 5) - 1);
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (!std::isfinite(id)) id = 0.0f;
  const std::uint16_t dh = f32_to_f16_bits(d), mh = f32_to_f16_bits(min);
  if (!finite_block(x) || (dh & 0x7FFF) == 0x7C00 || (mh & 0x7FFF) == 0x7C00) return bad_q5();
  Q5 b{};
  b[0] = std::uint8_t(dh);
  b[1] = std::uint8_t(dh >> 8);
  b[2] = std::uint8_t(mh);
  b[3] = std::uint8_t(mh >> 8);
  std::uint32_t qh = 0;
  for (int j = 0; j < kBlockValues / 2; ++j) {
    const float x0 = (x[j] - min) * id;
    const float x1 = (x[j + 16] - min) * id;
    const auto xi0 = std::uint8_t(fused ? std::fma(x[j] - min, id, 0.5f) : x0 + 0.5f);
    const auto xi1 = std::uint8_t(fused ? std::fma(x[j + 16] - min, id, 0.5f) : x1 + 0.5f);
    b[8 + j] = std::uint8_t((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
    qh |= std::uint32_t((xi0 & 0x10u) >> 4) << j;
    qh |= std::uint32_t((xi1 & 0x10u) >> 4) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) b[4 + i] = std::uint8_t(qh >> (8 * i));
  return b;
}

/// A block with a random power-of-two scale and random offset: realistic K/V data.
Block random_block(kvlayer::testing::Rng& rng) {
  Block x;
  const float scale = std::ldexp(1.0f, int(rng.range(-20, 12)));
  const float offset = rng.range(0, 3) == 0 ? scale * rng.uniform(-4.0f, 4.0f) : 0.0f;
  for (float& v : x) v = offset + scale * rng.uniform(-1.0f, 1.0f);
  return x;
}

// ---- q8_0: hand-computed blocks -------------------------------------------------------------

TEST(QuantizeQ8_0, HandBlockUnitScaleRoundsHalfAwayFromZero) {
  // amax = 127 -> d = 1 exactly, id = 1: the quant is roundf(x) itself.
  Block x{};
  x[0] = 127.0f;
  x[1] = -127.0f;
  x[2] = 2.5f;     // roundf: 3 (round-half-even would give 2)
  x[3] = -2.5f;    // -3
  x[4] = 0.5f;     // 1
  x[5] = -0.5f;    // -1
  x[6] = 3.5f;     // 4
  x[7] = 126.5f;   // 127
  x[8] = -126.5f;  // -127
  x[9] = 1.4999999f;
  x[10] = -7.0f;
  x[31] = 64.0f;
  const auto r = run_q8(x);
  EXPECT_FALSE(r.bad);
  Q8 want{};
  want[0] = 0x00;
  want[1] = 0x3C;  // fp16(1.0) = 0x3C00
  const int q[] = {127, -127, 3, -3, 1, -1, 4, 127, -127, 1, -7};
  for (int j = 0; j < 11; ++j) want[2 + j] = std::uint8_t(std::int8_t(q[j]));
  want[2 + 31] = 64;
  EXPECT_EQ(r.bytes, want);
  std::array<float, kBlockValues> deq;
  kvlayer::ref::dequantize_q8_0_block(r.bytes, deq);
  for (int j = 0; j < 11; ++j) EXPECT_EQ(deq[j], float(q[j])) << j;
}

TEST(QuantizeQ8_0, HandBlockScaleOneOver127) {
  // amax = 1: d = fl(1/127) = (1 − 2^-28)/127, so id = fl(1/d) = 127 exactly and 0.5 -> 63.5,
  // a tie that rounds away to 64. fp16(d): 1/127 = 2^-7·1.00787…, mantissa 8.06/1024 -> 0x2008.
  Block x{};
  x[0] = 1.0f;
  x[1] = 0.5f;
  x[2] = -0.5f;
  x[3] = -1.0f;
  const auto r = run_q8(x);
  EXPECT_FALSE(r.bad);
  EXPECT_EQ(u16(r.bytes.data()), 0x2008);
  EXPECT_EQ(std::int8_t(r.bytes[2]), 127);
  EXPECT_EQ(std::int8_t(r.bytes[3]), 64);
  EXPECT_EQ(std::int8_t(r.bytes[4]), -64);
  EXPECT_EQ(std::int8_t(r.bytes[5]), -127);
  std::array<float, kBlockValues> deq;
  kvlayer::ref::dequantize_q8_0_block(r.bytes, deq);
  // Dequant uses the *rounded* scale: 0x2008 = 2^-7·(1 + 8/1024).
  EXPECT_EQ(deq[0], 127.0f * 0x1.02p-7f);
  EXPECT_EQ(deq[1], 64.0f * 0x1.02p-7f);
}

TEST(QuantizeQ8_0, ScaleRoundsToNearestEvenInFp16) {
  // d = 1 + 2^-11 is a tie between fp16 0x3C00 and 0x3C01: even 0x3C00; d = 1 + 3·2^-11 is a
  // tie between 0x3C01 and 0x3C02: even 0x3C02. amax = 127·d is exact in f32, so d is too.
  for (auto [frac, want] : {std::pair{1.0f, 0x3C00}, std::pair{3.0f, 0x3C02}}) {
    Block x{};
    const float d = 1.0f + frac * 0x1p-11f;
    x[7] = -127.0f * d;
    x[8] = 3.0f;
    const auto r = run_q8(x);
    EXPECT_EQ(u16(r.bytes.data()), want) << frac;
    EXPECT_EQ(std::int8_t(r.bytes[2 + 7]), -127);
    EXPECT_EQ(std::int8_t(r.bytes[2 + 8]), 3);  // 3/d = 2.99… -> 3
  }
}

TEST(QuantizeQ8_0, ZeroAndNegativeZeroBlocksAreAllZeroBytes) {
  Block zero{}, negzero;
  negzero.fill(-0.0f);
  for (const Block& x : {zero, negzero}) {
    const auto r = run_q8(x);
    EXPECT_FALSE(r.bad);
    EXPECT_EQ(r.bytes, Q8{});
  }
}

TEST(QuantizeQ8_0, ConstantBlockIsFullScale) {
  Block x;
  x.fill(-3.0f);
  const auto r = run_q8(x);
  EXPECT_EQ(r.bytes, oracle_q8(x));
  for (int j = 0; j < kBlockValues; ++j) EXPECT_EQ(std::int8_t(r.bytes[2 + j]), -127);
}

TEST(QuantizeQ8_0, DegenerateSubnormalScaleGivesZeroQuants) {
  // amax = 1e-37: d ≈ 7.9e-40 (subnormal), 1/d overflows -> quants 0, stored scale 0.
  Block x{};
  x[0] = 1e-37f;
  x[1] = -5e-38f;
  x[2] = 1e-45f;
  const auto r = run_q8(x);
  EXPECT_FALSE(r.bad);
  EXPECT_EQ(r.bytes, Q8{});
  // amax = 1e-36: 1/d ≈ 1.27e38 is finite, so the quants follow the formula (ggml computes them)
  // while the fp16 scale still rounds to 0.
  x[0] = 1e-36f;
  const auto r2 = run_q8(x);
  EXPECT_FALSE(r2.bad);
  EXPECT_EQ(u16(r2.bytes.data()), 0);
  EXPECT_EQ(std::int8_t(r2.bytes[2]), 127);
  EXPECT_EQ(std::int8_t(r2.bytes[3]), -6);  // -5e-38/1e-36·127 = -6.35
  EXPECT_EQ(r2.bytes, oracle_q8(x));
}

TEST(QuantizeQ8_0, OverflowBoundaryOfTheScale) {
  // d = amax/127: 8321039/127 = 65519.99… -> fp16 65504 (fine); 8321040/127 = 65520 -> Inf (bad).
  Block x{};
  x[3] = 8321039.0f;
  x[4] = -1.0f;
  const auto ok = run_q8(x);
  EXPECT_FALSE(ok.bad);
  EXPECT_EQ(u16(ok.bytes.data()), 0x7BFF);
  EXPECT_EQ(std::int8_t(ok.bytes[2 + 3]), 127);
  x[3] = -8321040.0f;
  const auto bad = run_q8(x);
  ASSERT_TRUE(bad.bad);
  EXPECT_EQ(*bad.bad, -8321040.0f);  // the value of largest magnitude
  EXPECT_EQ(bad.bytes, bad_q8());
}

TEST(QuantizeQ8_0, NonFiniteValuesGiveTheCanonicalBadBlock) {
  struct Case {
    int first_pos;
    float first;
    int second_pos;
    float second;
  };
  for (const Case& c :
       {Case{5, NAN, 9, INFINITY}, Case{2, -INFINITY, 30, NAN}, Case{31, INFINITY, 0, 1.0f}}) {
    Block x;
    kvlayer::testing::Rng rng(7);
    for (float& v : x) v = rng.uniform(-1, 1);
    x[c.first_pos] = c.first;
    x[c.second_pos] = c.second;
    const auto r = run_q8(x);
    ASSERT_TRUE(r.bad);
    // The returned value is the block's first non-finite value (by position).
    const float want = c.first_pos < c.second_pos || std::isfinite(c.second) ? c.first : c.second;
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(*r.bad));
    else
      EXPECT_EQ(*r.bad, want);
    EXPECT_EQ(r.bytes, bad_q8());
    std::array<float, kBlockValues> deq;
    kvlayer::ref::dequantize_q8_0_block(r.bytes, deq);
    for (float v : deq) EXPECT_TRUE(std::isnan(v));  // loud: any attention reading it is NaN
  }
}

// ---- q5_1: hand-computed blocks -------------------------------------------------------------

TEST(QuantizeQ5_1, HandBlockEveryQuantOnce) {
  // x_j = j − 16: min −16, max 15, d = 1, q_j = j. Every nibble/qh position is exercised.
  Block x;
  for (int j = 0; j < kBlockValues; ++j) x[j] = float(j - 16);
  const auto r = run_q5(x);
  EXPECT_FALSE(r.bad);
  Q5 want{};
  want[1] = 0x3C;  // d = 1.0 = 0x3C00
  want[3] = 0xCC;  // m = −16 = 0xCC00
  want[6] = 0xFF;  // qh = 0xFFFF0000: quants 16..31 have bit 4
  want[7] = 0xFF;
  for (int j = 0; j < 16; ++j) want[8 + j] = std::uint8_t(j | (j << 4));  // q_j | q_{j+16} << 4
  EXPECT_EQ(r.bytes, want);
  std::array<float, kBlockValues> deq;
  kvlayer::ref::dequantize_q5_1_block(r.bytes, deq);
  for (int j = 0; j < kBlockValues; ++j) EXPECT_EQ(deq[j], x[j]) << j;
}

TEST(QuantizeQ5_1, HandBlockTiesRoundUpByTruncation) {
  // min 0, max 31 -> d = 1, id = 1; q = trunc(x + 0.5): ties go up (2.5 -> 3, 3.5 -> 4).
  Block x{};
  x[1] = 31.0f;
  x[2] = 2.5f;
  x[3] = 3.5f;
  x[4] = 3.4999998f;
  x[17] = 16.5f;  // 17: high nibble of byte 8+1, qh bit 17
  x[20] = 30.6f;  // 31
  const auto r = run_q5(x);
  EXPECT_FALSE(r.bad);
  Q5 want{};
  want[1] = 0x3C;            // d = 1
  want[2] = 0, want[3] = 0;  // m = +0
  const int q[kBlockValues] = {0, 31, 3, 4, 3,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 17, 0, 0, 31, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::uint32_t qh = 0;
  for (int j = 0; j < kBlockValues; ++j) {
    qh |= std::uint32_t((q[j] >> 4) & 1) << j;
    want[8 + j % 16] |= std::uint8_t((q[j] & 0xF) << (j < 16 ? 0 : 4));
  }
  EXPECT_EQ(qh, (1u << 1) | (1u << 17) | (1u << 20));
  for (int i = 0; i < 4; ++i) want[4 + i] = std::uint8_t(qh >> (8 * i));
  EXPECT_EQ(r.bytes, want);
}

TEST(QuantizeQ5_1, ConstantBlockHasZeroQuantsAndDequantizesToFp16Min) {
  Block x;
  x.fill(3.14159f);
  const auto r = run_q5(x);
  EXPECT_FALSE(r.bad);
  Q5 want{};
  want[2] = 0x48;  // fp16(3.14159) = 0x4248 (3.140625)
  want[3] = 0x42;
  EXPECT_EQ(r.bytes, want);
  std::array<float, kBlockValues> deq;
  kvlayer::ref::dequantize_q5_1_block(r.bytes, deq);
  for (float v : deq) EXPECT_EQ(v, 3.140625f);
}

TEST(QuantizeQ5_1, ZeroBlocksAndTheSignOfZeroMinimum) {
  // ggml keeps the first of equal minima: a block starting with −0 stores m = 0x8000.
  Block zero{};
  EXPECT_EQ(run_q5(zero).bytes, Q5{});
  Block neg_first{};
  neg_first[0] = -0.0f;
  Q5 want{};
  want[3] = 0x80;
  EXPECT_EQ(run_q5(neg_first).bytes, want);
  Block neg_later{};
  neg_later[1] = -0.0f;  // +0 came first and stays the minimum
  EXPECT_EQ(run_q5(neg_later).bytes, Q5{});
}

TEST(QuantizeQ5_1, DegenerateSubnormalScaleGivesZeroQuants) {
  // range 1e-38: d ≈ 3.2e-40, 1/d overflows -> quants 0; d and m round to fp16 0.
  Block x{};
  x[0] = 1e-38f;
  x[9] = -1e-40f;
  const auto r = run_q5(x);
  EXPECT_FALSE(r.bad);
  Q5 want{};
  want[3] = 0x80;  // m = fp16(−1e-40) = −0
  EXPECT_EQ(r.bytes, want);
}

TEST(QuantizeQ5_1, OverflowOfScaleOrMinimumGivesTheBadBlock) {
  Block x{};
  x[0] = -65519.0f;  // fp16(min) = −65504: fine
  const auto ok = run_q5(x);
  EXPECT_FALSE(ok.bad);
  EXPECT_EQ(u16(ok.bytes.data() + 2), 0xFBFF);
  x[0] = -65520.0f;  // fp16(min) overflows
  const auto r1 = run_q5(x);
  ASSERT_TRUE(r1.bad);
  EXPECT_EQ(*r1.bad, -65520.0f);
  EXPECT_EQ(r1.bytes, bad_q5());
  // min is representable but d = (2e6 + 60000)/31 ≈ 66451 overflows fp16.
  Block y{};
  y[0] = -60000.0f;
  y[13] = 2e6f;
  const auto r2 = run_q5(y);
  ASSERT_TRUE(r2.bad);
  EXPECT_EQ(*r2.bad, 2e6f);
  EXPECT_EQ(r2.bytes, bad_q5());
  // Range overflowing f32 itself: max − min = +Inf.
  Block z{};
  z[0] = -3e38f;
  z[1] = 3e38f;
  const auto r3 = run_q5(z);
  ASSERT_TRUE(r3.bad);
  EXPECT_EQ(r3.bytes, bad_q5());
}

TEST(QuantizeQ5_1, NonFiniteValuesGiveTheCanonicalBadBlock) {
  Block x;
  kvlayer::testing::Rng rng(11);
  for (float& v : x) v = rng.uniform(-1, 1);
  x[20] = -INFINITY;
  x[25] = NAN;
  const auto r = run_q5(x);
  ASSERT_TRUE(r.bad);
  EXPECT_EQ(*r.bad, -INFINITY);
  EXPECT_EQ(r.bytes, bad_q5());
  std::array<float, kBlockValues> deq;
  kvlayer::ref::dequantize_q5_1_block(r.bytes, deq);
  for (float v : deq) EXPECT_TRUE(std::isnan(v));
}

// ---- random blocks against the oracle -------------------------------------------------------

TEST(QuantizeRandom, BytesEqualTheGgmlOracle) {
  kvlayer::testing::Rng rng(0x9A11);
  for (int i = 0; i < 200'000; ++i) {
    const Block x = random_block(rng);
    ASSERT_EQ(run_q8(x).bytes, oracle_q8(x)) << "block " << i;
    ASSERT_EQ(run_q5(x).bytes, oracle_q5(x)) << "block " << i;
    ASSERT_FALSE(run_q8(x).bad);
  }
}

/// Values placed on (or next to) the rounding ties of each format, where a wrong rounding mode,
/// a reciprocal approximation or a fused multiply-add changes a quant.
TEST(QuantizeRandom, TieNeighbourhoodsEqualTheOracleAndFmaWouldDiffer) {
  kvlayer::testing::Rng rng(0x71E5);
  int fma_differs = 0;
  // Moves v by up to two ulps either way (0 keeps the tie itself).
  auto nudge = [&rng](float v) {
    const int n = int(rng.range(-2, 2));
    for (int s = 0; s < std::abs(n); ++s) v = std::nextafter(v, n < 0 ? 0.0f : INFINITY);
    return v;
  };
  for (int i = 0; i < 100'000; ++i) {
    const float d = std::ldexp(rng.uniform(1.0f, 2.0f), int(rng.range(-12, 8)));
    // q5_1: min 0, max 31·d, the rest on (x − min)·id ≈ k + 0.5.
    Block x;
    for (int j = 0; j < kBlockValues; ++j) x[j] = nudge((float(rng.range(0, 30)) + 0.5f) * d);
    x[0] = 0.0f;
    x[1] = 31.0f * d;
    const Q5 plain = oracle_q5(x), fused = oracle_q5(x, true);
    fma_differs += plain != fused;
    ASSERT_EQ(run_q5(x).bytes, plain) << "block " << i;
    // q8_0: amax 127·d, the rest on x·id ≈ ±(k + 0.5), both signs.
    Block y;
    for (int j = 0; j < kBlockValues; ++j)
      y[j] = (rng.range(0, 1) ? -1.0f : 1.0f) * nudge((float(rng.range(0, 126)) + 0.5f) * d);
    y[2] = -127.0f * d;
    ASSERT_EQ(run_q8(y).bytes, oracle_q8(y)) << "block " << i;
  }
  // If no block separated the fused from the unfused expression, this test could not catch a
  // contracted quantizer: fail loudly instead.
  EXPECT_GT(fma_differs, 0);
  RecordProperty("fma_differs", fma_differs);
}

// ---- dequantization formulas ------------------------------------------------------------------

TEST(Dequantize, Q8_0IsScaleTimesQuant) {
  kvlayer::testing::Rng rng(0xDE08);
  for (int i = 0; i < 20'000; ++i) {
    Q8 b;
    for (auto& byte : b) byte = std::uint8_t(rng.next());
    if ((b[1] & 0x7C) == 0x7C) b[1] &= 0xBF;  // keep d finite (exponent not all ones)
    std::array<float, kBlockValues> out;
    kvlayer::ref::dequantize_q8_0_block(b, out);
    const double d = double(f16_bits_to_f32(u16(b.data())));
    for (int j = 0; j < kBlockValues; ++j)
      ASSERT_EQ(out[j], float(d * std::int8_t(b[2 + j])));  // exact: 11 × 8 significant bits
  }
}

TEST(Dequantize, Q5_1IsScaleTimesQuantPlusMinimumRoundedOnce) {
  kvlayer::testing::Rng rng(0xDE51);
  for (int i = 0; i < 20'000; ++i) {
    Q5 b;
    for (auto& byte : b) byte = std::uint8_t(rng.next());
    if ((b[1] & 0x7C) == 0x7C) b[1] &= 0xBF;
    if ((b[3] & 0x7C) == 0x7C) b[3] &= 0xBF;
    std::array<float, kBlockValues> out;
    kvlayer::ref::dequantize_q5_1_block(b, out);
    const double d = f16_bits_to_f32(u16(b.data())), m = f16_bits_to_f32(u16(b.data() + 2));
    const std::uint32_t qh = std::uint32_t(b[4]) | std::uint32_t(b[5]) << 8 |
                             std::uint32_t(b[6]) << 16 | std::uint32_t(b[7]) << 24;
    for (int j = 0; j < kBlockValues; ++j) {
      const int q = ((b[8 + j % 16] >> (j < 16 ? 0 : 4)) & 0xF) | int((qh >> j) & 1) << 4;
      // d·q is exact (11 × 5 bits); d·q + m is exact in double (exponent gap < 53), so one
      // rounding to f32 gives the IEEE f32 sum.
      ASSERT_EQ(out[j], float(d * q + m)) << "block " << i << " j " << j;
    }
  }
}

// ---- rows -------------------------------------------------------------------------------------

TEST(QuantizeRow, WritesEveryBlockAndReportsTheFirstBadOne) {
  kvlayer::testing::Rng rng(0x5044);
  std::vector<float> x(5 * kBlockValues);
  for (float& v : x) v = rng.uniform(-2, 2);
  x[1 * 32 + 7] = NAN;
  x[3 * 32 + 0] = INFINITY;
  for (auto t : {kvlayer::ref::BlockType::q8_0, kvlayer::ref::BlockType::q5_1}) {
    const int bb = kvlayer::ref::block_bytes(t);
    std::vector<std::uint8_t> out(std::size_t(5 * bb), 0xAB);
    const auto bad = kvlayer::ref::quantize_row(t, x, out);
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->block, 1);
    EXPECT_TRUE(std::isnan(bad->value));
    for (int b = 0; b < 5; ++b) {
      Block blk;
      std::copy_n(x.begin() + b * 32, 32, blk.begin());
      const std::vector<std::uint8_t> got(out.begin() + b * bb, out.begin() + (b + 1) * bb);
      if (t == kvlayer::ref::BlockType::q8_0) {
        const Q8 w = oracle_q8(blk);
        EXPECT_EQ(got, std::vector<std::uint8_t>(w.begin(), w.end())) << b;
      } else {
        const Q5 w = oracle_q5(blk);
        EXPECT_EQ(got, std::vector<std::uint8_t>(w.begin(), w.end())) << b;
      }
    }
    std::vector<float> deq(5 * kBlockValues);
    kvlayer::ref::dequantize_row(t, out, deq);
    EXPECT_TRUE(std::isnan(deq[3 * 32 + 5]));
    EXPECT_FALSE(std::isnan(deq[2 * 32 + 5]));
  }
}

}  // namespace
