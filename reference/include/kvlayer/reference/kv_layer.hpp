// The reference KvLayer: the executable specification of every layer behaviour (SPEC §5–9, §11,
// §13).
// It keeps the whole K and V planes as bytes, the host counters (len, base) and a model of the
// device counters (len_d, base_d), so that a GPU layer can be compared with it byte for byte.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::ref {

/// Rows handed to an append: `n` rows of K (n × kv_dim_k elements) and of V (n × kv_dim_v),
/// row-major, all of element type `dtype`.
struct RowsView {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t n = 0;
  DType dtype = DType::f32;
};

/// A decode view: logical keys [begin, end) at physical rows begin − base …
struct DecodeView {
  std::int64_t begin = 0, end = 0, base = 0;
  bool operator==(const DecodeView&) const = default;
};

/// max_verify of a layer constructed without one (SPEC §11: at least 16 supported); the same
/// default as cuda::KvLayer's.
inline constexpr int kDefaultMaxVerify = 16;

/// The views of the T query rows of a verify decode at length `len` (SPEC §11): row i sits at
/// p_i = len − T + i and attends [s_i, p_i + 1) at physical key − base, with
/// s_i = max(0, p_i + 1 − window) on a windowed geometry, else 0. The single source of that
/// rule: decode_rows* attend these views, and a bound or an oracle per row takes them from here.
/// NOTE: checks nothing (a caller validates T, len ≥ T and s_0 ≥ base first).
std::vector<DecodeView> verify_views(const Geometry& geometry, std::int64_t len, std::int64_t base,
                                     int t);

/// What an append of n rows will do (SPEC §6 "append planning").
struct AppendPlan {
  bool rebase = false;
  std::int64_t retain = 0;     ///< new base after the rebase (== base when none)
  std::int64_t keep = 0;       ///< rows moved to the front by the rebase
  std::int64_t write_row = 0;  ///< physical row of the first new row
};

/// The reference layer. Every mutating call either completes or throws kvlayer::Error with the
/// state untouched.
class KvLayer {
 public:
  /// Builds an empty layer (planes zeroed). Throws on an illegal geometry, and refuses
  /// max_verify < 1. max_verify (SPEC §11) is the largest T of a multi-row step or verify
  /// decode; the reference has no upper limit (the CUDA layer has kMaxVerify).
  explicit KvLayer(const Geometry& geometry, int max_verify = kDefaultMaxVerify);

  const Geometry& geometry() const { return geometry_; }
  /// The largest T of append_rows_dc(w), inc_seqlen and decode_rows* (fixed at construction).
  int max_verify() const { return max_verify_; }

  /// Quantizes and appends rows.k / rows.v (SPEC §5, §6). Refused if n == 0, the pointers are
  /// null, len + n > max_ctx, or a ring cannot make room.
  void append(const RowsView& rows);

  /// Moves len (and len_d) back to new_len; bytes are untouched. Refused if new_len > len or,
  /// on a ring, can_rewind_to(new_len) is false.
  void rewind(std::int64_t new_len);

  /// Physical row range holding logical rows [start, end). Refused outside the resident rows.
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t start, std::int64_t end) const;

  /// True iff rewind(p) would be accepted.
  bool can_rewind_to(std::int64_t p) const;

  /// Makes the next k single-row appends contiguous, rebasing now if needed (SPEC §7).
  /// Refused when len + k > max_ctx or the ring cannot hold k more rows.
  void reserve(std::int64_t k);

  /// What append(n) would do, without doing it; throws the refusal append(n) would throw.
  AppendPlan plan_append(std::int64_t n, const char* operation = "append") const;

  // ---- Device-counter model (SPEC §7) ---------------------------------------------------

  /// Writes one row at physical len_d; len_d unchanged. Flat layers only (refused on a ring).
  /// A row past max_ctx writes nothing and records a device error.
  void append_dc(const RowsView& one_row);
  /// Writes one row at physical len_d − base_d; len_d unchanged. Out-of-plane rows write
  /// nothing and record a device error.
  void append_dcw(const RowsView& one_row);
  /// Writes rows.n = T rows (1 ≤ T ≤ max_verify) at physical len_d … len_d + T − 1 (SPEC
  /// §11), the bytes of T append_dc calls; len_d unchanged. Flat layers only (refused on a
  /// ring). When any row would reach max_ctx (len_d + T > max_ctx) it writes nothing and
  /// records append_past_max_ctx.
  void append_rows_dc(const RowsView& rows);
  /// Writes T rows at physical len_d − base_d …; len_d unchanged. Writes nothing and records
  /// append_past_max_ctx when len_d + T > max_ctx, else append_outside_rows when any row falls
  /// outside the plane (len_d − base_d < 0 or len_d − base_d + T > rows).
  void append_rows_dcw(const RowsView& rows);
  /// len_d += t (1 ≤ t ≤ max_verify), saturating at INT32_MAX (the device counter is int32).
  void inc_seqlen(int t = 1);
  /// Host accounting after k replayed device-counter steps: len += k (SPEC §7).
  /// NOTE: len_d is not checked (the host cannot read it without a sync); accounting for the
  /// wrong number of steps breaks len_d == len and is the caller's error. Refused when
  /// k < 0, len + k > max_ctx, or len + k − base > rows (more than reserve() made room for).
  void account_steps(std::int64_t k);

  // ---- Decode (SPEC §8), float64 over the dequantized cache ------------------------------

  /// Host-len decode: q is [n_q_heads, head_dim_k] f32; returns [n_q_heads, head_dim_v].
  /// scale defaults to 1/sqrt(head_dim_k) computed in f32.
  std::vector<double> decode(std::span<const float> q, int n_q_heads,
                             std::optional<float> scale = std::nullopt) const;
  /// Device-counter decode over [0, len_d). Flat, window-less layers only (refused otherwise).
  /// When len_d > max_ctx it writes nothing (nullopt) and records decode_view_too_long with
  /// limit max_ctx.
  /// NOTE: with compute_output false the view checks and error recording are identical but
  /// the float64 attention is skipped (an empty vector is returned): a harness that checks
  /// only some steps of a long chain uses it to stay fast.
  std::optional<std::vector<double>> decode_dc(std::span<const float> q, int n_q_heads,
                                               std::optional<float> scale = std::nullopt,
                                               bool compute_output = true);
  /// Device-counter decode over [max(0, len_d − window), len_d) at physical key − base_d.
  /// Windowed layers only (refused otherwise). Writes nothing (nullopt) and records
  /// decode_view_too_long when len_d > max_ctx (limit max_ctx), else when the view leaves the
  /// resident rows [base_d, base_d + rows) (limit rows).
  std::optional<std::vector<double>> decode_dcw(std::span<const float> q, int n_q_heads,
                                                std::optional<float> scale = std::nullopt,
                                                bool compute_output = true);

  /// Logical key range [begin, end) that decode() attends: [0, len), or
  /// [max(0, len − window), len) for windowed layers. Physical row = logical − base.
  std::pair<std::int64_t, std::int64_t> view() const;

  // ---- Verify decode (SPEC §11): q f32 [T, n_q_heads, head_dim_k], out [T, n_q_heads, head_dim_v]
  // Row i is exactly decode() at len p_i + 1 = L − T + i + 1 (the same float64 code over the
  // view verify_views() gives), so it is bit-identical to that single-query decode.

  /// Host-len verify (L = len, base). Refused when T < 1, T > max_verify, q's shape does not
  /// match, len < T, or the first row's view starts below base (ring, after a deep rewind).
  std::vector<double> decode_rows(std::span<const float> q, int n_q_heads, int t,
                                  std::optional<float> scale = std::nullopt) const;
  /// Device-counter verify over L = len_d. Flat, window-less layers only (refused otherwise;
  /// T and q's shape as decode_rows). Writes nothing (nullopt) and records
  /// decode_view_too_long when len_d > max_ctx (limit max_ctx), else when len_d < T (limit T).
  /// compute_output as for decode_dc.
  std::optional<std::vector<double>> decode_rows_dc(std::span<const float> q, int n_q_heads, int t,
                                                    std::optional<float> scale = std::nullopt,
                                                    bool compute_output = true);
  /// Device-counter verify over L = len_d at physical key − base_d. Windowed layers only.
  /// Writes nothing (nullopt) and records decode_view_too_long when len_d > max_ctx (limit
  /// max_ctx), else when len_d < T (limit T), else when the first row's view leaves the
  /// resident rows [base_d, base_d + rows) (limit rows).
  std::optional<std::vector<double>> decode_rows_dcw(std::span<const float> q, int n_q_heads, int t,
                                                     std::optional<float> scale = std::nullopt,
                                                     bool compute_output = true);
  /// The T views decode_rows() attends at the host len and base (verify_views()).
  std::vector<DecodeView> verify_views(int t) const;

  // ---- Snapshot and restore (SPEC §13) ----------------------------------------------------

  /// The live state: geometry, len, base, and the bytes of logical rows [first, len) with
  /// first = snapshot_first(geometry, len). Refused when len_d != len (device-counter steps
  /// not yet accounted for: the host's len does not say which rows are live) or, on a ring,
  /// when first < base (lapped; SPEC §6's rebase and rewind rules keep first ≥ base, so this
  /// only guards that invariant). The sticky status is not part of a snapshot.
  Snapshot snapshot() const;
  /// Restores `s` into this fresh layer: the rows at physical row logical − base, with
  /// base = first on a ring and 0 on a flat layer; len = len_d = s.len, base_d = base; every
  /// other plane byte stays zero, the status clear. Refused (layer unchanged) for another
  /// layout, a malformed snapshot (check_restore) or a layer that is not fresh().
  void restore(const Snapshot& s);
  /// Fresh: no call among append, append_dc, append_dcw, append_rows_dc, append_rows_dcw,
  /// inc_seqlen, reserve, rewind, account_steps and restore has been accepted since
  /// construction (even one that changed nothing, like rewind(0)); refused calls, decodes and
  /// status calls do not count. A fresh layer has all-zero planes, len = len_d = base = base_d = 0
  /// and a clear status.
  bool fresh() const { return fresh_; }

  // ---- State ------------------------------------------------------------------------------

  std::int64_t len() const { return len_; }
  std::int64_t base() const { return base_; }
  std::int64_t len_d() const { return len_d_; }
  std::int64_t base_d() const { return base_d_; }
  std::int64_t rows() const { return geometry_.rows(); }
  const std::vector<std::uint8_t>& k_plane() const { return k_plane_; }
  const std::vector<std::uint8_t>& v_plane() const { return v_plane_; }
  /// Sticky errors recorded since construction or the last clear_status().
  const LayerStatus& status() const { return status_; }
  void clear_status() { status_ = {}; }

  /// Dequantized K (or V) of one physical row, all heads: kv_dim values.
  std::vector<float> dequantized_row(Plane plane, std::int64_t physical_row) const;
  /// The quantized bytes of one KV head of one physical row (head_dim / 32 blocks).
  std::span<const std::uint8_t> head_bytes(Plane plane, std::int64_t physical_row,
                                           int kv_head) const;
  /// Dequantized K (or V) of one KV head of one physical row: head_dim values.
  std::vector<float> dequantized_head(Plane plane, std::int64_t physical_row, int kv_head) const;

 private:
  void check_rows(const RowsView& rows, const char* operation) const;
  void check_query(std::span<const float> q, int n_q_heads, const char* operation) const;
  void check_verify_count(std::int64_t t, const char* operation) const;
  void check_queries(std::span<const float> q, int n_q_heads, int t, const char* operation) const;
  void append_device(const RowsView& rows, bool windowed);
  void record(const DeviceError& e);
  std::vector<double> attend_rows(std::span<const float> q, int n_q_heads,
                                  std::optional<float> scale,
                                  const std::vector<DecodeView>& views) const;
  void apply_rebase(const AppendPlan& plan);
  void write_rows(const RowsView& rows, std::int64_t physical_row, std::int64_t logical_row);
  std::vector<double> attend(std::span<const float> q, int n_q_heads, std::optional<float> scale,
                             std::int64_t lbegin, std::int64_t lend, std::int64_t base) const;

  Geometry geometry_;
  int max_verify_ = kDefaultMaxVerify;
  std::vector<std::uint8_t> k_plane_, v_plane_;
  std::int64_t len_ = 0, base_ = 0;
  std::int64_t len_d_ = 0, base_d_ = 0;
  LayerStatus status_;
  bool fresh_ = true;  ///< see fresh()
};

/// Converts element i of a row buffer of type t to f32 (exact).
float element_to_f32(const void* data, DType t, std::int64_t i);

}  // namespace kvlayer::ref
