// What the batch tests and the harness's batch commands draw (SPEC §12).
#pragma once

#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "kvlayer/reference/kv_batch.hpp"
#include "kvlayer/reference/kv_layer.hpp"
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

/// The keys of each active position's view, in list order, as a batch launch of t queries'
/// schedule sees them (cuda::KvBatch::accumulation_shapes): a verify's the union of its rows'
/// views; 0 where the model refused the view (want[j] empty: the device gives it no split) or
/// the view is empty.
inline std::vector<std::int64_t> batch_view_keys(
    const ref::KvBatch& model, const std::vector<std::optional<std::vector<double>>>& want, int t) {
  std::vector<std::int64_t> keys;
  const Geometry& g = model.geometry();
  for (std::size_t j = 0; j < model.active().size(); ++j) {
    const ref::KvLayer& layer = model.layer(model.active()[j]);
    if (j >= want.size() || !want[j] || layer.len_d() < t || layer.len_d() <= 0) {
      keys.push_back(0);
      continue;
    }
    const std::vector<ref::DecodeView> views =
        ref::verify_views(g, layer.len_d(), g.window ? layer.base_d() : 0, t);
    keys.push_back(views.back().end - views.front().begin);
  }
  return keys;
}

}  // namespace kvlayer::testing
