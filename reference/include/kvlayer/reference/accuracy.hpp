// The decode accuracy contract (SPEC §8): a per-element bound on |GPU − float64 reference|
// derived from the internal precision the CUDA decode declares. Stated here once, used by
// every GPU decode test and the property harness; never widened to make a test pass. The
// kernels cite the rounding points by number.
//
// Declared GPU precision (cuda/src/decode/ implements exactly these rounding points):
//  (1) q is rounded once to fp16 (RNE): q̃. K quants are exact (int8). The dot product over
//      head_dim terms is accumulated in f32 (CUDA cores: sequential FMAs; tensor cores: (5)),
//      times f32(d) per block, block results summed in f32, times the f32 scale.
//  (2) online softmax in f32: exp of (s − m) with a few-ulp exp, f32 running sums, one rescale
//      (an exp and a multiply) per key tile of an accumulator.
//  (3) p is rounded to fp16 before it multiplies V; V is used at its exact dequantized f32
//      value, or that value rounded to fp16, or the exact d·q + m rounded once to fp16 (one
//      fused multiply-add), as tensor-core operands; the row sum uses the unrounded f32 p.
//      PV is accumulated in f32 (CUDA cores: ≤ L = max_keys_per_split sequential terms;
//      tensor cores: chains of ≤ pv_mma_steps mma accumulations, (5)).
//  (4) S partial results (splits, and a block's warps) are merged in f32.
//  (5) Tensor cores (mma.sync m16n8k16, fp16 × fp16 → f32). PTX documents the operation
//      D = A·B + C with f32 accumulation but not its internal rounding; measurements of
//      V100 … H100 (Fasi et al. 2021; Khattak & Mikaitis 2025) show products of fp16 operands
//      exact, the k = 16 products and C aligned to the largest exponent with at least 24
//      significand bits kept, and the sum normalized with truncation. The bound assumes only
//      that: each aligned addend loses < 2^-23 of the largest addend, the result < 2^-23 of
//      itself, so one mma's error is ≤ (k + 2)·2^-23·Σ|addends| = γ·Σ|addends|,
//      γ = 2(k + 2)·u32 = 36·u32. A 32-value block's dot is two chained mma into a fresh
//      accumulator: ≤ γ(2Σ₁ + Σ₂) ≤ 2γ·Σ_block|q̃·K|. A PV accumulator chained over c mma
//      steps (each |C| ≤ the sum of all earlier addends) errs by ≤ γ·c·Σ_t|p̃16_t·Ṽ_te|.
//
// Derivation, per query head h and output element e (u16 = 2^-11, u32 = 2^-24, D = head_dim).
// Let õ, p̃ be the exact (float64) attention output and probabilities for q̃.
//  - fp16 rounding of q is deterministic, so its effect is computed exactly, not bounded:
//    e_q = |õ_e − o_e|.
//  - f32 score error for q̃, per key: δ_t = scale·Σ_d|q̃_d·K_td|·c_dot + 8·u32·(1 + |s̃_t −
//    max s̃|) (dot, scale multiply, exp argument), c_dot = (D + 4)·u32 on CUDA cores and
//    2γ + (D/32 + 4)·u32 on tensor cores (block dot, × d, block sum, × scale).
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
//    contributing exactly 1): 2^-25·(1 + u16)·Σ_t |V_te|.
//  The bound is the sum of these terms; an element whose attended V is all zero has bound e_q
//  (the GPU multiplies exact zeros). A NaN in the reference (a canonical bad block was
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
  /// Tensor-core kernels: dot products and PV on mma.sync m16n8k16 (rounding point (5)), with
  /// at most pv_mma_steps chained mma accumulations into one PV accumulator.
  bool tensor_core = false;
  std::int64_t pv_mma_steps = 0;
};

/// k of the tensor-core instruction the kernels use (mma.sync m16n8k16): rounding point (5).
inline constexpr int kMmaK = 16;

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

/// How tight the bound was over many compared elements (SPEC §10.6: a bound that admits any
/// convex combination proves nothing). Summed by the harness and the GPU test suites, and
/// printed as one line by summary().
class BoundTightness {
 public:
  /// One compared element: a finite reference value, the system's error and its bound.
  void record(double err, double bound, double exact_q, double max_abs_v);
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
