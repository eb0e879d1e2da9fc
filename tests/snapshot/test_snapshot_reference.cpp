// Snapshots and restores of the reference layer (SPEC §13): which rows a snapshot holds (every
// row on a flat layer, from the restore plan's first row on a ring), where a restore puts them
// (physical logical − base, base = first on a ring) with every other byte zero, that the
// restored layer then behaves as the original under every command, and every refusal, with its
// exact message and the layer unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/snapshot.hpp"
#include "snapshot/lockstep.hpp"
#include "snapshot/snapshot_testbed.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

/// window 61, max_append 5, rewind_slack 3: rows 100 (as in test_ring_reference.cpp).
Geometry ring61() {
  return ring_geometry(2, 32, 64, 1000, 61, 5, 3);
}

/// The quantized bytes of every row appended so far, by logical row (the test's own record).
struct Written {
  std::vector<std::vector<std::uint8_t>> k, v;
  void add(const Geometry& g, const HostRows& r) {
    for (std::int64_t i = 0; i < r.n; ++i) {
      std::vector<std::uint8_t> kb(std::size_t(g.k_tok_bytes())), vb(std::size_t(g.v_tok_bytes()));
      (void)ref::quantize_row(BlockType::q8_0, r.row(Plane::k, i, g), kb);
      (void)ref::quantize_row(BlockType::q5_1, r.row(Plane::v, i, g), vb);
      k.push_back(kb);
      v.push_back(vb);
    }
  }
  /// Rows [from, to) concatenated.
  std::vector<std::uint8_t> range(Plane p, std::int64_t from, std::int64_t to) const {
    std::vector<std::uint8_t> out;
    for (std::int64_t r = from; r < to; ++r) {
      const auto& row = (p == Plane::k ? k : v)[std::size_t(r)];
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }
};

/// A layer filled to `len` by appends of 1..max rows.
struct Filled {
  KvLayer layer;
  Written written;
  Filled(const Geometry& g, std::int64_t len, std::uint64_t seed) : layer(g) {
    Rng rng(seed);
    const std::int64_t max = g.is_ring() ? g.max_append : 7;
    while (layer.len() < len) {
      const HostRows r = random_rows(g, std::min(rng.range(1, max), len - layer.len()), rng);
      layer.append(r.f32_view());
      written.add(g, r);
    }
  }
};

TEST(SnapshotReference, FlatLayersHoldEveryRowFromZero) {
  for (const Geometry& g : {flat_geometry(2, 32, 64, 300), flat_geometry(1, 64, 32, 300, 17)}) {
    SCOPED_TRACE(g.describe());
    for (std::int64_t len : {0, 1, 17, 120, 300}) {
      const Filled f(g, len, std::uint64_t(len) + 3);
      const kvlayer::Snapshot s = f.layer.snapshot();
      EXPECT_TRUE(same_layout(s.geometry, g));
      EXPECT_EQ(s.len, len);
      EXPECT_EQ(s.first, 0);
      EXPECT_EQ(s.base, 0);
      EXPECT_EQ(s.rows(), len);
      EXPECT_EQ(s.k, f.written.range(Plane::k, 0, len)) << "len " << len;
      EXPECT_EQ(s.v, f.written.range(Plane::v, 0, len)) << "len " << len;
    }
  }
}

TEST(SnapshotReference, RingsHoldTheRestorePlansRowsAcrossRebases) {
  const Geometry g = ring61();
  int above_base = 0;
  // Around the window, around a rebase (len 100 is exactly full) and after several.
  for (std::int64_t len : {0, 1, 60, 61, 62, 92, 93, 94, 100, 101, 124, 125, 333}) {
    const Filled f(g, len, std::uint64_t(len) * 7 + 1);
    const kvlayer::Snapshot s = f.layer.snapshot();
    const std::int64_t first = std::max<std::int64_t>(0, len - 60) / 32 * 32;
    EXPECT_EQ(s.first, first) << "len " << len;
    EXPECT_EQ(s.len, len);
    EXPECT_EQ(s.base, f.layer.base());
    EXPECT_LE(s.base, s.first);
    above_base += s.first > s.base;
    EXPECT_EQ(s.k, f.written.range(Plane::k, first, len)) << "len " << len;
    EXPECT_EQ(s.v, f.written.range(Plane::v, first, len)) << "len " << len;
  }
  // Some snapshots start above the layer's base: the rows below first are left behind.
  EXPECT_GT(above_base, 2);
}

TEST(SnapshotReference, RestoreIntoARingStartsAtPhysicalRowZero) {
  const Geometry g = ring61();
  for (std::int64_t len : {0, 45, 61, 93, 101, 333}) {
    SCOPED_TRACE("len " + std::to_string(len));
    const Filled f(g, len, std::uint64_t(len) + 11);
    const kvlayer::Snapshot s = f.layer.snapshot();
    KvLayer r(g);
    r.restore(s);
    const std::int64_t first = plan_first(g, len);
    EXPECT_EQ(r.len(), len);
    EXPECT_EQ(r.len_d(), len);
    EXPECT_EQ(r.base(), first);
    EXPECT_EQ(r.base_d(), first);
    EXPECT_TRUE(r.status().ok());
    EXPECT_FALSE(r.fresh());
    const std::int64_t n = len - first;
    EXPECT_EQ(
        std::vector<std::uint8_t>(r.k_plane().begin(), r.k_plane().begin() + n * g.k_tok_bytes()),
        f.written.range(Plane::k, first, len));
    EXPECT_EQ(
        std::vector<std::uint8_t>(r.v_plane().begin(), r.v_plane().begin() + n * g.v_tok_bytes()),
        f.written.range(Plane::v, first, len));
    EXPECT_EQ(zero_outside(r.k_plane(), g.k_tok_bytes(), 0, n), "");
    EXPECT_EQ(zero_outside(r.v_plane(), g.v_tok_bytes(), 0, n), "");
    EXPECT_EQ(r.physical_rows(first, len), std::make_pair(std::int64_t(0), n));
  }
}

TEST(SnapshotReference, RestoreIntoAFlatLayerPutsRowsAtTheirLogicalRows) {
  for (const Geometry& g : {flat_geometry(2, 32, 64, 200), flat_geometry(2, 32, 64, 200, 9)}) {
    SCOPED_TRACE(g.describe());
    const Filled f(g, 150, 5);
    KvLayer r(g);
    r.restore(f.layer.snapshot());
    EXPECT_EQ(r.len(), 150);
    EXPECT_EQ(r.len_d(), 150);
    EXPECT_EQ(r.base(), 0);
    EXPECT_EQ(r.base_d(), 0);
    EXPECT_EQ(logical_bytes(r, Plane::k, 0, 150), f.written.range(Plane::k, 0, 150));
    EXPECT_EQ(logical_bytes(r, Plane::v, 0, 150), f.written.range(Plane::v, 0, 150));
    EXPECT_EQ(zero_outside(r.k_plane(), g.k_tok_bytes(), 0, 150), "");
    EXPECT_EQ(zero_outside(r.v_plane(), g.v_tok_bytes(), 0, 150), "");
  }
}

TEST(SnapshotReference, StaleRowsPastLenStayBehind) {
  // A rewind leaves stale bytes past len (SPEC §5); a snapshot holds only [first, len).
  const Geometry g = flat_geometry(1, 32, 32, 50);
  Filled f(g, 40, 9);
  f.layer.rewind(25);
  const kvlayer::Snapshot s = f.layer.snapshot();
  EXPECT_EQ(s.rows(), 25);
  KvLayer r(g);
  r.restore(s);
  EXPECT_EQ(zero_outside(r.k_plane(), g.k_tok_bytes(), 0, 25), "");
  EXPECT_NE(zero_outside(f.layer.k_plane(), g.k_tok_bytes(), 0, 25),
            "");  // the original's stale rows
}

TEST(SnapshotReference, RestoredLayersBehaveAsTheOriginal) {
  struct Case {
    Geometry g;
    std::int64_t len;
  };
  const Case cases[] = {
      {flat_geometry(2, 32, 64, 400), 90},
      {flat_geometry(1, 64, 64, 400, 23), 70},
      {ring61(), 0},
      {ring61(), 59},
      {ring61(), 150},
      {ring_geometry(1, 32, 32, 2000, 1, 4, 0), 77},        // window 1
      {ring_geometry(2, 32, 32, 130, 40, 16, 5), 120},      // rows = max_ctx
      {ring_geometry(1, 64, 32, 5000, 200, 24, 16), 1000},  // wide window, deep slack
  };
  LockstepCounts total;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.g.describe() + " restored at len " + std::to_string(c.len));
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      Filled f(c.g, c.len, seed);
      KvLayer copy(c.g);
      copy.restore(f.layer.snapshot());
      Rng rng(seed * 1000 + 7);
      EXPECT_EQ(lockstep(f.layer, copy, rng, 150, &total), "") << "seed " << seed;
    }
  }
  // Every kind of command ran, and the ring exception (a rewind below the copy's first row)
  // was met.
  EXPECT_GT(total.appends, 50);
  EXPECT_GT(total.rewinds, 50);
  EXPECT_GT(total.refused_rewinds, 0);
  EXPECT_GT(total.chains, 50);
  EXPECT_GT(total.decodes, 50);
  EXPECT_GT(total.verifies, 50);
}

TEST(SnapshotReference, ARestoredRingRefusesRewindsBelowItsFirstRow) {
  // SPEC §13's one difference: at len 125 the original still holds rows from base 32, the copy
  // from first = align_down(125 - 60) = 64.
  const Geometry g = ring61();
  Filled f(g, 125, 8);
  ASSERT_EQ(f.layer.base(), 32);
  KvLayer copy(g);
  copy.restore(f.layer.snapshot());
  ASSERT_EQ(copy.base(), 64);
  EXPECT_TRUE(f.layer.can_rewind_to(110));  // needs row align_down(50) = 32
  EXPECT_FALSE(copy.can_rewind_to(110));
  expect_refused_unchanged(
      copy, [&] { copy.rewind(110); },
      "rewind: new_len 110 needs logical row 50 resident (the window of the "
      "next append), below base 64 (the ring already dropped it)");
  EXPECT_TRUE(copy.can_rewind_to(124));  // needs row 64
  copy.rewind(124);
  f.layer.rewind(124);
  EXPECT_EQ(logical_diff(f.layer, copy), "");
}

TEST(SnapshotReference, RestoreOfARestoredLayerIsTheSame) {
  const Geometry g = ring61();
  const Filled f(g, 222, 4);
  KvLayer a(g), b(g);
  a.restore(f.layer.snapshot());
  b.restore(a.snapshot());
  EXPECT_EQ(snapshot_diff(snapshot(a), snapshot(b), g), "");
  EXPECT_EQ(a.snapshot().k, f.layer.snapshot().k);
}

TEST(SnapshotReference, BadBlocksTravelAsBytesAndTheStatusStaysClear) {
  // The canonical bad block (SPEC §3) is data: it is restored as written and a decode over it
  // is NaN as on the original; the sticky status belongs to the original layer's history.
  const Geometry g = flat_geometry(1, 32, 32, 20);
  KvLayer l(g);
  Rng rng(3);
  HostRows r = random_rows(g, 4, rng);
  r.k[40] = NAN;  // row 1, block 0 of K
  l.append(r.f32_view());
  ASSERT_TRUE(l.status().data_error);
  KvLayer copy(g);
  copy.restore(l.snapshot());
  EXPECT_TRUE(copy.status().ok());
  EXPECT_EQ(logical_bytes(copy, Plane::k, 0, 4), logical_bytes(l, Plane::k, 0, 4));
  const std::vector<float> q = random_query(g, 1, rng);
  EXPECT_TRUE(std::isnan(copy.decode(q, 1)[0]));
}

// ---- refusals ----------------------------------------------------------------------------

constexpr const char* kNotFresh =
    "restore: the layer is not fresh (an append, rewind, reserve, device-counter step, "
    "account_steps or restore was accepted since its construction); restore into a newly "
    "constructed layer";

TEST(SnapshotReference, RestoreIsRefusedAfterEveryStateChangingCall) {
  const Geometry flat = flat_geometry(1, 32, 32, 64);
  const Geometry ring = ring_geometry(1, 32, 32, 640, 40, 4, 2);
  Rng rng(5);
  const HostRows one = random_rows(flat, 1, rng);
  struct Call {
    const char* name;
    bool on_ring;
    std::function<void(KvLayer&)> run;
  };
  const Call calls[] = {
      {"append", false, [&](KvLayer& l) { l.append(one.f32_view()); }},
      {"append_dc", false, [&](KvLayer& l) { l.append_dc(one.f32_view()); }},
      {"append_dcw", true, [&](KvLayer& l) { l.append_dcw(one.f32_view()); }},
      {"append_rows_dc", false, [&](KvLayer& l) { l.append_rows_dc(one.f32_view()); }},
      {"append_rows_dcw", true, [&](KvLayer& l) { l.append_rows_dcw(one.f32_view()); }},
      {"inc_seqlen", false, [&](KvLayer& l) { l.inc_seqlen(); }},
      {"reserve(0)", true, [&](KvLayer& l) { l.reserve(0); }},
      {"reserve(3)", true, [&](KvLayer& l) { l.reserve(3); }},
      {"rewind(0)", false, [&](KvLayer& l) { l.rewind(0); }},
      {"account_steps(0)", false, [&](KvLayer& l) { l.account_steps(0); }},
  };
  for (const Call& c : calls) {
    const Geometry& g = c.on_ring ? ring : flat;
    const Filled src(g, 10, 2);
    KvLayer l(g);
    ASSERT_TRUE(l.fresh());
    c.run(l);
    EXPECT_FALSE(l.fresh()) << c.name;
    expect_refused_unchanged(
        l, [&] { l.restore(src.layer.snapshot()); }, kNotFresh);
  }
  // A restore itself, even of an empty snapshot.
  KvLayer l(flat);
  l.restore(KvLayer(flat).snapshot());
  EXPECT_FALSE(l.fresh());
  EXPECT_EQ(l.len(), 0);
  expect_refused_unchanged(
      l, [&] { l.restore(Filled(flat, 3, 1).layer.snapshot()); }, kNotFresh);
}

TEST(SnapshotReference, RefusedCallsDecodesAndStatusCallsKeepALayerFresh) {
  const Geometry g = flat_geometry(1, 32, 32, 64, 8);
  KvLayer l(g);
  Rng rng(6);
  EXPECT_THROW(l.append({nullptr, nullptr, 1, DType::f32}), Error);
  EXPECT_THROW(l.rewind(1), Error);
  EXPECT_THROW(l.account_steps(65), Error);
  (void)l.decode(random_query(g, 1, rng), 1);
  (void)l.decode_dcw(random_query(g, 1, rng), 1);
  l.clear_status();
  EXPECT_TRUE(l.fresh());
  const Filled src(g, 30, 4);
  l.restore(src.layer.snapshot());
  EXPECT_EQ(l.len(), 30);
}

TEST(SnapshotReference, RestoreRefusesAnotherGeometry) {
  const Geometry g = ring61();
  const kvlayer::Snapshot s = Filled(g, 80, 1).layer.snapshot();
  auto with = [&](auto edit) {
    Geometry o = g;
    edit(o);
    return o;
  };
  const std::string snap =
      "snapshot geometry 'ring 2x32/64 max_ctx 1000 window 61 max_append 5 "
      "rewind_slack 3 rows 100' differs from the layer's '";
  const std::pair<Geometry, std::string> others[] = {
      {with([](Geometry& o) { o.n_kv_heads = 1; }),
       "ring 1x32/64 max_ctx 1000 window 61 max_append 5 rewind_slack 3 rows 100'"},
      {with([](Geometry& o) { o.head_dim_v = 32; }),
       "ring 2x32/32 max_ctx 1000 window 61 max_append 5 rewind_slack 3 rows 100'"},
      {with([](Geometry& o) { o.max_ctx = 999; }),
       "ring 2x32/64 max_ctx 999 window 61 max_append 5 rewind_slack 3 rows 100'"},
      {with([](Geometry& o) { o.window = 62; }),
       "ring 2x32/64 max_ctx 1000 window 62 max_append 5 rewind_slack 3 rows 101'"},
      {with([](Geometry& o) { o.max_append = 6; }),
       "ring 2x32/64 max_ctx 1000 window 61 max_append 6 rewind_slack 3 rows 101'"},
      {with([](Geometry& o) { o.rewind_slack = 2; }),
       "ring 2x32/64 max_ctx 1000 window 61 max_append 5 rewind_slack 2 rows 99'"},
      {with([](Geometry& o) { o.storage = Storage::flat; }),
       "flat 2x32/64 max_ctx 1000 window 61'"},
  };
  for (const auto& [other, described] : others) {
    KvLayer l(other);
    expect_refused_unchanged(
        l, [&] { l.restore(s); }, "restore: " + snap + described);
    EXPECT_TRUE(l.fresh());
  }
  // max_append and rewind_slack mean nothing on flat storage (SPEC §6): not a difference there.
  Geometry flat = flat_geometry(1, 32, 32, 50);
  const kvlayer::Snapshot fs = Filled(flat, 20, 1).layer.snapshot();
  flat.max_append = 9;
  flat.rewind_slack = 4;
  KvLayer l(flat);
  l.restore(fs);
  EXPECT_EQ(l.len(), 20);
}

TEST(SnapshotReference, RestoreRefusesAMalformedSnapshot) {
  const Geometry g = ring61();
  const kvlayer::Snapshot good = Filled(g, 150, 2).layer.snapshot();  // first 64, base 64
  ASSERT_EQ(good.first, 64);
  auto refused = [&](const std::function<void(kvlayer::Snapshot&)>& edit,
                     const std::string& message) {
    kvlayer::Snapshot s = good;
    edit(s);
    KvLayer l(g);
    expect_refused_unchanged(
        l, [&] { l.restore(s); }, "restore: " + message);
    EXPECT_TRUE(l.fresh());
  };
  refused([](kvlayer::Snapshot& s) { s.len = 1001; },
          "snapshot len 1001 is outside [0, max_ctx 1000]");
  refused([](kvlayer::Snapshot& s) { s.len = -1; }, "snapshot len -1 is outside [0, max_ctx 1000]");
  refused([](kvlayer::Snapshot& s) { s.first = 32; },
          "snapshot first 32 is not the restore plan's first row 64 for len 150 (ring: "
          "align_down(len - (window - 1)))");
  refused([](kvlayer::Snapshot& s) { s.len = 160; },  // a len whose plan starts elsewhere: first 96
          "snapshot first 64 is not the restore plan's first row 96 for len 160 (ring: "
          "align_down(len - (window - 1)))");
  refused([](kvlayer::Snapshot& s) { s.base = 48; },
          "snapshot base 48 must be a non-negative multiple of 32");
  refused([](kvlayer::Snapshot& s) { s.base = -32; },
          "snapshot base -32 must be a non-negative multiple of 32");
  refused([](kvlayer::Snapshot& s) { s.base = 96; },
          "snapshot base 96 is above its first row 64 (lapped: the ring had dropped rows the "
          "snapshot must hold)");
  refused([](kvlayer::Snapshot& s) { s.k.pop_back(); },
          "snapshot K holds 5847 bytes, expected 5848 (rows [64, 150) x 68)");
  refused([](kvlayer::Snapshot& s) { s.v.push_back(0); },
          "snapshot V holds 8257 bytes, expected 8256 (rows [64, 150) x 96)");

  const Geometry flat = flat_geometry(1, 32, 32, 50);
  kvlayer::Snapshot fs = Filled(flat, 20, 1).layer.snapshot();
  fs.first = 0;
  fs.base = 32;
  KvLayer l(flat);
  expect_refused_unchanged(
      l, [&] { l.restore(fs); }, "restore: snapshot base 32 must be 0 on a flat layer");
  fs.base = 0;
  fs.first = 1;
  expect_refused_unchanged(
      l, [&] { l.restore(fs); },
      "restore: snapshot first 1 is not the restore plan's first row 0 for "
      "len 20 (flat layers keep every row)");
}

TEST(SnapshotReference, SnapshotIsRefusedBeforeDeviceStepsAreAccountedFor) {
  const Geometry g = flat_geometry(1, 32, 32, 64);
  Filled f(g, 5, 3);
  Rng rng(1);
  f.layer.append_dc(random_rows(g, 1, rng).f32_view());
  f.layer.inc_seqlen();
  const Snapshot before = snapshot(f.layer);
  try {
    (void)f.layer.snapshot();
    ADD_FAILURE() << "no refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::refused);
    EXPECT_EQ(std::string(e.what()),
              "snapshot: len_d 6 != len 5 (account for replayed device-counter steps with "
              "account_steps first)");
  }
  EXPECT_EQ(snapshot_diff(before, snapshot(f.layer), g), "");
  f.layer.account_steps(1);
  EXPECT_EQ(f.layer.snapshot().len, 6);
}

TEST(SnapshotReference, ValidateSnapshotNamesTheGeometryField) {
  kvlayer::Snapshot s;
  s.geometry = flat_geometry(1, 48, 32, 10);
  try {
    validate_snapshot(s, "save_snapshot");
    ADD_FAILURE() << "no refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "save_snapshot: snapshot geometry: head_dim_k 48 must be a positive multiple of 32 "
              "up to 4096");
  }
}

}  // namespace
}  // namespace kvlayer::testing
