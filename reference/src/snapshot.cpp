// ref::KvLayer::snapshot and restore (SPEC §13): the live rows out of a layer, and into a fresh
// one at the restore plan's base.
#include <algorithm>
#include <cstring>

#include "kvlayer/error.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::ref {

Snapshot KvLayer::snapshot() const {
  const Geometry& g = geometry_;
  if (len_d_ != len_)
    refuse("snapshot", "len_d ", len_d_, " != len ", len_,
           " (account for replayed device-counter steps with account_steps first)");
  const std::int64_t first = snapshot_first(g, len_);
  if (first < base_)
    refuse("snapshot", "first row ", first, " (len ", len_, ", window ", g.window.value_or(0),
           ") is below base ", base_, ": the ring no longer holds it (lapped)");
  Snapshot s;
  s.geometry = g;
  s.len = len_;
  s.first = first;
  s.base = base_;
  const auto rows = std::size_t(len_ - first);
  const auto from = std::size_t(first - base_);
  s.k.assign(k_plane_.begin() + std::ptrdiff_t(from * g.k_tok_bytes()),
             k_plane_.begin() + std::ptrdiff_t((from + rows) * g.k_tok_bytes()));
  s.v.assign(v_plane_.begin() + std::ptrdiff_t(from * g.v_tok_bytes()),
             v_plane_.begin() + std::ptrdiff_t((from + rows) * g.v_tok_bytes()));
  return s;
}

void KvLayer::restore(const Snapshot& s) {
  check_restore(s, geometry_, "restore");
  if (!fresh_)
    refuse("restore",
           "the layer is not fresh (an append, rewind, reserve, device-counter step, "
           "account_steps or restore was accepted since its construction); restore "
           "into a newly constructed layer");
  const std::int64_t base = geometry_.is_ring() ? s.first : 0;
  const std::int64_t physical = s.first - base;
  std::copy(s.k.begin(), s.k.end(),
            k_plane_.begin() + std::ptrdiff_t(physical * geometry_.k_tok_bytes()));
  std::copy(s.v.begin(), s.v.end(),
            v_plane_.begin() + std::ptrdiff_t(physical * geometry_.v_tok_bytes()));
  len_ = len_d_ = s.len;
  base_ = base_d_ = base;
  fresh_ = false;
}

}  // namespace kvlayer::ref
