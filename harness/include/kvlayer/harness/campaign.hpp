// A fuzz campaign: the model-based property run batch after batch with derived seeds, until a
// case budget or a time budget is spent or a case fails (then shrunk by rapidcheck and saved
// as a replay file). Used by `kvlayer fuzz` and by the GPU property test.
// A found failure is never lost to the file system: the replay directory is checked before the
// first case, on_failure sees the shrunk sequence before the replay file is written, and a
// file that cannot be written is reported in the result, not thrown. A system call that hangs
// (hang_seconds) is a failure too: its case is saved unshrunk (a hung device cannot run the
// shrink), on_hang reports it and the process exits with status 1.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvlayer/harness/generate.hpp"
#include "kvlayer/harness/hang_watchdog.hpp"

namespace kvlayer::harness {

/// A hung case: the command that did not return, and where the case went.
struct HangReport {
  std::string command;       ///< describe() of the hung command
  std::size_t commands = 0;  ///< commands run, the hung one last
  double seconds = 0;        ///< how long the call had run
  std::uint64_t seed = 0;    ///< the batch seed
  std::string replay_file;   ///< the unshrunk case (empty when it could not be written)
  std::string replay_error;  ///< why not (empty: written)
};

/// Cases per rapidcheck batch of a campaign (each batch its own seed).
inline constexpr std::int64_t kCampaignBatch = 25;

struct CampaignConfig {
  std::uint64_t seed = 1;
  std::int64_t cases = 1000;  ///< stop after this many passing cases
  double minutes = 0;         ///< and/or after this long (0: no time limit)
  int max_size = 150;         ///< rapidcheck size: longest command sequences
  /// Cases are drawn in batches of kCampaignBatch, batch b from its own seed; shard k of n runs
  /// batches k, k + n, k + 2n, … of the `cases`, so that n processes with the same config and
  /// shards 0 … n − 1 together run exactly the cases of one.
  int shard = 0, shards = 1;
  DrawLimits limits;
  SystemFactory make_system;     ///< empty: reference only
  std::string replay_dir = ".";  ///< must be an existing, writable directory
  /// Called after every passing case with the cases done so far and the running totals
  /// (not for the passing runs of a shrink).
  std::function<void(std::int64_t cases_done, const Stats& totals)> on_progress;
  /// Called once a case has failed and been shrunk (or rapidcheck gave up), with rapidcheck's
  /// report (the shrunk sequence), before the replay file is written.
  std::function<void(const std::string& report)> on_failure;
  /// With a system: a call into it running longer than this is a hang (0: not watched).
  double hang_seconds = kDefaultHangSeconds;
  /// Called once on a hang, after the replay file was written (or not), on the watchdog's
  /// thread; the process exits with status 1 when it returns.
  std::function<void(const HangReport&)> on_hang;
};

struct CampaignResult {
  bool passed = true;
  std::int64_t cases = 0;  ///< passing cases run
  Stats stats;             ///< totals over passing cases (those before a failure included)
  double seconds = 0;
  // On failure:
  std::string report;                ///< rapidcheck's report: the shrunk sequence, one line each
  std::string replay_file;           ///< the shrunk case, replayable by `kvlayer replay` (empty
                                     ///< when it could not be written)
  std::string replay_error;          ///< why the replay file was not written (empty: it was)
  std::size_t failing_commands = 0;  ///< commands run by the failing case before shrinking
  std::size_t shrunk_commands = 0;
  std::int64_t shrinks = 0;
  std::uint64_t failing_seed = 0;  ///< the batch seed that failed
};

/// Throws kvlayer::Error (kind io) naming `dir` unless it is an existing, writable directory.
void check_replay_dir(const std::string& dir);

/// Runs the campaign. Throws kvlayer::Error before the first case when config.replay_dir is
/// not usable (check_replay_dir); never throws for a failing case or an unwritable replay
/// file (see CampaignResult).
CampaignResult run_campaign(const CampaignConfig& config);

}  // namespace kvlayer::harness
