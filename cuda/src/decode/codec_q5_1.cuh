// q5_1 V blocks on the device (SPEC §2, §4): the header's fp16 halves and the fp16-range
// predicate of the tensor-core kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace kvlayer::cuda::detail::decode_impl {

/// True when some value of the q5_1 block with header word dm (d | m << 16) might leave fp16's
/// range in d·q + m: |d| > 1024 or |m| > 32768 (or a NaN / inf header). Otherwise |d·q + m| ≤
/// 31·1024 + 32768 < 65504. Each 15-bit magnitude plus its complement carries into bit 15.
__device__ __forceinline__ bool v_header_maybe_wide(unsigned dm) {
  return (((dm & 0x7fff7fffu) + 0x07ff1bffu) & 0x80008000u) != 0u;
}

__device__ __forceinline__ float f16_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

}  // namespace kvlayer::cuda::detail::decode_impl
