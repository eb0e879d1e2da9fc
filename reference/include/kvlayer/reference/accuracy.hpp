// The decode accuracy contract (SPEC §8): a per-element bound on |GPU − float64 reference|
// derived from the internal precision the CUDA decode declares. Stated here once, used by
// every GPU decode test and the property harness; never widened to make a test pass.
//
// Declared GPU precision (cuda/src/decode/ implements exactly these rounding points):
//  (1) q is rounded once to fp16 (RNE): |q̃ − q| ≤ u16·|q|. K quants are exact (int8); the dot
//      product is accumulated in f32 over head_dim terms, times f32(d) per block, times the f32
//      scale.
//  (2) online softmax in f32: exp of (s − m) with a few-ulp exp, f32 running sums.
//  (3) p is rounded to fp16 before it multiplies V; V is used at its exact dequantized f32
//      value, or that value rounded to fp16, or the exact d·q + m rounded once to fp16 (one
//      fp16 fused multiply-add; it differs from the f32 value by at most (u16 + u32)·|V|, the
//      u32 part covered by the "+ 8" of the accumulation term below) as tensor-core operands;
//      the row sum uses the unrounded f32 p. PV is accumulated in f32 over at most L = max_keys_per_split
//      sequential terms; S partial results are merged in f32.
//
// Derivation, per query head h and output element e (u16 = 2^-11, u32 = 2^-24, D = head_dim).
// Let q̃ = fp16(q) and õ, p̃ the exact (float64) attention output and probabilities for q̃.
//  - fp16 rounding of q is deterministic, so its effect is computed exactly, not bounded:
//    |õ_e − o_e|.
//  - f32 score error for q̃: δ_t = scale·Σ_d|q̃_d·K_td|·(D + 4)·u32 + 8·u32·(1 + |s̃_t − max s̃|)
//    (accumulation, scale multiply, exp argument). Softmax is invariant to a common shift, so
//    p/p̃ ∈ [e^{−2Δ}, e^{2Δ}] with Δ = max_t δ_t: contributes (e^{2Δ} − 1)·Σ_t p̃_t·|V_te|.
//  - fp16 rounding of p and of V: (2·u16 + u16²)·Σ_t p̃_t·|V_te|, plus 2^-25 for a V below
//    fp16's normal range (absolute error there).
//  - f32 accumulation of PV and of the sums over ≤ L sequential terms, R online-softmax
//    rescales (each an exp and a multiply, ≤ 4·u32) and S merged partials:
//    (L + 4·R + S + 8)·u32·Σ_t p̃_t·2·B_te, with B_te the largest |value| of the V block
//    holding e.
//  - fp16 underflow of small p (absolute 2^-25 each, relative to a running max ≤ 1):
//    2^-25·Σ_t 2·B_te / Σ_t e^{s̃_t − max s̃}.
//  The bound is the sum of these terms. A NaN in the reference (a canonical bad block was
//  attended) must be matched by NaN; otherwise the GPU value must be finite.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::ref {

/// The GPU launch shape that enters the bound: the longest sequential accumulation and the
/// number of partial results merged.
struct AccumulationShape {
  std::int64_t max_keys_per_split = 1;
  std::int64_t n_splits = 1;
  /// Online-softmax rescales of one accumulator (one per key tile): ceil(L / tile). The
  /// default, one per key, is the worst case for a kernel that does not say.
  std::int64_t rescales = -1;
};

/// A decode view: logical keys [begin, end) at physical rows begin − base …
struct DecodeView {
  std::int64_t begin = 0, end = 0, base = 0;
};

/// The bound of every output element [n_q_heads × head_dim_v], with what its tightness is
/// measured against.
struct DecodeBound {
  std::vector<double> bound;     ///< on |GPU − reference|
  std::vector<double> exact_q;   ///< e_q = |õ − o|: the fp16(q) term, computed exactly
  std::vector<double> max_abs_v; ///< max over the view's keys of |V| at the element: a bound
                                 ///< this large admits any convex combination (vacuous)
};

/// Per-element bound on |GPU − reference| for decoding q over `view` of `layer`, for a GPU with
/// the declared precision above.
DecodeBound decode_bound(const KvLayer& layer, std::span<const float> q, int n_q_heads,
                         std::optional<float> scale, const DecodeView& view,
                         const AccumulationShape& shape);

/// decode_bound(...).bound.
std::vector<double> decode_tolerance(const KvLayer& layer, std::span<const float> q,
                                     int n_q_heads, std::optional<float> scale,
                                     const DecodeView& view, const AccumulationShape& shape);

/// How tight the bound was over many compared elements (SPEC §10.6: a bound that admits any
/// convex combination proves nothing). Summed by the harness and the GPU test suites, and
/// printed as one line by summary().
class BoundTightness {
 public:
  /// One compared element: a finite reference value, the system's error and its bound.
  void record(double err, double bound, double exact_q, double max_abs_v);
  /// Every element of one decode (elements whose reference value is NaN are skipped).
  void record_all(std::span<const double> want, std::span<const float> got, const DecodeBound& b);
  void add(const BoundTightness& other);

  std::int64_t elements() const { return elements_; }
  std::int64_t vacuous() const { return vacuous_; }
  double vacuous_fraction() const { return elements_ ? double(vacuous_) / double(elements_) : 0; }
  /// Residual headroom (err − e_q)/(bound − e_q), clamped to [0, 1]: largest and median.
  double headroom_max() const { return headroom_max_; }
  double headroom_median() const;
  /// "bound tightness: N elements, vacuous V (P%), residual headroom max X median Y"
  std::string summary() const;

 private:
  static constexpr int kBins = 4096;
  std::int64_t elements_ = 0, vacuous_ = 0, headroom_count_ = 0;
  double headroom_max_ = 0;
  std::vector<std::int64_t> histogram_ = std::vector<std::int64_t>(kBins, 0);
};

/// The default softmax scale, 1/sqrt(head_dim_k) computed in f32 (SPEC §8).
float default_scale(int head_dim_k);

}  // namespace kvlayer::ref
