// Snapshot properties of the reference layer (SPEC §13), with rapidcheck over random geometries
// (flat, windowed flat, rings with odd and tiny windows, rings capped by max_ctx):
//  - after any history (appends, rewinds, device-counter chains), snapshot() is accepted (SPEC
//    §6 keeps the restore plan's first row resident: a ring is never found lapped), holds the
//    rows [first, len) the layer reads back, and a restored copy then behaves as the original
//    under random commands (lockstep.hpp);
//  - a restored ring has room for every legal append (the claim of kvlayer/snapshot.hpp that
//    "a ring without room for len − first rows plus its headroom" cannot be asked for).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <string>

#include "kvlayer/snapshot.hpp"
#include "snapshot/lockstep.hpp"
#include "snapshot/snapshot_testbed.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

/// NOTE: resized to the full size, as in prop_layer.cpp (small sizes would give tiny layers).
/// Rings mostly with max_ctx well above rows (they rebase), sometimes capped by max_ctx.
rc::Gen<Geometry> gen_geometry(std::int64_t max_ctx_cap) {
  return rc::gen::resize(
      100, rc::gen::exec([max_ctx_cap] {
        Geometry g;
        g.n_kv_heads = *rc::gen::inRange(1, 3);
        g.head_dim_k = *rc::gen::element(32, 64);
        g.head_dim_v = *rc::gen::element(32, 64, 96);
        const int kind = *rc::gen::inRange(0, 4);  // flat, windowed flat, ring, ring
        if (kind >= 1)
          g.window = *rc::gen::oneOf(rc::gen::element<std::int64_t>(1, 2, 31, 32, 33, 61, 64),
                                     rc::gen::inRange<std::int64_t>(1, 100));
        g.max_ctx = *rc::gen::inRange<std::int64_t>(1, max_ctx_cap);
        if (kind >= 2) {
          g.storage = Storage::ring;
          g.max_append = *rc::gen::inRange<std::int64_t>(1, 12);
          g.rewind_slack = *rc::gen::inRange<std::int64_t>(0, 12);
          const std::int64_t rows = *g.window + g.max_append + g.rewind_slack + 31;
          g.max_ctx = *rc::gen::weightedOneOf<std::int64_t>(
              {{1, rc::gen::inRange<std::int64_t>(1, rows + 1)},
               {4, rc::gen::inRange<std::int64_t>(rows + 1, std::max(rows + 2, max_ctx_cap))}});
        }
        return g;
      }));
}

RC_GTEST_PROP(SnapshotProps, RestoredLayersBehaveAsTheOriginalAfterAnyHistory, ()) {
  const Geometry g = *gen_geometry(400);
  RC_TAG(g.is_ring() ? "ring" : g.window ? "windowed flat" : "flat");
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const int history = *rc::gen::inRange(0, 400);
  Rng rng(seed);
  // The history: the same random commands on a layer and a twin, so that the twin can then
  // serve as the "restored" side of lockstep() and drive the history alone.
  KvLayer original(g), twin(g);
  RC_ASSERT(lockstep(original, twin, rng, history) == "");

  const kvlayer::Snapshot s = original.snapshot();  // never refused: first ≥ base holds
  RC_ASSERT(s.first == plan_first(g, original.len()));
  RC_ASSERT(s.first >= original.base());
  RC_ASSERT(s.k == logical_bytes(original, Plane::k, s.first, s.len));
  RC_ASSERT(s.v == logical_bytes(original, Plane::v, s.first, s.len));

  KvLayer copy(g);
  copy.restore(s);
  RC_ASSERT(copy.base() == (g.is_ring() ? s.first : 0));
  RC_ASSERT(zero_outside(copy.k_plane(), g.k_tok_bytes(), s.first - copy.base(),
                         s.len - copy.base()) == "");
  RC_ASSERT(zero_outside(copy.v_plane(), g.v_tok_bytes(), s.first - copy.base(),
                         s.len - copy.base()) == "");
  RC_CLASSIFY(original.base() > 0, "rebased");
  RC_CLASSIFY(s.first > original.base(), "rows left behind");
  RC_ASSERT(lockstep(original, copy, rng, 80) == "");
}

RC_GTEST_PROP(SnapshotProps, ARestoredRingHasRoomForEveryLegalAppend, ()) {
  Geometry g = *gen_geometry(5000);
  g.storage = Storage::ring;
  if (!g.window) g.window = *rc::gen::inRange<std::int64_t>(1, 300);
  g.n_kv_heads = 1;
  g.head_dim_k = g.head_dim_v = 32;
  const std::int64_t len = *rc::gen::inRange<std::int64_t>(0, g.max_ctx + 1);
  // A snapshot as snapshot() would give it (its bytes do not matter here).
  kvlayer::Snapshot s;
  s.geometry = g;
  s.len = len;
  s.first = s.base = snapshot_first(g, len);
  s.k.assign(std::size_t(s.rows() * g.k_tok_bytes()), 0);
  s.v.assign(std::size_t(s.rows() * g.v_tok_bytes()), 0);
  RC_ASSERT(s.rows() <= g.rows());
  RC_CLASSIFY(g.rows() == g.max_ctx, "rows capped by max_ctx");
  RC_CLASSIFY(len > *g.window + 32, "len past the window");
  for (std::int64_t n = 1; n <= g.max_append && len + n <= g.max_ctx; ++n) {
    KvLayer copy(g);
    copy.restore(s);
    RC_ASSERT(!copy.plan_append(n).rebase);  // fits without even a rebase
    copy.reserve(n);
    RC_ASSERT(copy.base() == s.first);
  }
}

}  // namespace
}  // namespace kvlayer::testing
