// Decode attention in float64 over the dequantized cache (SPEC §8), the verify decode of T query
// rows (SPEC §11), and their accuracy bound.
#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "parallel_rows.hpp"

namespace kvlayer::ref {
namespace {

using MatrixXdR = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Eigen::MatrixXd;
/// Rows [first, first + n) of a head's cache: every view of a launch is such a block, so that
/// one query row's arithmetic is the same whichever union of views the cache was gathered for.
using RowsRef = Eigen::Ref<const MatrixXdR>;

/// Dequantized K and V of one KV head over the logical keys [begin, begin + k.rows()), as
/// float64 matrices [keys × head_dim]. Gathered once per launch (the union of its rows' views);
/// each row reads its own view as a block of it.
struct HeadCache {
  std::int64_t begin = 0;
  MatrixXdR k, v;
  /// [keys × head_dim_v]: |V − m| + |m| with m the q5_1 block's minimum, i.e. |d·q| + |m|, the
  /// magnitude the f32 (or fp16 fused) dequantization rounds at.
  MatrixXdR v_dequant_mag;
  /// Gathered for a tensor-core shape only (else empty): [keys × head_dim_v] the V the kernels
  /// multiply (accuracy.hpp (3): d·q + m fused to fp16; the f32 value for a key within a tile's
  /// reach of a block whose header may take a kernel's f32 path), and for those keys
  /// |fused − f32|, the other candidate (noise model (N0), (N3)).
  MatrixXdR v_fused, v_either;
  /// Gathered for a fused shape only (AccumulationShape::k_fused_f16; else empty):
  /// [keys × head_dim_k] the K the kernel multiplies (accuracy.hpp (1): fp16(d·q); the exact
  /// value for a key within a tile's reach of a block beyond the fold), and for those keys
  /// |fp16(d·q) − d·q|, the other candidate.
  /// v_either and k_either are allocated only when some key has a nonzero one.
  MatrixXdR k_fused, k_either;
  Eigen::Index first(const DecodeView& view) const { return Eigen::Index(view.begin - begin); }
  Eigen::Index keys(const DecodeView& view) const { return Eigen::Index(view.end - view.begin); }
};

/// Softmax of every column of a score matrix [keys × query heads] (one column per query head
/// of a KV head, so the whole GQA group is one matrix product).
struct ColumnSoftmax {
  MatrixXd scores, p;         ///< [keys × heads]: scale·K·q, and the probabilities
  Eigen::RowVectorXd top, l;  ///< per head: the largest score and Σ exp(score − top)
};

/// The softmax of every column of scores [keys × heads].
ColumnSoftmax softmax_of_scores(MatrixXd scores) {
  ColumnSoftmax r;
  r.scores = std::move(scores);
  r.top = r.scores.colwise().maxCoeff();
  const MatrixXd w = (r.scores.rowwise() - r.top).array().exp().matrix();
  r.l = w.colwise().sum();
  r.p = w.array().rowwise() / r.l.array();
  return r;
}

ColumnSoftmax softmax_columns(const RowsRef& k, const MatrixXd& q_columns, double scale) {
  return softmax_of_scores(scale * (k * q_columns));
}

/// The largest key tile whose K or V a kernel multiplies on one path (decode_mma_verify.cu's
/// block tile at head dim 128): a wide V block sends its whole tile to the f32 path, a K block
/// beyond the fold its whole tile to exact K.
constexpr std::int64_t kWideTileReach = 64;

/// Per key of [view.begin, view.end): whether a row within a tile's reach (kWideTileReach − 1
/// keys either side, the rows next to the view included: a tile may straddle its ends) has a
/// block of `plane` that sends its tile to a kernel's other path (`wide` of the block's bytes).
template <std::size_t kBytes, class Wide>
std::vector<char> near_wide_blocks(const KvLayer& layer, int kv_head, const DecodeView& view,
                                   Plane plane, Wide wide) {
  const Geometry& g = layer.geometry();
  const std::int64_t n = view.end - view.begin, reach = kWideTileReach - 1;
  const int blocks = (plane == Plane::k ? g.head_dim_k : g.head_dim_v) / kBlockValues;
  std::vector<std::int64_t> before(static_cast<std::size_t>(n + 2 * reach) + 1, 0);
  for (std::int64_t t = -reach; t < n + reach; ++t) {
    bool any = false;
    const std::int64_t phys = view.begin + t - view.base;
    if (phys >= 0 && phys < g.rows()) {
      const std::span<const std::uint8_t> bytes = layer.head_bytes(plane, phys, kv_head);
      for (int b = 0; b < blocks && !any; ++b)
        any = wide(std::span<const std::uint8_t, kBytes>(bytes.data() + b * kBytes, kBytes));
    }
    before[std::size_t(t + reach) + 1] = before[std::size_t(t + reach)] + (any ? 1 : 0);
  }
  std::vector<char> near(static_cast<std::size_t>(n), 0);
  // Keys [t − reach, t + reach] are entries [t, t + 2·reach] of `before`'s steps.
  for (std::int64_t t = 0; t < n; ++t)
    near[std::size_t(t)] = before[std::size_t(t + 2 * reach) + 1] != before[std::size_t(t)];
  return near;
}

/// For the keys `near` a block that sends its tile to a kernel's other path: `used` (the value
/// one path multiplies) takes the exact value, and `either` (allocated on the first need) the
/// distance to the candidate it had, where both are finite and differ.
void keep_exact_near(const std::vector<char>& near, const MatrixXdR& exact, MatrixXdR& used,
                     MatrixXdR& either) {
  for (Eigen::Index t = 0; t < exact.rows(); ++t) {
    if (!near[std::size_t(t)]) continue;
    for (Eigen::Index e = 0; e < exact.cols(); ++e) {
      const double x = exact(t, e), f = used(t, e);
      used(t, e) = x;
      if (std::isfinite(x) && std::isfinite(f) && f != x) {
        if (either.size() == 0) either.setZero(exact.rows(), exact.cols());
        either(t, e) = std::fabs(f - x);
      }
    }
  }
}

/// The keys [view.begin, view.end) of one KV head (physical row = key − view.base); with
/// tensor_core also V as the tensor-core kernels multiply it, with k_fused K as a fused shape's
/// kernel does (accuracy.hpp (1), (3)).
HeadCache gather_head(const KvLayer& layer, int kv_head, const DecodeView& view,
                      bool tensor_core = false, bool k_fused = false) {
  const Geometry& g = layer.geometry();
  const std::int64_t n = view.end - view.begin;
  HeadCache c;
  c.begin = view.begin;
  c.k.resize(n, g.head_dim_k);
  c.v.resize(n, g.head_dim_v);
  c.v_dequant_mag.resize(n, g.head_dim_v);
  if (tensor_core) c.v_fused.resize(n, g.head_dim_v);
  if (k_fused) c.k_fused.resize(n, g.head_dim_k);
  std::array<double, kBlockValues> fused{};
  // One buffer per plane for the whole view (dequantized_head would allocate per row).
  std::vector<float> k(std::size_t(g.head_dim_k)), v(std::size_t(g.head_dim_v));
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t phys = view.begin + t - view.base;
    const std::span<const std::uint8_t> k_bytes = layer.head_bytes(Plane::k, phys, kv_head);
    dequantize_row(BlockType::q8_0, k_bytes, k);
    const std::span<const std::uint8_t> v_bytes = layer.head_bytes(Plane::v, phys, kv_head);
    dequantize_row(BlockType::q5_1, v_bytes, v);
    for (int d = 0; d < g.head_dim_k; ++d) c.k(t, d) = k[std::size_t(d)];
    for (int b = 0; k_fused && b < g.head_dim_k; b += kBlockValues) {
      dequantize_q8_0_block_folded_f16(
          std::span<const std::uint8_t, kQ8_0BlockBytes>(
              k_bytes.data() + (b / kBlockValues) * kQ8_0BlockBytes, kQ8_0BlockBytes),
          fused);
      for (int j = 0; j < kBlockValues; ++j) c.k_fused(t, b + j) = fused[std::size_t(j)];
    }
    for (int b = 0; b < g.head_dim_v; b += kBlockValues) {
      const double m = q5_1_block_min(std::span<const std::uint8_t, kQ5_1BlockBytes>(
          v_bytes.data() + (b / kBlockValues) * kQ5_1BlockBytes, kQ5_1BlockBytes));
      for (int j = 0; j < kBlockValues; ++j) {
        const double x = v[std::size_t(b + j)];
        c.v(t, b + j) = x;
        c.v_dequant_mag(t, b + j) = std::fabs(x - m) + std::fabs(m);
      }
      if (!tensor_core) continue;
      dequantize_q5_1_block_fused_f16(
          std::span<const std::uint8_t, kQ5_1BlockBytes>(
              v_bytes.data() + (b / kBlockValues) * kQ5_1BlockBytes, kQ5_1BlockBytes),
          fused);
      for (int j = 0; j < kBlockValues; ++j) c.v_fused(t, b + j) = fused[std::size_t(j)];
    }
  }
  if (k_fused) {
    // A kernel folds d into a whole key tile's K unless one of its blocks' d is beyond the
    // fold: every key within a tile's reach of such a block may get either value.
    keep_exact_near(
        near_wide_blocks<kQ8_0BlockBytes>(layer, kv_head, view, Plane::k,
                                          [](std::span<const std::uint8_t, kQ8_0BlockBytes> b) {
                                            return q8_0_header_may_be_wide(b);
                                          }),
        c.k, c.k_fused, c.k_either);
  }
  if (tensor_core) {
    // A kernel multiplies a whole key tile's V in f32 when one of its blocks has a wide (or
    // non-finite) header: every key within a tile's reach of such a key may get either value.
    keep_exact_near(
        near_wide_blocks<kQ5_1BlockBytes>(layer, kv_head, view, Plane::v,
                                          [](std::span<const std::uint8_t, kQ5_1BlockBytes> b) {
                                            return q5_1_header_may_be_wide(b);
                                          }),
        c.v, c.v_fused, c.v_either);
  }
  return c;
}

/// The smallest view holding every non-empty one of `views` (they share one base); empty when
/// all are.
DecodeView union_of(std::span<const DecodeView> views) {
  DecodeView all{0, 0, views.empty() ? 0 : views.front().base};
  for (const DecodeView& v : views) {
    if (v.end <= v.begin) continue;
    if (all.end <= all.begin) {
      all = v;
      continue;
    }
    all.begin = std::min(all.begin, v.begin);
    all.end = std::max(all.end, v.end);
  }
  return all;
}

/// Every KV head's cache over `all`, gathered on the machine's cores.
std::vector<HeadCache> gather_heads(const KvLayer& layer, const DecodeView& all) {
  std::vector<HeadCache> heads(std::size_t(layer.geometry().n_kv_heads));
  detail::parallel_rows(heads.size(),
                        [&](std::size_t kv) { heads[kv] = gather_head(layer, int(kv), all); });
  return heads;
}

/// The query heads [first, first + count) as the columns of a [head_dim × count] matrix; with
/// `round_f16` each value is first rounded to fp16 (the kernels' declared rounding of q).
MatrixXd query_columns(std::span<const float> q, int first, int count, int head_dim,
                       bool round_f16) {
  MatrixXd out(head_dim, count);
  for (int h = 0; h < count; ++h)
    for (int d = 0; d < head_dim; ++d) {
      const float x = q[std::size_t(first + h) * std::size_t(head_dim) + std::size_t(d)];
      out(d, h) = round_f16 ? f16_bits_to_f32(f32_to_f16_bits(x)) : x;
    }
  return out;
}

}  // namespace

void KvLayer::check_query(std::span<const float> q, int n_q_heads, const char* operation) const {
  const Geometry& g = geometry_;
  if (n_q_heads < 1 || n_q_heads % g.n_kv_heads != 0)
    refuse(operation, "n_q_heads ", n_q_heads, " must be a positive multiple of n_kv_heads ",
           g.n_kv_heads);
  const std::int64_t want = std::int64_t(n_q_heads) * g.head_dim_k;
  if (std::int64_t(q.size()) != want)
    refuse(operation, "q has ", q.size(), " values, expected n_q_heads ", n_q_heads,
           " x head_dim_k ", g.head_dim_k, " = ", want);
}

std::vector<double> KvLayer::attend(std::span<const float> q, int n_q_heads,
                                    std::optional<float> scale, std::int64_t lbegin,
                                    std::int64_t lend, std::int64_t base) const {
  return attend_rows(q, n_q_heads, scale, {DecodeView{lbegin, lend, base}});
}

std::pair<std::int64_t, std::int64_t> KvLayer::view() const {
  const std::int64_t begin =
      geometry_.window ? std::max<std::int64_t>(0, len_ - *geometry_.window) : 0;
  return {begin, len_};
}

std::vector<double> KvLayer::decode(std::span<const float> q, int n_q_heads,
                                    std::optional<float> scale) const {
  check_query(q, n_q_heads, "decode");
  const auto [begin, end] = view();
  if (begin < base_)
    refuse("decode", "the view starts at logical row ", begin, ", below base ", base_,
           " (not resident; append before decoding after a rewind this deep)");
  return attend(q, n_q_heads, scale, begin, end, base_);
}

std::optional<std::vector<double>> KvLayer::decode_dc(std::span<const float> q, int n_q_heads,
                                                      std::optional<float> scale,
                                                      bool compute_output) {
  check_query(q, n_q_heads, "decode_dc");
  if (geometry_.is_ring()) refuse("decode_dc", "ring layers use decode_dcw");
  if (geometry_.window)
    refuse("decode_dc", "attends [0, len_d) and ignores the window ", *geometry_.window,
           "; windowed layers use decode_dcw");
  if (len_d_ > geometry_.max_ctx) {
    if (!status_.device_error)
      status_.device_error =
          DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.max_ctx};
    return std::nullopt;
  }
  if (!compute_output) return std::vector<double>{};
  return attend(q, n_q_heads, scale, 0, len_d_, 0);
}

std::optional<std::vector<double>> KvLayer::decode_dcw(std::span<const float> q, int n_q_heads,
                                                       std::optional<float> scale,
                                                       bool compute_output) {
  check_query(q, n_q_heads, "decode_dcw");
  if (!geometry_.window) refuse("decode_dcw", "the layer has no window; use decode_dc");
  const std::int64_t begin = std::max<std::int64_t>(0, len_d_ - *geometry_.window);
  std::optional<DeviceError> err;
  if (len_d_ > geometry_.max_ctx)
    err = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.max_ctx};
  else if (begin < base_d_ || len_d_ - base_d_ > geometry_.rows())
    err = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.rows()};
  if (err) {
    if (!status_.device_error) status_.device_error = err;
    return std::nullopt;
  }
  if (!compute_output) return std::vector<double>{};
  return attend(q, n_q_heads, scale, begin, len_d_, base_d_);
}

std::vector<DecodeView> verify_views(const Geometry& geometry, std::int64_t len, std::int64_t base,
                                     int t) {
  std::vector<DecodeView> views;
  for (int i = 0; i < t; ++i) {
    const std::int64_t end = len - t + i + 1;  // p_i + 1: causal among the new rows
    const std::int64_t begin =
        geometry.window ? std::max<std::int64_t>(0, end - *geometry.window) : 0;
    views.push_back({begin, end, base});
  }
  return views;
}

std::vector<DecodeView> KvLayer::verify_views(int t) const {
  return ref::verify_views(geometry_, len_, base_, t);
}

void KvLayer::check_queries(std::span<const float> q, int n_q_heads, int t,
                            const char* operation) const {
  const Geometry& g = geometry_;
  if (n_q_heads < 1 || n_q_heads % g.n_kv_heads != 0)
    refuse(operation, "n_q_heads ", n_q_heads, " must be a positive multiple of n_kv_heads ",
           g.n_kv_heads);
  const std::int64_t want = std::int64_t(t) * n_q_heads * g.head_dim_k;
  if (std::int64_t(q.size()) != want)
    refuse(operation, "q has ", q.size(), " values, expected T ", t, " x n_q_heads ", n_q_heads,
           " x head_dim_k ", g.head_dim_k, " = ", want);
}

std::vector<double> KvLayer::attend_rows(std::span<const float> q, int n_q_heads,
                                         std::optional<float> scale,
                                         const std::vector<DecodeView>& views) const {
  // Each (row, KV head) is the same arithmetic on its view's block of a cache gathered once
  // for the union of the views, so row i is bit-identical to decode() at len p_i + 1 (SPEC §11:
  // "the decode a single-query call would compute"), which is the one-row case of this code.
  const Geometry& g = geometry_;
  const int gqa = n_q_heads / g.n_kv_heads;
  const double s = scale.value_or(default_scale(g.head_dim_k));
  const std::size_t q_row = std::size_t(n_q_heads) * std::size_t(g.head_dim_k);
  const std::size_t out_row = std::size_t(n_q_heads) * std::size_t(g.head_dim_v);
  std::vector<double> out(views.size() * out_row, 0.0);  // an empty view's row is all zero
  const std::vector<HeadCache> heads = gather_heads(*this, union_of(views));
  detail::parallel_rows(views.size() * heads.size(), [&](std::size_t item) {
    const std::size_t i = item / heads.size();
    const int kv = int(item % heads.size());
    const DecodeView& view = views[i];
    if (view.end <= view.begin) return;
    const HeadCache& c = heads[std::size_t(kv)];
    const Eigen::Index first = c.first(view), n = c.keys(view);
    const MatrixXd q_columns =
        query_columns(q.subspan(i * q_row, q_row), kv * gqa, gqa, g.head_dim_k, false);
    const MatrixXd o =  // [head_dim_v × gqa]
        c.v.middleRows(first, n).transpose() *
        softmax_columns(c.k.middleRows(first, n), q_columns, s).p;
    for (int j = 0; j < gqa; ++j)
      for (int e = 0; e < g.head_dim_v; ++e)
        out[i * out_row + std::size_t(kv * gqa + j) * g.head_dim_v + std::size_t(e)] = o(e, j);
  });
  return out;
}

std::vector<double> KvLayer::decode_rows(std::span<const float> q, int n_q_heads, int t,
                                         std::optional<float> scale) const {
  check_verify_count(t, "decode_rows");
  check_queries(q, n_q_heads, t, "decode_rows");
  if (len_ < t) refuse("decode_rows", "len ", len_, " is less than T ", t);
  const std::vector<DecodeView> views = ref::verify_views(geometry_, len_, base_, t);
  // The first row's view starts lowest (s_i never decreases with i).
  if (views.front().begin < base_)
    refuse("decode_rows", "the view of query 0 starts at logical row ", views.front().begin,
           ", below base ", base_, " (not resident)");
  return attend_rows(q, n_q_heads, scale, views);
}

std::optional<std::vector<double>> KvLayer::decode_rows_dc(std::span<const float> q, int n_q_heads,
                                                           int t, std::optional<float> scale,
                                                           bool compute_output) {
  check_verify_count(t, "decode_rows_dc");
  check_queries(q, n_q_heads, t, "decode_rows_dc");
  if (geometry_.is_ring()) refuse("decode_rows_dc", "ring layers use decode_rows_dcw");
  if (geometry_.window)
    refuse("decode_rows_dc", "attends [0, len_d) and ignores the window ", *geometry_.window,
           "; windowed layers use decode_rows_dcw");
  // The device sees the counters only: where the host variant would refuse, record and write
  // nothing (max_ctx first, as decode_dc).
  if (len_d_ > geometry_.max_ctx) {
    record({DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.max_ctx});
    return std::nullopt;
  }
  if (len_d_ < t) {
    record({DeviceErrorKind::decode_view_too_long, len_d_, base_d_, t});
    return std::nullopt;
  }
  if (!compute_output) return std::vector<double>{};
  return attend_rows(q, n_q_heads, scale, ref::verify_views(geometry_, len_d_, 0, t));
}

std::optional<std::vector<double>> KvLayer::decode_rows_dcw(std::span<const float> q, int n_q_heads,
                                                            int t, std::optional<float> scale,
                                                            bool compute_output) {
  check_verify_count(t, "decode_rows_dcw");
  check_queries(q, n_q_heads, t, "decode_rows_dcw");
  if (!geometry_.window) refuse("decode_rows_dcw", "the layer has no window; use decode_rows_dc");
  std::optional<DeviceError> err;
  std::vector<DecodeView> views;
  if (len_d_ > geometry_.max_ctx) {
    err = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.max_ctx};
  } else if (len_d_ < t) {
    err = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, t};
  } else {
    views = ref::verify_views(geometry_, len_d_, base_d_, t);
    if (views.front().begin < base_d_ || len_d_ - base_d_ > geometry_.rows())
      err = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_, geometry_.rows()};
  }
  if (err) {
    record(*err);
    return std::nullopt;
  }
  if (!compute_output) return std::vector<double>{};
  return attend_rows(q, n_q_heads, scale, views);
}

namespace {

/// Bounds on the probabilities a GPU computes when every score s̃_t may be off by up to δ_t:
/// p̂_t = A/(A + R) with A = p̃_t·e^{ε_t}, R = Σ_{u≠t} p̃_u·e^{ε_u}, |ε| ≤ δ, is increasing in A
/// and decreasing in R, so p̂_t ∈ [lo_t, hi_t] from the extreme A and R (accuracy.hpp (2)).
/// Computed in the log domain (x_t = s̃_t − max s̃ is log of the unnormalized p̃_t) with
/// prefix / suffix sums for the Σ_{u≠t}, so neither overflow nor cancellation can occur.
void probability_range(const Eigen::VectorXd& x, const Eigen::VectorXd& delta, Eigen::VectorXd& lo,
                       Eigen::VectorXd& hi) {
  const Eigen::Index n = x.size();
  const Eigen::VectorXd a = x + delta, b = x - delta;  // log of the largest and smallest A
  const double a_max = a.maxCoeff(), b_max = b.maxCoeff();
  // others(w, shift)[t] = Σ_{u≠t} e^{w_u − shift}
  const auto others = [n](const Eigen::VectorXd& w, double shift) {
    Eigen::VectorXd e = (w.array() - shift).exp().matrix(), out(n);
    double before = 0;
    for (Eigen::Index t = 0; t < n; ++t) {
      out(t) = before;
      before += e(t);
    }
    double after = 0;
    for (Eigen::Index t = n - 1; t >= 0; --t) {
      out(t) += after;
      after += e(t);
    }
    return out;
  };
  const Eigen::VectorXd r_small = others(b, b_max), r_large = others(a, a_max);
  lo.resize(n);
  hi.resize(n);
  for (Eigen::Index t = 0; t < n; ++t) {
    // hi = e^{a_t} / (e^{a_t} + e^{b_max}·r_small_t), lo = e^{b_t} / (e^{b_t} +
    // e^{a_max}·r_large_t)
    hi(t) = r_small(t) > 0 ? 1 / (1 + std::exp(b_max - a(t) + std::log(r_small(t)))) : 1.0;
    lo(t) = r_large(t) > 0 ? 1 / (1 + std::exp(a_max - b(t) + std::log(r_large(t)))) : 1.0;
  }
}

}  // namespace

namespace {

/// A head's cache with the magnitudes the bound multiplies (over the same keys).
struct BoundCache {
  HeadCache c;
  MatrixXdR abs_k, abs_v;
  /// 1 where |V| is in fp16's subnormal range (rounded with an absolute error of 2^-25).
  MatrixXdR v_subnormal;
  bool any_subnormal = false;  ///< v_subnormal has a 1 (else its term is 0: not computed)
};

/// Where key t's p is exactly 1 in whatever accumulator frame holds it (accuracy.hpp (N1)): its
/// score x_t exceeds every other key's within frame_keys − 1 positions (a frame lies inside one
/// split, frame_keys = max_keys_per_split contiguous keys) by more than both scores' errors, so
/// the GPU's running maximum at its tile is its own score and exp2f(0) = 1 is not rounded.
Eigen::Array<bool, Eigen::Dynamic, 1> frame_maxima(const Eigen::VectorXd& x,
                                                   const Eigen::VectorXd& delta,
                                                   std::int64_t frame_keys) {
  const Eigen::Index n = x.size();
  const Eigen::Index w = std::clamp<Eigen::Index>(Eigen::Index(frame_keys) - 1, 0, n);
  Eigen::Array<bool, Eigen::Dynamic, 1> out(n);
  if (w == 0) {  // one key per frame: every p is e^0
    out.setConstant(true);
    return out;
  }
  // Windows of w keys on each side, from maxima within aligned blocks of w (van Herk): the
  // window [a, a + w) is max(suffix[a], prefix[a + w − 1]); clipped at the ends, the whole
  // prefix or suffix of the view.
  Eigen::VectorXd prefix(n), suffix(n), head(n), tail(n);
  for (Eigen::Index t = 0; t < n; ++t) {
    prefix(t) = t % w == 0 ? x(t) : std::max(prefix(t - 1), x(t));
    head(t) = t == 0 ? x(t) : std::max(head(t - 1), x(t));
  }
  for (Eigen::Index t = n - 1; t >= 0; --t) {
    suffix(t) = t == n - 1 || (t + 1) % w == 0 ? x(t) : std::max(suffix(t + 1), x(t));
    tail(t) = t == n - 1 ? x(t) : std::max(tail(t + 1), x(t));
  }
  const double worst = delta.maxCoeff();
  for (Eigen::Index t = 0; t < n; ++t) {
    double others = -INFINITY;
    if (t > 0) others = t - w < 0 ? head(t - 1) : std::max(suffix(t - w), prefix(t - 1));
    if (t < n - 1)
      others =
          std::max(others, t + w > n - 1 ? tail(t + 1) : std::max(suffix(t + 1), prefix(t + w)));
    out(t) = x(t) - others > delta(t) + worst;  // false for NaN
  }
  return out;
}

/// The statistical check's model of one (row, KV head) (accuracy.hpp, noise model): the output
/// with the GPU's deterministic rounding of V, and the variance of (N1)–(N3) per element.
struct NoiseModel {
  MatrixXd expected, variance;  ///< [head_dim_v × gqa]
};

NoiseModel noise_model(const BoundCache& bc, Eigen::Index first, Eigen::Index n,
                       const ColumnSoftmax& both, const Eigen::Ref<const MatrixXd>& high_underflow,
                       const MatrixXd& delta, const MatrixXd& delta_rms, std::int64_t frame_keys) {
  const double u16 = std::ldexp(1.0, -11);
  const Eigen::Index gqa = delta.cols();
  const bool tensor_core = bc.c.v_fused.size() > 0;
  const auto vm = (tensor_core ? bc.c.v_fused : bc.c.v).middleRows(first, n);
  const auto p = both.p.rightCols(gqa);
  NoiseModel m;
  m.expected = vm.transpose() * p;
  const auto high = high_underflow.leftCols(gqa), underflow = high_underflow.rightCols(gqa);
  // Per key: (N1) p's fp16 rounding, (u16²·p̂² + 2^-50 where p may be subnormal)/3 of V², none
  // for a frame's maximum; (N2) the score error, (p̂·δ_rms)² of (V − expected)² (the row sum
  // sees it too, hence the centring).
  MatrixXd w(n, 2 * gqa);
  for (Eigen::Index j = 0; j < gqa; ++j) {
    const Eigen::VectorXd x = both.scores.col(gqa + j);
    const auto exact = frame_maxima(x, delta.col(j), frame_keys);
    const Eigen::ArrayXd h2 = high.col(j).array().square();
    w.col(j) = (exact.select(
                    0.0, (h2 * (u16 * u16) + underflow.col(j).array() * std::ldexp(1.0, -50)) / 3))
                   .matrix();
    w.col(gqa + j) = (h2 * delta_rms.col(j).array().square()).matrix();
  }
  MatrixXd squares = MatrixXd::Zero(vm.cols(), 2 * gqa);
  for (Eigen::Index c = 0; c < n; c += 4096) {  // |V|² of a long view: chunks, no plane
    const Eigen::Index k = std::min<Eigen::Index>(4096, n - c);
    squares.noalias() +=
        vm.middleRows(c, k).array().square().matrix().transpose() * w.middleRows(c, k);
  }
  const MatrixXd linear = vm.transpose() * w.rightCols(gqa);
  const Eigen::RowVectorXd total = w.rightCols(gqa).colwise().sum();
  m.variance = squares.leftCols(gqa);
  for (Eigen::Index j = 0; j < gqa; ++j)
    m.variance.col(j) += (squares.col(gqa + j) - 2 * m.expected.col(j).cwiseProduct(linear.col(j)) +
                          total(j) * m.expected.col(j).cwiseAbs2())
                             .cwiseMax(0.0);
  // Keys of (nearly) one score round alike: the same p in a frame gets the same fp16 rounding
  // and the same score error. Within each group of keys whose x = s − max s agree to 2^-16 the
  // terms add coherently, (Σ a)² where it exceeds Σ a² (structured data: repeated rows,
  // integers, constant blocks; continuous data rarely pairs two keys so closely).
  std::vector<std::pair<std::int64_t, Eigen::Index>> order(static_cast<std::size_t>(n));
  Eigen::VectorXd sa(vm.cols()), qa(vm.cols()), sb(vm.cols()), qb(vm.cols());
  for (Eigen::Index j = 0; j < gqa; ++j) {
    const double top = both.top(gqa + j);
    for (Eigen::Index t = 0; t < n; ++t) {
      const double x = both.scores(t, gqa + j) - top;
      // Keys 2^40 below the top have p = 0 and no group (nor an int64 overflow).
      order[std::size_t(t)] = {x > -0x1p40 ? std::int64_t(std::floor(std::ldexp(x, 16)))
                                           : std::numeric_limits<std::int64_t>::min(),
                               t};
    }
    std::sort(order.begin(), order.end());
    for (std::size_t g = 0; g < order.size();) {
      std::size_t end = g + 1;
      while (end < order.size() && order[end].first == order[g].first) ++end;
      if (end - g >= 2 && order[g].first != std::numeric_limits<std::int64_t>::min()) {
        sa.setZero();
        qa.setZero();
        sb.setZero();
        qb.setZero();
        for (std::size_t k = g; k < end; ++k) {
          const Eigen::Index t = order[k].second;
          const auto row = vm.row(t).transpose().array();
          const Eigen::ArrayXd a = std::sqrt(w(t, j)) * row,
                               b = std::sqrt(w(t, gqa + j)) * (row - m.expected.col(j).array());
          sa.array() += a;
          qa.array() += a.square();
          sb.array() += b;
          qb.array() += b.square();
        }
        m.variance.col(j).array() += (sa.array().square() - qa.array()).cwiseMax(0.0) +
                                     (sb.array().square() - qb.array()).cwiseMax(0.0);
      }
      g = end;
    }
  }
  // (N3) A block whose header lets some kernel take the f32 path: the other candidate's whole
  // difference, weighted as a rounding of p̂·V would be.
  if (tensor_core && bc.c.v_either.size() > 0)
    m.variance.noalias() +=
        bc.c.v_either.middleRows(first, n).array().square().matrix().transpose() *
        high.array().square().matrix();
  return m;
}

/// The bound of every row of `views` (q is [views.size(), n_q_heads, head_dim_k]): each
/// (row, KV head) on its view's block of caches gathered once for the union of the views.
std::vector<DecodeBound> bound_rows(const KvLayer& layer, std::span<const float> q, int n_q_heads,
                                    std::optional<float> scale, std::span<const DecodeView> views,
                                    const AccumulationShape& shape) {
  const Geometry& g = layer.geometry();
  const int gqa = n_q_heads / g.n_kv_heads;
  const double s = scale.value_or(default_scale(g.head_dim_k));
  const double u16 = std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  const double D = g.head_dim_k;
  const std::size_t n_out = std::size_t(n_q_heads) * std::size_t(g.head_dim_v);
  const std::size_t q_row = std::size_t(n_q_heads) * std::size_t(g.head_dim_k);
  std::vector<DecodeBound> out(views.size());
  for (DecodeBound& r : out)
    r = DecodeBound{std::vector<double>(n_out, 0.0), std::vector<double>(n_out, 0.0),
                    std::vector<double>(n_out, 0.0), std::vector<double>(n_out, 0.0),
                    std::vector<double>(n_out, 0.0), std::vector<double>(n_out, 0.0),
                    std::vector<double>(n_out, 0.0)};
  // Rounding point (5): one m16n8k16 accumulation is within γ of Σ|addends|.
  const double gamma = 2.0 * (kMmaK + 2) * u32;
  // Score error per unit of scale·Σ_d|q̃_d·K_td| (rounding points (1) and (5)): an unfused dot
  // per block two mma, × d, the block sum and × scale. A fused dot is one chain of D/16 mma,
  // then × scale: γ (in (N2) γ/4) per unit of the chain's addends (chain_weights below), and
  // u32 per unit of the plain magnitude.
  const bool fused = shape.tensor_core && shape.k_fused_f16;
  const double dot = fused               ? u32
                     : shape.tensor_core ? 2 * gamma + (D / kBlockValues + 4) * u32
                                         : (D + 4) * u32;
  const double dot_rms = fused ? std::sqrt(1.0 / 3) * u32
                         : shape.tensor_core
                             ? gamma / 2 + std::sqrt((D / kBlockValues + 4) / 3) * u32
                             : std::sqrt((D + 4) / 3) * u32;
  // A fused chain's k-step i (dims [16i, 16i + 16)) adds its products to the accumulator that
  // every later step carries as its C (each |C| ≤ the sum of all earlier addends): step i's
  // addends count in steps i … D/16 − 1, D/16 − i times in all (rounding point (5)).
  Eigen::VectorXd chain_weights(g.head_dim_k);
  for (int d = 0; d < g.head_dim_k; ++d)
    chain_weights(d) = double(g.head_dim_k / kMmaK - d / kMmaK);
  const double rescales = double(shape.rescales >= 0 ? shape.rescales : shape.max_keys_per_split);
  // PV, and separately the row sums (each within this): the sequential chain (f32 adds, or γ
  // per chained mma, which also covers the row sum's shorter f32 chain), the rescales and the
  // merged partials (rounding points (2)-(4)).
  const double chain = shape.tensor_core ? gamma / u32 * double(shape.pv_mma_steps)
                                         : double(shape.max_keys_per_split);
  const double accumulation = (chain + 4 * rescales + double(shape.n_splits) + 8) * u32;
  // The noise model's (N4): each chain's per-step errors add as a root-sum-square.
  const double accumulation_rms =
      (std::sqrt(chain) + std::sqrt(4 * rescales + double(shape.n_splits) + 8)) * u32;
  const DecodeView all = union_of(views);
  std::vector<BoundCache> heads(std::size_t(g.n_kv_heads));
  detail::parallel_rows(heads.size(), [&](std::size_t kv) {
    BoundCache& h = heads[kv];
    h.c = gather_head(layer, int(kv), all, shape.tensor_core, fused);
    // |K| as the dot's addends see it: K̃, or either candidate near a block beyond the fold.
    h.abs_k = fused ? h.c.k_fused.cwiseAbs() : h.c.k.cwiseAbs();
    if (h.c.k_either.size() > 0) h.abs_k += h.c.k_either;
    h.abs_v = h.c.v.cwiseAbs();
    h.v_subnormal =
        (h.abs_v.array() > 0 && h.abs_v.array() < std::ldexp(1.0, -14)).cast<double>().matrix();
    h.any_subnormal = h.v_subnormal.any();
  });
  detail::parallel_rows(views.size() * heads.size(), [&](std::size_t item) {
    const std::size_t row = item / heads.size();
    const int kv = int(item % heads.size());
    const DecodeView& view = views[row];
    if (view.end <= view.begin) return;
    DecodeBound& r = out[row];
    const BoundCache& bc = heads[std::size_t(kv)];
    const Eigen::Index first = bc.c.first(view), n = bc.c.keys(view);
    const auto k = bc.c.k.middleRows(first, n), v = bc.c.v.middleRows(first, n);
    const auto abs_k = bc.abs_k.middleRows(first, n), abs_v = bc.abs_v.middleRows(first, n);
    const std::span<const float> q_i = q.subspan(row * q_row, q_row);
    // Both queries (exact and fp16-rounded) in one product over K, both outputs in one over V,
    // both |V| terms in one over |V|: each column is its own product (the passes over the view
    // are what a long view's bound costs).
    MatrixXd q_both(g.head_dim_k, 2 * gqa);
    q_both << query_columns(q_i, kv * gqa, gqa, g.head_dim_k, false),
        query_columns(q_i, kv * gqa, gqa, g.head_dim_k, true);
    // Columns: exact, then rounded (q̃, and K̃ for a fused shape).
    const ColumnSoftmax both = [&] {
      if (!fused) return softmax_columns(k, q_both, s);
      MatrixXd scores(n, 2 * gqa);
      scores.leftCols(gqa).noalias() = s * (k * q_both.leftCols(gqa));
      scores.rightCols(gqa).noalias() =
          s * (bc.c.k_fused.middleRows(first, n) * q_both.rightCols(gqa));
      return softmax_of_scores(std::move(scores));
    }();
    // [keys × gqa] scale·Σ_d|q̃_d·K_td|, and for a fused shape beside it the chain's addends
    // scale·Σ_d w_d·|q̃_d·K̃_td| (w = chain_weights), in one product.
    MatrixXd q_abs(g.head_dim_k, fused ? 2 * gqa : gqa);
    q_abs.leftCols(gqa) = q_both.rightCols(gqa).cwiseAbs();
    if (fused) q_abs.rightCols(gqa) = chain_weights.asDiagonal() * q_abs.leftCols(gqa);
    const MatrixXd magnitudes = std::fabs(s) * (abs_k * q_abs);
    const auto magnitude = magnitudes.leftCols(gqa);
    // Near a K block beyond the fold a key's score may come from either candidate of K: their
    // whole difference is a score error, in the bound and in (N2).
    const MatrixXd k_shift =
        bc.c.k_either.size() > 0
            ? MatrixXd(std::fabs(s) * (bc.c.k_either.middleRows(first, n) * q_abs.leftCols(gqa)))
            : MatrixXd();
    // [keys × gqa] each: p̂'s deviation, its largest value, and 1 where the GPU's p may fall
    // below fp16's normal range.
    MatrixXd deviation_high(n, 3 * gqa), delta_all(n, gqa), delta_rms(n, gqa);
    for (int j = 0; j < gqa; ++j) {
      const Eigen::VectorXd x = both.scores.col(gqa + j).array() - both.top(gqa + j);
      Eigen::VectorXd delta = magnitude.col(j) * dot + (8 * u32 * (1.0 + x.array().abs())).matrix();
      // (N2)'s RMS score error: the mma truncations at a quarter of γ each (uniform below their
      // worst case, not zero-mean), the f32 roundings at their root-sum-square.
      delta_rms.col(j) = magnitude.col(j) * dot_rms + (2 * u32 * (1.0 + x.array().abs())).matrix();
      if (fused) {
        delta += gamma * magnitudes.col(gqa + j);
        delta_rms.col(j) += gamma / 4 * magnitudes.col(gqa + j);
      }
      if (k_shift.size() > 0) {
        delta += k_shift.col(j);
        delta_rms.col(j) += k_shift.col(j);
      }
      delta_all.col(j) = delta;
      Eigen::VectorXd lo, hi;
      probability_range(x, delta, lo, hi);
      const auto p = both.p.col(gqa + j);
      deviation_high.col(j) = (hi - p).cwiseMax(p - lo).cwiseMax(0.0);
      deviation_high.col(gqa + j) = hi.cwiseMax(p);
      // The GPU rounds p = e^(s − m) to fp16 with m its running maximum, never above its
      // largest score: p ≥ e^(x_t − δ_t − max_u(x_u + δ_u)). A key whose p stays at or above
      // 2^-14 (fp16's smallest normal, with a margin for the exp's own error) is rounded with a
      // relative error (the |V|·p̂ term); the others may land in the subnormal range.
      const double top = (x + delta).maxCoeff();
      const double normal = std::log(std::ldexp(1.0, -14)) + std::ldexp(1.0, -10);
      deviation_high.col(2 * gqa + j) =
          (!((x - delta).array() - top >= normal)).cast<double>().matrix();  // NaN: may
    }
    const auto high = deviation_high.middleCols(gqa, gqa);
    const MatrixXd o_both = v.transpose() * both.p;  // [head_dim_v × 2gqa]: o, then õ
    const auto o_exact = o_both.leftCols(gqa), o_rounded = o_both.rightCols(gqa);
    // Perturbation, |V|·p̂, and Σ|V| over the keys whose p may underflow.
    const MatrixXd terms = abs_v.transpose() * deviation_high;
    const auto term_perturbation = terms.leftCols(gqa), term_v = terms.middleCols(gqa, gqa),
               term_underflow = terms.rightCols(gqa);
    const NoiseModel noise =
        noise_model(bc, first, n, both, deviation_high.middleCols(gqa, 2 * gqa), delta_all,
                    delta_rms, shape.max_keys_per_split);
    const MatrixXd term_dequant = bc.c.v_dequant_mag.middleRows(first, n).transpose() * high;
    const MatrixXd term_subnormal =
        bc.any_subnormal ? MatrixXd(bc.v_subnormal.middleRows(first, n).transpose() * high)
                         : MatrixXd::Zero(g.head_dim_v, gqa);
    // The view's column statistics in one pass: max |V|, min V, max V.
    Eigen::ArrayXd column_max = Eigen::ArrayXd::Zero(g.head_dim_v),
                   v_low = Eigen::ArrayXd::Constant(g.head_dim_v, INFINITY),
                   v_high = Eigen::ArrayXd::Constant(g.head_dim_v, -INFINITY);
    for (Eigen::Index t = 0; t < n; ++t) {
      const Eigen::ArrayXd x = v.row(t).transpose().array();
      column_max = column_max.max(x.abs());
      v_low = v_low.min(x);
      v_high = v_high.max(x);
    }
    for (int j = 0; j < gqa; ++j) {
      const std::size_t h = std::size_t(kv * gqa + j);
      for (int e = 0; e < g.head_dim_v; ++e) {
        const std::size_t i = h * std::size_t(g.head_dim_v) + std::size_t(e);
        r.exact_q[i] = std::fabs(o_rounded(e, j) - o_exact(e, j));
        r.max_abs_v[i] = column_max(e);
        r.rounded[i] = o_rounded(e, j);
        r.convex_reach[i] = std::max(o_rounded(e, j) - v_low(e), v_high(e) - o_rounded(e, j));
        // NOTE: a column whose attended V is all zero has no error at all, even where the
        // score perturbation is unbounded: skip the products (inf · 0 must not be NaN).
        if (column_max(e) == 0) {
          r.bound[i] = r.exact_q[i];
          continue;
        }
        const double small = std::ldexp(1.0, -25) * term_subnormal(e, j) +
                             8 * u32 * term_dequant(e, j) +
                             std::ldexp(1.0, -25) * (1 + u16) * term_underflow(e, j);
        r.bound[i] = r.exact_q[i] + term_perturbation(e, j) + (2 * u16 + u16 * u16) * term_v(e, j) +
                     2 * accumulation * (1 + 2 * u16) * term_v(e, j) + small;
        r.expected[i] = noise.expected(e, j);
        // (N4): the chains' rounding at their root-sum-square, on Σ p̂·|V|. The bound's small
        // terms are in (N0)–(N1) already (V as multiplied, subnormal p) or not there at all.
        const double chains = 2 * accumulation_rms * (1 + 2 * u16) * term_v(e, j);
        r.sigma[i] = std::sqrt(noise.variance(e, j) + chains * chains);
      }
    }
  });
  return out;
}

}  // namespace

DecodeBound decode_bound(const KvLayer& layer, std::span<const float> q, int n_q_heads,
                         std::optional<float> scale, const DecodeView& view,
                         const AccumulationShape& shape) {
  return std::move(bound_rows(layer, q, n_q_heads, scale, std::span(&view, 1), shape).front());
}

std::vector<DecodeBound> decode_rows_bound(const KvLayer& layer, std::span<const float> q,
                                           int n_q_heads, std::optional<float> scale,
                                           std::span<const DecodeView> views,
                                           const AccumulationShape& shape) {
  const Geometry& g = layer.geometry();
  const std::size_t q_row = std::size_t(std::max(n_q_heads, 0)) * std::size_t(g.head_dim_k);
  if (q.size() != views.size() * q_row)
    refuse("decode_rows_bound", "q has ", q.size(), " values, expected T ", views.size(),
           " x n_q_heads ", n_q_heads, " x head_dim_k ", g.head_dim_k, " = ", views.size() * q_row);
  return bound_rows(layer, q, n_q_heads, scale, views, shape);
}

void BoundTightness::record(double got, const DecodeBound& b, std::size_t i) {
  ++elements_;
  const double bound = b.bound[i], exact_q = b.exact_q[i];
  // A column whose view admits only one value (reach 0) is exact, not vacuous, at bound 0.
  const double reach = b.convex_reach[i];
  if (reach > 0 ? bound >= reach : bound > 0) ++vacuous_;
  if (!(bound > exact_q)) return;
  const double r = std::fabs(got - b.rounded[i]) / (bound - exact_q);
  ++resolved_;
  resolution_max_ = std::max(resolution_max_, r);
  int bin = 0;
  if (r >= 1)
    bin = kBins - 1;
  else if (r >= std::ldexp(1.0, -kOctaves))
    bin = 1 + std::min(kBins - 3, int(std::floor((std::log2(r) + kOctaves) * kPerOctave)));
  ++histogram_[std::size_t(bin)];
}

void BoundTightness::add(const BoundTightness& o) {
  elements_ += o.elements_;
  skipped_ += o.skipped_;
  vacuous_ += o.vacuous_;
  resolved_ += o.resolved_;
  resolution_max_ = std::max(resolution_max_, o.resolution_max_);
  for (int i = 0; i < kBins; ++i) histogram_[std::size_t(i)] += o.histogram_[std::size_t(i)];
}

double BoundTightness::resolution(double q) const {
  if (resolved_ == 0) return 0;
  const auto want = std::int64_t(std::ceil(q * double(resolved_)));
  std::int64_t seen = 0;
  for (int i = 0; i < kBins; ++i) {
    seen += histogram_[std::size_t(i)];
    if (seen >= std::max<std::int64_t>(want, 1)) {
      if (i == 0) return std::ldexp(1.0, -kOctaves);
      if (i == kBins - 1) return resolution_max_;
      // The bin's upper edge, never above the largest value seen.
      return std::min(resolution_max_, std::exp2(double(i) / kPerOctave - kOctaves));
    }
  }
  return resolution_max_;
}

std::string BoundTightness::summary() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "bound tightness: %lld elements, skipped %lld (NaN reference), vacuous %lld "
                "(%.4f%%) against the convex reach, resolution |got - o~|/(bound - e_q) p50 %.2g "
                "p90 %.2g p99 %.2g max %.2g",
                static_cast<long long>(elements_), static_cast<long long>(skipped_),
                static_cast<long long>(vacuous_), 100 * vacuous_fraction(), resolution(0.5),
                resolution(0.9), resolution(0.99), resolution_max_);
  return buf;
}

}  // namespace kvlayer::ref
