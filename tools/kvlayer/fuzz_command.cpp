// kvlayer fuzz: the model-based campaign (harness/): random append / rewind / rebase
// / decode / graph sequences on the reference and, when a GPU is present, the CUDA layer,
// compared after every command; a failure is shrunk and saved as a replay file.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/harness/campaign.hpp"
#include "system_choice.hpp"

#ifdef KVLAYER_WITH_CUDA
#include "kvlayer/harness/cuda_system.hpp"
#include "mutants.hpp"
#endif

namespace kvlayer::cli {
namespace {

constexpr std::string_view kUsage =
    "usage: kvlayer fuzz [--cases N] [--minutes M] [--seed S] [--max-size N]\n"
    "                    [--replay-dir DIR] [--reference-only] [--require-coverage]\n"
    "                    [--head-dim D] [--min-gqa G] [--max-gqa G] [--rows R] [--kernel K]\n"
    "                    [--verify-kernel V] [--longest N] [--hang-seconds S]\n"
    "  Runs random command sequences (append, append_dc(w), inc_seqlen, reserve, rewind,\n"
    "  decode variants, physical_rows, captured graph chains, status) on the reference and\n"
    "  the CUDA KvLayer, comparing planes, counters, status and decode outputs after every\n"
    "  command. Without a GPU (or with --reference-only) the reference runs alone: its\n"
    "  invariants and an independent float64 recomputation of decodes.\n"
    "  --cases N        passing cases to run (default 300)\n"
    "  --minutes M      stop after M minutes (default: no limit)\n"
    "  --seed S         campaign seed (default 1); the same seed draws the same cases\n"
    "  --max-size N     rapidcheck size: longest sequences (default 150)\n"
    "  --replay-dir D   where a failing case's replay file goes (default .); an existing,\n"
    "                   writable directory, checked before the first case\n"
    "  --head-dim D, --min-gqa G, --max-gqa G, --rows auto|split|whole, --kernel mma|cuda_core\n"
    "                   draw only cases of head dim D, gqa in [G, G], that row choice, that\n"
    "                   kernel family (aims a campaign at some kernel instances; tools/mutants\n"
    "                   runs one per instance, tools/device-campaign.sh aims some processes)\n"
    "  --verify-kernel mma|wgmma\n"
    "                   verify decodes of T·gqa > 16 at head dim 128 on that kernel only (mma:\n"
    "                   mma.sync; wgmma: warpgroup MMA where the device has it). Default: each\n"
    "                   case draws one\n"
    "  --longest N      draw no view longer than N keys (default 131072: short, medium and\n"
    "                   long views; tools/mutants uses 8192, whose cases and shrinks are fast)\n"
    "  --hang-seconds S a call into the CUDA layer (state read-backs included) that has not\n"
    "                   returned after S seconds is a hang (default 60; 0: never): the case is\n"
    "                   saved unshrunk (a hung device cannot run the shrink), the summary says\n"
    "                   \"failure kind  hang\" and the process exits 1 at once\n"
    "  --require-coverage  with the CUDA side: fail (exit 1) when a coverage floor is not met\n"
    "                   (every selectable kernel instance run with 1, 2 and >= 3 key-loop\n"
    "                   trips per warp; a merge over 256 splits, a verify of T > 16, a ring\n"
    "                   view past base over >= 2 splits, a rebase of >= 2 units)\n"
    "  A failing case is shrunk; its shrunk sequence is printed before the replay file\n"
    "  (DIR/failure-seed-S.json) is written.\n"
    "  exit status 0 when every case passed, 1 on a failure (and when the replay file could\n"
    "  not be written, said on stderr)\n";

double parse_minutes(const Options& o) {
  const auto v = o.get("minutes");
  if (!v) return 0;
  std::size_t used = 0;
  double x = -1;
  try {
    x = std::stod(*v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v->size() || !(x > 0) || x > 100000)
    throw UsageError("--minutes '" + *v + "' must be a number in (0, 100000]");
  return x;
}

/// A one-line progress bar on stderr, redrawn at most 5 times a second (a line per 10% when
/// stderr is not a terminal).
class Progress {
 public:
  Progress(std::int64_t total, double minutes) : total_(total), minutes_(minutes) {}
  void update(std::int64_t done, const harness::Stats& s) {
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - start_).count();
    const bool tty = isatty(2);
    if (tty && now - last_ < std::chrono::milliseconds(200) && done < total_) return;
    const double frac =
        std::max(double(done) / double(total_), minutes_ > 0 ? secs / (60 * minutes_) : 0.0);
    if (!tty && int(frac * 10) == last_decile_) return;
    last_ = now;
    last_decile_ = int(frac * 10);
    constexpr int kWidth = 30;
    const int filled = std::min(kWidth, int(frac * kWidth));
    std::fprintf(stderr, "%s[%s%s] %lld/%lld cases  %.1f cases/min  rebases %lld  replays %lld%s",
                 tty ? "\r" : "", std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(kWidth - filled), '.').c_str(), (long long)done,
                 (long long)total_, secs > 0 ? 60.0 * double(done) / secs : 0.0,
                 (long long)s.rebases, (long long)s.graph_replays, tty ? "   " : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (!finished_ && isatty(2)) std::fprintf(stderr, "\n");
    finished_ = true;
  }

 private:
  std::int64_t total_;
  double minutes_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
  int last_decile_ = -1;
  bool finished_ = false;
};

void print_summary(const harness::CampaignResult& r, const std::string& side) {
  auto line = [](const std::string& k, const std::string& v) {
    std::printf("  %-28s %s\n", k.c_str(), v.c_str());
  };
  std::printf("\nkvlayer fuzz summary\n");
  line("sides", side);
  line("cases", std::to_string(r.cases));
  line("seconds", std::to_string(int(r.seconds)));
  line("cases per minute",
       std::to_string(r.seconds > 0 ? int(60.0 * double(r.cases) / r.seconds) : 0));
  std::int64_t total = 0;
  for (const auto& [kind, n] : r.stats.commands) total += n;
  line("commands",
       std::to_string(total) + " (" + std::to_string(r.stats.refused) + " refused, on both sides)");
  for (const auto& [kind, n] : r.stats.commands) line("  " + kind, std::to_string(n));
  line("rebases", std::to_string(r.stats.rebases));
  line("rewinds", std::to_string(r.stats.rewinds));
  line("graph replays", std::to_string(r.stats.graph_replays));
  line("restores", std::to_string(r.stats.restores) + " (" +
                       std::to_string(r.stats.restores_past_base) +
                       " of a ring snapshot starting above its base)");
  line("bytes compared", std::to_string(r.stats.bytes_compared));
  line("decodes compared", std::to_string(r.stats.decodes_compared));
  char worst[160];
  std::snprintf(worst, sizeof worst, "%.3g (error %.3g against bound %.3g)",
                r.stats.worst_error_ratio, r.stats.worst_error, r.stats.worst_bound);
  line("largest decode error/bound", r.stats.worst_bound > 0 ? worst : "n/a (no GPU outputs)");
  if (r.stats.worst_energy > 0) {
    char energy[64];
    std::snprintf(energy, sizeof energy, "%.3g in ", r.stats.worst_energy);
    line("largest launch energy", energy + r.stats.worst_energy_at);
  }
  // Where the time went: tells a slow campaign's bottleneck (model, device calls, read-backs).
  const harness::Stats& t = r.stats;
  const double model =
      t.seconds_in_commands - t.seconds_in_system - t.seconds_in_snapshots - t.seconds_in_bounds;
  char split[240];
  std::snprintf(split, sizeof split,
                "%.1f s: system calls %.1f, state read-backs %.1f, decode bounds %.1f, model and "
                "comparisons %.1f",
                t.seconds_in_commands, t.seconds_in_system, t.seconds_in_snapshots,
                t.seconds_in_bounds, model);
  line("time in commands", split);
  line("time outside commands", std::to_string(int(r.seconds - t.seconds_in_commands)) +
                                    " s (case set-up and teardown, generation, shrinking)");
  line("failures", r.passed ? "0" : "1");
  if (!r.passed) {
    // What failed the case: a difference between the sides, or an exception from one.
    const bool difference = r.report.find(harness::kDifferencePrefix) != std::string::npos;
    const bool thrown = r.report.find(harness::kExceptionPrefix) != std::string::npos;
    line("failure kind", difference ? "difference" : (thrown ? "exception" : "other"));
    if (r.failing_commands > 0)
      line("failing case", std::to_string(r.failing_commands) + " commands");
    if (!r.replay_error.empty())
      line("replay file", "NOT WRITTEN: " + r.replay_error);
    else
      line("replay file", r.replay_file.empty() ? "(none)" : r.replay_file);
    if (r.shrunk_commands > 0 || r.shrinks > 0)
      line("shrunk sequence", std::to_string(r.shrunk_commands) + " commands after " +
                                  std::to_string(r.shrinks) + " shrinks");
  }
  // Unindented, so that tools/device-campaign.sh can collect it.
  if (r.stats.tightness.elements() > 0) std::printf("%s\n", r.stats.tightness.summary().c_str());
  if (r.stats.systematic.launches() > 0) {
    std::printf("%s\n", r.stats.systematic.summary().c_str());
    // Per kernel path too (unindented: the campaign collects them), the statistic's
    // calibration being per path.
    for (const auto& [path, check] : r.stats.systematic_by_path)
      if (check.launches() > 0) std::printf("%s\n", check.summary(path).c_str());
  }
  if (!r.stats.coverage.empty()) std::printf("%s", r.stats.coverage.table().c_str());
}

/// The summary's failure lines for a hung call (the process exits after them: the device
/// cannot be taken back, so no totals or coverage follow).
void print_hang(const harness::HangReport& h, const std::string& side) {
  auto line = [](const std::string& k, const std::string& v) {
    std::printf("  %-28s %s\n", k.c_str(), v.c_str());
  };
  std::printf("\nkvlayer fuzz summary\n");
  line("sides", side);
  line("failures", "1");
  line("failure kind", "hang");
  char what[200];
  std::snprintf(what, sizeof what, "%s (no return after %.0f s; batch seed %llu)",
                h.command.c_str(), h.seconds, (unsigned long long)h.seed);
  line("hung command", what);
  line("failing case", std::to_string(h.commands) + " commands (unshrunk)");
  line("replay file", h.replay_error.empty() ? h.replay_file : "NOT WRITTEN: " + h.replay_error);
}

/// The coverage floors of a run with the CUDA side (SPEC §10.7): the instances its plans can
/// select, for tools/campaign_coverage.py, which sums the tables of parallel processes; with
/// --require-coverage this process's own unmet floors fail it.
bool coverage_floors_met(const harness::CampaignResult& r, const SystemChoice& choice,
                         const harness::DrawLimits& limits, bool require) {
#ifdef KVLAYER_WITH_CUDA
  if (!choice.factory) return true;
  const auto selectable =
      harness::cuda_selectable_instances(limits.verify != harness::DecodeChoice::Verify::mma);
  std::printf("%s", harness::selectable_line(selectable).c_str());
  if (!require) return true;
  const auto unmet = r.stats.coverage.unmet_floors(selectable);
  for (const std::string& u : unmet) std::printf("coverage floor not met: %s\n", u.c_str());
  return unmet.empty();
#else
  (void)r;
  (void)choice;
  (void)limits;
  (void)require;
  return true;
#endif
}

/// The planted mutant armed in this process, when this build has them (KVLAYER_MUTANTS=ON)
/// and the CUDA side runs; an unknown KVLAYER_MUTANT name throws kvlayer::Error.
void print_mutant_note(const SystemChoice& choice) {
  const char* env = std::getenv("KVLAYER_MUTANT");
  if (env == nullptr || *env == '\0') return;
#ifdef KVLAYER_WITH_CUDA
  using cuda::detail::Mutant;
  const Mutant m = cuda::detail::active_mutant();
  if (m != Mutant::none) {
    if (choice.factory)
      std::printf("  planted mutant armed: %s\n", cuda::detail::mutant_name(m));
    else
      std::printf("  planted mutant %s is not exercised: the CUDA side does not run\n",
                  cuda::detail::mutant_name(m));
    return;
  }
#else
  (void)choice;
#endif
  std::printf("  KVLAYER_MUTANT=%s is ignored: this build has no planted mutants\n", env);
}

int run_fuzz(const std::vector<std::string>& args) {
  const Options o(args,
                  {"cases", "minutes", "seed", "max-size", "replay-dir", "head-dim", "min-gqa",
                   "max-gqa", "rows", "kernel", "verify-kernel", "longest", "hang-seconds"},
                  {"reference-only", "require-coverage"});
  harness::CampaignConfig config;
  config.cases = o.integer("cases", 300, 1, 1'000'000'000);
  config.minutes = parse_minutes(o);
  config.seed = std::uint64_t(o.integer("seed", 1, 0, INT64_MAX));
  config.max_size = int(o.integer("max-size", 150, 1, 10000));
  config.replay_dir = o.get("replay-dir").value_or(".");
  if (o.get("head-dim")) {
    config.limits.head_dim = int(o.integer("head-dim", 0, 1, 1 << 16));
    if (!cuda::head_dim_supported(config.limits.head_dim))
      throw UsageError("--head-dim '" + *o.get("head-dim") + "' must be one of " +
                       cuda::supported_head_dims());
  }
  config.limits.min_gqa = int(o.integer("min-gqa", 1, 1, 16));
  config.limits.max_gqa = int(o.integer("max-gqa", 16, config.limits.min_gqa, 16));
  if (const auto rows = o.get("rows")) {
    if (*rows == "auto")
      config.limits.rows = harness::DecodeChoice::Rows::automatic;
    else if (*rows == "split")
      config.limits.rows = harness::DecodeChoice::Rows::split;
    else if (*rows == "whole")
      config.limits.rows = harness::DecodeChoice::Rows::whole;
    else
      throw UsageError("--rows '" + *rows + "' must be auto, split or whole");
  }
  if (o.get("longest")) {
    harness::DrawLimits& l = config.limits;
    const std::int64_t n = o.integer("longest", l.long_ctx, 1, l.long_ctx);
    l.max_ctx = std::min(l.max_ctx, n);
    l.medium_ctx = std::min(l.medium_ctx, n);  // not drawn when not above max_ctx
    l.long_ctx = n < l.long_ctx_min ? 0 : n;   // not drawn when 0
  }
  if (const auto kernel = o.get("kernel")) {
    if (*kernel == "mma")
      config.limits.kernel = harness::DecodeChoice::Kernel::mma;
    else if (*kernel == "cuda_core")
      config.limits.kernel = harness::DecodeChoice::Kernel::cuda_core;
    else
      throw UsageError("--kernel '" + *kernel + "' must be mma or cuda_core");
  }
  if (const auto verify = o.get("verify-kernel")) {
    if (*verify == "mma")
      config.limits.verify = harness::DecodeChoice::Verify::mma;
    else if (*verify == "wgmma")
      config.limits.verify = harness::DecodeChoice::Verify::wgmma;
    else
      throw UsageError("--verify-kernel '" + *verify + "' must be mma or wgmma");
  }
  config.hang_seconds =
      double(o.integer("hang-seconds", std::int64_t(harness::kDefaultHangSeconds), 0, 86400));
  // Before anything runs: a failure found later must have somewhere to go.
  harness::check_replay_dir(config.replay_dir);
  const SystemChoice choice = choose_system(o.flag("reference-only"));
  config.make_system = choice.factory;
  std::printf(
      "kvlayer fuzz: seed %llu, %lld cases%s\n", (unsigned long long)config.seed,
      (long long)config.cases,
      config.minutes > 0 ? (" or " + std::to_string(config.minutes) + " minutes").c_str() : "");
  std::printf("  %s\n", choice.description.c_str());
  print_mutant_note(choice);
  std::fflush(stdout);
  Progress progress(config.cases, config.minutes);
  config.on_progress = [&](std::int64_t done, const harness::Stats& s) {
    progress.update(done, s);
  };
  // The shrunk sequence goes out before the replay file is written: it is the record of the
  // failure if the file cannot be.
  config.on_failure = [&](const std::string& report) {
    progress.finish();
    std::printf("\n%s\n", report.c_str());
    std::fflush(stdout);
  };
  // A hang ends the process from the watchdog's thread: the summary's failure lines now.
  config.on_hang = [&](const harness::HangReport& h) {
    progress.finish();
    print_hang(h, choice.sides);
  };
  const harness::CampaignResult r = harness::run_campaign(config);
  progress.finish();
  print_summary(r, choice.sides);
  const bool covered = coverage_floors_met(r, choice, config.limits, o.flag("require-coverage"));
  if (!r.replay_error.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvlayer fuzz: %s\n", r.replay_error.c_str());
  }
  return r.passed && covered ? kExitOk : kExitFailure;
}

}  // namespace

const Command& fuzz_command() {
  static const Command c{"fuzz",
                         "model-based campaign: reference vs CUDA layer, shrinking, replay files",
                         kUsage, &run_fuzz};
  return c;
}

}  // namespace kvlayer::cli
