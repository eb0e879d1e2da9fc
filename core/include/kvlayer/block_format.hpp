// The two block formats of the planes (SPEC §2–§4) as sizes and byte offsets: one definition
// for the host quantizers, the append kernels and the decode kernels (device code includes it).
#pragma once

#if defined(__CUDACC__)
#define KVLAYER_HOST_DEVICE __host__ __device__
#else
#define KVLAYER_HOST_DEVICE
#endif

namespace kvlayer {

inline constexpr int kBlockValues = 32;  ///< values per quantized block (q8_0 and q5_1)

/// q8_0 (K): d (fp16) at byte 0, then the 32 int8 quants.
inline constexpr int kQ8_0BlockBytes = 34;
inline constexpr int kQ8_0Quants = 2;  ///< offset of quant 0
/// A q8_0 block in 16-bit words: d, then 16 quant pairs. A head of n blocks spans 17·(2n)
/// bytes, so its span is 2n-byte aligned wherever a row's spans start (decode copy sizes).
inline constexpr int kQ8_0BlockWords = kQ8_0BlockBytes / 2;
/// The largest |d| (fp16 bits 0x5fff = 511.75) whose products with every int8 quant stay
/// within fp16's range (511.75·128 = 65504): the verify kernel folds only such d into its fp16
/// K operands (kvlayer/accuracy.hpp (1)).
inline constexpr unsigned kQ8_0FoldMaxScaleBits = 0x5fffu;

/// q5_1 (V): d, m (fp16) at bytes 0, 2; qh (u32, bit j: quant j's fifth bit) at 4; then 16
/// bytes of nibbles (byte i: quant i | quant i + 16 << 4).
inline constexpr int kQ5_1BlockBytes = 24;
inline constexpr int kQ5_1Min = 2;
inline constexpr int kQ5_1HighBits = 4;
inline constexpr int kQ5_1Nibbles = 8;

/// Bytes of one head's K span (q8_0) and V span (q5_1) in a row of head dim d.
KVLAYER_HOST_DEVICE constexpr int k_head_bytes(int d) {
  return d / kBlockValues * kQ8_0BlockBytes;
}
KVLAYER_HOST_DEVICE constexpr int v_head_bytes(int d) {
  return d / kBlockValues * kQ5_1BlockBytes;
}

static_assert(kQ8_0Quants + kBlockValues == kQ8_0BlockBytes);
static_assert(kQ5_1Nibbles + kBlockValues / 2 == kQ5_1BlockBytes);

}  // namespace kvlayer
