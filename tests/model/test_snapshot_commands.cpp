// The harness's snapshot and restore commands (SPEC §13) on the host: run on the reference
// alone and against ReferenceSystem (a second reference layer behind the System interface),
// which must agree with the model command by command; then against systems that get one thing
// wrong, each of which the command or the comparison after it must report. The CUDA layer's own
// restore mutants (cuda/src/mutants.def) need the GPU: tools/mutants.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/campaign.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/reference_system.hpp"
#include "kvlayer/snapshot.hpp"

namespace kvlayer::harness {
namespace {

/// A ring (rows 82) and the commands that take it past a rebase to len 136, base 64, where a
/// snapshot starts at row 96 (above base: the restore moves the rows to physical row 0).
Case ring_case() {
  Case c;
  c.geometry.n_kv_heads = 2;
  c.geometry.head_dim_k = c.geometry.head_dim_v = 64;
  c.geometry.max_ctx = 400;
  c.geometry.window = 40;
  c.geometry.storage = Storage::ring;
  c.geometry.max_append = 8;
  c.geometry.rewind_slack = 3;
  c.n_q_heads = 4;
  c.dtype = DType::f16;
  for (std::uint64_t i = 0; i < 17; ++i)
    c.commands.push_back(Append{8, 100 + i, DataKind::gaussian});
  return c;
}

/// Steps every command of c on an executor, failing the test at the first difference.
void run_clean(Executor& ex, const Case& c) {
  for (const Command& command : c.commands) {
    const auto d = ex.step(command);
    ASSERT_FALSE(d.has_value()) << *d;
  }
}

/// The case continues on the restored layers: appends, a device-counter step, rewinds (one
/// below the restored ring's first row, refused alike) and another snapshot, on the reference
/// alone and against ReferenceSystem.
TEST(SnapshotCommands, ARestoredRingContinuesTheCaseOnBothSides) {
  for (const bool with_system : {false, true}) {
    SCOPED_TRACE(with_system ? "against ReferenceSystem" : "reference alone");
    Case c = ring_case();
    ReferenceSystem system(c);
    Executor ex(c, with_system ? &system : nullptr);
    run_clean(ex, c);
    const Geometry& g = c.geometry;
    ASSERT_EQ(ex.model().len(), 136);
    ASSERT_EQ(ex.model().base(), 64);
    ASSERT_EQ(snapshot_first(g, 136), 96);  // the premise: the snapshot starts above base
    const std::vector<Command> after = {TakeSnapshot{},
                                        Restore{false},
                                        Append{8, 7, DataKind::ties},
                                        AppendDc{8, DataKind::integers, true},
                                        IncSeqlen{},
                                        TakeSnapshot{},  // refused: len_d > len
                                        AccountSteps{1},
                                        Rewind{95},
                                        Rewind{140},
                                        TakeSnapshot{},
                                        Restore{true},
                                        Restore{false}};
    for (std::size_t i = 0; i < after.size(); ++i) {
      const auto d = ex.step(after[i]);
      ASSERT_FALSE(d.has_value()) << *d;
      if (i == 1) {  // restored: base = first, the old layer replaced
        EXPECT_EQ(ex.model().base(), 96);
        EXPECT_EQ(ex.model().base_d(), 96);
        EXPECT_EQ(ex.model().len(), 136);
        EXPECT_FALSE(ex.model().fresh());
        // A rewind may reach back to the restored ring's first row, not one row further.
        EXPECT_TRUE(ex.model().can_rewind_to(96 + *g.window - 1));
        EXPECT_FALSE(ex.model().can_rewind_to(95 + *g.window - 1));
      }
    }
    EXPECT_EQ(ex.model().len(), 140);
    EXPECT_EQ(ex.stats().restores, 2);
    EXPECT_EQ(ex.stats().restores_past_base, 1);  // the second one starts at its base (96)
    // Refused alike: the snapshot with a step unaccounted, the rewind below first, the restore
    // into the (used) current layer.
    EXPECT_EQ(ex.stats().refused, 3);
  }
}

/// Restore into the current layer: accepted while it is fresh, refused (unchanged) after.
TEST(SnapshotCommands, RestoreIntoTheCurrentLayerIsRefusedUnlessItIsFresh) {
  Case c = ring_case();
  c.commands = {Restore{true}, Append{5, 1, DataKind::gaussian}, Restore{true}};
  ReferenceSystem system(c);
  Executor ex(c, &system);
  ASSERT_FALSE(ex.step(c.commands[0]).has_value());
  EXPECT_EQ(ex.stats().refused, 0);
  EXPECT_FALSE(ex.model().fresh());
  ASSERT_FALSE(ex.step(c.commands[1]).has_value());
  ASSERT_FALSE(ex.step(c.commands[2]).has_value());
  EXPECT_EQ(ex.stats().refused, 1);
  EXPECT_EQ(ex.model().len(), 5);
  EXPECT_EQ(ex.stats().restores, 0);
}

/// The generator's twin follows a restore: a new twin restored from its own snapshot, or
/// (into_current) refused unless fresh; a snapshot with steps unaccounted is refused.
TEST(SnapshotCommands, TheTwinFollowsARestore) {
  const Case c = ring_case();
  ref::KvLayer twin(c.geometry, 3);
  std::vector<float> k(std::size_t(8 * c.geometry.kv_dim_k())), v(k.size());
  const ref::RowsView rows{k.data(), v.data(), 8, DType::f32};
  for (int i = 0; i < 17; ++i) twin.append(rows);
  ASSERT_EQ(twin.base(), 64);
  Restore{false}.apply(twin);
  EXPECT_EQ(twin.len(), 136);
  EXPECT_EQ(twin.base(), 96);
  EXPECT_EQ(twin.max_verify(), 3);
  EXPECT_FALSE(twin.fresh());
  EXPECT_THROW(Restore{true}.apply(twin), Error);
  EXPECT_EQ(twin.len(), 136);
  ref::KvLayer fresh(c.geometry, 3);
  Restore{true}.apply(fresh);
  EXPECT_FALSE(fresh.fresh());
  twin.append_dcw(ref::RowsView{k.data(), v.data(), 1, DType::f32});
  twin.inc_seqlen();
  EXPECT_THROW(Restore{false}.apply(twin), Error);
  EXPECT_EQ(twin.base(), 96);
}

/// The difference a wrong system leaves: the step's report.
std::string first_difference(const Case& c, System& system) {
  Executor ex(c, &system);
  for (const Command& command : c.commands)
    if (auto d = ex.step(command)) return *d;
  return "(no difference)";
}

/// Snapshots are compared field by field and byte for byte, and refused alike.
TEST(SnapshotCommands, ASnapshotThatDiffersIsReported) {
  struct FlipsAByte : ReferenceSystem {
    using ReferenceSystem::ReferenceSystem;
    kvlayer::Snapshot take_snapshot() override {
      kvlayer::Snapshot s = ReferenceSystem::take_snapshot();
      s.k.at(std::size_t(3 * geometry().k_tok_bytes() + 5)) ^= 0x10;
      return s;
    }
  };
  struct WrongLen : ReferenceSystem {
    using ReferenceSystem::ReferenceSystem;
    kvlayer::Snapshot take_snapshot() override {
      kvlayer::Snapshot s = ReferenceSystem::take_snapshot();
      ++s.len;
      return s;
    }
  };
  struct NeverRefuses : ReferenceSystem {
    using ReferenceSystem::ReferenceSystem;
    kvlayer::Snapshot take_snapshot() override { return {}; }
  };
  Case c = ring_case();
  c.commands.push_back(TakeSnapshot{});
  FlipsAByte flips(c);
  const std::string flipped = first_difference(c, flips);
  // Row 3 of the snapshot is logical row 96 + 3; byte 5 of a q8_0 row is a quant.
  EXPECT_EQ(flipped.substr(0, flipped.find(": model 0x")),
            "snapshot: snapshot K bytes differ at byte 413 (logical row 99, byte 5 of the row)")
      << flipped;
  WrongLen wrong_len(c);
  EXPECT_EQ(first_difference(c, wrong_len), "snapshot: snapshots differ: len 137 (model 136)");
  Case steps = ring_case();
  steps.commands = {AppendDc{1, DataKind::gaussian, true}, IncSeqlen{}, TakeSnapshot{}};
  NeverRefuses lenient(steps);
  EXPECT_EQ(first_difference(steps, lenient),
            "snapshot: model refused: snapshot: len_d 1 != len 0 (account for replayed "
            "device-counter steps with account_steps first); system accepted");
}

/// A restore that goes wrong on the system is reported by the restore or by the comparison of
/// the restored layers right after it.
TEST(SnapshotCommands, AWrongRestoreIsReported) {
  struct KeepsTheOldLayer : ReferenceSystem {  // the restore never happened
    using ReferenceSystem::ReferenceSystem;
    void restore_into_fresh(const kvlayer::Snapshot&) override {}
  };
  struct RestoresIntoAUsedLayer : ReferenceSystem {  // ignores the freshness rule
    using ReferenceSystem::ReferenceSystem;
    void restore(const kvlayer::Snapshot& s) override { restore_into_fresh(s); }
  };
  // What the planted CUDA mutants (cuda/src/mutants.def, restore_*) read back after a restore.
  enum class ReadBack { base_d_zero, len_d_zero, rows_where_the_source_had_them };
  struct MisreadsTheRestore : ReferenceSystem {
    MisreadsTheRestore(const Case& c, ReadBack how) : ReferenceSystem(c), how_(how) {}
    void restore_into_fresh(const kvlayer::Snapshot& s) override {
      ReferenceSystem::restore_into_fresh(s);
      restored_from_ = s;
    }
    Snapshot snapshot() override {
      Snapshot s = ReferenceSystem::snapshot();
      if (!restored_from_) return s;
      const Geometry& g = geometry();
      const auto shift = std::size_t(restored_from_->first - restored_from_->base);
      switch (how_) {
        case ReadBack::base_d_zero:
          s.base_d = 0;
          break;
        case ReadBack::len_d_zero:
          s.len_d = 0;
          break;
        case ReadBack::rows_where_the_source_had_them:
          s.k_plane.insert(s.k_plane.begin(), shift * std::size_t(g.k_tok_bytes()), 0);
          s.k_plane.resize(std::size_t(g.rows() * g.k_tok_bytes()));
          break;
      }
      return s;
    }
    ReadBack how_;
    std::optional<kvlayer::Snapshot> restored_from_;
  };
  Case c = ring_case();
  c.commands.push_back(Restore{false});
  KeepsTheOldLayer keeps(c);
  const std::string kept = first_difference(c, keeps);
  EXPECT_TRUE(kept.starts_with("after restore into_fresh: K plane differs at byte 0")) << kept;
  MisreadsTheRestore base_d(c, ReadBack::base_d_zero), len_d(c, ReadBack::len_d_zero),
      placed(c, ReadBack::rows_where_the_source_had_them);
  EXPECT_EQ(first_difference(c, base_d),
            "after restore into_fresh: counters differ: base_d 0 (model 96)");
  EXPECT_EQ(first_difference(c, len_d),
            "after restore into_fresh: counters differ: len_d 0 (model 136)");
  // The source held row 96 at physical row 32: read back there, physical row 0 is zeros.
  const std::string misplaced = first_difference(c, placed);
  EXPECT_TRUE(misplaced.starts_with(
      "after restore into_fresh: K plane differs at byte 0 (physical row 0, byte 0 of the row)"))
      << misplaced;
  Case used = ring_case();
  used.commands = {Append{2, 1, DataKind::gaussian}, Restore{true}};
  RestoresIntoAUsedLayer lax(used);
  EXPECT_EQ(first_difference(used, lax),
            "restore into_current: model refused: restore: the layer is not fresh (an append, "
            "rewind, reserve, device-counter step, account_steps or restore was accepted since "
            "its construction); restore into a newly constructed layer; system accepted");
}

/// The generator draws both commands, restores into fresh layers, and restores of a ring
/// snapshot that starts above its base (where a misplaced copy shows), within a short campaign.
TEST(SnapshotCommands, ACampaignReachesEveryRestorePath) {
  CampaignConfig config;
  config.seed = 20261129;
  config.cases = 60;
  config.max_size = 100;
  config.limits.medium_ctx = 0;  // short views only: the paths, not the lengths
  config.limits.long_ctx = 0;
  const CampaignResult r = run_campaign(config);
  ASSERT_TRUE(r.passed) << r.report;
  EXPECT_GT(r.stats.commands.at("snapshot"), 0);
  EXPECT_GT(r.stats.commands.at("restore"), 0);
  EXPECT_GT(r.stats.restores, 0);
  EXPECT_GT(r.stats.restores_past_base, 0);
  std::cout << r.stats.commands.at("snapshot") << " snapshots, " << r.stats.commands.at("restore")
            << " restores (" << r.stats.restores << " into a fresh layer, "
            << r.stats.restores_past_base << " of a ring above its base) in " << r.seconds
            << " s\n";
}

}  // namespace
}  // namespace kvlayer::harness
