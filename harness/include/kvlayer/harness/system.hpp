// The system under test, seen by the harness through host types only: the CUDA KvLayer is
// adapted to this interface in cuda_system.hpp (kvlayer_harness_cuda), so the harness itself builds
// without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/coverage.hpp"
#include "kvlayer/harness/row_data.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/status.hpp"
#include "kvlayer/testing/snapshot.hpp"

namespace kvlayer::harness {

/// Everything SPEC §10.1 compares after each command (the tails included).
using testing::Snapshot;

/// The bit pattern a system writes into decode outputs before a decode runs; an element still
/// holding it was not written.
inline constexpr std::uint32_t kPoisonBits = 0x7FC0DEADu;

/// A batch of layers (SPEC §12) driven by the harness: made fresh by System::make_batch, of the
/// case's geometry, n_q_heads, max_verify and decode plan. Every call throws kvlayer::Error
/// exactly where the reference batch (ref::KvBatch) does.
class BatchSystem {
 public:
  virtual ~BatchSystem() = default;
  virtual void set_active(std::span<const int> sequences) = 0;
  // One sequence's host operations (its layer's own).
  virtual void append(int sequence, const HostRows& rows) = 0;
  virtual void reserve(int sequence, std::int64_t k) = 0;
  virtual void account_steps(int sequence, std::int64_t k) = 0;
  virtual void rewind(int sequence, std::int64_t to) = 0;
  // Batch operations over the active list; rows hold T rows per active sequence, in list order.
  virtual void append_rows_dc(const HostRows& rows, int t, bool windowed) = 0;
  virtual void inc_seqlen(int t) = 0;
  /// Each active sequence's decode of its T queries (q [active, T, n_q_heads, head_dim_k]);
  /// the output holds max_batch positions of [T, n_q_heads, head_dim_v], poisoned with
  /// kPoisonBits before the launch (position j: the list's entry j).
  virtual std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool windowed,
                                            std::optional<float> scale) = 0;
  /// Captures one step (append of one row per active sequence → inc_seqlen(1) → decode) once,
  /// then per round r: set_active(lists[r]), reserve(1) on each listed sequence, the round's
  /// rows and queries written into the captured buffers (position-major, lists[r].size() of
  /// each), one replay, account_steps(1) on each listed sequence. Returns each round's output
  /// (max_batch positions, poisoned before each replay).
  virtual std::vector<std::vector<float>> graph_chain(
      const std::vector<std::vector<int>>& lists, const std::vector<HostRows>& rows,
      const std::vector<std::vector<float>>& queries, bool windowed,
      std::optional<float> scale) = 0;
  /// Sequence i's whole state (synchronizes).
  virtual Snapshot snapshot(int sequence) = 0;
  /// The accumulation shape of each position's rows in a batch decode of T queries over a list
  /// whose views hold view_keys keys (list order), whichever list is active now (a chain's
  /// earlier replays had their own; cuda::KvBatch::accumulation_shapes).
  virtual std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int t, std::span<const std::int64_t> view_keys) = 0;
};

/// A layer implementation driven by the harness. Every call throws kvlayer::Error exactly where
/// the reference does (same message); state must then be unchanged.
class System {
 public:
  virtual ~System() = default;
  virtual void append(const HostRows& rows) = 0;
  virtual void append_dc(const HostRows& one_row, bool windowed) = 0;
  virtual void inc_seqlen() = 0;
  /// SPEC §11: append_rows_dc(w) of rows.n rows, inc_seqlen(t).
  virtual void append_rows_dc(const HostRows& rows, bool windowed) = 0;
  virtual void inc_seqlen(int t) = 0;
  virtual void account_steps(std::int64_t k) = 0;
  virtual void reserve(std::int64_t k) = 0;
  virtual void rewind(std::int64_t to) = 0;
  virtual std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t start,
                                                              std::int64_t end) = 0;
  virtual bool can_rewind_to(std::int64_t p) = 0;
  // Every decode takes the softmax scale of SPEC §8: nullopt is the default 1/sqrt(head_dim_k).

  /// Output [n_q_heads × head_dim_v], poisoned with kPoisonBits before the decode ran.
  virtual std::vector<float> decode(DecodeVariant variant, std::span<const float> q,
                                    std::optional<float> scale) = 0;
  /// A verify decode of t queries (q [t, n_q_heads, head_dim_k]); output [t, n_q_heads,
  /// head_dim_v], poisoned with kPoisonBits before the decode ran.
  virtual std::vector<float> decode_rows(DecodeVariant variant, std::span<const float> q, int t,
                                         std::optional<float> scale) = 0;
  /// Captures append_rows_dc(w) of t rows → inc_seqlen(t) → decode_rows_dc(w) of t queries
  /// (with scale) once; then per round r: reserve(t), the inputs written into the captured
  /// buffers, one replay, account_steps(t), and rewind(len − t + accepted[r]) when
  /// accepted[r] < t. Returns each round's output (poisoned before each replay).
  virtual std::vector<std::vector<float>> verify_chain(
      const std::vector<HostRows>& drafts, const std::vector<std::vector<float>>& queries,
      const std::vector<std::int64_t>& accepted, int t, bool windowed,
      std::optional<float> scale) = 0;
  /// Captures one step (append_dc(w) → inc_seqlen → decode_dc(w) with scale) once and replays
  /// it once per entry of rows/queries, writing the inputs into the captured buffers; returns
  /// each step's output (poisoned before each replay).
  virtual std::vector<std::vector<float>> graph_chain(
      const std::vector<HostRows>& rows, const std::vector<std::vector<float>>& queries,
      bool windowed, std::optional<float> scale) = 0;
  /// For the last graph_chain (verify_chain): each step's decode (round's verify) run eagerly
  /// on the state the replay left (same call, same state: must be bit-identical to the
  /// replayed output), or empty when the system has no eager path to compare.
  virtual std::vector<std::vector<float>> last_chain_eager() { return {}; }
  virtual void clear_status() = 0;
  /// Synchronizes and reads back the whole state.
  virtual Snapshot snapshot() = 0;
  // SPEC §13. NOTE: kvlayer::Snapshot (the layer's live rows), not the read-back above.
  /// The layer's own snapshot() (refused as the reference refuses it).
  virtual kvlayer::Snapshot take_snapshot() = 0;
  /// restore(s) into the current layer (refused unless it is fresh).
  virtual void restore(const kvlayer::Snapshot& s) = 0;
  /// Constructs a new layer as the case's (geometry, n_q_heads, max_verify, decode plan),
  /// restores s into it and replaces the current layer with it: every later call runs on the
  /// restored layer. Refused or failing, the current layer stays, unchanged.
  virtual void restore_into_fresh(const kvlayer::Snapshot& s) = 0;
  /// The decode launch shape that enters the accuracy bound.
  virtual kvlayer::AccumulationShape accumulation_shape(DecodeVariant variant) = 0;
  /// The launch shape of a verify decode of t queries (every row's bound).
  virtual kvlayer::AccumulationShape verify_accumulation_shape(int t) = 0;
  /// Moves what the system's decode launches reached since the last call into `into`
  /// (coverage.hpp); a system without kernels counts nothing.
  virtual void take_coverage(Coverage& into) { (void)into; }
  /// A fresh batch of `sequences` layers (SPEC §12), or null for a system without batches (its
  /// batch commands then run on the model alone, as a reference-only case does).
  virtual std::unique_ptr<BatchSystem> make_batch(int sequences) {
    (void)sequences;
    return nullptr;
  }
};

}  // namespace kvlayer::harness
