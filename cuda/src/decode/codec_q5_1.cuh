// q5_1 V blocks on the device (SPEC §2, §4): the header, d and m, one quant, four quants of a
// block in one word, two quants as an exact fp16x2 operand, and the predicates on a header that
// choose a kernel's path.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode/mma_fragments.cuh"
#include "kvlayer/block_format.hpp"

namespace kvlayer::cuda::detail::decode_impl {

__device__ __forceinline__ float f16_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

/// A block's first 8 bytes: x = d | m << 16 (fp16 bits), y = qh (bit j: quant j's fifth bit).
__device__ __forceinline__ uint2 q5_1_header(const std::uint8_t* block) {
  return *reinterpret_cast<const uint2*>(block);
}

/// d and m of a header word x.
__device__ __forceinline__ float q5_1_d(unsigned dm) {
  return f16_bits(dm & 0xffffu);
}
__device__ __forceinline__ float q5_1_m(unsigned dm) {
  return f16_bits(dm >> 16);
}

/// Quant j (0..31) of a block: the low nibble of the byte qs[j & 15] for j < 16, its high
/// nibble for j ≥ 16, and bit j of qh.
__device__ __forceinline__ unsigned q5_1_quant(unsigned qs_byte, unsigned qh, int j) {
  return (j < 16 ? qs_byte & 0xfu : qs_byte >> 4) | (((qh >> j) & 1u) << 4);
}

/// The 5-bit quants g, g + 8, g + 16, g + 24 of a q5_1 block in shared memory (bytes 0..3 of
/// the result), from qs[g] (quants g | g+16 << 4), qs[g+8] (g+8 | g+24 << 4) and bits of qh.
__device__ __forceinline__ unsigned v_quants5(const std::uint8_t* block, unsigned qh, int g) {
  const unsigned x =
      unsigned(block[kQ5_1Nibbles + g]) | (unsigned(block[kQ5_1Nibbles + 8 + g]) << 8);
  return ((x | (x << 12)) & 0x0f0f0f0fu) | (((qh >> g) << 4) & 0x10101010u);
}

/// The fp16x2 of two q5_1 quants (one per 16-bit half), exactly: the nibble at bits kNibble..+3
/// of each half of `qs` and the fifth bit at bit kQhBit of each half of `qh`. Low nibbles
/// (kNibble 0) become fp16 1024 + q (fifth bit → bit 4, bias 0x6400), high nibbles (4) 64 + q
/// (fifth bit → bit 8, mantissa bits 0..3 zero, bias 0x5400); the bias is subtracted exactly.
template <int kNibble, int kQhBit>
__device__ __forceinline__ __half2 v_quant_f16x2(unsigned qs, unsigned qh, unsigned bias) {
  constexpr int kTarget = kNibble == 0 ? 4 : 8;  // where the high bit goes
  const unsigned qh_at = kQhBit >= kTarget ? qh >> (kQhBit - kTarget) : qh << (kTarget - kQhBit);
  constexpr unsigned kNibMask = kNibble == 0 ? 0x000f000fu : 0x00f000f0u;
  constexpr unsigned kBitMask = kNibble == 0 ? 0x00100010u : 0x01000100u;
  // x = (qs & kNibMask) | (qh_at & kBitMask) | bias in two LOP3s: the bias (no bit inside either
  // mask) comes in a register, as a LOP3 takes one immediate.
  unsigned y, x;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(y) : "r"(qh_at), "n"(kBitMask), "r"(bias));
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(x) : "r"(qs), "n"(kNibMask), "r"(y));
  return __hsub2(as_h2(x), as_h2(bias));
}

/// True when the block with header word dm is a canonical bad block (a non-finite d or m: its
/// values are NaN, SPEC §3).
__device__ __forceinline__ bool v_block_not_finite(unsigned dm) {
  return (dm & 0x7c00u) == 0x7c00u || (dm & 0x7c000000u) == 0x7c000000u;
}

// The fp16-range predicates: the staged kernel tests the block's range in f32 (NaN headers give
// false: its fp16 path propagates them as the f32 path would); the direct and verify kernels
// take a conservative bit test (NaN and inf headers give true). One predicate for all would
// change which path such blocks take in some kernel.

/// True when some value of the block with header word dm may exceed fp16's range
/// (|d·q + m| ≤ |d|·31 + |m|, exact enough in f32).
__device__ __forceinline__ bool v_block_exceeds_f16(unsigned dm) {
  return fabsf(q5_1_d(dm)) * 31.0f + fabsf(q5_1_m(dm)) > 65504.0f;
}

/// True when some value of the block with header word dm might leave fp16's range in d·q + m:
/// |d| > 1024 or |m| > 32768 (or a NaN / inf header). Otherwise |d·q + m| ≤ 31·1024 + 32768 <
/// 65504. Each 15-bit magnitude plus its complement carries into bit 15.
__device__ __forceinline__ bool v_header_maybe_wide(unsigned dm) {
  return (((dm & 0x7fff7fffu) + 0x07ff1bffu) & 0x80008000u) != 0u;
}

}  // namespace kvlayer::cuda::detail::decode_impl
