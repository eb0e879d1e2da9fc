// The decode accuracy contract (SPEC §8): a per-element bound on |GPU − float64 reference|
// derived from the internal precision the CUDA decode declares (rounding points (1)–(5) in
// kvlayer/accuracy.hpp). Used by every GPU decode test and the property harness; never widened
// to make a test pass.
//
// Derivation, per query head h and output element e (u16 = 2^-11, u32 = 2^-24, D = head_dim).
// Let õ, p̃ be the exact (float64) attention output and probabilities for q̃.
//  - fp16 rounding of q (and, for a fused shape, of d·q into K̃) is deterministic, so its effect
//    is computed exactly, not bounded: e_q = |õ_e − o_e|, õ the decode of q̃ (and K̃).
//  - f32 score error for q̃, per key: δ_t = scale·Σ_d|q̃_d·K_td|·c_dot + 8·u32·(1 + |s̃_t −
//    max s̃|) (dot, scale multiply, exp argument), c_dot = (D + 4)·u32 on CUDA cores,
//    2γ + (D/32 + 4)·u32 on tensor cores (block dot, × d, block sum, × scale); for a fused
//    shape (one chain of D/16 mma on K̃, × scale) δ_t = scale·(γ·Σ_d w_d·|q̃_d·K̃_td| +
//    u32·Σ_d|q̃_d·K̃_td|) + the same exp-argument term, w_d = D/16 − ⌊d/16⌋ (the chain's steps
//    that carry dim d's product, accuracy.hpp (5)): ≤ (D/16)·γ + u32, about half that for a
//    key whose products spread evenly over the steps. A fused shape's
//    key within a tile's reach of a K block beyond the fold may use exact K instead: K_td is
//    then the larger candidate and δ_t gains scale·Σ_d|q̃_d|·|K̃_td − K_td|.
//  - The GPU's probabilities are p̂_t = A/(A + R), A = p̃_t·e^{ε_t}, R = Σ_{u≠t} p̃_u·e^{ε_u},
//    |ε_u| ≤ δ_u (softmax is invariant to a common shift): increasing in A, decreasing in R,
//    so p̂_t ∈ [lo_t, hi_t], the values at the extreme A and R. Contributes
//    Σ_t max(hi_t − p̃_t, p̃_t − lo_t)·|V_te|; a key far below the maximum (p̃_t tiny) adds
//    nothing however large its own δ_t, which keeps the bound sharp for wide scores.
//  - fp16 rounding of p and of V: (2·u16 + u16²)·Σ_t hi_t·|V_te|, plus 2^-25·Σ_t hi_t for
//    the V in fp16's subnormal range (absolute error there).
//  - Accumulation of PV and, separately, of the row sums (chain: L on CUDA cores,
//    γ/u32·pv_mma_steps on tensor cores, which exceeds the row sum's own f32 chain of
//    L/16 + 2 adds per lane), R online-softmax rescales (≤ 4·u32 each) and S merged
//    partials, each: 2·(chain + 4·R + S + 8)·u32·(1 + 2u16)·Σ_t hi_t·|V_te|.
//  - Dequantization of V (f32 d·q + m, or its one fp16 rounding): 8·u32·Σ_t hi_t·(|d·q| + |m|).
//  - fp16 underflow of small p (absolute 2^-25 each; the final row sum is ≥ 1, its maximum key
//    contributing exactly 1): 2^-25·(1 + u16)·Σ_{t ∈ U} |V_te|, U the keys whose p may fall
//    below 2^-14 in the GPU's frame: e^(x_t − δ_t − max_u(x_u + δ_u)) < 2^-14 (x = s̃ − max s̃;
//    the GPU rounds e^(s − m) with m its running maximum, never above its largest score).
//    Above 2^-14 the rounding of p is relative, in the term before.
//  The bound is the sum of these terms; an element whose attended V is all zero has bound e_q
//  (the GPU multiplies exact zeros). A NaN in the reference (a canonical bad block was
//  attended) must be matched by NaN; otherwise the GPU value must be finite.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlayer/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::ref {

/// The bound of every output element [n_q_heads × head_dim_v], with what its tightness is
/// measured against.
struct DecodeBound {
  std::vector<double> bound;     ///< on |GPU − reference|
  std::vector<double> exact_q;   ///< e_q = |õ − o|: the fp16(q) term, computed exactly
  std::vector<double> max_abs_v;  ///< max over the view's keys of |V| at the element
  std::vector<double> rounded;    ///< õ: the float64 decode of fp16(q), what the GPU approximates
  /// The distance from õ to the farthest value a convex combination of the view's V could take
  /// at the element (max(õ − min V, max V − õ)): a bound this large admits any wrong weights.
  std::vector<double> convex_reach;
  /// The statistical check's model (kvlayer/accuracy.hpp, noise model (N0)–(N4); not a bound):
  /// õ with V as the kernels multiply it (fp16 on tensor cores), the value a correct GPU
  /// scatters around, and the RMS of that scatter. SystematicCheck tests each launch's mean of
  /// ((GPU − expected)/sigma)² against the declared threshold.
  std::vector<double> expected = {};
  std::vector<double> sigma = {};

  /// Appends another output's elements (the rows of a verify, one after another).
  void append(const DecodeBound& o) {
    for (auto field : {&DecodeBound::bound, &DecodeBound::exact_q, &DecodeBound::max_abs_v,
                       &DecodeBound::rounded, &DecodeBound::convex_reach, &DecodeBound::expected,
                       &DecodeBound::sigma})
      (this->*field).insert((this->*field).end(), (o.*field).begin(), (o.*field).end());
  }
};

/// Per-element bound on |GPU − reference| for decoding q over `view` of `layer`, for a GPU with
/// the declared precision above.
DecodeBound decode_bound(const KvLayer& layer, std::span<const float> q, int n_q_heads,
                         std::optional<float> scale, const DecodeView& view,
                         const AccumulationShape& shape);

/// The bound of every output row of a verify decode (SPEC §11): q is [T, n_q_heads,
/// head_dim_k] with T = views.size() (take them from verify_views()), and row i's bound is
/// decode_bound() of query row i over views[i]. One shape serves every row: the launch's, which
/// bounds each row's accumulation. Refused when q's size does not match.
std::vector<DecodeBound> decode_rows_bound(const KvLayer& layer, std::span<const float> q,
                                           int n_q_heads, std::optional<float> scale,
                                           std::span<const DecodeView> views,
                                           const AccumulationShape& shape);

/// How tight the bound was over many compared elements (SPEC §10.6), summed by the harness and
/// the GPU test suites and printed as one line by summary():
///   - resolution percentiles (p50, p90, p99, max) of r = |got − õ| / (bound − e_q), over the
///     elements whose bound exceeds e_q: the share of the rounding allowance an element used.
///     A systematic error much smaller than (bound − e_q) at p99 can pass unseen; these
///     figures say how small that is. From log-spaced bins (8 per octave, down to 2^-40; a
///     percentile is the upper edge of its bin, so it never understates);
///   - vacuous: elements whose bound reaches the farthest value any convex combination of the
///     view's V could take (such a check proves nothing at that element);
///   - skipped: elements left out because the reference is NaN (a bad block in the view).
class BoundTightness {
 public:
  /// Element i of a decode whose reference is finite: the system's value and the bound.
  void record(double got, const DecodeBound& b, std::size_t i);
  /// An element not compared with a bound because the reference is NaN.
  void skip() { ++skipped_; }
  void add(const BoundTightness& other);

  std::int64_t elements() const { return elements_; }
  std::int64_t skipped() const { return skipped_; }
  std::int64_t vacuous() const { return vacuous_; }
  double vacuous_fraction() const { return elements_ ? double(vacuous_) / double(elements_) : 0; }
  /// The resolution r at percentile q in [0, 1] (0 when no element had bound > e_q).
  double resolution(double q) const;
  double resolution_max() const { return resolution_max_; }
  /// "bound tightness: N elements, skipped S (NaN reference), vacuous V (P%) against the convex
  /// reach, resolution |got - o~|/(bound - e_q) p50 A p90 B p99 C max D"
  std::string summary() const;

 private:
  static constexpr int kPerOctave = 8, kOctaves = 40;
  static constexpr int kBins = kPerOctave * kOctaves + 2;  ///< [0]: r below 2^-40; last: r ≥ 1
  std::int64_t elements_ = 0, skipped_ = 0, vacuous_ = 0, resolved_ = 0;
  double resolution_max_ = 0;
  std::vector<std::int64_t> histogram_ = std::vector<std::int64_t>(kBins, 0);
};

/// The default softmax scale (kvlayer/accuracy.hpp).
using kvlayer::default_scale;

}  // namespace kvlayer::ref
