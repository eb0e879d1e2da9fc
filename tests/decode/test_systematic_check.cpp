// The statistical check's statistic (reference/include/kvlayer/reference/systematic_check.hpp)
// on synthetic launches: zero-mean rounding-like noise of wildly different magnitude per
// element leaves |z| ~ |N(0, 1)| along both signatures; a relative error four times smaller
// than every element's noise, or an offset smaller than most elements' noise, is found along
// its own signature (and not along the other).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kvlayer/reference/systematic_check.hpp"
#include "kvlayer/testing/rng.hpp"

namespace kvlayer::ref {
namespace {

using testing::fresh_seed;
using testing::Rng;


/// One launch of n elements: õ ~ U(−1, 1), got = (1 + beta)·õ + offset + noise, the noise of
/// element e uniform with half-width 2^-k_e·(|õ| + 2^-10) (relative, with a floor), k_e drawn
/// in [k_lo, k_hi] per element (heteroscedastic when they differ).
void launch(SystematicCheck& c, Rng& rng, int n, double beta, double offset, int k_lo = 8,
            int k_hi = 20) {
  for (int e = 0; e < n; ++e) {
    const double o = rng.uniform() * 2 - 1;
    const double width = std::ldexp(std::fabs(o) + 0x1p-10, -int(rng.range(k_lo, k_hi)));
    c.record((1 + beta) * o + offset + width * (2 * rng.uniform() - 1), o, width);
  }
  c.end_launch();
}

TEST(SystematicCheck, CleanNoiseOfAnyMagnitudeStaysNearTheNormal) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SystematicCheck c;
  for (int l = 0; l < 2000; ++l) launch(c, rng, 1024, 0, 0);
  EXPECT_EQ(c.launches(), 2000);
  for (const auto s : {SystematicCheck::output, SystematicCheck::constant}) {
    // |N(0, 1)|: median 0.674, 99th percentile 2.58; P(|z| ≥ 6) = 2e-9 per launch.
    EXPECT_GT(c.abs_z(s, 0.5), 0.5) << c.summary();
    EXPECT_LT(c.abs_z(s, 0.5), 0.9) << c.summary();
    EXPECT_LT(c.abs_z(s, 0.99), 3.5) << c.summary();
    EXPECT_LT(c.max_abs_z(s), 6.0) << c.summary();
  }
}

TEST(SystematicCheck, ARelativeErrorBelowTheNoiseIsFoundAlongTheOutput) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SystematicCheck c;
  // 2^-10 against noise of relative half-width 2^-8 at every element: z ≈ 0.32·sqrt(8192) = 29.
  launch(c, rng, 8192, std::ldexp(1.0, -10), 0, 8, 8);
  EXPECT_GT(c.max_abs_z(SystematicCheck::output), 10.0) << c.summary();
  EXPECT_EQ(c.alarms(SystematicCheck::output), 1);
  EXPECT_LT(c.max_abs_z(SystematicCheck::constant), 6.0) << c.summary();
}

TEST(SystematicCheck, AnOffsetBelowTheNoiseIsFoundAlongTheConstant) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SystematicCheck c;
  // 2^-12 against noise of half-width 2^-8·(|õ| + 2^-10): larger than the offset wherever
  // |õ| > 2^-4, i.e. at 94% of the elements.
  launch(c, rng, 8192, 0, std::ldexp(1.0, -12), 8, 8);
  EXPECT_GT(c.max_abs_z(SystematicCheck::constant), 10.0) << c.summary();
  EXPECT_LT(c.max_abs_z(SystematicCheck::output), 6.0) << c.summary();
}

TEST(SystematicCheck, SmallLaunchesAreLeftOutAndTotalsAdd) {
  Rng rng(fresh_seed());
  SystematicCheck a, b;
  launch(a, rng, int(SystematicCheck::kMinElements) - 1, 0.5, 0);  // evidence of nothing
  EXPECT_EQ(a.launches(), 0);
  EXPECT_EQ(a.small_launches(), 1);
  EXPECT_EQ(a.max_abs_z(SystematicCheck::output), 0.0);
  launch(b, rng, 256, 0, 0);
  launch(b, rng, 4096, 0.01, 0);
  a.add(b);
  EXPECT_EQ(a.launches(), 2);
  EXPECT_EQ(a.elements(), 256 + 4096);
  EXPECT_EQ(a.small_launches(), 1);
  EXPECT_EQ(a.alarms(SystematicCheck::output), 1);
  EXPECT_EQ(a.max_abs_z(SystematicCheck::output), b.max_abs_z(SystematicCheck::output));
  EXPECT_NE(a.summary().find("2 launches of >= 64 elements (4352 elements, 1 smaller launches"),
            std::string::npos)
      << a.summary();
}

}  // namespace
}  // namespace kvlayer::ref
