// Deterministic test data from a seed, so a replay file stores seeds, not values.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/testing/rng.hpp"
#include "kvlayer/testing/rows.hpp"

namespace kvlayer::harness {

using testing::HostRows;
using testing::Rng;

/// n rows of K (kv_dim_k values each) and V (kv_dim_v) drawn from (seed, kind), rounded to the
/// case's dtype so that every side sees exactly the same inputs.
HostRows make_rows(const Geometry& g, DType dtype, std::int64_t n, std::uint64_t seed,
                   DataKind kind);

/// A query [n_q_heads × head_dim_k] f32 drawn from seed (gaussian, scale 10^u, u in [−1, 1]).
std::vector<float> make_query(const Geometry& g, int n_q_heads, std::uint64_t seed);

}  // namespace kvlayer::harness
