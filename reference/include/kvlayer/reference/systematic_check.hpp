// The statistical checks of issue #34 over a stream of decode output rows (a decode, or one row
// of a verify: each is the decode of its own view). Where the rigorous bound (accuracy.hpp)
// cannot resolve a small systematic error, the residuals of a whole row can.
//
// The declared check (kvlayer/accuracy.hpp, noise model (N0)–(N4)): each element's residual
// from DecodeBound::expected in units of its DecodeBound::sigma; per row the energy
// E = mean(((GPU − expected)/sigma)²), near or below 1 for a correct GPU, an alarm at
// kNoiseThreshold (the harness fails the case). A systematic error β·expected adds
// β²·mean((expected/sigma)²) to E whatever its sign. Reported: E's distribution, the alarms,
// the largest per-element ratio, and per row the β that would have taken E to the threshold.
//
// Report only, from earlier sessions: the heteroscedasticity-robust z of the regression of the
// residual from õ on a signature (σ = õ: a relative error; σ = 1: an offset), z = Σ w·r·σ /
// sqrt(Σ w²·r²·σ²) with w = 1/a for the bound's rounding allowance a. Clean runs reach |z| in
// the hundreds (p's fp16 rounding gives each row its own relative error along õ; bench/NOTES.md,
// session 18), so nothing fails on it. Resolution per row: the smallest relative output error
// β (got → got + β·õ, the worse sign) that would have failed the bound somewhere, and the
// smallest that would have reached |z| ≥ 5 (closed form from five sums of the row).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::ref {

class SystematicCheck {
 public:
  enum Signature { output = 0, constant = 1 };
  static constexpr int kSignatures = 2;
  /// Launches with fewer compared elements carry no evidence (z of a handful is noise).
  static constexpr std::int64_t kMinElements = 64;
  /// |z| at or above this is counted in the report ("alarms"): a reporting line, not yet a
  /// declared threshold.
  static constexpr double kReportZ = 5.0;

  /// One compared element of the launch in progress: the system's value, õ and its noise
  /// scale a > 0 (an element with a ≤ 0 or a non-finite input is not recorded).
  void record(double got, double rounded, double noise_scale);
  /// The same for element i of a decode compared with its bound (want: the reference output);
  /// also feeds the launch's bound resolution.
  void record(double got, double want, const DecodeBound& b, std::size_t i);
  /// Closes the launch in progress: its z per signature enters the distribution (launches of
  /// fewer than kMinElements elements are counted apart and left out).
  void end_launch();
  void add(const SystematicCheck& other);

  std::int64_t launches() const { return launches_; }
  std::int64_t elements() const { return elements_; }
  std::int64_t small_launches() const { return small_launches_; }
  double max_abs_z(Signature s) const { return max_abs_z_[s]; }
  std::int64_t alarms(Signature s) const { return alarms_[s]; }
  /// |z| at percentile q in [0, 1] over the launches (the upper edge of its bin).
  double abs_z(Signature s, double q) const;
  /// The z of the launch in progress (0 before any element), for tests.
  double current_z(Signature s) const;
  /// For the launch in progress: the smallest relative output error (worse sign) the bound
  /// would have caught (+inf: none, or no element recorded with its bound) and the statistic
  /// at |z| ≥ kReportZ (+inf: none; 0: it already is there).
  double current_bound_resolution() const;
  double current_statistic_resolution() const;
  /// Over the launches: the resolution at percentile q (upper bin edge, 4 bins per octave;
  /// +inf when the q-th launch caught nothing), for the bound and for the statistic.
  double bound_resolution(double q) const;
  double statistic_resolution(double q) const;

  // The noise model (DecodeBound::expected, ::sigma): |GPU − expected| / sigma per element.
  static constexpr double kNoiseLevels[] = {2, 4, 8};
  /// The declared check's threshold on a launch's energy (accuracy.hpp, noise model).
  static constexpr double kNoiseThreshold = 16;
  /// The largest ratio over every element recorded with a sigma.
  double max_noise_ratio() const { return max_noise_ratio_; }
  /// Elements at or above kNoiseLevels[k].
  std::int64_t noise_count(int k) const { return noise_counts_[std::size_t(k)]; }
  std::int64_t noise_elements() const { return noise_elements_; }
  /// For the launch in progress: the smallest relative error β along expected (worse sign) that
  /// would have put an element at kNoiseLevels[2] sigmas (+inf: no element with a sigma).
  double current_noise_resolution() const;
  /// Over the launches: that resolution at percentile q (as bound_resolution).
  double noise_resolution(double q) const;
  /// The launch's energy: the mean of ((GPU − expected)/sigma)² over its elements with a sigma.
  double current_energy() const;
  /// For the launch in progress: the smallest relative error β along expected (worse sign) that
  /// would have raised its energy to kNoiseThreshold (0: it is there already; +inf: no element).
  double current_energy_resolution() const;
  /// Over the launches: the energy and that resolution at percentile q (upper bin edges).
  double energy(double q) const;
  double energy_resolution(double q) const;
  double max_energy() const { return max_energy_; }
  /// Launches whose energy reached kNoiseThreshold.
  std::int64_t noise_alarms() const { return noise_alarms_; }
  /// "systematic check: L launches of >= 64 elements (E elements, S smaller launches left
  /// out); |z| (report only) along o~ p50 A p99 B max C (N >= 5), along 1 p50 … max … (N >= 5);
  /// smallest relative output error caught per launch: bound p50 … p90 …, statistic p50 … p90 …;
  /// noise model: max |GPU - expected|/sigma …, elements >= 2: …, >= 4: …, >= 8: … of E; 8
  /// sigma reached per launch by p50 … p90 …; declared check: energy per launch p50 … p99 …
  /// max …, A of L launches >= 16 (alarms); the threshold reached by p50 … p90 …" (a launch:
  /// one output row). With a kernel path ("verify d128") the line names it: "systematic check
  /// [verify d128] …".
  std::string summary(const std::string& path = "") const;

 private:
  static constexpr double kBinWidth = 0.125;
  static constexpr int kBins = 512;  ///< |z| in [0, 64); the last bin holds everything above
  static constexpr int kResolutionBins = 4 * 48 + 1;  ///< log2 β in [−40, 8), last bin: none
  void record_residual(double got, double rounded, double noise_scale);
  static int resolution_bin(double beta);
  static double resolution_at(const std::vector<std::int64_t>& histogram, std::int64_t total,
                              double q);
  std::array<double, kSignatures> sum_r_sigma_{}, sum_r2_sigma2_{};
  // Along õ, in units of the noise scale a (ρ = r/a, κ = õ/a): A = Σ õρ, B = Σ õκ, C = Σ õ²ρ²,
  // D = Σ õ²ρκ, E = Σ õ²κ² (the statistic's resolution).
  double a_ = 0, b_ = 0, c_ = 0, d_ = 0, e_ = 0;
  // The bound's resolution so far: the smallest β > 0 (and −β) that fails some element.
  double bound_up_ = INFINITY, bound_down_ = INFINITY;
  std::int64_t unbounded_ = 0;  ///< elements of the launch recorded without their bound
  std::int64_t in_launch_ = 0;
  std::vector<std::int64_t> bound_histogram_ = std::vector<std::int64_t>(kResolutionBins, 0),
                            statistic_histogram_ = std::vector<std::int64_t>(kResolutionBins, 0);
  std::int64_t bound_launches_ = 0;
  double noise_up_ = INFINITY, noise_down_ = INFINITY;  ///< the launch in progress
  std::int64_t noise_in_launch_ = 0, noise_launches_ = 0, noise_elements_ = 0;
  std::vector<std::int64_t> noise_histogram_ = std::vector<std::int64_t>(kResolutionBins, 0);
  std::array<std::int64_t, 3> noise_counts_{};
  double max_noise_ratio_ = 0;
  // The energy of the launch in progress, in units of sigma (ρ = r/σ, κ = expected/σ):
  // Σ ρ², Σ ρκ, Σ κ² over its noise_in_launch_ elements.
  double energy_rr_ = 0, energy_rk_ = 0, energy_kk_ = 0;
  std::vector<std::int64_t> energy_histogram_ = std::vector<std::int64_t>(kResolutionBins, 0),
                            energy_resolution_histogram_ =
                                std::vector<std::int64_t>(kResolutionBins, 0);
  double max_energy_ = 0;
  std::int64_t noise_alarms_ = 0;
  std::int64_t launches_ = 0, elements_ = 0, small_launches_ = 0;
  std::array<double, kSignatures> max_abs_z_{};
  std::array<std::int64_t, kSignatures> alarms_{};
  std::array<std::vector<std::int64_t>, kSignatures> histogram_{
      std::vector<std::int64_t>(kBins, 0), std::vector<std::int64_t>(kBins, 0)};
};

}  // namespace kvlayer::ref
