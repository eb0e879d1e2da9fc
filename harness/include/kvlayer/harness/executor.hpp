// Runs a case on the reference (the model) and, when given one, a System, comparing after
// every command (SPEC §10). Used by the rapidcheck state machine, `kvlayer fuzz` and
// `kvlayer replay`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/system.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::harness {

/// Counters a campaign sums over its cases.
struct Stats {
  std::map<std::string, std::int64_t> commands;  ///< by kind name
  std::int64_t refused = 0;
  std::int64_t rebases = 0;
  std::int64_t rewinds = 0;
  std::int64_t graph_replays = 0;
  std::int64_t bytes_compared = 0;
  std::int64_t decodes_compared = 0;
  double worst_error_ratio = 0;  ///< largest |system − reference| / bound over all elements
  double worst_error = 0;        ///< the error at that element
  double worst_bound = 0;        ///< and its bound
  ref::BoundTightness tightness; ///< over every element compared with a bound
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

/// Steps one case. NOTE: the model and the system must start fresh for each case.
class Executor {
 public:
  /// system may be null: then only the reference runs, with its invariants and an
  /// independent float64 recomputation of every decode.
  Executor(const Case& c, System* system);

  /// Runs one command on both sides and compares. Returns the difference, if any.
  std::optional<std::string> step(const Command& command);

  /// Runs every command of the case, stopping at the first difference.
  std::optional<Mismatch> run_all();

  const ref::KvLayer& model() const { return model_; }
  /// The commands stepped so far, in order (a failing case is saved from these).
  const std::vector<Command>& executed() const { return executed_; }
  const Stats& stats() const { return stats_; }

 private:
  /// What a decode must produce: the reference output (nullopt: nothing may be written) and
  /// the per-element bound, taken on the model state the decode ran on.
  struct Expectation {
    std::string name;
    std::optional<std::vector<double>> out;
    ref::DecodeBound bound;
    std::optional<std::string> self_check;  ///< reference-only: naive recomputation failed
  };
  std::optional<std::string> compare_state();
  std::optional<std::string> check_model_invariants();
  Expectation expect_decode(DecodeVariant variant, const std::vector<float>& q,
                            std::optional<std::vector<double>> out);
  std::optional<std::string> check_decode(const Expectation& x, const std::vector<float>& actual);
  void remember_rows(const HostRows& rows, std::int64_t first_logical_row);
  bool dc_append_writes(bool windowed) const;

  Case case_;
  std::unique_ptr<System> timed_;  ///< the given system behind a timing decorator
  System* system_;
  ref::KvLayer model_;
  Stats stats_;
  std::vector<Command> executed_;
  std::int64_t last_base_ = 0;
  /// Expected bytes of every logical row written and still live: logical row -> (K, V).
  std::map<std::int64_t, std::pair<std::vector<std::uint8_t>, std::vector<std::uint8_t>>> shadow_;
};

}  // namespace kvlayer::harness
