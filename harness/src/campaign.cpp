#include "kvlayer/harness/campaign.hpp"

#include <rapidcheck.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/replay_file.hpp"

namespace kvlayer::harness {
namespace {

/// Counts shrinks for the report.
class ShrinkCounter : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    if (accepted) ++shrinks;
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
  std::int64_t shrinks = 0;
};

/// Inside a catch block: whether the exception in flight makes rapidcheck fail the case (as
/// opposed to discarding it).
bool in_flight_is_failure() {
  try {
    throw;
  } catch (const rc::detail::CaseResult& r) {
    return r.type == rc::detail::CaseResult::Type::Failure;
  } catch (const rc::GenerationFailure&) {
    return false;
  } catch (...) {
    return true;
  }
}

void remove_quietly(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

/// Moves the shrunk case from `scratch` (written by the property at each failing run) to
/// `path`; a failure to do so lands in result.replay_error.
void save_replay(const std::string& scratch, const std::string& path, CampaignResult& result) {
  Case shrunk;
  try {
    shrunk = read_replay_file(scratch);
  } catch (const Error& e) {
    // The property could not write the scratch file (its error is in the report).
    result.replay_error = "replay file " + path + ": cannot be written (" + e.what() + ")";
    return;
  }
  result.shrunk_commands = shrunk.commands.size();
  try {
    write_replay_file(path, shrunk);
  } catch (const Error& e) {
    result.replay_error = std::string(e.what()) + " (the shrunk case is in " + scratch + ")";
    return;
  }
  remove_quietly(scratch);
  result.replay_file = path;
}

}  // namespace

void check_replay_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) throw Error(ErrorKind::io, "replay dir " + dir + ": does not exist");
  if (!fs::is_directory(st))
    throw Error(ErrorKind::io, "replay dir " + dir + ": is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(ErrorKind::io, "replay dir " + dir + ": is not writable");
}

CampaignResult run_campaign(const CampaignConfig& config) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto elapsed_minutes = [&] {
    return std::chrono::duration<double>(clock::now() - start).count() / 60.0;
  };
  const std::string dir = config.replay_dir.empty() ? "." : config.replay_dir;
  // Before any case runs: a failure found after hours must have somewhere to go.
  check_replay_dir(dir);
  CampaignResult result;
  const std::string replay_path = dir + "/failure-seed-" + std::to_string(config.seed) + ".json";
  // Every failing run of a shrink overwrites this file; only the final shrunk case is moved to
  // replay_path, after on_failure has seen it. Per process, so that parallel campaigns with
  // the same seed and folder do not mix their cases.
  const std::string scratch = replay_path + ".partial-" + std::to_string(::getpid());
  if (config.shards < 1 || config.shard < 0 || config.shard >= config.shards)
    throw Error(ErrorKind::refused, "campaign shard " + std::to_string(config.shard) + " of " +
                                        std::to_string(config.shards) +
                                        ": the shard must be in [0, shards)");
  // Batch b holds cases [b · kCampaignBatch, (b + 1) · kCampaignBatch) of the whole campaign.
  const auto step = std::uint64_t(config.shards);
  for (std::uint64_t batch = std::uint64_t(config.shard);
       std::int64_t(batch) * kCampaignBatch < config.cases; batch += step) {
    if (config.minutes > 0 && elapsed_minutes() >= config.minutes) break;
    rc::detail::TestParams params;
    params.seed = config.seed * 1000003u + batch;
    params.maxSuccess =
        int(std::min(kCampaignBatch, config.cases - std::int64_t(batch) * kCampaignBatch));
    params.maxSize = config.max_size;
    Stats batch_stats;
    std::int64_t batch_cases = 0;
    // Set by the batch's first failing case: every run after it belongs to the shrink.
    bool shrinking = false;
    std::size_t failing_commands = 0;
    PropertyOptions options;
    options.make_system = config.make_system;
    options.replay_path = scratch;
    options.limits = config.limits;
    options.hang_seconds = config.hang_seconds;
    options.on_hang = [&](const Case& hung, double seconds) {
      HangReport r;
      r.commands = hung.commands.size();
      if (!hung.commands.empty()) r.command = describe(hung.commands.back());
      r.seconds = seconds;
      r.seed = params.seed;
      try {
        write_replay_file(replay_path, hung);
        r.replay_file = replay_path;
      } catch (const Error& e) {
        r.replay_error = e.what();
      }
      if (config.on_hang) config.on_hang(r);
    };
    options.on_case_done = [&](const Stats& s) {
      if (shrinking) return;
      batch_stats.add(s);
      ++batch_cases;
      if (config.on_progress) {
        Stats running = result.stats;
        running.add(batch_stats);
        config.on_progress(result.cases + batch_cases, running);
      }
    };
    const auto property = [&] {
      // Past the time limit the batch's remaining cases run nothing and are not counted: a
      // batch of long-view cases can take minutes, and --minutes is what a campaign plans by.
      if (!shrinking && config.minutes > 0 && elapsed_minutes() >= config.minutes) return;
      try {
        model_based_property(options);
      } catch (...) {
        if (!shrinking && in_flight_is_failure()) {
          shrinking = true;
          try {
            failing_commands = read_replay_file(scratch).commands.size();
          } catch (const Error&) {
            // Not written: save_replay reports it once the shrink is done.
          }
        }
        throw;
      }
    };
    ShrinkCounter listener;
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = "kvlayer model-based campaign";
    const auto outcome = rc::detail::checkTestable(property, metadata, params, listener);
    // The passing cases count whatever the outcome (the runs of a shrink are left out above).
    result.stats.add(batch_stats);
    result.cases += batch_cases;
    rc::detail::FailureResult failure;
    if (outcome.match(failure)) {
      result.passed = false;
      std::ostringstream report;
      rc::detail::printResultMessage(outcome, report);
      result.report = report.str();
      result.failing_commands = failing_commands;
      result.shrinks = listener.shrinks;
      result.failing_seed = params.seed;
      if (config.on_failure) config.on_failure(result.report);
      save_replay(scratch, replay_path, result);
      break;
    }
    rc::detail::GaveUpResult gave_up;
    rc::detail::Error error;
    if (outcome.match(gave_up) || outcome.match(error)) {
      result.passed = false;
      std::ostringstream report;
      rc::detail::printResultMessage(outcome, report);
      result.report = report.str();
      remove_quietly(scratch);
      if (config.on_failure) config.on_failure(result.report);
      break;
    }
  }
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return result;
}

}  // namespace kvlayer::harness
