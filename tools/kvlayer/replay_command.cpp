// kvlayer replay FILE: re-runs a saved case (a replay file written by a failing campaign) on
// both sides without rapidcheck, one line per command.
#include <cstdio>
#include <iostream>
#include <optional>

#include "commands.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/replay_file.hpp"
#include "system_choice.hpp"

namespace kvlayer::cli {
namespace {

constexpr std::string_view kUsage =
    "usage: kvlayer replay FILE [--reference-only] [--hang-seconds S]\n"
    "  Re-runs the case in FILE (JSON: geometry, dtype, seeds, commands) on the reference and,\n"
    "  when a GPU is present, the CUDA KvLayer, printing one line per command and the first\n"
    "  difference. A call into the CUDA layer that has not returned after S seconds (default\n"
    "  60; 0: never) is a hang: its command's line says HANG and the process exits at once.\n"
    "  Exit status 0 when both sides agree throughout, 1 otherwise.\n";

/// The accuracy bound's tightness over the decodes compared with a bound (none on the
/// reference alone), as the line `kvlayer fuzz` prints.
void print_tightness(const harness::Stats& s) {
  if (s.tightness.elements() > 0) std::printf("%s\n", s.tightness.summary().c_str());
  if (s.systematic.launches() > 0) std::printf("%s\n", s.systematic.summary().c_str());
}

int run_replay(const std::vector<std::string>& args) {
  // The file is the one positional argument: `kvlayer replay FILE [--reference-only]`.
  if (args.empty() || args.front().rfind("--", 0) == 0)
    throw UsageError("missing FILE (usage: kvlayer replay FILE [--reference-only] ...)");
  const std::string path = args.front();
  const Options o(std::vector<std::string>(args.begin() + 1, args.end()), {"hang-seconds"},
                  {"reference-only"});
  const auto hang_seconds =
      double(o.integer("hang-seconds", std::int64_t(harness::kDefaultHangSeconds), 0, 86400));
  const harness::Case c = harness::read_replay_file(path);
  const SystemChoice choice = choose_system(o.flag("reference-only"));
  std::printf("kvlayer replay %s: %s, n_q_heads %d, dtype %s, %zu commands\n  %s\n", path.c_str(),
              c.geometry.describe().c_str(), c.n_q_heads, std::string(dtype_name(c.dtype)).c_str(),
              c.commands.size(), choice.description.c_str());
  auto system = choice.factory ? choice.factory(c) : nullptr;
  // The hung command's line, from the watchdog's thread (this one is blocked in the call);
  // the process then exits 1.
  std::size_t at = 0;
  std::optional<harness::HangWatchdog> watchdog;
  if (system && hang_seconds > 0)
    watchdog.emplace(hang_seconds, [&](double seconds) {
      std::printf("%4zu  %-48s HANG (no return after %.0f s)\n", at,
                  harness::describe(c.commands[at]).c_str(), seconds);
    });
  harness::Executor executor(c, system.get(), watchdog ? &*watchdog : nullptr);
  for (std::size_t i = 0; i < c.commands.size(); ++i) {
    at = i;
    const auto diff = executor.step(c.commands[i]);
    std::printf("%4zu  %-48s %s\n", i, harness::describe(c.commands[i]).c_str(),
                diff ? "MISMATCH" : "ok");
    if (diff) {
      std::printf("\n%s\n", diff->c_str());
      print_tightness(executor.stats());
      return kExitFailure;
    }
  }
  std::printf("\nall %zu commands agree (%s)\n", c.commands.size(), choice.sides.c_str());
  print_tightness(executor.stats());
  return kExitOk;
}

}  // namespace

const Command& replay_command() {
  static const Command c{"replay",
                         "re-run a saved failing case on the reference and the CUDA layer", kUsage,
                         &run_replay};
  return c;
}

}  // namespace kvlayer::cli
