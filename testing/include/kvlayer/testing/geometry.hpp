// Geometries with the fields tests vary most; everything else at its default.
#pragma once

#include <cstdint>
#include <optional>

#include "kvlayer/geometry.hpp"

namespace kvlayer::testing {

inline Geometry flat_geometry(int heads, int hdk, int hdv, std::int64_t max_ctx,
                              std::optional<std::int64_t> window = std::nullopt) {
  Geometry g;
  g.n_kv_heads = heads;
  g.head_dim_k = hdk;
  g.head_dim_v = hdv;
  g.max_ctx = max_ctx;
  g.window = window;
  return g;
}

inline Geometry ring_geometry(int heads, int hdk, int hdv, std::int64_t max_ctx,
                              std::int64_t window, std::int64_t max_append,
                              std::int64_t rewind_slack) {
  Geometry g = flat_geometry(heads, hdk, hdv, max_ctx, window);
  g.storage = Storage::ring;
  g.max_append = max_append;
  g.rewind_slack = rewind_slack;
  return g;
}

}  // namespace kvlayer::testing
