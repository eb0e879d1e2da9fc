// The online softmax every split kernel and the merge share (accuracy.hpp (2), (4)): the finite
// minus-infinity sentinel, the warp reductions, the rescale and weight of a running state, the
// shared memory a block's warps merge their states in.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "decode/mutant_hooks.cuh"

namespace kvlayer::cuda::detail::decode_impl {

inline constexpr float kNegSentinel = -FLT_MAX;  ///< finite "minus infinity" for m
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

/// Butterfly sum: every lane ends with the same, order-fixed result (f32 + is commutative).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

/// The weight of a state whose max is m once the max is m_new ≥ m (a rescale α, or a merge
/// weight): exactly 1 when m_new == m, else IEEE exp2f((m − m_new)·log2e).
__device__ __forceinline__ float softmax_rescale(float m, float m_new) {
  return m_new == m ? 1.0f : exp2f((m - m_new) * kLog2e);
}

/// p of a score s under the running max m: IEEE exp2f((s − m)·log2e), in f32.
__device__ __forceinline__ float softmax_weight(float s, float m) {
  return exp2f((s - m) * kLog2e);
}

/// The max and the sum over a warp's 8 lane groups (the lanes of one threadID_in_group t): the
/// keys of an mma C fragment's row are spread over them.
__device__ __forceinline__ float max_over_lane_groups(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 4));
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 8));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 16));
}
__device__ __forceinline__ float sum_over_lane_groups(float x) {
  x += __shfl_xor_sync(kFullMask, x, 4);
  x += __shfl_xor_sync(kFullMask, x, 8);
  return x + __shfl_xor_sync(kFullMask, x, 16);
}

/// The running softmax of the kRows query rows a lane works on within a split (accuracy.hpp
/// (2)): for row r, m[r], the largest score of the keys seen (kNegSentinel before any), and
/// l[r], the sum of their weights under m[r] (in the tensor-core kernels a lane's share: each
/// lane holds some of the row's keys, and the warp sums the shares when the split ends). Every
/// split kernel moves it a tile at a time: m_new = max_with(r, the tile's largest attended score
/// reduced over the row's lanes), α = rescale_to(r, m_new), the tile's weights
/// softmax_weight(s, m_new), then advance(r, m_new, α, their sum); whatever was accumulated under
/// the old max is scaled by α. (Two arrays, l first, not an array of rows: ptxas allocates the
/// kernels' registers in this order.)
template <int kRows>
struct SoftmaxState {
  float l[kRows];
  float m[kRows];

  __device__ __forceinline__ void reset(int r) {
    m[r] = kNegSentinel;
    l[r] = 0.0f;
  }
  __device__ __forceinline__ float max_with(int r, float top) const { return fmaxf(m[r], top); }
  __device__ __forceinline__ float rescale_to(int r, float m_new) const {
    return softmax_rescale(m[r], m_new);
  }
  __device__ __forceinline__ void advance(int r, float m_new, float alpha, float sum) {
    l[r] = l[r] * alpha + sum;
    m[r] = m_new;
  }
};

/// The shared memory in which a tensor-core block's kWarps warps merge their states into the
/// split's partial (the staged and verify kernels, reusing their stages): m, l and the merge
/// weights w, [warp][16] floats each, then o, [warp][rows][o_stride].
template <int kWarps>
struct WarpMergeScratch {
  float* base;

  __device__ __forceinline__ float* m() const { return base; }
  __device__ __forceinline__ float* l() const { return m() + kWarps * 16; }
  __device__ __forceinline__ float* w() const { return l() + kWarps * 16; }
  __device__ __forceinline__ float* o() const { return w() + kWarps * 16; }
  static constexpr int bytes(int rows, int o_stride) {
    return 4 * (3 * kWarps * 16 + kWarps * rows * o_stride);
  }
};

/// The rescale of a warp's running P·V accumulators in the mma C layout, o[n][m][e] for the
/// n-th 8-row tile's row 2t + (e & 1), by that row's α (alpha[n][e & 1]), each kept by
/// pv_accumulator (a mutant's hook).
template <int kN, int kM>
__device__ __forceinline__ void rescale_pv_accumulators(float (&o)[kN][kM][4],
                                                        const float (&alpha)[kN][2],
                                                        MutantSite site) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][m][e] = pv_accumulator(o[n][m][e] * alpha[n][e & 1], site);
}

}  // namespace kvlayer::cuda::detail::decode_impl
