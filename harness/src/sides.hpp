// The two sides a command runs on: the model (the reference KvLayer) and, when the case has one,
// the system under test; with what the executor checks after every command and the helpers a
// command's run uses to call both and compare. The Executor owns one per case (executor.cpp
// defines it); each command's file uses it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/row_data.hpp"
#include "kvlayer/harness/system.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/snapshot.hpp"

namespace kvlayer::harness {

inline ref::RowsView view_of(const HostRows& rows) {
  return ref::RowsView{rows.k_bytes.data(), rows.v_bytes.data(), rows.n, rows.dtype};
}

/// The result of running one call on one side: a value, or the refusal message.
template <typename T>
struct Result {
  std::optional<T> value;
  std::optional<std::string> refused;
};

/// Runs f, catching a refusal (any other error propagates). A void call's value is `true`.
template <typename F>
auto attempt(F&& f) {
  using T = decltype(f());
  Result<std::conditional_t<std::is_void_v<T>, bool, T>> r;
  try {
    if constexpr (std::is_void_v<T>) {
      f();
      r.value = true;
    } else {
      r.value = f();
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::refused) throw;
    r.refused = e.what();
  }
  return r;
}

/// Both sides must refuse alike, or both accept.
template <typename A, typename B>
std::optional<std::string> compare_refusal(const Result<A>& model, const Result<B>& system) {
  if (model.refused.has_value() != system.refused.has_value())
    return "model " + (model.refused ? "refused: " + *model.refused : std::string("accepted")) +
           "; system " + (system.refused ? "refused: " + *system.refused : std::string("accepted"));
  if (model.refused && *model.refused != *system.refused)
    return "refusal messages differ:\n  model:  " + *model.refused +
           "\n  system: " + *system.refused;
  return std::nullopt;
}

class Sides {
 public:
  /// What a decode must produce: the reference output (nullopt: nothing may be written) and
  /// the per-element bound, taken on the model state the decode ran on.
  struct Expectation {
    std::string name;
    std::optional<std::vector<double>> out;
    ref::DecodeBound bound;
    std::optional<std::string> self_check;  ///< reference-only: naive recomputation failed
    /// The output's value count, which the system returns whether or not it may write them.
    std::size_t size = 0;
  };
  /// What both() found: whether the model accepted the call, and the difference, if any.
  struct Outcome {
    bool accepted = false;
    std::optional<std::string> diff;
  };

  /// system may be null: then only the reference runs. watchdog (may be null) watches every
  /// call into the system.
  Sides(const Case& c, System* system, HangWatchdog* watchdog);
  Sides(const Sides&) = delete;
  Sides& operator=(const Sides&) = delete;

  const Geometry& geometry() const { return geometry_; }
  int n_q_heads() const { return n_q_heads_; }
  ref::KvLayer& model() { return model_; }
  const ref::KvLayer& model() const { return model_; }
  /// The system under test (timed into stats()), or null.
  System* system() { return system_; }
  Stats& stats() { return stats_; }
  const Stats& stats() const { return stats_; }

  /// The case's rows and queries drawn from a seed.
  HostRows rows(std::int64_t n, std::uint64_t seed, DataKind kind) const;
  std::vector<float> query(std::uint64_t seed) const;

  /// Runs model_call on the model and, with a system, system_call on it: both must refuse
  /// alike, or both accept with equal results. Counts the model's refusals.
  template <typename M, typename S>
  Outcome both(M&& model_call, S&& system_call) {
    const auto m = attempt(model_call);
    Outcome o{m.value.has_value(), std::nullopt};
    if (m.refused) ++stats_.refused;
    if (!system_) return o;
    const auto s = attempt(system_call);
    o.diff = compare_refusal(m, s);
    if (!o.diff && m.value && s.value && !(*m.value == *s.value)) o.diff = "results differ";
    return o;
  }

  // Every decode below takes the softmax scale of SPEC §8 (nullopt: the default
  // 1/sqrt(head_dim_k)); the model, the bound, the naive recomputation and the system all get
  // the same one.

  /// The model's device-counter append (append_dcw when windowed) and decodes.
  void model_append_dc(const HostRows& row, bool windowed);
  std::optional<std::vector<double>> model_decode(DecodeVariant variant,
                                                  const std::vector<float>& q,
                                                  std::optional<float> scale);
  /// Whether a device-counter append on the model now writes its row (SPEC §7).
  bool dc_append_writes(bool windowed) const;
  /// Stops expecting the bytes of logical rows ≥ first (a rebase keeps only rows below len).
  void forget_rows_from(std::int64_t first) { shadow_.erase(shadow_.lower_bound(first), shadow_.end()); }
  /// Records the expected bytes of rows written at logical rows first, first + 1, ...
  void remember_rows(const HostRows& rows, std::int64_t first_logical_row);

  /// t queries, [t, n_q_heads, head_dim_k], drawn from seed.
  std::vector<float> queries(std::int64_t t, std::uint64_t seed) const;
  /// The model's multi-row device-counter append (append_rows_dcw when windowed).
  void model_append_rows_dc(const HostRows& rows, bool windowed);
  /// Whether a multi-row device-counter append of t rows on the model now writes them
  /// (SPEC §11: every row inside the plane and below max_ctx).
  bool rows_append_writes(std::int64_t t, bool windowed) const;
  /// The model's verify decode of t queries (decode_rows, decode_rows_dc, decode_rows_dcw).
  std::optional<std::vector<double>> model_decode_rows(DecodeVariant variant,
                                                       const std::vector<float>& q, std::int64_t t,
                                                       std::optional<float> scale);
  /// The expectation of a verify decode the model just ran: each row within the bound of its
  /// own view (ref::verify_views), the rows' bounds one after the other.
  Expectation expect_decode_rows(DecodeVariant variant, const std::vector<float>& q, std::int64_t t,
                                 std::optional<float> scale,
                                 std::optional<std::vector<double>> out);

  /// A verify decode of t queries on the model and the system: both refuse alike, or the
  /// system's rows lie within their bounds (reference-only: the model's spot check).
  std::optional<std::string> verify_both(DecodeVariant variant, const std::vector<float>& q,
                                         std::int64_t t, std::optional<float> scale);

  /// The expectation of a decode the model just ran (out: its output); reference-only, a few
  /// of its elements are recomputed by a naive float64 loop instead.
  Expectation expect_decode(DecodeVariant variant, const std::vector<float>& q,
                            std::optional<float> scale, std::optional<std::vector<double>> out);
  /// The system's decode output against the expectation (within the bound; nothing written
  /// when the model recorded a device error).
  std::optional<std::string> check_decode(const Expectation& x, const std::vector<float>& actual);
  /// A captured chain's replays (named `unit` 0, 1, …): each within its bound, and bit for bit
  /// equal to the system's eager call on the state that replay left (SPEC §10.3), when the
  /// system has an eager path (`eager` not empty).
  std::optional<std::string> check_replays(const char* unit,
                                           const std::vector<Expectation>& expected,
                                           const std::vector<std::vector<float>>& outputs,
                                           const std::vector<std::vector<float>>& eager);

  /// What take_snapshots() found: each side's kvlayer::Snapshot when it took one (the system's
  /// only with a system), and the difference, if any.
  struct Snapshots {
    std::optional<kvlayer::Snapshot> model, system;
    std::optional<std::string> diff;
  };
  /// A snapshot (SPEC §13) on both sides: both refuse alike, or both accept with snapshots of
  /// the same geometry, len, first, base and bytes; the model's must hold the restore plan's
  /// rows [first, len) with the bytes they were written with (the shadow).
  Snapshots take_snapshots();
  /// Restores each side's snapshot (taken by take_snapshots, which found no difference) into
  /// its current layer (`into_current`: refused alike unless the layer is fresh), or into a new,
  /// fresh layer that replaces the current one (the model's a new ref::KvLayer of the case's
  /// geometry and max_verify, the system's through restore_into_fresh). Accepted, the rows
  /// expected afterwards are the snapshot's: a restored ring holds none below `first`.
  Outcome restore(const Snapshots& s, bool into_current);

  /// After every command: the model's invariants, then planes, counters and status of both.
  std::optional<std::string> compare_state();

 private:
  std::optional<std::string> check_model_invariants();
  /// count random elements of out (one query's [n_q_heads, head_dim_v] output over view)
  /// recomputed by the naive float64 loop; the first that differs, described.
  std::optional<std::string> naive_mismatch(const std::vector<float>& q, std::optional<float> scale,
                                            const ref::DecodeView& view, const double* out,
                                            Rng& pick, int count) const;

  Geometry geometry_;
  DType dtype_;
  int n_q_heads_;
  std::uint64_t seed_;          ///< the case's (named by the largest-energy launch)
  mutable unsigned kinds_ = 0;  ///< the data kinds drawn so far (bit per DataKind), likewise
  Stats stats_;
  std::unique_ptr<System> timed_;  ///< the given system behind a timing decorator
  System* system_;
  ref::KvLayer model_;
  std::int64_t last_base_ = 0;
  /// Expected bytes of every logical row written and still live: logical row -> (K, V).
  std::map<std::int64_t, std::pair<std::vector<std::uint8_t>, std::vector<std::uint8_t>>> shadow_;
};

}  // namespace kvlayer::harness
