// rapidcheck generation of whole cases: a geometry per case, then a stateful command sequence
// (rc::state) whose shrinking removes commands and simplifies their arguments. Shared by the
// GoogleTest properties (tests/model) and the `kvlayer fuzz` campaign.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/system.hpp"

namespace kvlayer::harness {

/// How a failing case's message starts: the harness found a difference between the sides, or
/// a side threw (a CUDA failure, not a difference).
inline constexpr const char* kDifferencePrefix = "difference: ";
inline constexpr const char* kExceptionPrefix = "exception (not a difference): ";

/// Makes a fresh system for a case; an empty function means "reference only".
using SystemFactory = std::function<std::unique_ptr<System>(const Case&)>;

/// Limits on what a campaign draws. A case's max_ctx falls in one of three classes: short
/// (up to max_ctx, most cases), medium (up to medium_ctx: windows above 64, rings rebasing by
/// many units, forced long splits of thousands of keys) and long (long_ctx_min … long_ctx keys,
/// one KV head, so the float64 reference stays affordable: the merges over hundreds of splits).
/// A class whose limit is 0 is never drawn.
struct DrawLimits {
  int max_kv_heads = 8;
  std::int64_t max_ctx = 640;
  std::int64_t medium_ctx = 8192;
  std::int64_t long_ctx_min = 16384;
  std::int64_t long_ctx = 131072;
  int max_verify = 64;  ///< a case's max_verify is 16 half the time, else drawn up to this
  /// Restrictions that aim a campaign at some kernel instances (tools/mutants runs a mutant
  /// once per instance): 0 draws any supported head dim; gqa within [min_gqa, max_gqa]; a set
  /// row choice or kernel family replaces the drawn one (and is recorded in the case).
  int head_dim = 0;
  int min_gqa = 1, max_gqa = 16;
  std::optional<DecodeChoice::Rows> rows;
  std::optional<DecodeChoice::Kernel> kernel;
  std::optional<DecodeChoice::Verify> verify;
};

/// What the property needs besides rapidcheck.
struct PropertyOptions {
  SystemFactory make_system;  ///< empty: the reference runs alone
  std::string replay_path;    ///< where a failing case is written (empty: nowhere)
  DrawLimits limits;
  std::function<void(const Stats&)> on_case_done;  ///< called after every passing case
  /// Called after every passing case with the case and the commands it ran.
  std::function<void(const Case&)> on_case_passed;
  /// With a system: a call into it that runs longer than this is a hang (HangWatchdog);
  /// on_hang gets the case with the commands run so far (the last one hung) and the call's
  /// seconds, on the watchdog's thread, and the process then exits with status 1. 0: calls
  /// are not watched.
  double hang_seconds = 0;
  std::function<void(const Case& hung, double seconds)> on_hang;
};

/// The body of the model-based property: draws a case with rapidcheck's generators, runs it
/// command by command through an Executor, RC_FAILs on the first difference after writing
/// the replay file. NOTE: call only inside a rapidcheck property.
void model_based_property(const PropertyOptions& options);

/// The geometry generator alone (used by tests of the generator itself).
Geometry draw_geometry(const DrawLimits& limits, int* n_q_heads);

/// The decode-plan choice of a case (with rapidcheck's generators; shrinks to the defaults).
DecodeChoice draw_decode_choice(const DrawLimits& limits);

}  // namespace kvlayer::harness
