// What the batch tests and the harness's batch commands draw (SPEC §12).
#pragma once

#include <numeric>
#include <utility>
#include <vector>

#include "kvlayer/testing/rng.hpp"

namespace kvlayer::testing {

/// A random active list: a random subset of [0, max_batch) in random order, empty one time in
/// ten.
inline std::vector<int> draw_active(int max_batch, Rng& rng) {
  std::vector<int> all(static_cast<std::size_t>(max_batch));
  std::iota(all.begin(), all.end(), 0);
  for (std::size_t i = all.size(); i > 1; --i)
    std::swap(all[i - 1], all[std::size_t(rng.range(0, std::int64_t(i) - 1))]);
  all.resize(std::size_t(rng.chance(10) ? 0 : rng.range(1, max_batch)));
  return all;
}

}  // namespace kvlayer::testing
