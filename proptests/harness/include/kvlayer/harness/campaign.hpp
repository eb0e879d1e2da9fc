// A fuzz campaign: the model-based property run batch after batch with derived seeds, until a
// case budget or a time budget is spent or a case fails (then shrunk by rapidcheck and saved
// as a replay file). Used by `kvlayer fuzz` and by the GPU property test.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvlayer/harness/generate.hpp"

namespace kvlayer::harness {

struct CampaignConfig {
  std::uint64_t seed = 1;
  std::int64_t cases = 1000;  ///< stop after this many passing cases
  double minutes = 0;         ///< and/or after this long (0: no time limit)
  int max_size = 150;         ///< rapidcheck size: longest command sequences
  DrawLimits limits;
  SystemFactory make_system;  ///< empty: reference only
  std::string replay_dir = ".";
  /// Called after every passing case with the cases done so far and the running totals.
  std::function<void(std::int64_t cases_done, const Stats& totals)> on_progress;
};

struct CampaignResult {
  bool passed = true;
  std::int64_t cases = 0;  ///< passing cases run
  Stats stats;             ///< totals over passing cases
  double seconds = 0;
  // On failure:
  std::string report;            ///< rapidcheck's report: the shrunk sequence, one line each
  std::string replay_file;       ///< the shrunk case, replayable by `kvlayer replay`
  std::size_t shrunk_commands = 0;
  std::int64_t shrinks = 0;
  std::uint64_t failing_seed = 0;  ///< the batch seed that failed
};

/// Runs the campaign. Never throws for a failing case (see CampaignResult); throws
/// kvlayer::Error only when the replay file cannot be written.
CampaignResult run_campaign(const CampaignConfig& config);

}  // namespace kvlayer::harness
