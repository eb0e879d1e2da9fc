#include "kvlayer/harness/reference_system.hpp"

#include <algorithm>
#include <bit>

#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/testing/snapshot.hpp"
#include "reference_calls.hpp"

namespace kvlayer::harness {
namespace {

using Output = std::optional<std::vector<double>>;

/// n values of kPoisonBits: an output before the decode writes it.
std::vector<float> poisoned(std::size_t n) {
  return std::vector<float>(n, std::bit_cast<float>(kPoisonBits));
}

/// The reference's float64 output rounded to float into `into` from element `at`; nothing for a
/// decode that recorded a device error (the poison stays, as on the device).
void write(const Output& out, std::vector<float>& into, std::size_t at) {
  if (!out) return;
  for (std::size_t i = 0; i < out->size() && at + i < into.size(); ++i)
    into[at + i] = float((*out)[i]);
}

/// A decode output of n values as the device returns it: poisoned, then written.
std::vector<float> output_of(const Output& out, std::size_t n) {
  std::vector<float> result = poisoned(n);
  write(out, result, 0);
  return result;
}

/// The shape of an unsplit float computation over `keys` keys: one sequential pass (a chain of
/// `keys` f32 adds), one tile (one rescale), one partial, CUDA cores.
/// Why it bounds what this system returns: its output is float(o), o the model's own float64
/// value (the same code on the same state), so its one error is the final rounding,
/// |float(o) − o| ≤ 2^-24·|o|. Every element's bound (ref::decode_bound, whatever the shape)
/// is at least e_q + 2·2^-11·Σ_t hi_t·|V_te| (the fp16 rounding of p alone), and
/// Σ_t hi_t·|V_te| ≥ |õ| ≥ |o| − e_q: far above 2^-24·|o|. An element whose V is all zero is
/// exactly 0 on both sides (its bound is e_q). The shape only sets how loose the bound is; this
/// one describes the computation, and is not chosen to pass.
kvlayer::AccumulationShape unsplit(std::int64_t keys) {
  kvlayer::AccumulationShape s;
  s.max_keys_per_split = std::max<std::int64_t>(1, keys);
  s.n_splits = 1;
  s.rescales = 1;
  s.tensor_core = false;
  s.pv_mma_steps = 0;
  return s;
}

/// Refuses a T outside [1, max_verify] in the reference's words, where the CUDA layer's shape
/// queries refuse it.
void check_t(int t, int max_verify, const char* operation) {
  if (t < 1) refuse(operation, "T ", t, " must be at least 1");
  if (t > max_verify) refuse(operation, "T ", t, " exceeds max_verify ", max_verify);
}

void append_one(ref::KvLayer& layer, const HostRows& row, bool windowed) {
  windowed ? layer.append_dcw(row.view()) : layer.append_dc(row.view());
}

/// q as the kernels take it (kvlayer/accuracy.hpp (1): rounded once to fp16), so that this
/// system's decodes are the float64 decodes of the GPU's query: |got − õ| is their rounding to
/// float, which the declared statistical check's noise model has no term for e_q to hide in.
std::vector<float> as_kernels_take(std::span<const float> q) {
  std::vector<float> out(q.begin(), q.end());
  for (float& x : out) x = f16_bits_to_f32(f32_to_f16_bits(x));
  return out;
}

/// A batch decode's output: max_batch positions of T queries (the CUDA batch's output buffer),
/// position j the list's entry j; positions past the list and those of a sequence that recorded
/// a device error stay poisoned.
std::vector<float> batch_decode(ref::KvBatch& batch, int n_q_heads, std::span<const float> q, int t,
                                bool windowed, std::optional<float> scale) {
  const std::vector<float> q16 = as_kernels_take(q);
  const auto outs = windowed ? batch.decode_rows_dcw(q16, n_q_heads, t, scale)
                             : batch.decode_rows_dc(q16, n_q_heads, t, scale);
  const std::size_t per_position = std::size_t(std::max(t, 1)) * std::size_t(n_q_heads) *
                                   std::size_t(batch.geometry().head_dim_v);
  std::vector<float> out = poisoned(std::size_t(batch.max_batch()) * per_position);
  for (std::size_t j = 0; j < outs.size(); ++j) write(outs[j], out, j * per_position);
  return out;
}

}  // namespace

// ---- ReferenceBatchSystem ----------------------------------------------------------------

ReferenceBatchSystem::ReferenceBatchSystem(const Geometry& g, int n_q_heads, int sequences,
                                           int max_verify)
    : batch_(g, sequences, max_verify), n_q_heads_(n_q_heads) {}

void ReferenceBatchSystem::set_active(std::span<const int> sequences) {
  batch_.set_active(sequences);
}
void ReferenceBatchSystem::append(int i, const HostRows& rows) {
  batch_.layer(i).append(rows.view());
}
void ReferenceBatchSystem::reserve(int i, std::int64_t k) {
  batch_.layer(i).reserve(k);
}
void ReferenceBatchSystem::account_steps(int i, std::int64_t k) {
  batch_.layer(i).account_steps(k);
}
void ReferenceBatchSystem::rewind(int i, std::int64_t to) {
  batch_.layer(i).rewind(to);
}
void ReferenceBatchSystem::append_rows_dc(const HostRows& rows, int t, bool windowed) {
  // rows holds T rows per active sequence, as ref::KvBatch takes them.
  windowed ? batch_.append_rows_dcw(rows.view(), t) : batch_.append_rows_dc(rows.view(), t);
}
void ReferenceBatchSystem::inc_seqlen(int t) {
  batch_.inc_seqlen(t);
}

std::vector<float> ReferenceBatchSystem::decode_rows_dc(std::span<const float> q, int t,
                                                        bool windowed, std::optional<float> scale) {
  return batch_decode(batch_, n_q_heads_, q, t, windowed, scale);
}

std::vector<std::vector<float>> ReferenceBatchSystem::graph_chain(
    const std::vector<std::vector<int>>& lists, const std::vector<HostRows>& rows,
    const std::vector<std::vector<float>>& queries, bool windowed, std::optional<float> scale) {
  // The rounds on a copy: a refusal in any round leaves the batch as it was.
  ref::KvBatch work = batch_;
  std::vector<std::vector<float>> outputs;
  for (std::size_t r = 0; r < lists.size(); ++r) {
    work.set_active(lists[r]);
    for (const int i : lists[r]) work.layer(i).reserve(1);
    windowed ? work.append_rows_dcw(rows.at(r).view(), 1)
             : work.append_rows_dc(rows.at(r).view(), 1);
    work.inc_seqlen(1);
    outputs.push_back(batch_decode(work, n_q_heads_, queries.at(r), 1, windowed, scale));
    for (const int i : lists[r]) work.layer(i).account_steps(1);
  }
  batch_ = std::move(work);
  return outputs;
}

Snapshot ReferenceBatchSystem::snapshot(int i) {
  return testing::snapshot(batch_.layer(i));
}

std::vector<kvlayer::AccumulationShape> ReferenceBatchSystem::accumulation_shapes(
    int t, std::span<const std::int64_t> view_keys) {
  check_t(t, batch_.max_verify(), "batch accumulation_shapes");
  if (view_keys.size() > std::size_t(batch_.max_batch()))
    refuse("batch accumulation_shapes", "view_keys has ", view_keys.size(),
           " entries, more than max_batch ", batch_.max_batch());
  std::vector<kvlayer::AccumulationShape> shapes;
  for (const std::int64_t keys : view_keys) shapes.push_back(unsplit(keys));
  return shapes;
}

// ---- ReferenceSystem ---------------------------------------------------------------------

ReferenceSystem::ReferenceSystem(const Case& c)
    : n_q_heads_(c.n_q_heads), max_verify_(c.max_verify), layer_(c.geometry, c.max_verify) {}

void ReferenceSystem::append(const HostRows& rows) {
  layer_.append(rows.view());
}
void ReferenceSystem::append_dc(const HostRows& row, bool windowed) {
  append_one(layer_, row, windowed);
}
void ReferenceSystem::inc_seqlen() {
  layer_.inc_seqlen();
}
void ReferenceSystem::append_rows_dc(const HostRows& rows, bool windowed) {
  reference_append_rows_dc(layer_, rows, windowed);
}
void ReferenceSystem::inc_seqlen(int t) {
  layer_.inc_seqlen(t);
}
void ReferenceSystem::account_steps(std::int64_t k) {
  layer_.account_steps(k);
}
void ReferenceSystem::reserve(std::int64_t k) {
  layer_.reserve(k);
}
void ReferenceSystem::rewind(std::int64_t to) {
  layer_.rewind(to);
}
std::pair<std::int64_t, std::int64_t> ReferenceSystem::physical_rows(std::int64_t s,
                                                                     std::int64_t e) {
  return layer_.physical_rows(s, e);
}
bool ReferenceSystem::can_rewind_to(std::int64_t p) {
  return layer_.can_rewind_to(p);
}

std::vector<float> ReferenceSystem::decode(DecodeVariant variant, std::span<const float> q,
                                           std::optional<float> scale) {
  return output_of(reference_decode(layer_, variant, as_kernels_take(q), n_q_heads_, scale),
                   std::size_t(n_q_heads_) * std::size_t(geometry().head_dim_v));
}

std::vector<float> ReferenceSystem::decode_rows(DecodeVariant variant, std::span<const float> q,
                                                int t, std::optional<float> scale) {
  return output_of(
      reference_decode_rows(layer_, variant, as_kernels_take(q), n_q_heads_, t, scale),
      std::size_t(std::max(t, 0)) * std::size_t(n_q_heads_) * std::size_t(geometry().head_dim_v));
}

std::vector<std::vector<float>> ReferenceSystem::verify_chain(
    const std::vector<HostRows>& drafts, const std::vector<std::vector<float>>& queries,
    const std::vector<std::int64_t>& accepted, int t, bool windowed, std::optional<float> scale) {
  eager_.clear();
  if (drafts.empty()) return {};
  const DecodeVariant variant = dc_variant(windowed);
  {
    // The capture: the device layer checks the captured calls before any round's reserve, so a
    // call refused there is refused here first, with its own message.
    ref::KvLayer capture = layer_;
    reference_append_rows_dc(capture, drafts.front(), windowed);
    capture.inc_seqlen(t);
    reference_decode_rows(capture, variant, queries.front(), n_q_heads_, t, scale, false);
  }
  ref::KvLayer work = layer_;
  std::vector<std::vector<float>> outputs, eager;
  const std::size_t n =
      std::size_t(t) * std::size_t(n_q_heads_) * std::size_t(geometry().head_dim_v);
  for (std::size_t r = 0; r < drafts.size(); ++r) {
    work.reserve(t);
    reference_append_rows_dc(work, drafts[r], windowed);
    work.inc_seqlen(t);
    for (auto* into : {&outputs, &eager})
      into->push_back(output_of(reference_decode_rows(work, variant, as_kernels_take(queries.at(r)),
                                                      n_q_heads_, t, scale),
                                n));
    work.account_steps(t);
    if (accepted.at(r) < t) work.rewind(work.len() - t + accepted[r]);
  }
  layer_ = std::move(work);
  eager_ = std::move(eager);
  return outputs;
}

std::vector<std::vector<float>> ReferenceSystem::graph_chain(
    const std::vector<HostRows>& rows, const std::vector<std::vector<float>>& queries,
    bool windowed, std::optional<float> scale) {
  eager_.clear();
  // Every step is the captured sequence itself (append, inc_seqlen, decode), whose refusals
  // do not depend on the state: the first step refuses where the capture would. On a copy, so
  // that a refusal leaves the layer as it was.
  ref::KvLayer work = layer_;
  std::vector<std::vector<float>> outputs, eager;
  const std::size_t n = std::size_t(n_q_heads_) * std::size_t(geometry().head_dim_v);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    append_one(work, rows[i], windowed);
    work.inc_seqlen();
    for (auto* into : {&outputs, &eager})
      into->push_back(output_of(reference_decode(work, dc_variant(windowed),
                                                 as_kernels_take(queries.at(i)), n_q_heads_, scale),
                                n));
  }
  layer_ = std::move(work);
  eager_ = std::move(eager);
  return outputs;
}

void ReferenceSystem::clear_status() {
  layer_.clear_status();
}

Snapshot ReferenceSystem::snapshot() {
  return testing::snapshot(layer_);
}

kvlayer::Snapshot ReferenceSystem::take_snapshot() {
  return layer_.snapshot();
}

void ReferenceSystem::restore(const kvlayer::Snapshot& s) {
  layer_.restore(s);
}

void ReferenceSystem::restore_into_fresh(const kvlayer::Snapshot& s) {
  // The current layer stays until the restore succeeded.
  ref::KvLayer fresh(layer_.geometry(), max_verify_);
  fresh.restore(s);
  layer_ = std::move(fresh);
}

kvlayer::AccumulationShape ReferenceSystem::accumulation_shape(DecodeVariant) {
  // The longest view the geometry lets a decode attend (no plan cuts it).
  const Geometry& g = geometry();
  return unsplit(g.window ? std::min(*g.window, g.max_ctx) : g.max_ctx);
}

kvlayer::AccumulationShape ReferenceSystem::verify_accumulation_shape(int t) {
  check_t(t, max_verify_, "verify_accumulation_shape");
  // The union of the T rows' views at its longest.
  const Geometry& g = geometry();
  return unsplit(g.window ? std::min(*g.window + t - 1, g.max_ctx) : g.max_ctx);
}

std::unique_ptr<BatchSystem> ReferenceSystem::make_batch(int sequences) {
  return std::make_unique<ReferenceBatchSystem>(geometry(), n_q_heads_, sequences, max_verify_);
}

std::unique_ptr<System> make_reference_system(const Case& c) {
  return std::make_unique<ReferenceSystem>(c);
}

SystemFactory reference_system_factory() {
  return [](const Case& c) { return make_reference_system(c); };
}

}  // namespace kvlayer::harness
