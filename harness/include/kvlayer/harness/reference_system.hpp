// The reference layer behind the harness's System interface: a second ref::KvLayer (and, for
// batches, a ref::KvBatch) driven call for call as the CUDA adapter (cuda_system.cpp) drives the
// device layer, with the same output and poison contract. It lets the harness's system path
// (the executor's comparisons, the poison and chain checks, the batch commands) run where there
// is no GPU; tests derive from it to build systems that get one thing wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/generate.hpp"
#include "kvlayer/harness/system.hpp"
#include "kvlayer/reference/kv_batch.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::harness {

/// A batch (SPEC §12) on a ref::KvBatch; decodes are its float64 outputs rounded to float.
class ReferenceBatchSystem : public BatchSystem {
 public:
  ReferenceBatchSystem(const Geometry& g, int n_q_heads, int sequences, int max_verify);

  void set_active(std::span<const int> sequences) override;
  void append(int sequence, const HostRows& rows) override;
  void reserve(int sequence, std::int64_t k) override;
  void account_steps(int sequence, std::int64_t k) override;
  void rewind(int sequence, std::int64_t to) override;
  void append_rows_dc(const HostRows& rows, int t, bool windowed) override;
  void inc_seqlen(int t) override;
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool windowed,
                                    std::optional<float> scale) override;
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override;
  Snapshot snapshot(int sequence) override;
  std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int t, std::span<const std::int64_t> view_keys) override;

  const ref::KvBatch& batch() const { return batch_; }

 private:
  ref::KvBatch batch_;
  int n_q_heads_;
};

/// A layer on a ref::KvLayer of the case's geometry and max_verify (the reference has no decode
/// plan: the case's DecodeChoice changes nothing here). Every call is the reference's own, so it
/// throws where the model does and leaves its state unchanged then; a chain runs its rounds on a
/// copy that replaces the layer only once every round was accepted.
class ReferenceSystem : public System {
 public:
  explicit ReferenceSystem(const Case& c);

  void append(const HostRows& rows) override;
  void append_dc(const HostRows& one_row, bool windowed) override;
  void inc_seqlen() override;
  void append_rows_dc(const HostRows& rows, bool windowed) override;
  void inc_seqlen(int t) override;
  void account_steps(std::int64_t k) override;
  void reserve(std::int64_t k) override;
  void rewind(std::int64_t to) override;
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t start,
                                                      std::int64_t end) override;
  bool can_rewind_to(std::int64_t p) override;
  std::vector<float> decode(DecodeVariant variant, std::span<const float> q,
                            std::optional<float> scale) override;
  std::vector<float> decode_rows(DecodeVariant variant, std::span<const float> q, int t,
                                 std::optional<float> scale) override;
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& queries,
                                               const std::vector<std::int64_t>& accepted, int t,
                                               bool windowed, std::optional<float> scale) override;
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override;
  /// The last chain's decodes run again on the state each replay left (the same float64 code
  /// on the same state: bit-identical, as SPEC §10.3 requires of an eager path).
  std::vector<std::vector<float>> last_chain_eager() override { return eager_; }
  void clear_status() override;
  Snapshot snapshot() override;
  kvlayer::Snapshot take_snapshot() override;
  void restore(const kvlayer::Snapshot& s) override;
  void restore_into_fresh(const kvlayer::Snapshot& s) override;
  kvlayer::AccumulationShape accumulation_shape(DecodeVariant variant) override;
  kvlayer::AccumulationShape verify_accumulation_shape(int t) override;
  std::unique_ptr<BatchSystem> make_batch(int sequences) override;

  const Geometry& geometry() const { return layer_.geometry(); }
  int n_q_heads() const { return n_q_heads_; }
  const ref::KvLayer& layer() const { return layer_; }

 private:
  int n_q_heads_;
  int max_verify_;
  ref::KvLayer layer_;
  std::vector<std::vector<float>> eager_;  ///< the last chain's eager decodes
};

/// A ReferenceSystem for the case.
std::unique_ptr<System> make_reference_system(const Case& c);

/// A factory making a ReferenceSystem per case (for run_campaign and PropertyOptions).
SystemFactory reference_system_factory();

}  // namespace kvlayer::harness
