// Quantizer properties (SPEC §3–4): for random finite blocks of widely varied scale,
// |dequant(quant(x)) − x| stays within a bound derived below from the block's own scale, and a
// dequantized q8_0 block quantizes back to the same bytes.
//
// Notation: u = 2^-24 (f32 unit roundoff), d = the unrounded f32 scale, d̃ = f32(fp16(d)) the
// stored scale, m̃ = f32(fp16(min)), q_j the stored quant.
//
// q8_0. d = fl(amax/127), id = fl(1/d), q_j = roundf(fl(x_j·id)). Let t_j = x_j/d (real), with
// |t_j| ≤ amax/d ≤ 127(1 + u). fl(x·fl(1/d)) = t(1 + δ1)(1 + δ2), so it is within
// 127(1 + u)(2u + u²) < 255u of t, and rounding to an integer adds at most 1/2:
// |q_j − t_j| ≤ 1/2 + 255u. Dequantization d̃·q_j is exact (11 × 8 significant bits), so
//   |d̃·q_j − x_j| = |(d̃ − d)·q_j + d·(q_j − t_j)| ≤ |d̃ − d|·|q_j| + d·(1/2 + 255u).
// |d̃ − d| is what fp16 rounding of d costs: ≤ 2^-11·d for a normal fp16, ≤ 2^-25 below.
//
// q5_1. d = fl((max − min)/31), id = fl(1/d), c_j = fl(fl(x_j − min)·id) = t_j(1 + δ)^3 with
// t_j = (x_j − min)/d ≤ 31(1 + u): |c_j − t_j| ≤ 31·3.01u < 94u. w_j = fl(c_j + 0.5) is within
// 2^-20 (half an ulp below 32) of c_j + 0.5, and q_j = trunc(w_j) ∈ (w_j − 1, w_j], so
// |q_j − t_j| ≤ 1/2 + 2^-20 + 94u. Dequantization fl(d̃·q_j + m̃): d̃·q_j is exact, the add
// rounds once (relative u). With x_j = min + d·t_j:
//   |x̂_j − x_j| ≤ |d̃ − d|·q_j + d·(1/2 + 2^-20 + 94u) + |m̃ − min| + u·|d̃·q_j + m̃|.
// A constant block (d = 0) has q_j = 0 and x̂_j = m̃: the bound reduces to |m̃ − min|.
//
// Blocks whose 1/d overflows (amax below ≈3.7e-37, SPEC §3's degenerate case) quantize to
// zero quants by definition and are excluded from the bound; the generator keeps scales
// in [2^-60, 2^15] (q5_1 stores the minimum itself in fp16, so |values| stay below 65504).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <sstream>

#include "kvlayer/half.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "testbed.hpp"

namespace {

using Block = std::array<float, kvlayer::kBlockValues>;
constexpr double u = 0x1p-24;

/// How a generated block's values are laid out.
enum class Shape { uniform, offset, few_values, ties, constant, one_spike };

/// A block description that shrinks well (a shape, an exponent, an offset, a seed) and the
/// values it expands to.
struct BlockSpec {
  Shape shape;
  int exponent;  ///< values are about 2^exponent
  int offset;    ///< offset in units of 2^exponent (q5_1 asymmetric ranges)
  std::uint64_t seed;

  Block values() const {
    kvlayer::testing::Rng rng(seed);
    const float s = std::ldexp(1.0f, exponent);
    // Offsets that would push q5_1's minimum past fp16's range are dropped: such blocks are
    // bad blocks by definition (UnrepresentableBlocksAreAlwaysTheCanonicalBadBlock).
    const float o = std::fabs(float(offset) * s) + s > 6e4f ? 0.0f : float(offset) * s;
    Block x;
    for (int j = 0; j < kvlayer::kBlockValues; ++j) {
      switch (shape) {
        case Shape::uniform:
          x[j] = s * rng.uniform(-1, 1);
          break;
        case Shape::offset:
          x[j] = o + s * rng.uniform(0, 1);
          break;
        case Shape::few_values:
          x[j] = o + s * 0.5f * float(rng.range(-2, 2));
          break;
        case Shape::ties:  // x·id on the .5 ties of q8_0 (amax = s pinned by x[0] below)
          x[j] = j == 0 ? s : s / 127.0f * (float(rng.range(-126, 126)) + 0.5f);
          break;
        case Shape::constant:
          x[j] = o + s;
          break;
        case Shape::one_spike:
          x[j] = j == int(seed % 32) ? o + s : o + s * 1e-4f * rng.uniform(-1, 1);
          break;
      }
    }
    return x;
  }
};

std::ostream& operator<<(std::ostream& os, const BlockSpec& b) {
  return os << "BlockSpec{shape " << int(b.shape) << ", exponent " << b.exponent << ", offset "
            << b.offset << ", seed " << b.seed << "}";
}

/// Blocks with exponents in [lo, hi). NOTE: rc::gen::inRange scales its range with the size
/// parameter (size 0 gives lo only); the block generator is resized to the full size so that
/// every case draws from the whole exponent range, while shrinking still works.
rc::Gen<BlockSpec> gen_block(int lo = -60, int hi = 16) {
  return rc::gen::resize(100, rc::gen::apply(
                                  [](int shape, int exponent, int offset, std::uint64_t seed) {
                                    return BlockSpec{Shape(shape), exponent, offset, seed};
                                  },
                                  rc::gen::inRange(0, 6), rc::gen::inRange(lo, hi),
                                  rc::gen::inRange(-40, 41), rc::gen::arbitrary<std::uint64_t>()));
}

std::uint16_t u16(const std::uint8_t* p) {
  return std::uint16_t(p[0] | (p[1] << 8));
}

}  // namespace

namespace rc {
template <>
struct Arbitrary<BlockSpec> {
  static Gen<BlockSpec> arbitrary() { return gen_block(); }
};
}  // namespace rc

namespace {
void check_q8_0_bound(const BlockSpec& spec);
void check_q5_1_bound(const BlockSpec& spec);
}  // namespace

/// Each case checks a list of blocks (shrinking keeps the failing one), so the quantizer sees
/// thousands of blocks per run at the fixed CI case count.
RC_GTEST_PROP(QuantizeProps, Q8_0ErrorWithinTheDerivedBound,
              (const std::vector<BlockSpec>& specs)) {
  for (const BlockSpec& spec : specs) check_q8_0_bound(spec);
}

RC_GTEST_PROP(QuantizeProps, Q5_1ErrorWithinTheDerivedBound,
              (const std::vector<BlockSpec>& specs)) {
  for (const BlockSpec& spec : specs) check_q5_1_bound(spec);
}

namespace {

void check_q8_0_bound(const BlockSpec& spec) {
  const Block x = spec.values();
  std::array<std::uint8_t, kvlayer::kQ8_0BlockBytes> b;
  RC_ASSERT(!kvlayer::ref::quantize_q8_0_block(x, b));
  std::array<float, kvlayer::kBlockValues> y;
  kvlayer::ref::dequantize_q8_0_block(b, y);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const double d = double(amax / 127.0f);
  const double dt = kvlayer::f16_bits_to_f32(u16(b.data()));
  RC_ASSERT(std::fabs(dt - d) <= std::max(0x1p-11 * d, 0x1p-25));  // fp16 rounding of d
  for (int j = 0; j < kvlayer::kBlockValues; ++j) {
    const int q = std::int8_t(b[std::size_t(2 + j)]);
    const double bound = std::fabs(dt - d) * std::abs(q) + d * (0.5 + 255 * u);
    const double err = std::fabs(double(y[j]) - double(x[j]));
    if (!(err <= bound))
      RC_FAIL("j " + std::to_string(j) + ": |error| " + std::to_string(err) + " > bound " +
              std::to_string(bound));
  }
  // A quant of magnitude 127 always exists (the amax element), unless the block is all zero.
  if (amax > 0) {
    int qmax = 0;
    for (int j = 0; j < 32; ++j)
      qmax = std::max(qmax, std::abs(int(std::int8_t(b[std::size_t(2 + j)]))));
    RC_ASSERT(qmax == 127);
  }
}

void check_q5_1_bound(const BlockSpec& spec) {
  const Block x = spec.values();
  std::array<std::uint8_t, kvlayer::kQ5_1BlockBytes> b;
  RC_ASSERT(!kvlayer::ref::quantize_q5_1_block(x, b));
  std::array<float, kvlayer::kBlockValues> y;
  kvlayer::ref::dequantize_q5_1_block(b, y);
  float lo = x[0], hi = x[0];
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  const double d = double((hi - lo) / 31.0f);
  const double dt = kvlayer::f16_bits_to_f32(u16(b.data()));
  const double mt = kvlayer::f16_bits_to_f32(u16(b.data() + 2));
  RC_ASSERT(std::fabs(dt - d) <= std::max(0x1p-11 * d, 0x1p-25));
  RC_ASSERT(std::fabs(mt - lo) <= std::max(0x1p-11 * std::fabs(lo), 0x1p-25));
  const std::uint32_t qh = std::uint32_t(b[4]) | std::uint32_t(b[5]) << 8 |
                           std::uint32_t(b[6]) << 16 | std::uint32_t(b[7]) << 24;
  for (int j = 0; j < kvlayer::kBlockValues; ++j) {
    const int q = ((b[std::size_t(8 + j % 16)] >> (j < 16 ? 0 : 4)) & 0xF) | int((qh >> j) & 1)
                                                                                 << 4;
    const double bound = std::fabs(dt - d) * q + d * (0.5 + 0x1p-20 + 94 * u) +
                         std::fabs(mt - double(lo)) + u * std::fabs(dt * q + mt);
    const double err = std::fabs(double(y[j]) - double(x[j]));
    if (!(err <= bound))
      RC_FAIL("j " + std::to_string(j) + ": |error| " + std::to_string(err) + " > bound " +
              std::to_string(bound));
  }
}

}  // namespace

RC_GTEST_PROP(QuantizeProps, Q8_0RequantizingADequantizedBlockGivesTheSameBytes, ()) {
  // x̂ = d̃·q exactly, so amax' = 127·d̃, d' = d̃ and q' = q: the format is a fixed point of
  // quantize ∘ dequantize whenever the stored scale is not 0 (exponents ≥ 2^-14 keep it so,
  // except for all-zero blocks).
  const BlockSpec spec = *gen_block(-14, 16);
  const Block x = spec.values();
  std::array<std::uint8_t, kvlayer::kQ8_0BlockBytes> b, b2;
  (void)kvlayer::ref::quantize_q8_0_block(x, b);
  RC_PRE(u16(b.data()) != 0);
  Block y;
  kvlayer::ref::dequantize_q8_0_block(b, y);
  RC_ASSERT(!kvlayer::ref::quantize_q8_0_block(y, b2));
  RC_ASSERT(b == b2);
}

RC_GTEST_PROP(QuantizeProps, UnrepresentableBlocksAreAlwaysTheCanonicalBadBlock,
              (const BlockSpec& spec, int where, int what)) {
  // Any block with a NaN/Inf anywhere, or scaled past fp16's range, is the canonical bad block
  // in both formats, whatever the other values.
  Block x = spec.values();
  const int j = std::abs(where) % 32;
  switch (std::abs(what) % 4) {
    case 0:
      x[j] = NAN;
      break;
    case 1:
      x[j] = INFINITY;
      break;
    case 2:
      x[j] = -INFINITY;
      break;
    case 3:
      x[j] = (what < 0 ? -1.0f : 1.0f) * 1e7f * 127.0f;
      break;  // d ≈ 1e7 > 65504
  }
  std::array<std::uint8_t, kvlayer::kQ8_0BlockBytes> b8;
  std::array<std::uint8_t, kvlayer::kQ5_1BlockBytes> b5;
  const auto bad8 = kvlayer::ref::quantize_q8_0_block(x, b8);
  const auto bad5 = kvlayer::ref::quantize_q5_1_block(x, b5);
  RC_ASSERT(bad8.has_value());
  RC_ASSERT(bad5.has_value());
  std::array<std::uint8_t, kvlayer::kQ8_0BlockBytes> want8{};
  want8[1] = 0x7E;
  std::array<std::uint8_t, kvlayer::kQ5_1BlockBytes> want5{};
  want5[1] = 0x7E;
  want5[3] = 0x7E;
  RC_ASSERT(b8 == want8);
  RC_ASSERT(b5 == want5);
  if (std::abs(what) % 4 == 3) {
    RC_ASSERT(*bad8 == x[j]);  // the value of largest magnitude
  } else {
    RC_ASSERT(!std::isfinite(*bad8));
  }
}
