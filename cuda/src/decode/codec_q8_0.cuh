// q8_0 K blocks on the device (SPEC §2, §4): int8 quants to exact fp16 tensor-core operands,
// those operands with the block's d folded in (K̃ = fp16(d·q)), and the predicate on d that
// keeps a block out of the fold.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "decode/mma_fragments.cuh"
#include "kvlayer/block_format.hpp"

namespace kvlayer::cuda::detail::decode_impl {

/// Bytes 2h, 2h+1 of a word of int8 quants whose sign bits are already flipped (u = w ^
/// 0x80808080) → fp16x2, exactly: fp16 bits 0x64xx = 1024 + xx with xx = q + 128, minus 1152.
__device__ __forceinline__ unsigned int8_pair_to_f16x2(unsigned u, int h) {
  const unsigned biased = __byte_perm(u, 0x64646464u, h ? 0x4342 : 0x4140);
  return h2_bits(__hsub2(as_h2(biased), as_h2(0x64806480u)));
}

/// Four int8 quants (one 32-bit word) → two fp16x2 (bytes 0,1 and bytes 2,3), exactly.
__device__ __forceinline__ void int8x4_to_f16x2x2(unsigned w, unsigned& lo, unsigned& hi) {
  const unsigned u = w ^ 0x80808080u;
  lo = int8_pair_to_f16x2(u, 0);
  hi = int8_pair_to_f16x2(u, 1);
}

/// True when d (fp16 bits) may not be folded into fp16 quants: |d| > 511.75 (0x5fff) or d is
/// not finite. Otherwise |d·q| ≤ 511.75·128 = 65504 for every int8 q, fp16's largest finite.
__device__ __forceinline__ bool k_header_maybe_wide(unsigned d_bits) {
  return (d_bits & 0x7fffu) > kQ8_0FoldMaxScaleBits;
}

/// A pair of exact fp16 quants (int8_pair_to_f16x2) times d (fp16 bits) in one HMUL2: each
/// exact product d·q rounded once to fp16 (RNE, subnormals kept), accuracy.hpp (1).
__device__ __forceinline__ unsigned k_fold_f16x2(unsigned q2, unsigned d_bits) {
  return h2_bits(__hmul2(as_h2(q2), as_h2(d_bits | (d_bits << 16))));
}

}  // namespace kvlayer::cuda::detail::decode_impl
