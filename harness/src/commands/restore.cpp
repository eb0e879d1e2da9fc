// restore: a snapshot of the current state restored into a new, fresh layer on each side, on
// which the case goes on (SPEC §13); now and then into the current layer, refused unless fresh.
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

/// More often on a ring whose snapshot would start above its base: only there does the restore
/// move the rows (to physical row 0), so only there can it put them in the wrong place.
int Restore::weight(const GenView& v) {
  return v.geometry.is_ring() && snapshot_first(v.geometry, v.twin.len()) > v.twin.base() ? 4 : 1;
}

/// Into a fresh layer mostly (shrinks there); one in six into the current one.
Restore Restore::gen(const GenView&, Draw& d) {
  return Restore{d.in_range(0, 6) == 5};
}

/// The twin follows: restored into a new twin (its geometry and max_verify), or refused where
/// the real sides refuse (a snapshot with steps unaccounted, a current layer not fresh).
void Restore::apply(ref::KvLayer& twin) const {
  const kvlayer::Snapshot s = twin.snapshot();
  if (into_current) return twin.restore(s);
  ref::KvLayer fresh(twin.geometry(), twin.max_verify());
  fresh.restore(s);
  twin = std::move(fresh);
}

std::optional<std::string> Restore::run(Sides& s) const {
  const Sides::Snapshots snapshots = s.take_snapshots();
  if (snapshots.diff || !snapshots.model) return snapshots.diff;
  return s.restore(snapshots, into_current).diff;
}

}  // namespace kvlayer::harness
