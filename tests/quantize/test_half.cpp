// half.hpp: f16 and bf16 conversions (SPEC §2–3 rely on them for every stored scale).
// The oracle is independent of half.hpp: it decodes bit patterns with ldexp into doubles and
// rounds an f32 to the nearest representable value by searching that table, ties to even.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvlayer/half.hpp"
#include "testbed.hpp"

namespace {

using kvlayer::bf16_bits_to_f32;
using kvlayer::f16_bits_to_f32;
using kvlayer::f32_to_bf16_bits;
using kvlayer::f32_to_f16_bits;

/// Value of a non-negative finite binary16 pattern, computed from the IEEE definition.
double f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  return e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
}

/// Value of a non-negative finite bfloat16 pattern.
double bf16_value(std::uint16_t b) {
  const int e = (b >> 7) & 0xFF, m = b & 0x7F;
  return e == 0 ? std::ldexp(double(m), -133) : std::ldexp(double(128 + m), e - 134);
}

/// A 16-bit format as a sorted table of its non-negative finite values (index == bit pattern),
/// plus the value the pattern just past the largest finite one would have if the exponent
/// range continued (the rounding boundary towards infinity is half-way to it).
struct Format {
  std::vector<double> values;
  double past_max;
  std::uint16_t inf_bits;

  /// Nearest pattern to f (round to nearest, ties to the even pattern), NaN excluded.
  std::uint16_t round(float f) const {
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(double(f));
    if (std::isinf(f)) return sign | inf_bits;
    const auto it = std::upper_bound(values.begin(), values.end(), a);
    const std::size_t lo = std::size_t(it - values.begin()) - 1;
    const double lo_v = values[lo];
    const double hi_v = lo + 1 < values.size() ? values[lo + 1] : past_max;
    std::size_t r = lo;
    if (a - lo_v > hi_v - a || (a - lo_v == hi_v - a && (lo & 1))) r = lo + 1;
    return std::uint16_t(sign | r);  // r == values.size() is exactly the infinity pattern
  }
};

const Format& f16_format() {
  static const Format f = [] {
    Format x{{}, 65536.0, 0x7C00};
    for (std::uint32_t h = 0; h < 0x7C00; ++h) x.values.push_back(f16_value(std::uint16_t(h)));
    return x;
  }();
  return f;
}

const Format& bf16_format() {
  static const Format f = [] {
    Format x{{}, std::ldexp(1.0, 128), 0x7F80};
    for (std::uint32_t b = 0; b < 0x7F80; ++b) x.values.push_back(bf16_value(std::uint16_t(b)));
    return x;
  }();
  return f;
}

bool is_nan16(std::uint16_t h, std::uint16_t exp_mask, std::uint16_t mant_mask) {
  return (h & exp_mask) == exp_mask && (h & mant_mask) != 0;
}

// ---- f16 -> f32 ---------------------------------------------------------------------------

TEST(HalfF16, EveryPatternDecodesExactly) {
  for (std::uint32_t u = 0; u < 0x10000; ++u) {
    const auto h = std::uint16_t(u);
    const float f = f16_bits_to_f32(h);
    const bool neg = h & 0x8000;
    if (is_nan16(h, 0x7C00, 0x3FF)) {
      // NaN: sign and payload carried into the top of the f32 mantissa.
      const std::uint32_t want =
          (std::uint32_t(neg) << 31) | 0x7F800000u | (std::uint32_t(h & 0x3FF) << 13);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f), want) << "h=0x" << std::hex << u;
      continue;
    }
    if ((h & 0x7FFF) == 0x7C00) {
      ASSERT_TRUE(std::isinf(f) && std::signbit(f) == neg) << "h=0x" << std::hex << u;
      continue;
    }
    ASSERT_EQ(double(f), (neg ? -1 : 1) * f16_value(h & 0x7FFF)) << "h=0x" << std::hex << u;
    ASSERT_EQ(std::signbit(f), neg) << "h=0x" << std::hex << u;  // −0 stays −0
  }
}

TEST(HalfF16, EveryPatternRoundTrips) {
  for (std::uint32_t u = 0; u < 0x10000; ++u) {
    const auto h = std::uint16_t(u);
    const std::uint16_t back = f32_to_f16_bits(f16_bits_to_f32(h));
    if (is_nan16(h, 0x7C00, 0x3FF)) {
      // NaN stays NaN, same sign and payload, quietened (bit 9 set).
      ASSERT_EQ(back, h | 0x200) << "h=0x" << std::hex << u;
    } else {
      ASSERT_EQ(back, h) << "h=0x" << std::hex << u;
    }
  }
}

// ---- f32 -> f16 ---------------------------------------------------------------------------

/// Every rounding boundary of the format: for each pair of neighbours (both signs), the exact
/// midpoint (a tie: even pattern wins) and the f32 values one ulp either side of it.
TEST(HalfF16, EveryMidpointRoundsToEvenAndNeighboursToNearest) {
  const Format& fmt = f16_format();
  int checked = 0;
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {
    const double hi = h + 1 < 0x7C00 ? fmt.values[h + 1] : fmt.past_max;
    const float mid = float((fmt.values[h] + hi) / 2);
    ASSERT_EQ(double(mid), (fmt.values[h] + hi) / 2) << "midpoint not exact in f32";
    const std::uint16_t even = std::uint16_t((h & 1) ? h + 1 : h);
    for (float s : {1.0f, -1.0f}) {
      const std::uint16_t sb = s < 0 ? 0x8000 : 0;
      ASSERT_EQ(f32_to_f16_bits(s * mid), sb | even) << "tie above h=0x" << std::hex << h;
      ASSERT_EQ(f32_to_f16_bits(s * std::nextafter(mid, 0.0f)), sb | h) << "h=0x" << std::hex << h;
      ASSERT_EQ(f32_to_f16_bits(s * std::nextafter(mid, INFINITY)), sb | (h + 1))
          << "h=0x" << std::hex << h;
      checked += 3;
    }
  }
  EXPECT_EQ(checked, 0x7C00 * 6);
}

TEST(HalfF16, OverflowBoundary) {
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7BFF);                       // below the tie
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // last finite
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);                        // tie -> "even" Inf
  EXPECT_EQ(f32_to_f16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(FLT_MAX), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-INFINITY), 0xFC00);
}

TEST(HalfF16, SubnormalsAndZeros) {
  EXPECT_EQ(f32_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000);  // tie between 0 and 1: even
  EXPECT_EQ(f32_to_f16_bits(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(3 * 0x1p-25f), 0x0002);        // tie between 1 and 2: even
  EXPECT_EQ(f32_to_f16_bits(1023 * 0x1p-24f), 0x03FF);     // largest subnormal
  EXPECT_EQ(f32_to_f16_bits(1023.5f * 0x1p-24f), 0x0400);  // tie carries into the exponent
  EXPECT_EQ(f32_to_f16_bits(0x1p-14f), 0x0400);            // smallest normal
  EXPECT_EQ(f32_to_f16_bits(0x1p-26f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(1e-40f), 0x0000);  // f32 subnormal input
  EXPECT_EQ(f32_to_f16_bits(-1e-40f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(HalfF16, NaNStaysQuietNaN) {
  for (std::uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FBFFFFFu, 0xFF800001u}) {
    const std::uint16_t h = f32_to_f16_bits(std::bit_cast<float>(bits));
    EXPECT_TRUE(is_nan16(h, 0x7C00, 0x3FF)) << std::hex << bits;
    EXPECT_TRUE(h & 0x200) << "not quiet: " << std::hex << bits;
    EXPECT_EQ(bool(h & 0x8000), bool(bits >> 31)) << std::hex << bits;
  }
}

/// Random f32 values concentrated on the exponents f16 can represent (and a margin around
/// them), against the table oracle.
TEST(HalfF16, RandomFloatsMatchOracle) {
  kvlayer::testing::Rng rng(0xF16);
  const Format& fmt = f16_format();
  for (int i = 0; i < 2'000'000; ++i) {
    std::uint32_t bits = std::uint32_t(rng.next());
    if (i % 4 != 0) {  // 3 in 4: exponent in [127−30, 127+17]
      const std::uint32_t e = std::uint32_t(rng.range(97, 144));
      bits = (bits & 0x807FFFFFu) | (e << 23);
    }
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16_bits(f), fmt.round(f)) << "bits=0x" << std::hex << bits;
  }
}

#ifdef __FLT16_MANT_DIG__
/// Second, compiler-provided oracle where the toolchain has _Float16 (its conversion routine is
/// round-to-nearest-even in software or F16C hardware).
TEST(HalfF16, RandomFloatsMatchCompilerFloat16) {
  kvlayer::testing::Rng rng(0xF17);
  for (int i = 0; i < 1'000'000; ++i) {
    const std::uint32_t e = std::uint32_t(rng.range(97, 144));
    const std::uint32_t bits = (std::uint32_t(rng.next()) & 0x807FFFFFu) | (e << 23);
    const float f = std::bit_cast<float>(bits);
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(f32_to_f16_bits(f), want) << "bits=0x" << std::hex << bits;
  }
}
#endif

// ---- bf16 -----------------------------------------------------------------------------------

TEST(HalfBf16, EveryPatternDecodesAndRoundTrips) {
  for (std::uint32_t u = 0; u < 0x10000; ++u) {
    const auto b = std::uint16_t(u);
    const float f = bf16_bits_to_f32(b);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), u << 16);
    if (is_nan16(b, 0x7F80, 0x7F)) {
      const std::uint16_t back = f32_to_bf16_bits(f);
      ASSERT_TRUE(is_nan16(back, 0x7F80, 0x7F)) << std::hex << u;
      ASSERT_EQ(back & 0x8000, b & 0x8000) << std::hex << u;
      continue;
    }
    if ((b & 0x7FFF) < 0x7F80) {
      ASSERT_EQ(double(f), ((b & 0x8000) ? -1 : 1) * bf16_value(b & 0x7FFF)) << std::hex << u;
    }
    ASSERT_EQ(f32_to_bf16_bits(f), b) << std::hex << u;
  }
}

TEST(HalfBf16, TiesOverflowAndNaN) {
  auto from = [](std::uint32_t bits) { return f32_to_bf16_bits(std::bit_cast<float>(bits)); };
  EXPECT_EQ(from(0x3F808000u), 0x3F80);  // tie, even stays
  EXPECT_EQ(from(0x3F818000u), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(from(0x3F807FFFu), 0x3F80);
  EXPECT_EQ(from(0x3F808001u), 0x3F81);
  EXPECT_EQ(from(0xBF818000u), 0xBF82);  // sign-magnitude: same on the negative side
  EXPECT_EQ(from(0x7F7F7FFFu), 0x7F7F);  // largest value that stays finite
  EXPECT_EQ(from(0x7F7F8000u), 0x7F80);  // tie at the top, odd: overflows to Inf
  EXPECT_EQ(f32_to_bf16_bits(FLT_MAX), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(-INFINITY), 0xFF80);
  EXPECT_EQ(from(0x00008000u), 0x0000);  // subnormal tie to even zero
  EXPECT_EQ(from(0x00018000u), 0x0002);
  const std::uint16_t nan = from(0x7F800001u);  // payload only in the low bits
  EXPECT_TRUE(is_nan16(nan, 0x7F80, 0x7F)) << std::hex << nan;
}

TEST(HalfBf16, RandomFloatsMatchOracle) {
  kvlayer::testing::Rng rng(0xBF16);
  const Format& fmt = bf16_format();
  for (int i = 0; i < 2'000'000; ++i) {
    const std::uint32_t bits = std::uint32_t(rng.next());
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16_bits(f), fmt.round(f)) << "bits=0x" << std::hex << bits;
  }
}

}  // namespace
