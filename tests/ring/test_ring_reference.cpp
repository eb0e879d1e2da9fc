// The sliding-window ring (SPEC §6, §10.5) at its boundaries: len at window−1/window/window+1,
// rebases when exactly full, appends of exactly max_append, appends that cannot fit, rewinds at
// the can_rewind_to limit, physical_rows at the edges, reserve(k). Every byte moved by a rebase
// is checked against the model, which copies the bytes itself from the rows the test appended.
#include <gtest/gtest.h>

#include <vector>

#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

using P = std::pair<std::int64_t, std::int64_t>;

/// The main ring of these tests: window 61, max_append 5, rewind_slack 3 -> rows 100.
Geometry ring61() {
  return ring_geometry(2, 32, 64, 1000, 61, 5, 3);
}

/// Ring bed: reference + model; every mutation is applied to both, then bytes, counters and the
/// SPEC §10.5 invariants are checked.
struct RingBed {
  Geometry g;
  KvLayer layer;
  Shadow model;
  Rng rng;
  std::int64_t prev_base = 0;
  explicit RingBed(const Geometry& geo, std::uint64_t seed = 1)
      : g(geo), layer(geo), model(geo), rng(seed) {}

  std::string check() {
    std::string d = state_diff(model, layer) + ring_invariants(layer, prev_base);
    prev_base = layer.base();
    return d;
  }
  HostRows append(std::int64_t n) {
    HostRows r = random_rows(g, n, rng);
    layer.append(r.f32_view());
    model.append(r);
    return r;
  }
  void fill_to(std::int64_t len) {
    while (layer.len() < len) {
      append(1);
      ASSERT_EQ(check(), "") << "at len " << layer.len();
    }
  }
  void rewind(std::int64_t p) {
    layer.rewind(p);
    model.rewind(p);
  }
  void reserve(std::int64_t k) {
    layer.reserve(k);
    model.reserve(k);
  }
  /// The bytes of physical rows [a, b) of the K or V plane.
  std::vector<std::uint8_t> rows_bytes(Plane p, std::int64_t a, std::int64_t b) const {
    const auto& plane = p == Plane::k ? layer.k_plane() : layer.v_plane();
    const std::int64_t tb = p == Plane::k ? g.k_tok_bytes() : g.v_tok_bytes();
    return {plane.begin() + a * tb, plane.begin() + b * tb};
  }
};

TEST(Ring, RowsFormula) {
  EXPECT_EQ(KvLayer(ring61()).rows(), 61 + 5 + 3 + 31);
  EXPECT_EQ(KvLayer(ring_geometry(1, 32, 32, 20, 10, 2, 0)).rows(), 20);  // min with max_ctx
  EXPECT_EQ(KvLayer(ring_geometry(1, 32, 32, 1000, 1, 1, 0)).rows(), 33);
  EXPECT_EQ(KvLayer(ring61()).k_plane().size(), std::size_t(100 * 2 * 34));
  EXPECT_EQ(KvLayer(ring61()).v_plane().size(), std::size_t(100 * 4 * 24));
}

TEST(Ring, LenAroundTheWindow) {
  RingBed b(ring61());
  b.fill_to(60);  // window − 1
  EXPECT_EQ(b.layer.view(), P(0, 60));
  b.fill_to(61);  // window
  EXPECT_EQ(b.layer.view(), P(0, 61));
  b.fill_to(62);  // window + 1: the first key leaves the view
  EXPECT_EQ(b.layer.view(), P(1, 62));
  EXPECT_EQ(b.layer.physical_rows(1, 62), P(1, 62));
  EXPECT_EQ(b.layer.base(), 0);
  EXPECT_EQ(b.check(), "");
}

TEST(Ring, RebaseWhenExactlyFullMovesTheRetainedRowsAndNothingElse) {
  RingBed b(ring61(), 7);
  b.fill_to(100);  // len − base == rows: exactly full, still no rebase
  ASSERT_EQ(b.layer.base(), 0);
  const auto plan = b.layer.plan_append(1);
  // retain = align_down(100 − 60 − 3) = 32, keep = 68.
  EXPECT_TRUE(plan.rebase);
  EXPECT_EQ(plan.retain, 32);
  EXPECT_EQ(plan.keep, 68);
  EXPECT_EQ(plan.write_row, 68);
  const Snapshot before = snapshot(b.layer);
  const HostRows r = b.append(1);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 32);
  EXPECT_EQ(b.layer.base_d(), 32);
  EXPECT_EQ(b.layer.len(), 101);
  // Explicitly, independent of the model: physical [32, 100) moved to [0, 68) ...
  for (Plane p : {Plane::k, Plane::v}) {
    const std::int64_t tb = p == Plane::k ? b.g.k_tok_bytes() : b.g.v_tok_bytes();
    const auto& old = p == Plane::k ? before.k_plane : before.v_plane;
    EXPECT_EQ(b.rows_bytes(p, 0, 68),
              std::vector<std::uint8_t>(old.begin() + 32 * tb, old.begin() + 100 * tb));
    // ... the new row is quantized at physical 68 ...
    std::vector<std::uint8_t> q(static_cast<std::size_t>(tb));
    (void)kvlayer::ref::quantize_row(p == Plane::k ? BlockType::q8_0 : BlockType::q5_1,
                                     r.row(p, 0, b.g), q);
    EXPECT_EQ(b.rows_bytes(p, 68, 69), q);
    // ... and physical rows 69..99 keep their stale bytes (old logical rows 69..99).
    EXPECT_EQ(b.rows_bytes(p, 69, 100),
              std::vector<std::uint8_t>(old.begin() + 69 * tb, old.begin() + 100 * tb));
  }
  // The logical rows read back what was written before the move.
  EXPECT_EQ(b.layer.physical_rows(40, 41), P(8, 9));
  EXPECT_EQ(b.layer.dequantized_row(Plane::k, 8), b.model.dequantized(Plane::k, 40));
}

TEST(Ring, AppendOfExactlyMaxAppendFillsThePlaneThenRebases) {
  RingBed b(ring61(), 8);
  b.fill_to(95);
  b.append(5);  // 95 + 5 == rows: contiguous, exactly full
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 0);
  EXPECT_EQ(b.layer.len(), 100);
  const auto plan = b.layer.plan_append(5);
  EXPECT_TRUE(plan.rebase);
  EXPECT_EQ(plan.retain, 32);
  EXPECT_EQ(plan.write_row, 68);
  b.append(5);  // rebase, then rows at physical 68..72
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 32);
  EXPECT_EQ(b.layer.len(), 105);
  EXPECT_EQ(b.layer.view(), P(44, 105));
  EXPECT_EQ(b.layer.physical_rows(44, 105), P(12, 73));
}

TEST(Ring, AppendThatCannotFitIsRefusedAndOneThatFitsExactlyIsNot) {
  RingBed b(ring61(), 9);
  b.fill_to(100);
  // keep = 68 after the rebase: 68 + 33 > 100 is refused, 68 + 32 == 100 fits (larger than
  // max_append, but SPEC §6 refuses only what cannot fit).
  expect_refused_unchanged(
      b.layer, [&] { b.layer.append(random_rows(b.g, 33, b.rng).f32_view()); },
      "append: ring cannot fit n 33 rows: 68 rows must stay resident (from logical row 32) and "
      "68 + 33 exceeds rows 100");
  b.append(32);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.len() - b.layer.base(), b.layer.rows());
  // An empty ring cannot take more than rows at once either.
  RingBed e(ring61(), 10);
  expect_refused_unchanged(
      e.layer, [&] { e.layer.append(random_rows(e.g, 101, e.rng).f32_view()); },
      "append: ring cannot fit n 101 rows: 0 rows must stay resident (from logical row 0) and "
      "0 + 101 exceeds rows 100");
  e.append(100);
  EXPECT_EQ(e.check(), "");
}

TEST(Ring, RewindAtExactlyTheLimitAndOneRowPast) {
  RingBed b(ring61(), 11);
  b.fill_to(101);  // one rebase: base 32
  ASSERT_EQ(b.layer.base(), 32);
  // can_rewind_to(p) iff align_down(p − 60) ≥ 32: p ≥ 92.
  EXPECT_TRUE(b.layer.can_rewind_to(92));
  EXPECT_FALSE(b.layer.can_rewind_to(91));
  EXPECT_TRUE(b.layer.can_rewind_to(101));
  EXPECT_FALSE(b.layer.can_rewind_to(102));
  expect_refused_unchanged(
      b.layer, [&] { b.layer.rewind(91); },
      "rewind: new_len 91 needs logical row 31 resident (the window of the next append), below "
      "base 32 (the ring already dropped "
      "it)");
  expect_refused_unchanged(
      b.layer, [&] { b.layer.rewind(102); }, "rewind: new_len 102 is outside [0, len 101]");
  const Snapshot before = snapshot(b.layer);
  b.rewind(92);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.len(), 92);
  EXPECT_EQ(b.layer.len_d(), 92);
  EXPECT_EQ(b.layer.k_plane(), before.k_plane);  // rewinds move no bytes and never base
  EXPECT_EQ(b.layer.v_plane(), before.v_plane);
  EXPECT_EQ(b.layer.base(), 32);
  // SPEC §10.5: the next append + decode stay inside the resident rows.
  b.append(1);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.view(), P(32, 93));
  EXPECT_EQ(b.layer.physical_rows(32, 93), P(0, 61));
  Rng qr(5);
  EXPECT_NO_THROW((void)b.layer.decode(random_query(b.g, 2, qr), 2));
}

TEST(Ring, PhysicalRowsAtTheEdges) {
  RingBed b(ring61(), 12);
  b.fill_to(101);
  EXPECT_EQ(b.layer.physical_rows(32, 32), P(0, 0));
  EXPECT_EQ(b.layer.physical_rows(32, 132), P(0, 100));  // end − base == rows
  EXPECT_EQ(b.layer.physical_rows(100, 101), P(68, 69));
  EXPECT_EQ(b.layer.physical_rows(132, 132), P(100, 100));
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(31, 40); },
      "physical_rows: [31, 40) is not within the resident rows [32, 132)");
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(32, 133); },
      "physical_rows: [32, 133) is not within the resident rows [32, 132)");
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(50, 49); },
      "physical_rows: [50, 49) is not within the resident rows [32, 132)");
}

TEST(Ring, ReserveMakesTheNextKDeviceStepsContiguous) {
  RingBed b(ring61(), 13);
  b.fill_to(100);  // full: the next append would rebase
  // Already contiguous: reserve(0) and a reserve on a ring with room change nothing.
  const Snapshot full = snapshot(b.layer);
  b.layer.reserve(0);
  EXPECT_EQ(snapshot_diff(full, snapshot(b.layer), b.g), "");
  b.reserve(5);  // rebases now: base 32, keep 68
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 32);
  EXPECT_EQ(b.layer.len(), 100);
  const std::int64_t base = b.layer.base();
  for (int step = 0; step < 5; ++step) {
    const HostRows r = random_rows(b.g, 1, b.rng);
    b.layer.append_dcw(r.f32_view());
    b.model.append_device(r, true);
    b.layer.inc_seqlen();
    b.model.inc_seqlen();
    ASSERT_EQ(b.layer.base_d(), base) << "a reserved step rebased";
    ASSERT_TRUE(b.layer.status().ok()) << b.layer.status().message();
  }
  b.layer.account_steps(5);
  b.model.account_steps(5);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.len(), 105);
  // A reserve that fits without a rebase moves nothing.
  const Snapshot s = snapshot(b.layer);
  b.reserve(5);
  EXPECT_EQ(snapshot_diff(s, snapshot(b.layer), b.g), "");
  // Impossible: a rebase would retain max(32, align_down(105 − 63)) = 32, the base itself, so
  // nothing can be dropped: keep 73 + 28 > 100.
  expect_refused_unchanged(
      b.layer, [&] { b.layer.reserve(28); },
      "reserve: ring cannot fit n 28 rows: 73 rows must stay resident (from logical row 32) and "
      "73 + 28 exceeds rows 100");
  expect_refused_unchanged(
      b.layer, [&] { b.layer.reserve(-1); }, "reserve: k -1 must not be negative");
  expect_refused_unchanged(
      b.layer, [&] { b.layer.reserve(896); }, "reserve: len 105 + n 896 exceeds max_ctx 1000");
  b.reserve(27);  // 73 + 27 == rows: contiguous, exactly full, no rebase
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 32);
  // At len 127 (95 rows resident) reserve(27) must rebase: retain align_down(127 − 63) = 64.
  b.fill_to(127);
  b.reserve(27);
  ASSERT_EQ(b.check(), "");
  EXPECT_EQ(b.layer.base(), 64);
}

TEST(Ring, WithoutReserveTheStepPastTheLastRowIsADeviceErrorThatWritesNothing) {
  RingBed b(ring61(), 14);
  b.fill_to(100);
  const Snapshot before = snapshot(b.layer);
  const HostRows r = random_rows(b.g, 1, b.rng);
  b.layer.append_dcw(r.f32_view());
  b.model.append_device(r, true);
  EXPECT_EQ(b.layer.k_plane(), before.k_plane);
  EXPECT_EQ(b.layer.v_plane(), before.v_plane);
  ASSERT_TRUE(b.layer.status().device_error);
  EXPECT_EQ(*b.layer.status().device_error,
            (kvlayer::DeviceError{kvlayer::DeviceErrorKind::append_outside_rows, 100, 0, 100}));
  EXPECT_EQ(b.check(), "");
}

TEST(Ring, RingWhoseRowsAreCappedByMaxCtxNeverRebases) {
  RingBed b(ring_geometry(1, 32, 32, 20, 10, 2, 0), 15);
  ASSERT_EQ(b.layer.rows(), 20);
  b.fill_to(20);
  EXPECT_EQ(b.layer.base(), 0);
  expect_refused_unchanged(
      b.layer, [&] { b.layer.append(random_rows(b.g, 1, b.rng).f32_view()); },
      "append: len 20 + n 1 exceeds max_ctx 20");
}

/// Odd and tiny geometries under one fixed pseudo-random schedule of appends (1..2·max_append),
/// legal rewinds and reserves, compared with the model after every operation.
struct RingCase {
  std::int64_t window, max_append, rewind_slack, max_ctx;
};

class RingSchedule : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingSchedule, MatchesTheModelAndKeepsTheInvariants) {
  const RingCase c = GetParam();
  RingBed b(ring_geometry(1, 32, 64, c.max_ctx, c.window, c.max_append, c.rewind_slack),
            std::uint64_t(c.window * 1000 + c.max_append));
  int rebases = 0, rewinds = 0;
  for (int op = 0; op < 400; ++op) {
    const std::int64_t what = b.rng.range(0, 19), base_before = b.layer.base();
    if (what < 14) {  // 70 %: an append of 1 .. 2·max_append rows
      const std::int64_t n = b.rng.range(1, 2 * c.max_append);
      if (!b.model.plan(n).fits) {
        const Snapshot s = snapshot(b.layer);
        EXPECT_THROW(b.layer.append(random_rows(b.g, n, b.rng).f32_view()), kvlayer::Error);
        ASSERT_EQ(snapshot_diff(s, snapshot(b.layer), b.g), "");
        if (b.layer.len() + n > c.max_ctx) break;  // capacity reached: done
        continue;
      }
      b.append(n);
    } else if (what < 17) {  // 15 %: a rewind, shallow or to the very limit of can_rewind_to
      const std::int64_t limit = b.layer.base() == 0 ? 0 : b.layer.base() + c.window - 1;
      // (to the limit only once base > 0: before, the limit is 0 and the run would restart)
      std::int64_t p =
          what == 16 && limit > 0 ? limit : b.layer.len() - b.rng.range(0, 2 * c.max_append);
      if (!b.model.can_rewind_to(p)) p = b.layer.len();
      ASSERT_TRUE(b.layer.can_rewind_to(p)) << p;
      ASSERT_FALSE(b.layer.can_rewind_to(limit - 1)) << limit;
      b.rewind(p);
      ++rewinds;
    } else {  // 15 %: reserve
      const std::int64_t k = b.rng.range(1, c.max_append);
      if (!b.model.can_reserve(k)) continue;
      b.reserve(k);
    }
    rebases += b.layer.base() != base_before;
    ASSERT_EQ(b.check(), "") << "op " << op;
    // Every accepted state that just appended has its decode view resident.
    if (b.model.can_decode()) {
      const auto v = b.layer.view();
      ASSERT_NO_THROW((void)b.layer.physical_rows(v.first, v.second)) << "op " << op;
    }
    // Rows still known to the model read back exactly.
    for (const auto& [row, vals] : b.model.written())
      if (row >= b.layer.base() && row < b.layer.len()) {
        const auto phys = b.layer.physical_rows(row, row + 1).first;
        ASSERT_EQ(b.layer.dequantized_row(Plane::k, phys), b.model.dequantized(Plane::k, row));
        ASSERT_EQ(b.layer.dequantized_row(Plane::v, phys), b.model.dequantized(Plane::v, row));
      }
  }
  EXPECT_GT(rebases, 0) << "schedule never rebased: the test would not exercise the ring";
  EXPECT_GT(rewinds, 0);
}

INSTANTIATE_TEST_SUITE_P(Reference, RingSchedule,
                         ::testing::Values(RingCase{61, 5, 3, 2000}, RingCase{63, 2, 1, 2000},
                                           RingCase{1, 1, 0, 500}, RingCase{2, 1, 0, 500},
                                           RingCase{1, 7, 40, 1000}, RingCase{33, 1, 0, 700},
                                           RingCase{61, 5, 3, 130}, RingCase{32, 32, 32, 3000}),
                         [](const auto& info) {
                           const RingCase& c = info.param;
                           return "w" + std::to_string(c.window) + "_a" +
                                  std::to_string(c.max_append) + "_s" +
                                  std::to_string(c.rewind_slack) + "_ctx" +
                                  std::to_string(c.max_ctx);
                         });

}  // namespace
}  // namespace kvlayer::testing
