// The declared internal precision of the CUDA decode (SPEC §8): the rounding points that
// cuda/src/decode implements and cites by number, and the launch shape a layer reports, from
// which the reference (kvlayer/reference/accuracy.hpp) derives the bound of every output
// element. Shared vocabulary: the CUDA layer reports its shape, the reference bounds it.
//
// Declared GPU precision (cuda/src/decode/ implements exactly these rounding points):
//  (1) q is rounded once to fp16 (RNE): q̃. K quants are exact (int8). The dot product over
//      head_dim terms is accumulated in f32 (CUDA cores: sequential FMAs; tensor cores: (5)),
//      times f32(d) per block, block results summed in f32, times the f32 scale.
//      Where the shape says k_fused_f16 (the verify kernels at head dim 128, T·gqa > 16): d is
//      folded into K first, K̃ = d·q rounded once to fp16 (RNE, subnormals kept), the dot one
//      chain of head_dim/16 mma (5) from zero, times the f32 scale. A key tile holding a K block
//      with |d| > 511.75 or a non-finite d (kQ8_0FoldMaxScaleBits: d·q might leave fp16) takes
//      the unfused arithmetic above for all its keys.
//  (2) online softmax in f32: exp of (s − m) with a few-ulp exp, f32 running sums, one rescale
//      (an exp and a multiply) per key tile of an accumulator.
//  (3) p is rounded to fp16 before it multiplies V; V is used at its exact dequantized f32
//      value, or that value rounded to fp16, or the exact d·q + m rounded once to fp16 (one
//      fused multiply-add), as tensor-core operands; the row sum uses the unrounded f32 p.
//      PV is accumulated in f32 (CUDA cores: ≤ L = max_keys_per_split sequential terms;
//      tensor cores: chains of ≤ pv_mma_steps mma accumulations, (5)).
//  (4) S partial results (splits, and a block's warps where a row's keys are spread over
//      several) are merged in f32.
//  (5) Tensor cores (mma.sync m16n8k16, and wgmma m64nNk16 where a kernel uses warpgroup MMA:
//      fp16 × fp16 → f32, k = 16 per instruction). PTX documents the operation
//      D = A·B + C with f32 accumulation but not its internal rounding; measurements of
//      V100 … H100 (Fasi et al. 2021; Khattak & Mikaitis 2025) show products of fp16 operands
//      exact, the k = 16 products and C aligned to the largest exponent with at least 24
//      significand bits kept, and the sum normalized with truncation (`kvlayer mma-probe`
//      checks both instructions against this on the device, bench/NOTES.md). The bound
//      assumes only that: each aligned addend loses < 2^-23 of the largest addend, the result
//      < 2^-23 of itself, so one mma's error is ≤ (k + 2)·2^-23·Σ|addends| = γ·Σ|addends|,
//      γ = 2(k + 2)·u32 = 36·u32. A 32-value block's dot is two chained mma into a fresh
//      accumulator: ≤ γ(2Σ₁ + Σ₂) ≤ 2γ·Σ_block|q̃·K|. A chain of c mma steps (each |C| ≤ the
//      sum of all earlier addends) errs by ≤ γ·Σ_i (c − i)·Σ_i (Σ_i: step i's addends, i from
//      0): ≤ γ·c·Σ|addends|. A PV accumulator takes the latter, c = pv_mma_steps, on
//      Σ_t|p̃16_t·Ṽ_te|; a fused dot the former, c = head_dim/16, on its products |q̃_d·K̃_d|:
//      Σ_d w_d·|q̃_d·K̃_d|, w_d = head_dim/16 − ⌊d/16⌋.
//
// Noise model of the declared statistical check (issue #34; the reference computes it as
// DecodeBound::expected and ::sigma, ref::SystematicCheck applies it). Not a bound: where the
// bound takes every rounding at its worst and aligned, a correct GPU's error scatters around
// a value the declared roundings fix, by roundings that are independent and spread within
// their worst case (RMS = worst/√3 for a round-to-nearest):
//  (N0) expected: the float64 decode of q̃ with V as (3) has the tensor-core kernels multiply
//       it, d·q + m fused to fp16 (the CUDA-core kernel: the f32 value), and with a fused
//       shape's K̃ (1) (exact K for every key within 64 positions of a block beyond the fold,
//       whose score then carries both candidates' difference in (N2) and the bound's δ). A key tile
//       holding a V block whose header may take the f32 path (|d| > 1024, |m| > 32768 or not
//       finite) is multiplied in f32: every key within 64 positions of such a block keeps its f32
//       value in expected and puts the fp16 candidate's whole difference into (N3).
//  (N1) p to fp16 (3): (u16²·p̂_t² + 2^-50 where p may be subnormal)/3 of V_te² per key, none
//       for a key that is the maximum of its accumulator's frame (p = exp2f(0) = 1 exactly): a
//       key whose score exceeds every other within max_keys_per_split − 1 positions (a frame
//       lies in one split) by more than both scores' worst-case errors.
//  (N2) score errors (1), (2), (5): per key an RMS δ_t = scale·Σ_d|q̃_d·K_td|·c + 2·u32·(1 +
//       |s_t − max s|), c = γ/2 + √((D/32 + 4)/3)·u32 on tensor cores (each mma's truncations
//       at a quarter of γ: below their worst case but one-signed), √((D + 4)/3)·u32 on CUDA
//       cores; a fused dot's δ_t = scale·(γ/4·Σ_d w_d·|q̃_d·K̃_td| + √(1/3)·u32·Σ_d|q̃_d·K̃_td|)
//       (its chain's truncations on (5)'s weighted addends, the scale's rounding) + the same
//       2·u32 term; it acts as Σ_t p̂_t·ε_t·(V_te − expected_e) (the row sum sees it too).
//  (N1) and (N2) add coherently, (Σ a)² where that exceeds Σ a², within each group of keys
//       whose s − max s agree to 2^-16 (the same p rounds alike: repeated rows, integers).
//  (N3) the f32 and fp16 candidates of (N0)'s keys: their whole difference, weighted by p̂².
//  (N4) the accumulation chains (3)–(5): the bound's term with each chain's length and the
//       rescale and merge count replaced by their square roots, on Σ_t p̂_t·|V_te|.
// σ² is the sum of (N1)–(N4). The check's unit is an output row (a decode, or one row of a
// verify): its energy E = mean over the row's elements of ((GPU − expected)/σ)², about 1 or
// less for a correct GPU, fails at E ≥ 16 (ref::SystematicCheck::kNoiseThreshold). Measured
// clean on an H100 before it was declared (bench/NOTES.md, session 25): 152,787 rows of a
// campaign, 3.66·10^8 elements, no row at 16, the largest E 2.7.
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
  /// Tensor-core kernels: dot products and PV on mma.sync m16n8k16 or wgmma m64nNk16 (rounding
  /// point (5): k = 16 either way), with
  /// at most pv_mma_steps chained mma accumulations into one PV accumulator.
  bool tensor_core = false;
  std::int64_t pv_mma_steps = 0;
  /// Rounding point (1)'s fused form: K̃ = fp16(d·q), the dot one chain of head_dim/16 mma
  /// (tensor-core kernels that fold d; tiles with a block beyond the fold excepted).
  bool k_fused_f16 = false;
};

/// k of the tensor-core instructions the kernels use (mma.sync m16n8k16, wgmma m64nNk16):
/// rounding point (5).
inline constexpr int kMmaK = 16;

}  // namespace kvlayer
