// A layer's live state taken out of it (SPEC §13): what KvLayer::snapshot() returns (reference
// and CUDA alike), what KvLayer::restore() takes, and what save_snapshot / load_snapshot
// (snapshot_file.hpp) keep in a GGUF file. Plain host data.
// NOTE: not kvlayer::testing::Snapshot, the tests' whole-state comparison (every plane byte).
#pragma once

#include <cstdint>
#include <vector>

#include "kvlayer/geometry.hpp"

namespace kvlayer {

/// The first logical row a snapshot of a layer at length `len` holds: 0 on a flat layer (with
/// or without a window), and on a ring align_down(max(0, len − (window − 1))), the oldest row
/// the next append's window can reach (the restore plan, SPEC §13).
std::int64_t snapshot_first(const Geometry& g, std::int64_t len);

/// The live state of a layer: its geometry, len, and the K and V bytes of the logical rows
/// [first, len), row after row as in the planes (SPEC §2).
struct Snapshot {
  Geometry geometry;
  std::int64_t len = 0;
  std::int64_t first = 0;  ///< snapshot_first(geometry, len)
  /// The source layer's base when the snapshot was taken: 0 on a flat layer, a multiple of 32
  /// at most `first` on a ring. Informational (a restore sets base = first on a ring).
  std::int64_t base = 0;
  std::vector<std::uint8_t> k;  ///< (len − first) · k_tok_bytes bytes of q8_0 blocks
  std::vector<std::uint8_t> v;  ///< (len − first) · v_tok_bytes bytes of q5_1 blocks

  /// Rows held: len − first.
  std::int64_t rows() const { return len - first; }
};

/// True when two geometries give layers of the same layout and behaviour: every field equal,
/// except max_append and rewind_slack on flat storage, which SPEC §6 ignores there.
bool same_layout(const Geometry& a, const Geometry& b);

/// Refuses (kvlayer::Error, refused: "<operation>: snapshot …", naming the value and the
/// limit) a malformed snapshot: an illegal geometry ("<operation>: snapshot geometry: …"), len
/// outside [0, max_ctx], first other than snapshot_first(geometry, len), a base that is not 0
/// (flat) or a multiple of 32 in [0, first] (ring; base > first means the ring had dropped rows the
/// snapshot needs: lapped), or byte counts that are not rows() whole K and V rows.
void validate_snapshot(const Snapshot& s, const char* operation);

/// validate_snapshot without the byte counts: the geometry, len, first and base alone (a reader
/// checks these before it trusts a row count enough to allocate).
void validate_snapshot_rows(const Snapshot& s, const char* operation);

/// Refuses restoring `s` into a layer of geometry `layer`: another layout (same_layout), or a
/// malformed snapshot (validate_snapshot). Whether the layer is fresh is the layer's check.
/// NOTE: SPEC §13 also refuses "a ring without room for len − first rows plus its headroom".
/// With the source's own geometry that cannot happen: len − first ≤ window + 30, and a ring has
/// rows = min(max_ctx, window + max_append + rewind_slack + 31), so the rows plus any append of
/// up to max_append rows fit without a rebase (or rows = max_ctx ≥ len + n). The test
/// tests/snapshot/prop_snapshot.cpp keeps that claim honest.
void check_restore(const Snapshot& s, const Geometry& layer, const char* operation);

}  // namespace kvlayer
