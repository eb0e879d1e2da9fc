// q5_1 V blocks on the device (SPEC §2, §4): the header, d and m, one quant, and the predicates
// on a header that choose a kernel's path. The kernels assemble these into the fragment layouts
// of their own (several quants per 32-bit word).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

/// True when the block with header word dm is a canonical bad block (a non-finite d or m: its
/// values are NaN, SPEC §3).
__device__ __forceinline__ bool v_block_not_finite(unsigned dm) {
  return (dm & 0x7c00u) == 0x7c00u || (dm & 0x7c000000u) == 0x7c000000u;
}

// The fp16-range predicates: the staged kernel tests the block's range in f32 (NaN headers give
// false: its fp16 path propagates them as the f32 path would); the direct and verify kernels
// take a conservative bit test (NaN and inf headers give true). One predicate for all is a path
// change, to be measured and validated on the GPU.

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
