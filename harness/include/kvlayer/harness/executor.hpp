// Runs a case on the reference (the model) and, when given one, a System, comparing after
// every command (SPEC §10). Used by the rapidcheck state machine, `kvlayer fuzz` and
// `kvlayer replay`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/coverage.hpp"
#include "kvlayer/harness/hang_watchdog.hpp"
#include "kvlayer/harness/system.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/systematic_check.hpp"

namespace kvlayer::harness {

/// Counters a campaign sums over its cases.
struct Stats {
  std::map<std::string, std::int64_t> commands;  ///< by kind name
  std::int64_t refused = 0;
  std::int64_t rebases = 0;
  std::int64_t rewinds = 0;
  std::int64_t graph_replays = 0;
  /// Restores into a fresh layer accepted, and those of a ring whose snapshot starts above the
  /// source's base (restored to physical row 0: a copy placed as in the source shows).
  std::int64_t restores = 0, restores_past_base = 0;
  std::int64_t bytes_compared = 0;
  std::int64_t decodes_compared = 0;
  double worst_error_ratio = 0;  ///< largest |system − reference| / bound over all elements
  double worst_error = 0;        ///< the error at that element
  double worst_bound = 0;        ///< and its bound
  ref::BoundTightness tightness; ///< over every element compared with a bound
  ref::SystematicCheck systematic;  ///< issue #34's statistics per decode launch
  double worst_energy = 0;          ///< the largest launch energy (the declared check's)
  std::string worst_energy_at;      ///< and its launch
  /// The same by kernel path ("decode d128": one query; "verify d128": T ≥ 2 rows): each
  /// path's clean distribution, reported apart (bench/NOTES.md, sessions 18 and 25).
  std::map<std::string, ref::SystematicCheck> systematic_by_path;
  Coverage coverage;             ///< what the system's launches reached (coverage.hpp)
  /// Wall-clock seconds spent in commands, and the parts of it in the system's calls (without
  /// its state read-backs), in those read-backs (snapshots) and in the derived decode bounds.
  /// The rest of `in_commands` is the model and the comparisons.
  double seconds_in_commands = 0, seconds_in_system = 0, seconds_in_snapshots = 0,
         seconds_in_bounds = 0;
  void add(const Stats& other);
};

/// The first difference found: which command, and what differed.
struct Mismatch {
  std::size_t command_index = 0;
  std::string what;
};

class Sides;

/// Steps one case. NOTE: the model and the system must start fresh for each case.
class Executor {
 public:
  /// system may be null: then only the reference runs, with its invariants and an
  /// independent float64 recomputation of every decode. A watchdog, when given, watches
  /// every call into the system (state read-backs included: a hung kernel blocks the first
  /// synchronizing call after its launch).
  Executor(const Case& c, System* system, HangWatchdog* watchdog = nullptr);
  ~Executor();

  /// Runs one command on both sides and compares. Returns the difference, if any.
  std::optional<std::string> step(const Command& command);

  /// Runs every command of the case, stopping at the first difference.
  std::optional<Mismatch> run_all();

  const ref::KvLayer& model() const;
  /// The commands stepped so far, in order (a failing case is saved from these).
  const std::vector<Command>& executed() const { return executed_; }
  const Stats& stats() const;

 private:
  Case case_;
  std::unique_ptr<Sides> sides_;  ///< the model, the system and what is compared on them
  std::vector<Command> executed_;
};

}  // namespace kvlayer::harness
