// The statistical check's statistic (reference/include/kvlayer/reference/systematic_check.hpp)
// on synthetic launches: zero-mean rounding-like noise of wildly different magnitude per
// element leaves |z| ~ |N(0, 1)| along both signatures; a relative error four times smaller
// than every element's noise, or an offset smaller than most elements' noise, is found along
// its own signature (and not along the other).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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

/// The bound's resolution of a launch, by hand: elements õ = 1, 2 with d = got − want of +2^-12
/// (along õ) and −2^-12 (against õ), bound 2^-10 each. A relative error β grows |d + β·õ| from
/// |d| where it goes d's way, or first through zero where it does not.
TEST(SystematicCheck, TheBoundResolutionIsTheSmallestRelativeErrorThatLeavesTheBound) {
  SystematicCheck c;
  const double u = std::ldexp(1.0, -12), b = std::ldexp(1.0, -10);
  const DecodeBound bound{{b, b}, {0.0, 0.0}, {1.0, 1.0}, {1.0, 2.0}, {1.0, 1.0}};
  c.record(1.0 + u, 1.0, bound, 0);  // d = +u along õ = 1
  c.record(2.0 - u, 2.0, bound, 1);  // d = −u against õ = 2
  // β > 0: element 0 at (b − u)/1, element 1 at (b + u)/2 → (b + u)/2. β < 0: element 0 at
  // (b + u)/1, element 1 at (b − u)/2 → (b − u)/2. The worse sign: (b + u)/2.
  EXPECT_DOUBLE_EQ(c.current_bound_resolution(), (b + u) / 2);
  // Without its bound, an element leaves the launch's bound resolution unknown.
  c.record(1.0, 1.0, 1e-3);
  EXPECT_EQ(c.current_bound_resolution(), INFINITY);
}

/// The statistic's resolution (closed form) against a scan: adding β·õ to every element, the
/// smallest β of the worse sign that reaches |z| ≥ 5.
TEST(SystematicCheck, TheStatisticResolutionMatchesAScanOfPlantedErrors) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int n = 2048;
  std::vector<double> o(n), a(n), r(n);
  for (int e = 0; e < n; ++e) {
    o[e] = rng.uniform() * 2 - 1;
    a[e] = std::ldexp(std::fabs(o[e]) + 0x1p-10, -int(rng.range(8, 14)));
    r[e] = a[e] * (2 * rng.uniform() - 1) * 0.3;
  }
  SystematicCheck c;
  for (int e = 0; e < n; ++e) c.record(o[e] + r[e], o[e], a[e]);
  const double closed = c.current_statistic_resolution();
  const auto z_at = [&](double beta) {
    SystematicCheck p;
    for (int e = 0; e < n; ++e) p.record(o[e] + r[e] + beta * o[e], o[e], a[e]);
    return std::fabs(p.current_z(SystematicCheck::output));
  };
  // The smallest β on a fine grid reaching |z| ≥ 5, per sign; the worse sign's.
  const auto first = [&](double sign) {
    for (double l = -30; l <= 0; l += 1.0 / 64)
      if (z_at(sign * std::exp2(l)) >= SystematicCheck::kReportZ) return std::exp2(l);
    return double(INFINITY);
  };
  const double scanned = std::max(first(1), first(-1));
  ASSERT_TRUE(std::isfinite(scanned));
  EXPECT_LE(closed, scanned);
  EXPECT_GE(closed, scanned * std::exp2(-1.0 / 64)) << "closed " << closed << " scan " << scanned;
  EXPECT_GE(z_at(closed * (1 + 1e-9)), SystematicCheck::kReportZ - 1e-6);
  EXPECT_GE(z_at(-closed * (1 + 1e-9)), SystematicCheck::kReportZ - 1e-6);
}

/// The noise model's counts and resolution: an element 3 sigma off along expected = 2 counts at
/// level 2 only; 8 sigma are reached by β = 5e/2 its way, (8 + 3)e/2 the other (the worse).
TEST(SystematicCheck, TheNoiseModelCountsRatiosAndItsResolution) {
  SystematicCheck c;
  const double e = std::ldexp(1.0, -20);
  DecodeBound b{{1.0}, {0.0}, {1.0}, {2.0}, {1.0}};
  b.expected = {2.0};
  b.sigma = {e};
  c.record(2.0 + 3 * e, 2.0, b, 0);
  EXPECT_DOUBLE_EQ(c.max_noise_ratio(), 3.0);
  EXPECT_EQ(c.noise_count(0), 1);
  EXPECT_EQ(c.noise_count(1), 0);
  EXPECT_DOUBLE_EQ(c.current_noise_resolution(), 11 * e / 2);
  // Without a sigma an element counts nowhere.
  c.record(2.5, 2.0, DecodeBound{{1.0}, {0.0}, {1.0}, {2.0}, {1.0}}, 0);
  EXPECT_EQ(c.noise_elements(), 1);
  EXPECT_DOUBLE_EQ(c.max_noise_ratio(), 3.0);
}

/// The declared check: the energy is the mean of ((got − expected)/sigma)² over a launch (an
/// output row); the relative error β along expected that takes it to the threshold (both
/// signs: the one that first lowers it, the worse, is reported); a launch at the threshold is
/// an alarm, one just below it is not.
TEST(SystematicCheck, TheEnergyAveragesTheLaunchAndAlarmsAtTheThreshold) {
  Rng rng(fresh_seed());
  const double tau = SystematicCheck::kNoiseThreshold;
  std::vector<double> o(256), d(256), sg(256);
  for (std::size_t e = 0; e < o.size(); ++e) {
    o[e] = rng.uniform() * 2 - 1;
    sg[e] = std::ldexp(std::fabs(o[e]) + 0x1p-10, -12);
    d[e] = sg[e] * (rng.uniform() - 0.5) / 4;  // clean: an eighth of a sigma at most
  }
  // The output a launch records for element e; the energy takes its residual as the check
  // sees it, got − expected (o + d rounds to double, so d alone would differ from it by up to
  // 2^-39 of itself).
  const auto got = [&](std::size_t e, double beta) { return o[e] + d[e] + beta * o[e]; };
  const auto energy_at = [&](double beta) {
    double sum = 0;
    for (std::size_t e = 0; e < o.size(); ++e) sum += std::pow((got(e, beta) - o[e]) / sg[e], 2);
    return sum / double(o.size());
  };
  const auto launch = [&](SystematicCheck& c, double beta) {
    for (std::size_t e = 0; e < o.size(); ++e) {
      DecodeBound b{{1.0}, {0.0}, {1.0}, {o[e]}, {1.0}};
      b.expected = {o[e]};
      b.sigma = {sg[e]};
      c.record(got(e, beta), o[e], b, 0);
    }
  };
  SystematicCheck c;
  launch(c, 0);
  EXPECT_NEAR(c.current_energy(), energy_at(0), 1e-12 * energy_at(0));
  EXPECT_LT(c.current_energy(), 1.0 / 64);
  const double beta = c.current_energy_resolution();
  ASSERT_TRUE(std::isfinite(beta) && beta > 0);
  EXPECT_NEAR(std::min(energy_at(beta), energy_at(-beta)), tau, 1e-9 * tau);
  EXPECT_GE(std::max(energy_at(beta), energy_at(-beta)), tau);
  // About four sigma per element (2^-12 of the output at most): β below 2^-9 reaches it.
  EXPECT_LT(beta, 0x1p-9);
  c.end_launch();
  EXPECT_EQ(c.noise_alarms(), 0);
  // The same launch planted just below and at the worse sign's β: no alarm, then one.
  const double down = energy_at(beta) < energy_at(-beta) ? beta : -beta;
  launch(c, down * (1 - 1e-6));
  EXPECT_LT(c.current_energy(), tau);
  c.end_launch();
  launch(c, down * (1 + 1e-6));
  EXPECT_GE(c.current_energy(), tau);
  c.end_launch();
  EXPECT_EQ(c.noise_alarms(), 1);
  EXPECT_GE(c.max_energy(), tau);
  EXPECT_NE(c.summary().find("1 of 3 launches >= 16 (alarms)"), std::string::npos) << c.summary();
}

TEST(SystematicCheck, TheSummaryReportsBothResolutions) {
  Rng rng(fresh_seed());
  SystematicCheck c;
  for (int l = 0; l < 10; ++l) {
    for (int e = 0; e < 128; ++e) {
      const double o = rng.uniform() + 0.5, b = 0x1p-8;
      c.record(o + 0x1p-12 * (rng.uniform() - 0.5), o, DecodeBound{{b}, {0.0}, {1.0}, {o}, {1.0}},
               0);
    }
    c.end_launch();
  }
  // Every element: |d| ≤ 2^-13, õ ≤ 1.5, bound 2^-8: the bound catches β ≈ 2^-8/1.5.
  EXPECT_LE(c.bound_resolution(0.5), 0x1p-8);
  EXPECT_GE(c.bound_resolution(0.5), 0x1p-9);
  EXPECT_LT(c.statistic_resolution(0.5), c.bound_resolution(0.5)) << c.summary();
  EXPECT_EQ(c.summary("verify d128").rfind("systematic check [verify d128]: ", 0), 0u)
      << c.summary("verify d128");
  EXPECT_NE(c.summary().find("smallest relative output error caught per launch: bound p50 2^"),
            std::string::npos)
      << c.summary();
}

}  // namespace
}  // namespace kvlayer::ref
