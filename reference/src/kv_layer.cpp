// The reference KvLayer: plain, sequential C++ that follows SPEC §5–7 and §11 line by line.
#include "kvlayer/reference/kv_layer.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/quantize.hpp"

namespace kvlayer::ref {

float element_to_f32(const void* data, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, static_cast<const unsigned char*>(data) + 4 * i, 4);
      return f;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, static_cast<const unsigned char*>(data) + 2 * i, 2);
      return t == DType::f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
    }
  }
  return 0.0f;
}

KvLayer::KvLayer(const Geometry& geometry, int max_verify)
    : geometry_(geometry), max_verify_(max_verify) {
  geometry_.validate();
  if (max_verify < 1) refuse("ref::KvLayer", "max_verify ", max_verify, " must be at least 1");
  k_plane_.assign(std::size_t(geometry_.rows() * geometry_.k_tok_bytes()), 0);
  v_plane_.assign(std::size_t(geometry_.rows() * geometry_.v_tok_bytes()), 0);
}

void KvLayer::check_rows(const RowsView& rows, const char* operation) const {
  if (rows.k == nullptr || rows.v == nullptr) refuse(operation, "k and v must not be null");
  if (rows.n < 1) refuse(operation, "n ", rows.n, " must be at least 1");
  if (rows.dtype != DType::f32 && rows.dtype != DType::f16 && rows.dtype != DType::bf16)
    refuse(operation, "dtype ", int(rows.dtype), " is not f32, f16 or bf16");
}

void KvLayer::check_verify_count(std::int64_t t, const char* operation) const {
  if (t < 1) refuse(operation, "T ", t, " must be at least 1");
  if (t > max_verify_) refuse(operation, "T ", t, " exceeds max_verify ", max_verify_);
}

AppendPlan KvLayer::plan_append(std::int64_t n, const char* operation) const {
  const Geometry& g = geometry_;
  if (n < 1) refuse(operation, "n ", n, " must be at least 1");
  if (len_ + n > g.max_ctx)
    refuse(operation, "len ", len_, " + n ", n, " exceeds max_ctx ", g.max_ctx);
  AppendPlan plan{false, base_, 0, len_ - base_};
  if (!g.is_ring() || len_ - base_ + n <= g.rows()) return plan;
  // SPEC §6: keep the rows a window plus a rewind may still need, from an aligned base.
  const std::int64_t retain = std::max(
      base_, align_down(std::max<std::int64_t>(0, len_ - (*g.window - 1) - g.rewind_slack)));
  const std::int64_t keep = len_ - retain;
  if (keep + n > g.rows())
    refuse(operation, "ring cannot fit n ", n, " rows: ", keep,
           " rows must stay resident (from logical row ", retain, ") and ", keep, " + ", n,
           " exceeds rows ", g.rows());
  return AppendPlan{true, retain, keep, keep};
}

void KvLayer::apply_rebase(const AppendPlan& plan) {
  if (!plan.rebase) return;
  const std::int64_t from = plan.retain - base_;
  for (auto [plane, tok] : {std::pair{&k_plane_, geometry_.k_tok_bytes()},
                            std::pair{&v_plane_, geometry_.v_tok_bytes()}}) {
    // memmove: the ranges may overlap; the result is as if copied through a temporary.
    std::memmove(plane->data(), plane->data() + from * tok, std::size_t(plan.keep * tok));
  }
  base_ = plan.retain;
  base_d_ = plan.retain;
}

void KvLayer::write_rows(const RowsView& rows, std::int64_t physical_row,
                         std::int64_t logical_row) {
  const Geometry& g = geometry_;
  std::vector<float> k(std::size_t(g.kv_dim_k())), v(std::size_t(g.kv_dim_v()));
  for (std::int64_t r = 0; r < rows.n; ++r) {
    for (std::int64_t i = 0; i < g.kv_dim_k(); ++i)
      k[std::size_t(i)] = element_to_f32(rows.k, rows.dtype, r * g.kv_dim_k() + i);
    for (std::int64_t i = 0; i < g.kv_dim_v(); ++i)
      v[std::size_t(i)] = element_to_f32(rows.v, rows.dtype, r * g.kv_dim_v() + i);
    const std::int64_t p = physical_row + r;
    std::span<std::uint8_t> k_out(k_plane_.data() + p * g.k_tok_bytes(),
                                  std::size_t(g.k_tok_bytes()));
    std::span<std::uint8_t> v_out(v_plane_.data() + p * g.v_tok_bytes(),
                                  std::size_t(g.v_tok_bytes()));
    if (auto bad = quantize_row(BlockType::q8_0, k, k_out))
      keep_first(status_.data_error, DataError{logical_row + r, Plane::k, bad->block, bad->value});
    if (auto bad = quantize_row(BlockType::q5_1, v, v_out))
      keep_first(status_.data_error, DataError{logical_row + r, Plane::v, bad->block, bad->value});
  }
}

void KvLayer::append(const RowsView& rows) {
  check_rows(rows, "append");
  const AppendPlan plan = plan_append(rows.n, "append");
  apply_rebase(plan);
  write_rows(rows, plan.write_row, len_);
  len_ += rows.n;
  len_d_ = len_;
  fresh_ = false;
}

bool KvLayer::can_rewind_to(std::int64_t p) const {
  if (p < 0 || p > len_) return false;
  if (!geometry_.is_ring()) return true;
  return align_down(std::max<std::int64_t>(0, p - (*geometry_.window - 1))) >= base_;
}

void KvLayer::rewind(std::int64_t new_len) {
  if (new_len < 0 || new_len > len_)
    refuse("rewind", "new_len ", new_len, " is outside [0, len ", len_, "]");
  if (!can_rewind_to(new_len))
    refuse("rewind", "new_len ", new_len, " needs logical row ",
           std::max<std::int64_t>(0, new_len - (*geometry_.window - 1)),
           " resident (the window of the next append), below base ", base_,
           " (the ring already dropped it)");
  len_ = new_len;
  len_d_ = new_len;
  fresh_ = false;
}

std::pair<std::int64_t, std::int64_t> KvLayer::physical_rows(std::int64_t start,
                                                             std::int64_t end) const {
  const std::int64_t rows = geometry_.rows();
  if (start < base_ || start > end || end - base_ > rows)
    refuse("physical_rows", "[", start, ", ", end, ") is not within the resident rows [", base_,
           ", ", base_ + rows, ")");
  return {start - base_, end - base_};
}

void KvLayer::reserve(std::int64_t k) {
  if (k < 0) refuse("reserve", "k ", k, " must not be negative");
  if (k > 0) apply_rebase(plan_append(k, "reserve"));
  fresh_ = false;
}

void KvLayer::record(const DeviceError& e) {
  if (!status_.device_error) status_.device_error = e;
}

void KvLayer::append_device(const RowsView& rows, bool windowed) {
  fresh_ = false;  // accepted, whether it writes or records a device error
  // Every row of the step is checked before any is written: a step that does not fit writes
  // none (SPEC §7, §11), and max_ctx is checked first.
  const std::int64_t base = windowed ? base_d_ : 0;
  if (len_d_ + rows.n > geometry_.max_ctx)
    return record({DeviceErrorKind::append_past_max_ctx, len_d_, base_d_, geometry_.max_ctx});
  if (windowed && (len_d_ - base < 0 || len_d_ - base + rows.n > geometry_.rows()))
    return record({DeviceErrorKind::append_outside_rows, len_d_, base_d_, geometry_.rows()});
  write_rows(rows, len_d_ - base, len_d_);
}

void KvLayer::append_dc(const RowsView& one_row) {
  check_rows(one_row, "append_dc");
  if (one_row.n != 1) refuse("append_dc", "n ", one_row.n, " must be 1");
  if (geometry_.is_ring()) refuse("append_dc", "ring layers use append_dcw");
  append_device(one_row, false);
}

void KvLayer::append_dcw(const RowsView& one_row) {
  check_rows(one_row, "append_dcw");
  if (one_row.n != 1) refuse("append_dcw", "n ", one_row.n, " must be 1");
  append_device(one_row, true);
}

void KvLayer::append_rows_dc(const RowsView& rows) {
  check_rows(rows, "append_rows_dc");
  check_verify_count(rows.n, "append_rows_dc");
  if (geometry_.is_ring()) refuse("append_rows_dc", "ring layers use append_rows_dcw");
  append_device(rows, false);
}

void KvLayer::append_rows_dcw(const RowsView& rows) {
  check_rows(rows, "append_rows_dcw");
  check_verify_count(rows.n, "append_rows_dcw");
  append_device(rows, true);
}

void KvLayer::inc_seqlen(int t) {
  check_verify_count(t, "inc_seqlen");
  fresh_ = false;
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();  // int32 on the device
  if (len_d_ < kMax) len_d_ = std::min(len_d_ + t, kMax);
}

void KvLayer::account_steps(std::int64_t k) {
  if (k < 0 || len_ + k > geometry_.max_ctx)
    refuse("account_steps", "len ", len_, " + k ", k, " is outside [len, max_ctx ",
           geometry_.max_ctx, "]");
  if (len_ + k - base_ > geometry_.rows())
    refuse("account_steps", "len ", len_, " + k ", k, " - base ", base_, " exceeds rows ",
           geometry_.rows(), " (more steps than reserve() made room for)");
  len_ += k;
  fresh_ = false;
}

std::vector<float> KvLayer::dequantized_row(Plane plane, std::int64_t physical_row) const {
  const bool is_k = plane == Plane::k;
  const std::int64_t tok = is_k ? geometry_.k_tok_bytes() : geometry_.v_tok_bytes();
  std::vector<float> out(std::size_t(is_k ? geometry_.kv_dim_k() : geometry_.kv_dim_v()));
  const auto& bytes = is_k ? k_plane_ : v_plane_;
  dequantize_row(is_k ? BlockType::q8_0 : BlockType::q5_1,
                 std::span<const std::uint8_t>(bytes.data() + physical_row * tok, std::size_t(tok)),
                 out);
  return out;
}

std::span<const std::uint8_t> KvLayer::head_bytes(Plane plane, std::int64_t physical_row,
                                                  int kv_head) const {
  const bool is_k = plane == Plane::k;
  const std::int64_t tok = is_k ? geometry_.k_tok_bytes() : geometry_.v_tok_bytes();
  const int head_dim = is_k ? geometry_.head_dim_k : geometry_.head_dim_v;
  const std::int64_t head = head_dim / kBlockValues * (is_k ? kQ8_0BlockBytes : kQ5_1BlockBytes);
  const auto& bytes = is_k ? k_plane_ : v_plane_;
  return {bytes.data() + physical_row * tok + kv_head * head, std::size_t(head)};
}

std::vector<float> KvLayer::dequantized_head(Plane plane, std::int64_t physical_row,
                                             int kv_head) const {
  const bool is_k = plane == Plane::k;
  std::vector<float> out(
      static_cast<std::size_t>(is_k ? geometry_.head_dim_k : geometry_.head_dim_v));
  dequantize_row(is_k ? BlockType::q8_0 : BlockType::q5_1, head_bytes(plane, physical_row, kv_head),
                 out);
  return out;
}

}  // namespace kvlayer::ref
