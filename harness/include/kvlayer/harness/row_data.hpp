// Deterministic test data from a seed, so a replay file stores seeds, not values.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlayer/harness/commands.hpp"

namespace kvlayer::harness {

/// splitmix64: small, fast, and the same on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform integer in [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi);
  /// Standard normal (Box–Muller).
  double normal();

 private:
  std::uint64_t state_;
};

/// Rows of K or V for an append: f32 values and their encoding in the case's dtype.
struct HostRows {
  std::vector<float> k, v;                 ///< values as f32 (exactly representable in dtype)
  std::vector<std::uint8_t> k_bytes, v_bytes;  ///< the same values encoded as dtype
  std::int64_t n = 0;
  DType dtype = DType::f32;
};

/// n rows of K (kv_dim_k values each) and V (kv_dim_v) drawn from (seed, kind), rounded to the
/// case's dtype so that every side sees exactly the same inputs.
HostRows make_rows(const Geometry& g, DType dtype, std::int64_t n, std::uint64_t seed,
                   DataKind kind);

/// A query [n_q_heads × head_dim_k] f32 drawn from seed (gaussian, scale 10^u, u in [−1, 1]).
std::vector<float> make_query(const Geometry& g, int n_q_heads, std::uint64_t seed);

}  // namespace kvlayer::harness
