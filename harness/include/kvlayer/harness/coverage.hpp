// What a campaign's decode launches reached, per kernel instance (SPEC §10.7): how many trips
// of the key loop one warp made in the longest split (1, 2, ≥ 3: a second register buffer or
// ring stage, then a stage reused and its barrier parity flipped, and every rescale of a
// non-empty accumulator inside a warp), merges over more than 256 partials, verify row blocks
// of T > 16, ring views past base 0 cut into several splits, and rebases that move base by more
// than one 32-row unit. The system counts its launches from its own launch arithmetic; the
// executor counts the rebases. A campaign that leaves a floor unmet fails.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvlayer::harness {

/// One launch as the system ran it.
struct LaunchRecord {
  std::string instance;  ///< the kernel instance: "mma_direct d128 r8", …
  std::int64_t loop_trips = 0;
  int active_splits = 0;
  int queries = 0;         ///< 0: a decode; T ≥ 1: a verify decode of T queries
  bool past_base = false;  ///< a ring view whose base is above 0
};

struct Coverage {
  struct Instance {
    std::int64_t launches = 0;
    std::int64_t trips[3] = {0, 0, 0};  ///< launches whose longest warp loop ran 1, 2, ≥ 3 trips
    std::int64_t merges_over_256 = 0;
  };
  std::map<std::string, Instance> instances;
  std::int64_t verify_over_16 = 0;         ///< verify launches of T > 16
  std::int64_t ring_past_base_splits = 0;  ///< ring views past base 0 over ≥ 2 splits
  std::int64_t rebases_over_one_unit = 0;  ///< rebases moving base by ≥ 2 units of 32 rows
  // Batches (SPEC §12), counted by the batch commands: decodes of ≥ 2 active sequences, those
  // of a ring whose active sequences' bases differ (each must take its own base_d), and graph
  // replays whose active list differs from the replay before (one captured graph serves both).
  std::int64_t batch_decodes = 0;
  std::int64_t batch_ring_distinct_bases = 0;
  std::int64_t batch_replays_membership_changed = 0;

  void record(const LaunchRecord& launch);
  void add(const Coverage& other);
  bool empty() const { return instances.empty(); }
  /// The table `kvlayer fuzz` prints: one line per instance, then the other rows.
  std::string table() const;
  /// The floors this coverage misses, one line each (empty: all met). Every instance in
  /// `selectable` must have run 1, 2 and ≥ 3 trips; a merge over 256 partials, a verify of
  /// T > 16, a ring view past base with several splits, a multi-unit rebase and the three batch
  /// rows must each have happened.
  std::vector<std::string> unmet_floors(const std::vector<std::string>& selectable) const;
};

/// "coverage selectable: a; b; …\n": the instances the floors require, as `kvlayer fuzz`
/// prints them for tools/campaign_coverage.py.
std::string selectable_line(const std::vector<std::string>& selectable);

}  // namespace kvlayer::harness
