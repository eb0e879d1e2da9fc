// Exact conversions between f32 and the 16-bit float formats, in portable integer code.
// NOTE: written with bit manipulation rather than compiler intrinsics so that the result does
// not depend on the host's F16C support or rounding mode: round-to-nearest-even always.
#pragma once

#include <bit>
#include <cstdint>

namespace kvlayer {

/// IEEE binary16 bits -> f32 (exact; subnormals, infinities and NaN payload-preserving).
constexpr float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits = 0;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant != 0) {
    // Subnormal half: normalise into an f32 normal.
    std::uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
  } else {
    bits = sign;
  }
  return std::bit_cast<float>(bits);
}

/// f32 -> IEEE binary16 bits, round-to-nearest-even; overflow gives ±Inf, NaN stays NaN (quiet).
constexpr std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t exp = (x >> 23) & 0xFFu;
  const std::uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return std::uint16_t(sign | 0x7C00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int e = int(exp) - 127 + 15;  // biased half exponent
  if (e >= 0x1F) return std::uint16_t(sign | 0x7C00u);
  if (e <= 0) {
    // Result is subnormal (or zero): shift the full significand, rounding to nearest even.
    if (e < -10) return sign;  // below half the smallest subnormal: rounds to zero
    const std::uint32_t m = mant | 0x800000u;
    const int shift = 14 - e;  // 24-bit significand down to the subnormal's 10 bits
    const std::uint32_t half_bits = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    std::uint32_t r = half_bits;
    if (rest > halfway || (rest == halfway && (half_bits & 1u))) ++r;
    return std::uint16_t(sign | r);  // a carry into bit 10 correctly yields the smallest normal
  }
  std::uint32_t r = (std::uint32_t(e) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // may carry into exponent: correct
  return std::uint16_t(sign | r);  // r == 0x7C00 after a carry is the correct overflow to Inf
}

/// bfloat16 bits -> f32 (exact).
constexpr float bf16_bits_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(std::uint32_t(b) << 16);
}

/// f32 -> bfloat16 bits, round-to-nearest-even; NaN stays NaN (quiet).
constexpr std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) return std::uint16_t((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return std::uint16_t((x + rounding) >> 16);
}

}  // namespace kvlayer
