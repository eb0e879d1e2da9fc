// Decode attention in float64 over the dequantized cache (SPEC §8), and its accuracy bound.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::ref {
namespace {

using MatrixXdR = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Dequantized K and V of one KV head over a view, as float64 matrices [keys × head_dim].
struct HeadCache {
  MatrixXdR k, v;
  MatrixXdR v_block_max;  ///< [keys × head_dim_v]: largest |V| of the block holding element e
};

/// Scores, unnormalised weights and probabilities of one query head over a HeadCache.
struct Softmax {
  Eigen::VectorXd scores, p;
  double top = 0, l = 0;
};

Softmax softmax(const HeadCache& c, const Eigen::VectorXd& q, double scale) {
  Softmax r;
  r.scores = scale * (c.k * q);
  r.top = r.scores.maxCoeff();
  const Eigen::VectorXd w = (r.scores.array() - r.top).exp().matrix();
  r.l = w.sum();
  r.p = w / r.l;
  return r;
}

HeadCache gather_head(const KvLayer& layer, int kv_head, const DecodeView& view) {
  const Geometry& g = layer.geometry();
  const std::int64_t n = view.end - view.begin;
  HeadCache c{MatrixXdR(n, g.head_dim_k), MatrixXdR(n, g.head_dim_v), MatrixXdR(n, g.head_dim_v)};
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t phys = view.begin + t - view.base;
    const auto k = layer.dequantized_head(Plane::k, phys, kv_head);
    const auto v = layer.dequantized_head(Plane::v, phys, kv_head);
    for (int d = 0; d < g.head_dim_k; ++d) c.k(t, d) = k[std::size_t(d)];
    for (int b = 0; b < g.head_dim_v; b += kBlockValues) {
      double block_max = 0;
      for (int j = 0; j < kBlockValues; ++j) {
        const double x = v[std::size_t(b + j)];
        c.v(t, b + j) = x;
        block_max = std::max(block_max, std::fabs(x));
      }
      for (int j = 0; j < kBlockValues; ++j) c.v_block_max(t, b + j) = block_max;
    }
  }
  return c;
}

Eigen::VectorXd query_head(std::span<const float> q, int h, int head_dim) {
  Eigen::VectorXd out(head_dim);
  for (int d = 0; d < head_dim; ++d) out(d) = q[std::size_t(h) * head_dim + d];
  return out;
}

}  // namespace

float default_scale(int head_dim_k) { return 1.0f / std::sqrt(float(head_dim_k)); }

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
  const Geometry& g = geometry_;
  const int gqa = n_q_heads / g.n_kv_heads;
  const double s = scale.value_or(default_scale(g.head_dim_k));
  std::vector<double> out(std::size_t(n_q_heads) * g.head_dim_v, 0.0);
  if (lend <= lbegin) return out;  // empty view: all-zero output
  for (int kv = 0; kv < g.n_kv_heads; ++kv) {
    const HeadCache c = gather_head(*this, kv, DecodeView{lbegin, lend, base});
    for (int h = kv * gqa; h < (kv + 1) * gqa; ++h) {
      const Eigen::VectorXd o = c.v.transpose() * softmax(c, query_head(q, h, g.head_dim_k), s).p;
      for (int e = 0; e < g.head_dim_v; ++e) out[std::size_t(h) * g.head_dim_v + e] = o(e);
    }
  }
  return out;
}

std::pair<std::int64_t, std::int64_t> KvLayer::view() const {
  const std::int64_t begin = geometry_.window ? std::max<std::int64_t>(0, len_ - *geometry_.window) : 0;
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
      status_.device_error = DeviceError{DeviceErrorKind::decode_view_too_long, len_d_, base_d_,
                                         geometry_.max_ctx};
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

std::vector<double> decode_tolerance(const KvLayer& layer, std::span<const float> q,
                                     int n_q_heads, std::optional<float> scale,
                                     const DecodeView& view, const AccumulationShape& shape) {
  const Geometry& g = layer.geometry();
  const int gqa = n_q_heads / g.n_kv_heads;
  const double s = scale.value_or(default_scale(g.head_dim_k));
  const double u16 = std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  const double D = g.head_dim_k;
  std::vector<double> bound(std::size_t(n_q_heads) * g.head_dim_v, 0.0);
  if (view.end <= view.begin) return bound;
  for (int kv = 0; kv < g.n_kv_heads; ++kv) {
    const HeadCache c = gather_head(layer, kv, view);
    const MatrixXdR abs_k = c.k.cwiseAbs();
    const MatrixXdR abs_v = c.v.cwiseAbs();
    for (int h = kv * gqa; h < (kv + 1) * gqa; ++h) {
      const Eigen::VectorXd qh = query_head(q, h, g.head_dim_k);
      Eigen::VectorXd qh16(qh.size());
      for (Eigen::Index d = 0; d < qh.size(); ++d)
        qh16(d) = f16_bits_to_f32(f32_to_f16_bits(float(qh(d))));
      const Softmax exact = softmax(c, qh, s), rounded = softmax(c, qh16, s);
      const Eigen::VectorXd magnitude = std::fabs(s) * (abs_k * qh16.cwiseAbs());
      const Eigen::VectorXd delta =
          magnitude * ((D + 4) * u32) +
          (8 * u32 * (1.0 + (rounded.top - rounded.scores.array()).abs())).matrix();
      const double spread = std::expm1(2 * delta.maxCoeff());
      const Eigen::VectorXd& p = rounded.p;
      const double rescales = double(shape.rescales >= 0 ? shape.rescales : shape.max_keys_per_split);
      const double accumulation =
          (double(shape.max_keys_per_split + shape.n_splits + 8) + 4 * rescales) * u32;
      const Eigen::VectorXd o_exact = c.v.transpose() * exact.p;
      const Eigen::VectorXd o_rounded = c.v.transpose() * p;
      const Eigen::VectorXd term_v = abs_v.transpose() * p;
      const Eigen::VectorXd term_b = c.v_block_max.transpose() * p;
      const Eigen::VectorXd term_under = c.v_block_max.colwise().sum().transpose() / rounded.l;
      for (int e = 0; e < g.head_dim_v; ++e)
        bound[std::size_t(h) * g.head_dim_v + e] =
            std::fabs(o_rounded(e) - o_exact(e)) + (spread + 2 * u16 + u16 * u16) * term_v(e) + std::ldexp(1.0, -25) +
            accumulation * 2 * term_b(e) + std::ldexp(1.0, -24) * term_under(e);
    }
  }
  return bound;
}

}  // namespace kvlayer::ref
