// The campaign behind `kvlayer fuzz` never loses a found failure: the replay directory is
// checked before the first case, the shrunk sequence reaches on_failure before the replay file
// is written, a write failure is named as such (the case stays in the scratch file), and the
// result counts the passing cases that ran before the failure. A found failure is forced by a
// system that gets every state wrong (the reference-only campaign cannot fail). A system call
// that never returns (a deadlocked kernel) is reported as a hang with its case saved, and the
// process exits 1, instead of waiting for an outer timeout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/campaign.hpp"
#include "kvlayer/harness/replay_file.hpp"

namespace kvlayer::harness {
namespace {

namespace fs = std::filesystem;

/// Keeps nothing: its snapshot (empty planes) differs from the model after any command.
class ForgetfulSystem : public System {
 public:
  explicit ForgetfulSystem(const Case& c)
      : outputs_(std::size_t(c.n_q_heads) * std::size_t(c.geometry.head_dim_v), 0.0f) {}
  void append(const HostRows&) override {}
  void append_dc(const HostRows&, bool) override {}
  void inc_seqlen() override {}
  void append_rows_dc(const HostRows&, bool) override {}
  void inc_seqlen(int) override {}
  std::vector<float> decode_rows(DecodeVariant, std::span<const float>, int t,
                                 std::optional<float>) override {
    return std::vector<float>(std::size_t(std::max(t, 0)) * outputs_.size(), 0.0f);
  }
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>&,
                                               const std::vector<std::int64_t>&, int t, bool,
                                               std::optional<float>) override {
    return std::vector<std::vector<float>>(drafts.size(),
                                           std::vector<float>(std::size_t(t) * outputs_.size()));
  }
  kvlayer::AccumulationShape verify_accumulation_shape(int) override { return {}; }
  void account_steps(std::int64_t) override {}
  void reserve(std::int64_t) override {}
  void rewind(std::int64_t) override {}
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t, std::int64_t) override {
    return {0, 0};
  }
  bool can_rewind_to(std::int64_t) override { return false; }
  std::vector<float> decode(DecodeVariant, std::span<const float>, std::optional<float>) override {
    return outputs_;
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>&, bool,
                                              std::optional<float>) override {
    return std::vector<std::vector<float>>(rows.size(), outputs_);
  }
  void clear_status() override {}
  Snapshot snapshot() override { return {}; }
  kvlayer::Snapshot take_snapshot() override { return {}; }
  void restore(const kvlayer::Snapshot&) override {}
  void restore_into_fresh(const kvlayer::Snapshot&) override {}
  kvlayer::AccumulationShape accumulation_shape(DecodeVariant) override { return {}; }

 private:
  std::vector<float> outputs_;
};

/// Its first read-back (of the state or of a decode's outputs) never returns, as after a
/// deadlocked kernel: whichever command a case draws first, the case hangs in it.
class HangingSystem : public ForgetfulSystem {
 public:
  using ForgetfulSystem::ForgetfulSystem;
  Snapshot snapshot() override { return hang(ForgetfulSystem::snapshot()); }
  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    return hang(ForgetfulSystem::decode(v, q, scale));
  }
  std::vector<float> decode_rows(DecodeVariant v, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    return hang(ForgetfulSystem::decode_rows(v, q, t, scale));
  }
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& q,
                                               const std::vector<std::int64_t>& accept, int t,
                                               bool windowed, std::optional<float> scale) override {
    return hang(ForgetfulSystem::verify_chain(drafts, q, accept, t, windowed, scale));
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& q,
                                              bool windowed, std::optional<float> scale) override {
    return hang(ForgetfulSystem::graph_chain(rows, q, windowed, scale));
  }

 private:
  template <typename T>
  static T hang(T value) {
    std::this_thread::sleep_for(std::chrono::hours(1));
    return value;
  }
};

class Campaign : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kvlayer_campaign_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Small cases; the first `honest_cases` cases run on the reference alone (and pass), every
  /// later one (the shrink's runs too) against a ForgetfulSystem.
  CampaignConfig config(int honest_cases) {
    CampaignConfig c;
    c.seed = 5;
    c.cases = 1000;
    c.max_size = 12;
    c.limits.max_kv_heads = 2;
    c.limits.max_ctx = 48;
    c.limits.medium_ctx = 0;  // short cases only
    c.limits.long_ctx = 0;
    c.replay_dir = dir_.string();
    c.make_system = [this, honest_cases](const Case& k) -> std::unique_ptr<System> {
      if (systems_made_++ < honest_cases) return nullptr;
      return std::make_unique<ForgetfulSystem>(k);
    };
    c.on_progress = [this](std::int64_t done, const Stats& totals) {
      progress_cases_ = done;
      progress_commands_ = total_commands(totals);
    };
    return c;
  }

  static std::int64_t total_commands(const Stats& s) {
    std::int64_t n = 0;
    for (const auto& [kind, count] : s.commands) n += count;
    return n;
  }

  /// The files left in the replay directory (names only).
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  int systems_made_ = 0;
  std::int64_t progress_cases_ = 0, progress_commands_ = 0;
};

TEST_F(Campaign, AMissingReplayDirIsRefusedBeforeTheFirstCase) {
  CampaignConfig c = config(0);
  c.replay_dir = (dir_ / "missing").string();
  try {
    run_campaign(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "replay dir " + c.replay_dir + ": does not exist");
    EXPECT_EQ(e.kind(), ErrorKind::io);
  }
  EXPECT_EQ(systems_made_, 0) << "a case ran before the check";
}

TEST_F(Campaign, AReplayDirThatIsAFileIsRefused) {
  std::ofstream(dir_ / "plain").put('x');
  CampaignConfig c = config(0);
  c.replay_dir = (dir_ / "plain").string();
  try {
    run_campaign(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "replay dir " + c.replay_dir + ": is not a directory");
  }
  EXPECT_EQ(systems_made_, 0);
}

/// What a reference-only campaign of `cases` (shard k of n) drew: each case as the system
/// factory sees it (geometry, seed, plan; its commands are drawn as it runs), and the commands
/// it ran by kind.
struct Drawn {
  std::vector<std::string> cases;
  std::map<std::string, std::int64_t> commands;
};
Drawn drawn_cases(CampaignConfig c, std::int64_t cases, int shard, int shards) {
  Drawn d;
  c.cases = cases;
  c.shard = shard;
  c.shards = shards;
  c.on_progress = nullptr;
  c.make_system = [&d](const Case& k) -> std::unique_ptr<System> {
    d.cases.push_back(to_json(k));
    return nullptr;
  };
  const CampaignResult r = run_campaign(c);
  EXPECT_TRUE(r.passed);
  d.commands = r.stats.commands;
  return d;
}

// device-check runs test_model_cuda as shards: together they must be the one run's cases.
TEST_F(Campaign, ShardsTogetherDrawExactlyTheCasesOfOneCampaign) {
  const CampaignConfig c = config(0);
  const std::int64_t cases = 4 * kCampaignBatch + 7;  // a partial last batch too
  Drawn whole = drawn_cases(c, cases, 0, 1);
  ASSERT_EQ(std::int64_t(whole.cases.size()), cases);
  Drawn shards;
  for (int k = 0; k < 3; ++k) {
    const Drawn part = drawn_cases(c, cases, k, 3);
    EXPECT_FALSE(part.cases.empty()) << "shard " << k;
    shards.cases.insert(shards.cases.end(), part.cases.begin(), part.cases.end());
    for (const auto& [kind, n] : part.commands) shards.commands[kind] += n;
  }
  std::sort(whole.cases.begin(), whole.cases.end());
  std::sort(shards.cases.begin(), shards.cases.end());
  EXPECT_EQ(shards.cases, whole.cases);
  EXPECT_EQ(shards.commands, whole.commands);
}

TEST_F(Campaign, AShardOutsideItsCountIsRefusedBeforeTheFirstCase) {
  for (const auto& [shard, shards] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    CampaignConfig c = config(0);
    c.shard = shard;
    c.shards = shards;
    try {
      run_campaign(c);
      ADD_FAILURE() << "shard " << shard << " of " << shards << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "campaign shard " + std::to_string(shard) + " of " +
                                           std::to_string(shards) +
                                           ": the shard must be in [0, shards)");
      EXPECT_EQ(e.kind(), ErrorKind::refused);
    }
  }
  EXPECT_EQ(systems_made_, 0) << "a case ran before the check";
}

TEST_F(Campaign, AFailureIsReportedBeforeItsReplayFileAndCountsWhatRan) {
  CampaignConfig c = config(30);
  const fs::path replay = dir_ / "failure-seed-5.json";
  int failures_seen = 0;
  c.on_failure = [&](const std::string& report) {
    ++failures_seen;
    // The shrunk sequence and the difference it ends in.
    EXPECT_NE(report.find("Falsifiable after"), std::string::npos) << report;
    // (what differs first depends on the command the shrink ends with)
    EXPECT_TRUE(report.find("plane sizes differ") != std::string::npos ||
                report.find("; system accepted") != std::string::npos ||
                report.find("snapshots differ") != std::string::npos)
        << report;
    EXPECT_FALSE(fs::exists(replay)) << "the replay file was written before the report";
  };
  const CampaignResult r = run_campaign(c);
  ASSERT_FALSE(r.passed);
  EXPECT_EQ(failures_seen, 1);
  EXPECT_EQ(r.replay_error, "");
  EXPECT_EQ(r.replay_file, replay.string());
  EXPECT_EQ(files(), std::vector<std::string>{"failure-seed-5.json"}) << "scratch file left";
  const Case saved = read_replay_file(r.replay_file);
  EXPECT_EQ(saved.commands.size(), r.shrunk_commands);
  EXPECT_GE(r.shrunk_commands, 1u);
  EXPECT_GE(r.failing_commands, r.shrunk_commands);
  // The passing cases before the failure: counted, and no run of the shrink among them.
  EXPECT_GE(r.cases, 30);
  EXPECT_EQ(r.cases, progress_cases_);
  EXPECT_GT(total_commands(r.stats), 0);
  EXPECT_EQ(total_commands(r.stats), progress_commands_);
}

TEST_F(Campaign, AReplayFileThatCannotBeWrittenIsNamedAndTheCaseKept) {
  CampaignConfig c = config(0);
  const fs::path replay = dir_ / "failure-seed-5.json";
  // A directory in the file's place: no one, root included, can write the file.
  c.on_failure = [&](const std::string&) { fs::create_directories(replay / "occupied"); };
  const CampaignResult r = run_campaign(c);
  ASSERT_FALSE(r.passed);
  EXPECT_EQ(r.replay_file, "");
  const std::string scratch = replay.string() + ".partial-" + std::to_string(::getpid());
  EXPECT_EQ(r.replay_error, "replay file " + replay.string() +
                                ": cannot be written (the shrunk case is in " + scratch + ")");
  EXPECT_EQ(read_replay_file(scratch).commands.size(), r.shrunk_commands);
  EXPECT_GE(r.shrunk_commands, 1u);
}

TEST(HangWatchdog, CallsThatReturnInTimeAreNotHangs) {
  int hangs = 0;
  {
    HangWatchdog watchdog(0.2, [&](double) { ++hangs; });
    for (int i = 0; i < 5; ++i) {
      const HangWatchdog::Call call(&watchdog);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Time between calls is not watched.
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const HangWatchdog::Call unwatched(nullptr);
  }
  EXPECT_EQ(hangs, 0);
}

TEST(HangWatchdog, ACallPastTheLimitIsReportedAndEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(
      {
        HangWatchdog watchdog(
            0.2, [](double seconds) { std::fprintf(stderr, "hang after %.1f s\n", seconds); });
        const HangWatchdog::Call call(&watchdog);
        std::this_thread::sleep_for(std::chrono::seconds(30));
      },
      ::testing::ExitedWithCode(1), "hang after 0\\.[2-9] s");
}

TEST_F(Campaign, AHungCallIsReportedWithItsCaseSavedAndEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "fast");  // fork: the child writes into this test's dir_
  const fs::path replay = dir_ / "failure-seed-5.json";
  CampaignConfig c = config(3);
  c.make_system = [this](const Case& k) -> std::unique_ptr<System> {
    if (systems_made_++ < 3) return nullptr;  // three passing cases first
    return std::make_unique<HangingSystem>(k);
  };
  c.hang_seconds = 0.3;
  c.on_hang = [](const HangReport& h) {
    std::fprintf(stderr, "hang: %s after %.1f s, %zu commands, replay %s%s\n", h.command.c_str(),
                 h.seconds, h.commands, h.replay_file.c_str(), h.replay_error.c_str());
  };
  EXPECT_EXIT(run_campaign(c), ::testing::ExitedWithCode(1),
              "hang: .+ after 0\\.[3-9] s, 1 commands, replay .*failure-seed-5\\.json\n");
  // The hung case, unshrunk: its first command's read-back never returned.
  ASSERT_TRUE(fs::exists(replay));
  const Case saved = read_replay_file(replay.string());
  EXPECT_EQ(saved.commands.size(), 1u);
}

}  // namespace
}  // namespace kvlayer::harness
