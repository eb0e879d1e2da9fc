// The `ops` layer of cuda/src/quantize_block.cuh in host f32 arithmetic, so that the device
// block quantizers themselves (not a re-implementation) run on the host against the reference.
// Include this before quantize_block.cuh.
//
// NOTE: it checks the algorithms (extremes, first-element selections, bad-block reports, nibble
// and high-bit packing, branch structure) and the rounding sequence; it cannot check the CUDA
// intrinsics' own semantics (IEEE __fdiv_rn/__frcp_rn, roundf), which the GPU tests do.
#pragma once

#define KVLAYER_QUANTIZE_HOST_OPS 1

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvlayer/half.hpp"

namespace kvlayer::cuda::detail::ops {

inline unsigned bits(float x) {
  return std::bit_cast<unsigned>(x);
}
// Host IEEE single arithmetic (SSE; the test target is built with -ffp-contract=off).
inline float div_rn(float a, float b) {
  return a / b;
}
inline float rcp_rn(float a) {
  return 1.0f / a;
}
inline float sub_rn(float a, float b) {
  return a - b;
}
inline float mul_rn(float a, float b) {
  return a * b;
}
inline float add_rn(float a, float b) {
  return a + b;
}
inline float round_half_away(float x) {
  return std::roundf(x);
}
inline float fabs(float x) {
  return std::fabs(x);
}
inline unsigned short half_bits(float x) {
  return kvlayer::f32_to_f16_bits(x);
}
inline void store_u16(std::uint8_t* p, unsigned short v) {
  std::memcpy(p, &v, 2);
}
inline void store_u64(std::uint8_t* p, unsigned long long v) {
  std::memcpy(p, &v, 8);
}
inline float fma_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline unsigned bit_reverse(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}

}  // namespace kvlayer::cuda::detail::ops
