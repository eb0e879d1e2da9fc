// q8_0 K blocks on the device (SPEC §2, §4): int8 quants to exact fp16 tensor-core operands.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "decode/mma_fragments.cuh"

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

}  // namespace kvlayer::cuda::detail::decode_impl
