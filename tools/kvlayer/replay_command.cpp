// kvlayer replay FILE: re-runs a saved case (a replay file written by a failing campaign) on
// both sides without rapidcheck, one line per command.
#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/replay_file.hpp"
#include "system_choice.hpp"

namespace kvlayer::cli {
namespace {

constexpr std::string_view kUsage =
    "usage: kvlayer replay FILE [--reference-only]\n"
    "  Re-runs the case in FILE (JSON: geometry, dtype, seeds, commands) on the reference and,\n"
    "  when a GPU is present, the CUDA KvLayer, printing one line per command and the first\n"
    "  difference. Exit status 0 when both sides agree throughout, 1 otherwise.\n";

/// The accuracy bound's tightness over the decodes compared with a bound (none on the
/// reference alone), as the line `kvlayer fuzz` prints.
void print_tightness(const harness::Stats& s) {
  if (s.tightness.elements() > 0) std::printf("%s\n", s.tightness.summary().c_str());
}

int run_replay(const std::vector<std::string>& args) {
  // The file is the one positional argument: `kvlayer replay FILE [--reference-only]`.
  if (args.empty() || args.front().rfind("--", 0) == 0)
    throw UsageError("missing FILE (usage: kvlayer replay FILE [--reference-only])");
  const std::string path = args.front();
  const Options o(std::vector<std::string>(args.begin() + 1, args.end()), {}, {"reference-only"});
  const harness::Case c = harness::read_replay_file(path);
  const SystemChoice choice = choose_system(o.flag("reference-only"));
  std::printf("kvlayer replay %s: %s, n_q_heads %d, dtype %s, %zu commands\n  %s\n", path.c_str(),
              c.geometry.describe().c_str(), c.n_q_heads, std::string(dtype_name(c.dtype)).c_str(),
              c.commands.size(), choice.description.c_str());
  auto system = choice.factory ? choice.factory(c) : nullptr;
  harness::Executor executor(c, system.get());
  for (std::size_t i = 0; i < c.commands.size(); ++i) {
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
