// A batch of CUDA layers (SPEC §12): max_batch layers of one geometry on one device and stream,
// per-sequence host operations on each layer, and batch operations of one launch each over the
// sequences of an active list that lives in device memory, so that one captured graph serves a
// batch whose membership changes between replays.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvlayer/cuda/decode_options.hpp"
#include "kvlayer/cuda/kv_layer.hpp"

namespace kvlayer::cuda {

/// Largest max_batch (one launch's positions: the grids' z and y dimensions hold them).
inline constexpr int kMaxBatch = 1024;

/// The batch. Move-only; its layers, device table, active list and scratch are allocated once at
/// construction and released by the destructor. The reference is ref::KvBatch: every batch
/// operation equals, byte for byte (appends, counters, status) and within each sequence's
/// bound (decodes), the same device-counter operation on each active layer alone.
/// NOTE: not thread-safe; everything is enqueued on the batch's stream (the layers hold it too).
class KvBatch {
 public:
  /// max_batch fresh layers (KvLayer's refusals, word for word) and an empty active list.
  /// Refused: max_batch outside [1, kMaxBatch].
  KvBatch(const Geometry& geometry, int n_q_heads, int max_batch, cudaStream_t stream = nullptr,
          int max_verify = kDefaultMaxVerify,
          const DecodeOptions& options = DecodeOptions::from_environment());
  ~KvBatch();
  KvBatch(KvBatch&&) noexcept;
  KvBatch& operator=(KvBatch&&) noexcept;
  KvBatch(const KvBatch&) = delete;
  KvBatch& operator=(const KvBatch&) = delete;

  const Geometry& geometry() const;
  int n_q_heads() const;
  int max_batch() const;
  int max_verify() const;
  cudaStream_t stream() const;

  /// Sequence i's layer, for the per-sequence host operations (append, rewind, reserve,
  /// account_steps, status, decode, snapshots). Refused when i is outside [0, max_batch).
  KvLayer& layer(int i);
  const KvLayer& layer(int i) const;

  /// Which sequences the batch operations touch, in which order: distinct indices in
  /// [0, max_batch) (empty allowed: the operations then do nothing). Refused, with the list
  /// unchanged, otherwise (ref::KvBatch's messages). Writes the device list stream-ordered (a
  /// kernel taking the entries by value: legal while capturing, no host memory held), so a
  /// graph captured before reads the list of its replay.
  void set_active(std::span<const int> sequences);
  const std::vector<int>& active() const;

  // ---- Batch operations, one launch each over the active list's positions (position j:
  // entry j). Rows, q and out are position-major device arrays: position j owns rows
  // [j·T, (j + 1)·T), queries and outputs j of [T, n_q_heads, head_dim]. Refused (nothing
  // enqueued) for T outside [1, max_verify], null pointers, a layout the layers refuse. A
  // device-detected error of one sequence is recorded in its layer's status and writes nothing
  // for it; the others proceed.

  /// Each active (flat) sequence's append_rows_dc of its T rows (rows.n = T per position).
  void append_rows_dc(const RowsView& rows);
  /// Each active sequence's append_rows_dcw of its T rows.
  void append_rows_dcw(const RowsView& rows);
  /// Each active sequence's inc_seqlen(t).
  void inc_seqlen(int t);
  /// Each active sequence's decode_dc (T = 1) or decode_rows_dc (T ≥ 2) of its queries (flat,
  /// window-less layers).
  void decode_rows_dc(const float* q, float* out, int T, std::optional<float> scale = std::nullopt);
  /// The same with decode_dcw / decode_rows_dcw (windowed layers).
  void decode_rows_dcw(const float* q, float* out, int T,
                       std::optional<float> scale = std::nullopt);

  /// Each position's accumulation shape (for its bound, kvlayer/accuracy.hpp) in a launch over
  /// a list whose views hold view_keys keys, in list order (a verify's: the union of its T rows'
  /// views; 0 for an empty view or one in error): a batch launch cuts its views by a schedule
  /// made at each launch from all the active views, which this computes as the device does. The
  /// list need not be the one active now (a captured chain's earlier replays had their own).
  /// Refused: T outside [1, max_verify], more than max_batch entries.
  std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int T, std::span<const std::int64_t> view_keys) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kvlayer::cuda
