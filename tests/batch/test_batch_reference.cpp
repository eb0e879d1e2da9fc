// The reference batch (SPEC §12) against its definition: every batch operation equals the same
// operation on each active layer alone (a twin layer per sequence receives it one by one), byte
// for byte, in every counter and status, for flat layers and windowed rings, with active lists
// that change, reorder and empty between steps, and per-sequence host operations in between.
// Refusals name the value and the limit and leave every layer and the active list as they
// were; a device-detected overrun is recorded for its sequence alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvlayer/reference/kv_batch.hpp"
#include "kvlayer/testing/batch.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

using ref::KvBatch;

/// Everything a batch operation may change in one layer.
struct LayerState {
  std::vector<std::uint8_t> k, v;
  std::int64_t len, len_d, base, base_d;
  LayerStatus status;
  bool operator==(const LayerState&) const = default;
};

LayerState state_of(const KvLayer& l) {
  return {l.k_plane(), l.v_plane(), l.len(), l.len_d(), l.base(), l.base_d(), l.status()};
}

/// The first sequence whose layer differs from its twin ("" when none).
std::string batch_diff(const KvBatch& batch, const std::vector<KvLayer>& alone) {
  for (int i = 0; i < batch.max_batch(); ++i) {
    const KvLayer& got = batch.layer(i);
    const KvLayer& want = alone[std::size_t(i)];
    const Geometry& g = got.geometry();
    std::string d = plane_diff("K", want.k_plane(), got.k_plane(), g.k_tok_bytes()) +
                    plane_diff("V", want.v_plane(), got.v_plane(), g.v_tok_bytes());
    if (got.len() != want.len() || got.len_d() != want.len_d() || got.base() != want.base() ||
        got.base_d() != want.base_d())
      d += "counters differ: batch len " + std::to_string(got.len()) + " len_d " +
           std::to_string(got.len_d()) + " base " + std::to_string(got.base()) + " base_d " +
           std::to_string(got.base_d()) + ", alone len " + std::to_string(want.len()) + " len_d " +
           std::to_string(want.len_d()) + " base " + std::to_string(want.base()) + " base_d " +
           std::to_string(want.base_d()) + "\n";
    if (!(got.status() == want.status())) d += "status differs\n";
    if (!d.empty()) return "sequence " + std::to_string(i) + ": " + d;
  }
  return "";
}

std::vector<LayerState> states_of(const KvBatch& batch) {
  std::vector<LayerState> s;
  for (int i = 0; i < batch.max_batch(); ++i) s.push_back(state_of(batch.layer(i)));
  return s;
}

/// The steps an engine takes with a batch: per step an active list, T rows per active sequence
/// (room made by reserve on a ring), inc_seqlen(T), a decode of T queries, the host's
/// account_steps(T); now and then a sequence is rewound. Checked after every operation.
void run_engine_steps(const Geometry& g, int max_batch, int steps, std::uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  constexpr int kMaxVerify = 8;
  KvBatch batch(g, max_batch, kMaxVerify);
  std::vector<KvLayer> alone(std::size_t(max_batch), KvLayer(g, kMaxVerify));
  const bool windowed = g.window.has_value();
  const int n_q_heads = g.n_kv_heads * int(rng.range(1, 4));
  std::int64_t decodes = 0, rows_appended = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<int> active = draw_active(max_batch, rng);
    batch.set_active(active);
    ASSERT_EQ(batch.active(), active);
    const int t = int(rng.range(1, kMaxVerify));
    // Room for T rows in every active sequence (the host's per-sequence call).
    bool room = true;
    for (const int i : active) room = room && batch.layer(i).len() + t <= g.max_ctx;
    if (!room) break;
    for (const int i : active) {
      batch.layer(i).reserve(t);
      alone[std::size_t(i)].reserve(t);
    }
    const HostRows rows = random_rows(g, std::int64_t(active.size()) * t, rng);
    if (windowed)
      batch.append_rows_dcw(rows.view(), t);
    else
      batch.append_rows_dc(rows.view(), t);
    for (std::size_t j = 0; j < active.size(); ++j) {
      KvLayer& a = alone[std::size_t(active[j])];
      const HostRows mine = slice(rows, g, std::int64_t(j) * t, t);
      windowed ? a.append_rows_dcw(mine.view()) : a.append_rows_dc(mine.view());
    }
    rows_appended += std::int64_t(active.size()) * t;
    ASSERT_EQ(batch_diff(batch, alone), "") << "after the batch append";
    batch.inc_seqlen(t);
    for (const int i : active) alone[std::size_t(i)].inc_seqlen(t);
    ASSERT_EQ(batch_diff(batch, alone), "") << "after inc_seqlen";
    std::vector<float> q;
    for (std::size_t j = 0; j < active.size() * std::size_t(t); ++j) {
      const std::vector<float> one = random_query(g, n_q_heads, rng);
      q.insert(q.end(), one.begin(), one.end());
    }
    const auto out =
        windowed ? batch.decode_rows_dcw(q, n_q_heads, t) : batch.decode_rows_dc(q, n_q_heads, t);
    ASSERT_EQ(out.size(), active.size());
    const std::size_t per = std::size_t(t) * std::size_t(n_q_heads) * std::size_t(g.head_dim_k);
    for (std::size_t j = 0; j < active.size(); ++j) {
      KvLayer& a = alone[std::size_t(active[j])];
      const std::span<const float> mine = std::span<const float>(q).subspan(j * per, per);
      const auto want =
          t == 1 ? (windowed ? a.decode_dcw(mine, n_q_heads) : a.decode_dc(mine, n_q_heads))
                 : (windowed ? a.decode_rows_dcw(mine, n_q_heads, t)
                             : a.decode_rows_dc(mine, n_q_heads, t));
      ASSERT_EQ(out[j].has_value(), want.has_value()) << "output " << j;
      if (want) {
        EXPECT_EQ(*out[j], *want) << "output " << j << " (sequence " << active[j] << ")";
        ++decodes;
      }
    }
    ASSERT_EQ(batch_diff(batch, alone), "") << "after the decode";
    for (const int i : active) {
      batch.layer(i).account_steps(t);
      alone[std::size_t(i)].account_steps(t);
    }
    // Now and then a sequence rejects some of its draft: rewound alone, between steps.
    if (!active.empty() && rng.chance(30)) {
      const int i = active[std::size_t(rng.range(0, std::int64_t(active.size()) - 1))];
      const std::int64_t to = batch.layer(i).len() - rng.range(0, t - 1);
      if (batch.layer(i).can_rewind_to(to)) {
        batch.layer(i).rewind(to);
        alone[std::size_t(i)].rewind(to);
      }
    }
    ASSERT_EQ(batch_diff(batch, alone), "") << "after the host's accounting";
  }
  // What the run reached: a batch that only ever ran empty lists proves nothing.
  EXPECT_GT(rows_appended, 8 * max_batch);
  EXPECT_GT(decodes, steps / 2);
  if (g.is_ring()) {
    std::int64_t rebased = 0;
    for (int i = 0; i < max_batch; ++i) rebased += batch.layer(i).base() > 0;
    EXPECT_GT(rebased, 0) << "no ring rebased: the windowed steps never left the first unit";
  }
}

TEST(BatchReference, FlatBatchOperationsEqualEachActiveLayerAlone) {
  run_engine_steps(flat_geometry(2, 64, 32, 4096), 6, 60, fresh_seed());
}

TEST(BatchReference, RingBatchOperationsEqualEachActiveLayerAlone) {
  // Window 48, appends of up to 8 rows, slack 4: rebases every few steps.
  run_engine_steps(ring_geometry(2, 32, 64, 100000, 48, 8, 4), 5, 80, fresh_seed());
}

/// A batch with some history: every sequence at its own length.
struct RefusalBed {
  Geometry g = flat_geometry(2, 32, 32, 64);
  KvBatch batch{g, 4, 4};
  Rng rng{fresh_seed()};
  RefusalBed() {
    for (int i = 0; i < batch.max_batch(); ++i)
      batch.layer(i).append(random_rows(g, 3 + i, rng).view());
    const std::vector<int> active{2, 0, 3};
    batch.set_active(active);
  }
};

/// Runs f, expecting a refusal whose message is `message`, and every layer and the active list
/// unchanged.
template <typename F>
void expect_refused_unchanged(KvBatch& batch, F&& f, const std::string& message) {
  const std::vector<LayerState> before = states_of(batch);
  const std::vector<int> active = batch.active();
  try {
    f();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::refused);
    EXPECT_EQ(std::string(e.what()), message);
  }
  EXPECT_TRUE(states_of(batch) == before) << "a refused call changed a layer";
  EXPECT_EQ(batch.active(), active) << "a refused call changed the active list";
}

TEST(BatchReference, BadActiveListsAreRefusedNamingTheEntryAndChangeNothing) {
  RefusalBed b;
  const std::vector<int> too_long{0, 1, 2, 3, 0};
  expect_refused_unchanged(
      b.batch, [&] { b.batch.set_active(too_long); },
      "batch set_active: the list has 5 sequences, more than max_batch 4");
  const std::vector<int> out_of_range{1, 4};
  expect_refused_unchanged(
      b.batch, [&] { b.batch.set_active(out_of_range); },
      "batch set_active: entry 1 is sequence 4, outside [0, max_batch 4)");
  const std::vector<int> negative{-1};
  expect_refused_unchanged(
      b.batch, [&] { b.batch.set_active(negative); },
      "batch set_active: entry 0 is sequence -1, outside [0, max_batch 4)");
  const std::vector<int> repeated{3, 1, 3};
  expect_refused_unchanged(
      b.batch, [&] { b.batch.set_active(repeated); },
      "batch set_active: sequence 3 appears twice (entries 0 and 2)");
  expect_refused_unchanged(
      b.batch, [&] { (void)b.batch.layer(4); },
      "batch layer: sequence 4 is outside [0, max_batch 4)");
}

TEST(BatchReference, BadShapesAndLayoutsAreRefusedBeforeAnyLayerChanges) {
  RefusalBed b;
  const HostRows six = random_rows(b.g, 6, b.rng);  // active 3 × T 2
  expect_refused_unchanged(
      b.batch, [&] { b.batch.append_rows_dc(six.view(), 3); },
      "batch append_rows_dc: rows.n 6 is not active sequences 3 x T 3 = 9");
  expect_refused_unchanged(
      b.batch, [&] { b.batch.append_rows_dc(six.view(), 0); },
      "batch append_rows_dc: T 0 is outside [1, max_verify 4]");
  expect_refused_unchanged(
      b.batch, [&] { b.batch.inc_seqlen(5); },
      "batch inc_seqlen: T 5 is outside [1, max_verify 4]");
  // A layer's own refusal (the layout) comes before any layer changes.
  const Geometry ring = ring_geometry(2, 32, 32, 1000, 16, 4, 2);
  KvBatch rings(ring, 3, 4);
  for (int i = 0; i < 3; ++i) rings.layer(i).append(random_rows(ring, 2 + i, b.rng).view());
  const std::vector<int> all{0, 1, 2};
  rings.set_active(all);
  expect_refused_unchanged(rings, [&] { rings.append_rows_dc(six.view(), 2); },
                           "append_rows_dc: ring layers use append_rows_dcw");
  const std::vector<float> q(std::size_t(3 * 2 * 4 * 32), 0.25f);  // active 3 × T 2 × 4 heads
  expect_refused_unchanged(
      b.batch, [&] { (void)b.batch.decode_rows_dc(q, 4, 1); },
      "batch decode_rows_dc: q has 768 values, expected active sequences 3 "
      "x T 1 x n_q_heads 4 x head_dim_k 32 = 384");
  expect_refused_unchanged(
      b.batch, [&] { (void)b.batch.decode_rows_dc(q, 3, 2); },
      "batch decode_rows_dc: q has 768 values, expected active sequences 3 "
      "x T 2 x n_q_heads 3 x head_dim_k 32 = 576");
  const std::vector<float> q3(std::size_t(3 * 2 * 3 * 32), 0.25f);
  expect_refused_unchanged(
      b.batch, [&] { (void)b.batch.decode_rows_dc(q3, 3, 2); },
      "decode_rows_dc: n_q_heads 3 must be a positive multiple of "
      "n_kv_heads 2");
  expect_refused_unchanged(
      b.batch, [&] { (void)b.batch.decode_rows_dcw(q, 4, 2); },
      "decode_rows_dcw: the layer has no window; use decode_rows_dc");
}

TEST(BatchReference, ADeviceOverrunIsRecordedForItsSequenceAloneAndTheOthersProceed) {
  const Geometry g = flat_geometry(2, 32, 32, 16);
  KvBatch batch(g, 3, 4);
  std::vector<KvLayer> alone(3, KvLayer(g, 4));
  Rng rng(fresh_seed());
  // Sequence 1 at 14 rows: T = 3 reaches max_ctx 16; sequences 0 and 2 have room.
  const std::int64_t lens[] = {2, 14, 5};
  for (int i = 0; i < 3; ++i) {
    const HostRows r = random_rows(g, lens[i], rng);
    batch.layer(i).append(r.view());
    alone[std::size_t(i)].append(r.view());
  }
  const std::vector<int> active{1, 0, 2};
  batch.set_active(active);
  const std::vector<LayerState> before = states_of(batch);
  const HostRows rows = random_rows(g, 9, rng);
  batch.append_rows_dc(rows.view(), 3);
  for (std::size_t j = 0; j < 3; ++j)
    alone[std::size_t(active[j])].append_rows_dc(slice(rows, g, std::int64_t(j) * 3, 3).view());
  ASSERT_EQ(batch_diff(batch, alone), "");
  EXPECT_FALSE(batch.layer(1).status().ok()) << "the overrun was not recorded";
  EXPECT_TRUE(batch.layer(0).status().ok());
  EXPECT_TRUE(batch.layer(2).status().ok());
  // Its rows were not written; the others' were.
  EXPECT_EQ(batch.layer(1).k_plane(), before[1].k);
  EXPECT_EQ(batch.layer(1).v_plane(), before[1].v);
  EXPECT_NE(batch.layer(0).k_plane(), before[0].k);
  EXPECT_NE(batch.layer(2).v_plane(), before[2].v);
  // The decode: sequence 1's view runs past max_ctx after inc_seqlen: nothing for it.
  batch.inc_seqlen(3);
  const int n_q_heads = 4;
  std::vector<float> q;
  for (int j = 0; j < 3 * 3; ++j) {
    const auto one = random_query(g, n_q_heads, rng);
    q.insert(q.end(), one.begin(), one.end());
  }
  const auto out = batch.decode_rows_dc(q, n_q_heads, 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(out[0].has_value()) << "sequence 1 (17 > max_ctx 16) was decoded";
  EXPECT_TRUE(out[1].has_value());
  EXPECT_TRUE(out[2].has_value());
}

TEST(BatchReference, AnEmptyActiveListTouchesNothing) {
  const Geometry g = flat_geometry(1, 32, 32, 64);
  KvBatch batch(g, 2);
  Rng rng(fresh_seed());
  batch.layer(1).append(random_rows(g, 4, rng).view());
  const std::vector<LayerState> before = states_of(batch);
  batch.set_active({});
  batch.append_rows_dc(ref::RowsView{nullptr, nullptr, 0, DType::f32}, 2);
  batch.inc_seqlen(2);
  EXPECT_TRUE(batch.decode_rows_dc({}, 2, 2).empty());
  EXPECT_TRUE(states_of(batch) == before);
}

}  // namespace
}  // namespace kvlayer::testing
