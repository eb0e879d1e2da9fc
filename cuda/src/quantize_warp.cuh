// The warp-cooperative block quantizers of the append kernel (SPEC §3): one warp per 32-value
// block, lane j holding x_j. Bit-exact with reference/src/quantize.cpp.
//
// The arithmetic and the warp collectives go through the small `ops` layer below: on the device
// it is the CUDA intrinsics with explicit IEEE rounding; host code may instead include
// tests/cuda/layer/warp_emulation.hpp first (it defines KVLAYER_WARP_EMULATION and the same ops
// over 32 host threads), so that these exact functions are checked against the reference
// without a GPU.
//
// NOTE: exactness rests on IEEE division and reciprocal, separate f32 multiply and add (no FMA),
// and no flush-to-zero: the device build of this code needs -fmad=false --prec-div=true
// --ftz=false (cuda/CMakeLists.txt), never fast-math.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>

#include "mutants.cuh"
#define KVLAYER_WARP_FN __device__ __forceinline__
#elif defined(KVLAYER_WARP_EMULATION)
#define KVLAYER_WARP_FN inline
#else
#error "quantize_warp.cuh needs nvcc, or warp_emulation.hpp included first"
#endif

namespace kvlayer::cuda::detail {

#if defined(__CUDACC__)
namespace ops {
constexpr unsigned kFullMask = 0xFFFFFFFFu;
KVLAYER_WARP_FN unsigned ballot(bool p) {
  return __ballot_sync(kFullMask, p);
}
KVLAYER_WARP_FN float shfl(float x, int src_lane) {
  return __shfl_sync(kFullMask, x, src_lane);
}
KVLAYER_WARP_FN float shfl_xor(float x, int mask) {
  return __shfl_xor_sync(kFullMask, x, mask);
}
KVLAYER_WARP_FN unsigned shfl_down(unsigned x, int delta) {
  return __shfl_down_sync(kFullMask, x, delta);
}
KVLAYER_WARP_FN int lowest_lane(unsigned mask) {
  return __ffs(static_cast<int>(mask)) - 1;
}
KVLAYER_WARP_FN unsigned bits(float x) {
  return __float_as_uint(x);
}
KVLAYER_WARP_FN float div_rn(float a, float b) {
  if (KVLAYER_DEVICE_MUTANT(fast_math_quantization)) return __fdividef(a, b);  // planted bug
  return __fdiv_rn(a, b);
}
KVLAYER_WARP_FN float rcp_rn(float a) {
  if (KVLAYER_DEVICE_MUTANT(fast_math_quantization)) return __fdividef(1.0f, a);  // planted bug
  return __frcp_rn(a);
}
KVLAYER_WARP_FN float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
KVLAYER_WARP_FN float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
KVLAYER_WARP_FN float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
KVLAYER_WARP_FN float round_half_away(float x) {
  return roundf(x);
}
KVLAYER_WARP_FN float fmax(float a, float b) {
  return fmaxf(a, b);
}
KVLAYER_WARP_FN float fmin(float a, float b) {
  return fminf(a, b);
}
KVLAYER_WARP_FN float fabs(float x) {
  return fabsf(x);
}
/// f32 -> fp16 bits, round-to-nearest-even.
KVLAYER_WARP_FN unsigned short half_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
/// NOTE: a 16-bit store, never a byte-wise copy: K blocks are only 2-byte aligned, and a memcpy
/// of an fp16 into bytes once miscompiled (FIELD-NOTES).
KVLAYER_WARP_FN void store_u16(std::uint8_t* p, unsigned short v) {
  *reinterpret_cast<unsigned short*>(p) = v;
}
/// A 32-bit little-endian store at a 4-byte aligned address.
KVLAYER_WARP_FN void store_u32(std::uint8_t* p, unsigned v) {
  *reinterpret_cast<unsigned*>(p) = v;
}
}  // namespace ops
#endif

namespace qw {

constexpr unsigned short kNaNHalf = 0x7E00;

KVLAYER_WARP_FN bool is_finite(float x) {
  return (ops::bits(x) & 0x7F800000u) != 0x7F800000u;
}

KVLAYER_WARP_FN bool is_inf_half(unsigned short h) {
  return (h & 0x7FFFu) == 0x7C00u;
}

KVLAYER_WARP_FN float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = ops::fmax(x, ops::shfl_xor(x, o));
  return x;
}

KVLAYER_WARP_FN float warp_min(float x) {
  for (int o = 16; o > 0; o >>= 1) x = ops::fmin(x, ops::shfl_xor(x, o));
  return x;
}

/// The x of the lowest lane where `pred` holds (pred must hold somewhere).
KVLAYER_WARP_FN float first_where(bool pred, float x) {
  return ops::shfl(x, ops::lowest_lane(ops::ballot(pred)));
}

/// IEEE reciprocal, or 0 when d is 0 or 1/d is not finite (SPEC §3 degenerate blocks).
KVLAYER_WARP_FN float safe_reciprocal(float d) {
  if (d == 0.0f) return 0.0f;
  const float r = ops::rcp_rn(d);
  return is_finite(r) ? r : 0.0f;
}

/// The value a bad block is reported with: its first non-finite value, else the first value of
/// largest magnitude (the reference's offending_value). Warp-uniform call.
KVLAYER_WARP_FN float offending_value(float x, unsigned nonfinite_lanes) {
  if (nonfinite_lanes != 0) return ops::shfl(x, ops::lowest_lane(nonfinite_lanes));
  const float amax = warp_max(ops::fabs(x));  // all finite: exact, the same on every lane
  return first_where(ops::fabs(x) == amax, x);
}

}  // namespace qw

/// Quantizes the warp's 32 values (lane j holds x_j) into the q8_0 block at blk (34 bytes,
/// 2-byte aligned). Returns true (and the offending value) when the block was written as the
/// canonical bad block.
/// NOTE: every branch below is warp-uniform (ballots, or reductions of finite values, which are
/// exact and agree on every lane), so the full-mask collectives are legal.
KVLAYER_WARP_FN bool quantize_q8_0_warp(float x, std::uint8_t* blk, int lane, float* bad_value) {
  const unsigned nonfinite = ops::ballot(!qw::is_finite(x));
  const float amax = qw::warp_max(ops::fabs(x));
  const float d = ops::div_rn(amax, 127.0f);
  const unsigned short dh = ops::half_bits(d);
  if (nonfinite != 0 || qw::is_inf_half(dh)) {
    *bad_value = qw::offending_value(x, nonfinite);
    blk[2 + lane] = 0;
    if (lane == 0) ops::store_u16(blk, qw::kNaNHalf);
    return true;
  }
  const float id = qw::safe_reciprocal(d);
  const float q = ops::round_half_away(ops::mul_rn(x, id));  // |q| ≤ 127
  blk[2 + lane] = static_cast<std::uint8_t>(static_cast<std::int8_t>(static_cast<int>(q)));
  if (lane == 0) ops::store_u16(blk, dh);
  return false;
}

/// Quantizes the warp's 32 values into the q5_1 block at blk (24 bytes, 8-byte aligned).
KVLAYER_WARP_FN bool quantize_q5_1_warp(float x, std::uint8_t* blk, int lane, float* bad_value) {
  const unsigned nonfinite = ops::ballot(!qw::is_finite(x));
  if (nonfinite != 0) {
    *bad_value = qw::offending_value(x, nonfinite);
  } else {
    // NOTE: the reference keeps the FIRST element attaining the min (max): take that lane's own
    // value, so that the sign of a zero extreme matches (it reaches fp16(min) and d).
    const float lo = qw::first_where(x == qw::warp_min(x), x);
    const float hi = qw::first_where(x == qw::warp_max(x), x);
    const float d = ops::div_rn(ops::sub_rn(hi, lo), 31.0f);
    const unsigned short dh = ops::half_bits(d);
    const unsigned short mh = ops::half_bits(lo);
    if (qw::is_finite(d) && !qw::is_inf_half(dh) && !qw::is_inf_half(mh)) {
      const float id = qw::safe_reciprocal(d);
      const float scaled = ops::mul_rn(ops::sub_rn(x, lo), id);  // one f32 multiply ...
      float shifted = ops::add_rn(scaled, 0.5f);                 // ... then one add, never fused
#if defined(KVLAYER_MUTANTS) && defined(__CUDACC__)
      if (KVLAYER_DEVICE_MUTANT(q5_1_fma)) shifted = __fmaf_rn(ops::sub_rn(x, lo), id, 0.5f);
#endif
      const unsigned q = static_cast<unsigned>(shifted);         // truncation; 0 ≤ q ≤ 31
      unsigned qh = ops::ballot(((q >> 4) & 1u) != 0);
#if defined(KVLAYER_MUTANTS) && defined(__CUDACC__)
      if (KVLAYER_DEVICE_MUTANT(qh_bit_order)) qh = __brev(qh);  // planted bug
#endif
      const unsigned q_hi = ops::shfl_down(q, 16);
      if (lane < 16) blk[8 + lane] = static_cast<std::uint8_t>((q & 0xFu) | ((q_hi & 0xFu) << 4));
      if (lane == 0) {
        ops::store_u16(blk, dh);
        ops::store_u16(blk + 2, mh);
        ops::store_u32(blk + 4, qh);
      }
      return false;
    }
    *bad_value = qw::offending_value(x, 0);
  }
  if (lane < 16) blk[8 + lane] = 0;
  if (lane == 0) {
    ops::store_u16(blk, qw::kNaNHalf);
    ops::store_u16(blk + 2, qw::kNaNHalf);
    ops::store_u32(blk + 4, 0u);
  }
  return true;
}

}  // namespace kvlayer::cuda::detail
