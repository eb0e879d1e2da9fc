#include "kvlayer/harness/campaign.hpp"

#include <rapidcheck.h>

#include <chrono>
#include <sstream>

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

}  // namespace

CampaignResult run_campaign(const CampaignConfig& config) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto elapsed_minutes = [&] {
    return std::chrono::duration<double>(clock::now() - start).count() / 60.0;
  };
  CampaignResult result;
  const std::string replay_path = config.replay_dir + "/failure-seed-" + std::to_string(config.seed) + ".json";
  constexpr std::int64_t kBatch = 25;
  for (std::uint64_t batch = 0; result.cases < config.cases; ++batch) {
    if (config.minutes > 0 && elapsed_minutes() >= config.minutes) break;
    rc::detail::TestParams params;
    params.seed = config.seed * 1000003u + batch;
    params.maxSuccess = int(std::min(kBatch, config.cases - result.cases));
    params.maxSize = config.max_size;
    Stats batch_stats;
    std::int64_t batch_cases = 0;
    PropertyOptions options;
    options.make_system = config.make_system;
    options.replay_path = replay_path;
    options.limits = config.limits;
    options.on_case_done = [&](const Stats& s) {
      batch_stats.add(s);
      ++batch_cases;
      if (config.on_progress) {
        Stats running = result.stats;
        running.add(batch_stats);
        config.on_progress(result.cases + batch_cases, running);
      }
    };
    ShrinkCounter listener;
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = "kvlayer model-based campaign";
    const auto outcome = rc::detail::checkTestable([&] { model_based_property(options); },
                                                   metadata, params, listener);
    rc::detail::FailureResult failure;
    if (outcome.match(failure)) {
      result.passed = false;
      std::ostringstream report;
      rc::detail::printResultMessage(outcome, report);
      result.report = report.str();
      result.replay_file = replay_path;
      result.shrunk_commands = read_replay_file(replay_path).commands.size();
      result.shrinks = listener.shrinks;
      result.failing_seed = params.seed;
      result.cases += failure.numSuccess;
      break;
    }
    rc::detail::GaveUpResult gave_up;
    rc::detail::Error error;
    if (outcome.match(gave_up) || outcome.match(error)) {
      result.passed = false;
      std::ostringstream report;
      rc::detail::printResultMessage(outcome, report);
      result.report = report.str();
      break;
    }
    // Only the passing cases of a batch count (a shrink run also calls on_case_done).
    result.stats.add(batch_stats);
    result.cases += batch_cases;
  }
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return result;
}

}  // namespace kvlayer::harness
