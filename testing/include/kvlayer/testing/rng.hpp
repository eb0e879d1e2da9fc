// The deterministic generator of the tests and the harness: a replay file stores seeds, not
// values, so every stream drawn from it must stay the same.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace kvlayer::testing {

/// splitmix64: the same seed gives the same inputs with every standard library (unlike the
/// std distributions).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi) with 24 random bits.
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * 0x1p-24f; }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [-1, 1), from uniform().
  float sym() { return float(2.0 * uniform() - 1.0); }
  /// Uniform integer in [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    return lo + std::int64_t(next() % std::uint64_t(hi - lo + 1));
  }
  /// True with probability percent / 100.
  bool chance(int percent) { return range(0, 99) < percent; }
  /// Standard normal (Box–Muller), from two uniform() draws.
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t s_;
};

/// A seed no earlier run used, for tests that draw fresh inputs each run (print it with every
/// failure, e.g. in a SCOPED_TRACE, so that the run can be repeated).
inline std::uint64_t fresh_seed() {
  std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

}  // namespace kvlayer::testing
