// Shared by the snapshot tests (reference, properties, CUDA): SPEC §13's restore plan re-derived
// from the text, the bytes a layer holds for a range of logical rows, and the comparison of two
// layers that should hold the same logical rows at different physical rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::testing {

/// SPEC §13, from the text (not kvlayer::snapshot_first): 0 on a flat layer; on a ring the
/// oldest row the next append's window needs, rounded down to 32.
inline std::int64_t plan_first(const Geometry& g, std::int64_t len) {
  if (g.storage != Storage::ring) return 0;
  const std::int64_t oldest = std::max<std::int64_t>(0, len - (*g.window - 1));
  return oldest / 32 * 32;
}

/// The bytes of logical rows [from, to) of one plane of a reference layer, read at
/// physical = logical − base.
inline std::vector<std::uint8_t> logical_bytes(const ref::KvLayer& l, Plane p, std::int64_t from,
                                               std::int64_t to) {
  const std::int64_t tb = p == Plane::k ? l.geometry().k_tok_bytes() : l.geometry().v_tok_bytes();
  const auto& plane = p == Plane::k ? l.k_plane() : l.v_plane();
  return {plane.begin() + (from - l.base()) * tb, plane.begin() + (to - l.base()) * tb};
}

/// "" when both layers hold the same len, len_d, and the same bytes for every logical row both
/// still hold ([max(base a, base b), len)), else the first difference.
inline std::string logical_diff(const ref::KvLayer& a, const ref::KvLayer& b) {
  std::ostringstream s;
  if (a.len() != b.len()) s << "len " << a.len() << " vs " << b.len() << "; ";
  if (a.len_d() != b.len_d()) s << "len_d " << a.len_d() << " vs " << b.len_d() << "; ";
  if (!s.str().empty()) return s.str();
  const std::int64_t from = std::max(a.base(), b.base());
  for (Plane p : {Plane::k, Plane::v})
    for (std::int64_t r = from; r < a.len(); ++r)
      if (logical_bytes(a, p, r, r + 1) != logical_bytes(b, p, r, r + 1)) {
        s << (p == Plane::k ? "K" : "V") << " of logical row " << r << " differs (bases "
          << a.base() << ", " << b.base() << "); ";
        return s.str();
      }
  return "";
}

/// "" when every byte of `plane` outside physical rows [begin, end) is zero.
inline std::string zero_outside(const std::vector<std::uint8_t>& plane, std::int64_t tok_bytes,
                                std::int64_t begin, std::int64_t end) {
  for (std::size_t i = 0; i < plane.size(); ++i) {
    const std::int64_t row = std::int64_t(i) / tok_bytes;
    if ((row < begin || row >= end) && plane[i] != 0)
      return "byte " + std::to_string(i) + " (physical row " + std::to_string(row) +
             ") is not zero, outside the restored rows [" + std::to_string(begin) + ", " +
             std::to_string(end) + ")";
  }
  return "";
}

}  // namespace kvlayer::testing
