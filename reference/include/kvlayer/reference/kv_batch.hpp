// The reference batch (SPEC §12): max_batch reference layers of one geometry and an active
// list. A batch operation is, by definition, the same device-counter operation on each active
// layer alone, in list order; this class is that loop, and the CUDA batch is compared with it
// byte for byte (appends, counters, per-sequence status) and per sequence within the §8 bound
// (decodes).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::ref {

class KvBatch {
 public:
  /// max_batch ≥ 1 fresh layers of `geometry` (refused otherwise, as KvLayer refuses the
  /// geometry or max_verify). The active list starts empty.
  KvBatch(const Geometry& geometry, int max_batch, int max_verify = kDefaultMaxVerify);

  const Geometry& geometry() const { return layers_.front().geometry(); }
  int max_batch() const { return int(layers_.size()); }
  int max_verify() const { return layers_.front().max_verify(); }

  /// Sequence i's layer, for the per-sequence host operations (append, rewind, reserve,
  /// account_steps, status, snapshots). Refused when i is outside [0, max_batch).
  KvLayer& layer(int i);
  const KvLayer& layer(int i) const;

  /// Which sequences the batch operations touch, and in which order: distinct indices in
  /// [0, max_batch), at most max_batch of them; empty is allowed (the operations then do
  /// nothing). Refused (the list unchanged) otherwise, naming the offending entry.
  void set_active(std::span<const int> sequences);
  const std::vector<int>& active() const { return active_; }

  // ---- Batch operations. rows / q / outputs are sequence-major: active sequence j owns
  // entries [j·T, (j + 1)·T) of the row (or query) index. Every refusal (T outside
  // [1, max_verify], a shape that does not match active().size() × T, the layout a layer
  // refuses) is raised before any layer changes. A device-detected error of one sequence is
  // recorded in its layer's status and writes nothing for it; the others proceed.

  /// append_rows_dc of T rows to each active layer (flat layers; refused on a ring).
  /// rows.n must be active().size() × t.
  void append_rows_dc(const RowsView& rows, int t);
  /// append_rows_dcw of T rows to each active layer.
  void append_rows_dcw(const RowsView& rows, int t);
  /// inc_seqlen(t) on each active layer.
  void inc_seqlen(int t);

  /// Per active sequence j: for T = 1 its decode_dc, for T ≥ 2 its decode_rows_dc (flat,
  /// window-less layers; refused otherwise), over q's entries of j: q is
  /// [active, T, n_q_heads, head_dim_k]. Output j is that call's output ([T, n_q_heads,
  /// head_dim_v]) or nullopt when the call recorded a device error and wrote nothing.
  std::vector<std::optional<std::vector<double>>> decode_rows_dc(
      std::span<const float> q, int n_q_heads, int t, std::optional<float> scale = std::nullopt);
  /// As decode_rows_dc with decode_dcw / decode_rows_dcw (windowed layers).
  std::vector<std::optional<std::vector<double>>> decode_rows_dcw(
      std::span<const float> q, int n_q_heads, int t, std::optional<float> scale = std::nullopt);

 private:
  void check_t(int t, const char* operation) const;
  void append_rows(const RowsView& rows, int t, bool windowed);
  std::vector<std::optional<std::vector<double>>> decode_rows(std::span<const float> q,
                                                              int n_q_heads, int t,
                                                              std::optional<float> scale,
                                                              bool windowed);

  std::vector<KvLayer> layers_;
  std::vector<int> active_;
};

}  // namespace kvlayer::ref
