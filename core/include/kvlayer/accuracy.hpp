// The declared internal precision of the CUDA decode (SPEC §8): the rounding points that
// cuda/src/decode implements and cites by number, and the launch shape a layer reports, from
// which the reference (kvlayer/reference/accuracy.hpp) derives the bound of every output
// element. Shared vocabulary: the CUDA layer reports its shape, the reference bounds it.
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
#pragma once

#include <cmath>
#include <cstdint>

namespace kvlayer {

/// The default softmax scale, 1/sqrt(head_dim_k) computed in f32 (SPEC §8): the one definition
/// the reference and the CUDA layer use.
inline float default_scale(int head_dim_k) {
  return 1.0f / std::sqrt(float(head_dim_k));
}

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

}  // namespace kvlayer
