#include "kvlayer/snapshot.hpp"

#include <algorithm>
#include <tuple>

#include "kvlayer/error.hpp"

namespace kvlayer {

std::int64_t snapshot_first(const Geometry& g, std::int64_t len) {
  if (!g.is_ring()) return 0;
  return align_down(std::max<std::int64_t>(0, len - (*g.window - 1)));
}

bool same_layout(const Geometry& a, const Geometry& b) {
  const bool same = a.n_kv_heads == b.n_kv_heads && a.head_dim_k == b.head_dim_k &&
                    a.head_dim_v == b.head_dim_v && a.max_ctx == b.max_ctx &&
                    a.window == b.window && a.storage == b.storage;
  if (!same || !a.is_ring()) return same;
  return a.max_append == b.max_append && a.rewind_slack == b.rewind_slack;
}

void validate_snapshot_rows(const Snapshot& s, const char* operation) {
  const Geometry& g = s.geometry;
  try {
    g.validate();
  } catch (const Error& e) {
    refuse(operation, "snapshot ", e.what());
  }
  if (s.len < 0 || s.len > g.max_ctx)
    refuse(operation, "snapshot len ", s.len, " is outside [0, max_ctx ", g.max_ctx, "]");
  const std::int64_t first = snapshot_first(g, s.len);
  if (s.first != first)
    refuse(
        operation, "snapshot first ", s.first, " is not the restore plan's first row ", first,
        " for len ", s.len,
        g.is_ring() ? " (ring: align_down(len - (window - 1)))" : " (flat layers keep every row)");
  if (!g.is_ring() && s.base != 0)
    refuse(operation, "snapshot base ", s.base, " must be 0 on a flat layer");
  if (g.is_ring() && (s.base < 0 || s.base % kRingAlign != 0))
    refuse(operation, "snapshot base ", s.base, " must be a non-negative multiple of ", kRingAlign);
  if (s.base > s.first)
    refuse(operation, "snapshot base ", s.base, " is above its first row ", s.first,
           " (lapped: the ring had dropped rows the snapshot must hold)");
}

void validate_snapshot(const Snapshot& s, const char* operation) {
  validate_snapshot_rows(s, operation);
  const Geometry& g = s.geometry;
  for (auto [name, bytes, tok] :
       {std::tuple{"K", &s.k, g.k_tok_bytes()}, std::tuple{"V", &s.v, g.v_tok_bytes()}}) {
    const std::int64_t want = s.rows() * tok;
    if (std::int64_t(bytes->size()) != want)
      refuse(operation, "snapshot ", name, " holds ", bytes->size(), " bytes, expected ", want,
             " (rows [", s.first, ", ", s.len, ") x ", tok, ")");
  }
}

void check_restore(const Snapshot& s, const Geometry& layer, const char* operation) {
  if (!same_layout(s.geometry, layer))
    refuse(operation, "snapshot geometry '", s.geometry.describe(), "' differs from the layer's '",
           layer.describe(), "'");
  validate_snapshot(s, operation);
}

}  // namespace kvlayer
