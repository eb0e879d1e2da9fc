// The `kvlayer` CLI: one executable, subcommands registered in main.cpp's table. A subcommand
// is one file defining a `const Command& xxx_command()`; add its declaration here and one line
// to the table in main.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvlayer::cli {

/// Exit statuses shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< data or I/O error, or a failed check
inline constexpr int kExitUsage = 2;    ///< bad command line

/// A command-line mistake: printed as one line "kvlayer CMD: <message>", exit status 2.
/// Any kvlayer::Error escaping a subcommand is printed the same way with exit status 1.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One subcommand.
struct Command {
  std::string_view name;
  std::string_view summary;  ///< one line for `kvlayer --help`
  std::string_view usage;    ///< full text for `kvlayer NAME --help`
  /// Runs with the arguments after the subcommand name (never containing --help).
  int (*run)(const std::vector<std::string>& args);
};

/// Parsed `--name value`, `--name=value` and `--flag` arguments of a subcommand.
class Options {
 public:
  /// Parses args; `valued` and `flags` list the accepted option names (without dashes). Throws
  /// UsageError for an unknown option, a missing value, a repeated option or a positional
  /// argument.
  Options(const std::vector<std::string>& args, const std::vector<std::string>& valued,
          const std::vector<std::string>& flags);

  /// The value of --name, if given.
  std::optional<std::string> get(const std::string& name) const;
  /// The value of --name; throws UsageError "missing --name (usage: ...)" when absent.
  std::string require(const std::string& name, std::string_view usage_line) const;
  /// True iff --name was given.
  bool flag(const std::string& name) const;
  /// The integer value of --name, or `fallback` when absent; throws UsageError
  /// "--name 'V' must be an integer in [lo, hi]" when it is not one.
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t lo,
                       std::int64_t hi) const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> flags_;
};

const Command& quantize_command();
const Command& dequantize_command();
const Command& selfcheck_command();
const Command& fuzz_command();
const Command& replay_command();
const Command& inspect_command();
const Command& snapshot_demo_command();
const Command& sensitivity_command();
#ifdef KVLAYER_WITH_CUDA
const Command& bench_command();
const Command& soak_command();
const Command& probe_command();
const Command& mma_probe_command();
const Command& snapshot_bench_command();
#endif

}  // namespace kvlayer::cli
