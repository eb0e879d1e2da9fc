// The planted mutants of the split kernels (cuda/src/mutants.def): identities in normal builds.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mutants.cuh"

namespace kvlayer::cuda::detail::decode_impl {

/// A P·V accumulator after an update or rescale: itself; under pv_accumulated_in_f16 it is kept
/// in fp16 (rounded, so wide values overflow to inf).
__device__ __forceinline__ float pv_accumulator(float x, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(pv_accumulated_in_f16)) {
    const float r = __half2float(__float2half_rn(x));  // planted bug
    if (r != x) KVLAYER_MUTANT_REACHED(site);
    return r;
  }
  return x;
}

/// Whether a warp rescales its P·V accumulators after a max update: when any of its rows' max
/// moved; under rescale_skipped_after_first_tile never after the warp's first key-loop trip
/// (whose accumulators are no longer empty).
__device__ __forceinline__ bool rescale_accumulators(bool any_moved, bool first_trip,
                                                     MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(rescale_skipped_after_first_tile) && any_moved && !first_trip) {
    KVLAYER_MUTANT_REACHED(site);
    return false;  // planted bug
  }
  return any_moved;
}

/// pv_accumulator for the registers one mma just updated.
template <int N>
__device__ __forceinline__ void pv_accumulators(float (&c)[N], MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(pv_accumulated_in_f16)) {
#pragma unroll
    for (int e = 0; e < N; ++e) c[e] = pv_accumulator(c[e], site);
  }
}

/// The f32 q value a kernel rounds to its fp16 operand: q; under scale_folded_into_f16_q,
/// q·fp16(scale), and the dot is then left unscaled (score_scaled).
__device__ __forceinline__ float q_operand(float q, float scale, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(scale_folded_into_f16_q)) {
    const float folded = __fmul_rn(q, __half2float(__float2half_rn(scale)));  // planted bug
    const float normal = __fmul_rn(__half2float(__float2half_rn(q)), scale);
    if (__half2float(__float2half_rn(folded)) != normal) KVLAYER_MUTANT_REACHED(site);
    return folded;
  }
  return q;
}

/// score = dot × scale in f32 (__fmul_rn), or the dot alone under scale_folded_into_f16_q.
__device__ __forceinline__ float score_scaled(float dot, float scale) {
  if (KVLAYER_DEVICE_MUTANT(scale_folded_into_f16_q)) return dot;  // planted bug
  return __fmul_rn(dot, scale);
}

/// Whether a tensor-core tile whose vote found a V block beyond fp16 takes the f32 path: yes;
/// under wide_values_on_tensor_cores, no.
__device__ __forceinline__ bool wide_tile_on_cuda_cores(bool any_wide, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(wide_values_on_tensor_cores) && any_wide) {
    KVLAYER_MUTANT_REACHED(site);
    return false;  // planted bug
  }
  return any_wide;
}

/// Whether a verify tile whose vote found a K block with a scale beyond the fold
/// (k_header_maybe_wide) is converted again without it: yes; under k_folded_on_wide_block, no.
__device__ __forceinline__ bool k_tile_unfolded(bool any_wide, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(k_folded_on_wide_block) && any_wide) {
    KVLAYER_MUTANT_REACHED(site);
    return false;  // planted bug
  }
  return any_wide;
}

/// The d (fp16 bits) a thread folds into the quants of its j-th K block: that block's own d;
/// under k_fold_first_block_scale, its first block's d for both.
__device__ __forceinline__ unsigned k_fold_scale(unsigned d_bits, unsigned first_d_bits, int j,
                                                 MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(k_fold_first_block_scale) && j > 0) {
    if (d_bits != first_d_bits) KVLAYER_MUTANT_REACHED(site);
    return first_d_bits;  // planted bug
  }
  return d_bits;
}

}  // namespace kvlayer::cuda::detail::decode_impl
