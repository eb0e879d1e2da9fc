// The reference batch: SPEC §12 as the loop over the active layers.
#include "kvlayer/reference/kv_batch.hpp"

#include <cstddef>
#include <string>

#include "kvlayer/batch.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer::ref {
namespace {

/// One sequence's T rows of a sequence-major batch of rows.
RowsView rows_of(const RowsView& rows, const Geometry& g, std::size_t j, int t) {
  const std::size_t bytes = dtype_size(rows.dtype);
  const std::size_t first = j * std::size_t(t);
  return RowsView{
      static_cast<const unsigned char*>(rows.k) + first * std::size_t(g.kv_dim_k()) * bytes,
      static_cast<const unsigned char*>(rows.v) + first * std::size_t(g.kv_dim_v()) * bytes, t,
      rows.dtype};
}

}  // namespace

KvBatch::KvBatch(const Geometry& geometry, int max_batch, int max_verify) {
  if (max_batch < 1) refuse("ref::KvBatch", "max_batch ", max_batch, " must be at least 1");
  layers_.reserve(std::size_t(max_batch));
  for (int i = 0; i < max_batch; ++i) layers_.emplace_back(geometry, max_verify);
}

KvLayer& KvBatch::layer(int i) {
  return const_cast<KvLayer&>(static_cast<const KvBatch&>(*this).layer(i));
}

const KvLayer& KvBatch::layer(int i) const {
  if (i < 0 || i >= max_batch())
    refuse("batch layer", "sequence ", i, " is outside [0, max_batch ", max_batch(), ")");
  return layers_[std::size_t(i)];
}

void KvBatch::set_active(std::span<const int> sequences) {
  check_active_list("batch set_active", sequences, max_batch());
  active_.assign(sequences.begin(), sequences.end());
}

void KvBatch::check_t(int t, const char* operation) const {
  if (t < 1 || t > max_verify())
    refuse(operation, "T ", t, " is outside [1, max_verify ", max_verify(), "]");
}

void KvBatch::append_rows(const RowsView& rows, int t, bool windowed) {
  const char* op = windowed ? "batch append_rows_dcw" : "batch append_rows_dc";
  check_t(t, op);
  const std::int64_t want = std::int64_t(active_.size()) * t;
  if (rows.n != want)
    refuse(op, "rows.n ", rows.n, " is not active sequences ", active_.size(), " x T ", t, " = ",
           want);
  // A layer refuses on the geometry, max_verify, the dtype and the pointers alone, which every
  // layer and every slice share: the first call refuses (changing nothing) or none does.
  for (std::size_t j = 0; j < active_.size(); ++j) {
    KvLayer& layer = layers_[std::size_t(active_[j])];
    const RowsView mine = rows_of(rows, geometry(), j, t);
    if (windowed)
      layer.append_rows_dcw(mine);
    else
      layer.append_rows_dc(mine);
  }
}

void KvBatch::append_rows_dc(const RowsView& rows, int t) {
  append_rows(rows, t, false);
}

void KvBatch::append_rows_dcw(const RowsView& rows, int t) {
  append_rows(rows, t, true);
}

void KvBatch::inc_seqlen(int t) {
  check_t(t, "batch inc_seqlen");
  for (const int i : active_) layers_[std::size_t(i)].inc_seqlen(t);
}

std::vector<std::optional<std::vector<double>>> KvBatch::decode_rows(std::span<const float> q,
                                                                     int n_q_heads, int t,
                                                                     std::optional<float> scale,
                                                                     bool windowed) {
  const char* op = windowed ? "batch decode_rows_dcw" : "batch decode_rows_dc";
  check_t(t, op);
  if (n_q_heads < 1)
    refuse(op, "n_q_heads ", n_q_heads, " must be a positive multiple of n_kv_heads ",
           geometry().n_kv_heads);
  const std::size_t per_sequence =
      std::size_t(t) * std::size_t(n_q_heads) * std::size_t(geometry().head_dim_k);
  const std::size_t want = active_.size() * per_sequence;
  if (q.size() != want)
    refuse(op, "q has ", q.size(), " values, expected active sequences ", active_.size(), " x T ",
           t, " x n_q_heads ", n_q_heads, " x head_dim_k ", geometry().head_dim_k, " = ", want);
  // As for appends: a layer refuses on the layout and the query's shape alone, shared by all.
  std::vector<std::optional<std::vector<double>>> out;
  out.reserve(active_.size());
  for (std::size_t j = 0; j < active_.size(); ++j) {
    KvLayer& layer = layers_[std::size_t(active_[j])];
    const std::span<const float> mine = q.subspan(j * per_sequence, per_sequence);
    if (t == 1)
      out.push_back(windowed ? layer.decode_dcw(mine, n_q_heads, scale)
                             : layer.decode_dc(mine, n_q_heads, scale));
    else
      out.push_back(windowed ? layer.decode_rows_dcw(mine, n_q_heads, t, scale)
                             : layer.decode_rows_dc(mine, n_q_heads, t, scale));
  }
  return out;
}

std::vector<std::optional<std::vector<double>>> KvBatch::decode_rows_dc(
    std::span<const float> q, int n_q_heads, int t, std::optional<float> scale) {
  return decode_rows(q, n_q_heads, t, scale, false);
}

std::vector<std::optional<std::vector<double>>> KvBatch::decode_rows_dcw(
    std::span<const float> q, int n_q_heads, int t, std::optional<float> scale) {
  return decode_rows(q, n_q_heads, t, scale, true);
}

}  // namespace kvlayer::ref
