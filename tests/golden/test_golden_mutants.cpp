// The golden quantization data must catch the classic quantizer defects, not just agree with
// the reference: an independent C++ quantizer written from SPEC §3 matches every golden block,
// and each single deliberate defect (round-half-even, division instead of the reciprocal, FMA
// contraction, no degenerate-block rule, a missed fp16 overflow, numpy-style signed-zero
// minimum) produces mismatches on the case built to catch it.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>

#include "golden_data.hpp"
#include "kvlayer/half.hpp"

namespace kvlayer::testing {
namespace {

using kvlayer::golden::QuantCase;
using kvlayer::ref::BlockType;

struct Defects {
  bool round_half_even = false;     ///< q8_0: nearbyint instead of roundf
  bool divide = false;              ///< x/d (q5_1: (x-min)/d) instead of x·(1/d)
  bool fma = false;                 ///< q5_1: fmaf((x-min), id, 0.5f)
  bool no_degenerate_rule = false;  ///< keep id = 1/d even when it is not finite (inf → clamp)
  bool miss_fp16_overflow = false;  ///< write the overflowed scale instead of the bad block
  bool last_extreme = false;        ///< q5_1: keep the last of equal extremes (sign of a zero)
};

void store16(std::uint8_t* p, std::uint16_t v) {
  p[0] = std::uint8_t(v);
  p[1] = std::uint8_t(v >> 8);
}

bool finite_block(std::span<const float> x) {
  for (float v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

float reciprocal(float d, const Defects& m) {
  if (d == 0) return 0;
  const float id = 1.0f / d;
  return std::isfinite(id) || m.no_degenerate_rule ? id : 0.0f;
}

/// Saturating float → int conversion so that defects with infinite id stay defined behaviour.
int to_int(float v, int lo, int hi) {
  if (std::isnan(v)) return 0;
  return int(std::fmax(float(lo), std::fmin(float(hi), v)));
}

std::vector<std::uint8_t> q8_0(std::span<const float> x, const Defects& m) {
  std::vector<std::uint8_t> out(34, 0);
  float amax = 0;
  for (float v : x) amax = std::fmax(amax, std::fabs(v));
  const float d = amax / 127.0f;
  const std::uint16_t dh = kvlayer::f32_to_f16_bits(d);
  if (!finite_block(x) || ((dh & 0x7FFF) == 0x7C00 && !m.miss_fp16_overflow)) {
    store16(out.data(), 0x7E00);
    return out;
  }
  const float id = reciprocal(d, m);
  store16(out.data(), dh);
  for (int j = 0; j < 32; ++j) {
    const float s = m.divide ? (d == 0 ? 0.0f : x[j] / d) : x[j] * id;
    const float r = m.round_half_even ? std::nearbyint(s) : std::round(s);
    out[2 + j] = std::uint8_t(std::int8_t(to_int(r, -128, 127)));
  }
  return out;
}

std::vector<std::uint8_t> q5_1(std::span<const float> x, const Defects& m) {
  std::vector<std::uint8_t> out(24, 0);
  float lo = x[0], hi = x[0];
  for (float v : x) {
    if (m.last_extreme ? v <= lo : v < lo) lo = v;
    if (m.last_extreme ? v >= hi : v > hi) hi = v;
  }
  const float d = (hi - lo) / 31.0f;
  const std::uint16_t dh = kvlayer::f32_to_f16_bits(d), mh = kvlayer::f32_to_f16_bits(lo);
  const bool overflow = (dh & 0x7FFF) == 0x7C00 || (mh & 0x7FFF) == 0x7C00;
  if (!finite_block(x) || !std::isfinite(d) || (overflow && !m.miss_fp16_overflow)) {
    store16(out.data(), 0x7E00);
    store16(out.data() + 2, 0x7E00);
    return out;
  }
  const float id = reciprocal(d, m);
  store16(out.data(), dh);
  store16(out.data() + 2, mh);
  std::uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) {
    const float a = x[j] - lo;
    float s;
    if (m.fma)
      s = std::fma(a, id, 0.5f);
    else if (m.divide)
      s = (d == 0 ? 0.0f : a / d) + 0.5f;
    else {
      const float p = a * id;  // built with -ffp-contract=off: a separate multiply and add
      s = p + 0.5f;
    }
    const int q = to_int(std::trunc(s), 0, 31);
    qh |= std::uint32_t((q >> 4) & 1) << j;
    out[8 + j % 16] |= std::uint8_t((q & 15) << (j < 16 ? 0 : 4));
  }
  for (int b = 0; b < 4; ++b) out[4 + b] = std::uint8_t(qh >> (8 * b));
  return out;
}

/// Blocks of case `name` in format `t` where the defective quantizer differs from golden.
int mismatches(const std::string& name, BlockType t, const Defects& m) {
  const auto* set = golden_set();
  for (const QuantCase& c : set->quant) {
    if (c.name != name) continue;
    for (const auto& f : c.formats) {
      if (f.type != t) continue;
      const std::size_t bb = t == BlockType::q8_0 ? 34 : 24;
      int n = 0;
      for (std::int64_t b = 0; b < c.blocks; ++b) {
        std::span<const float> x(c.input.data() + b * 32, 32);
        const auto got = t == BlockType::q8_0 ? q8_0(x, m) : q5_1(x, m);
        n += !std::equal(got.begin(), got.end(), f.expected.begin() + std::ptrdiff_t(b * bb));
      }
      return n;
    }
  }
  ADD_FAILURE() << "no golden case " << name;
  return -1;
}

TEST(GoldenMutants, AnIndependentQuantizerMatchesEveryGoldenBlock) {
  const auto* set = golden_set();
  ASSERT_NE(set, nullptr) << load_error();
  for (const QuantCase& c : set->quant)
    for (BlockType t : {BlockType::q8_0, BlockType::q5_1})
      EXPECT_EQ(mismatches(c.name, t, {}), 0) << c.name;
}

TEST(GoldenMutants, EachDefectIsCaught) {
  ASSERT_NE(golden_set(), nullptr) << load_error();
  EXPECT_GT(mismatches("ties_q8_0", BlockType::q8_0, {.round_half_even = true}), 10);
  EXPECT_GT(mismatches("ties_q8_0", BlockType::q8_0, {.divide = true}), 5);
  EXPECT_GT(mismatches("ties_q5_1", BlockType::q5_1, {.divide = true}), 5);
  EXPECT_GT(mismatches("ties_q5_1", BlockType::q5_1, {.fma = true}), 5);
  EXPECT_GT(mismatches("subnormal", BlockType::q8_0, {.no_degenerate_rule = true}), 3);
  EXPECT_GT(mismatches("subnormal", BlockType::q5_1, {.no_degenerate_rule = true}), 2);
  EXPECT_GT(mismatches("bad", BlockType::q8_0, {.miss_fp16_overflow = true}), 2);
  EXPECT_GT(mismatches("bad", BlockType::q5_1, {.miss_fp16_overflow = true}), 2);
  EXPECT_GT(mismatches("signed_zero", BlockType::q5_1, {.last_extreme = true}), 1);
}

}  // namespace
}  // namespace kvlayer::testing
