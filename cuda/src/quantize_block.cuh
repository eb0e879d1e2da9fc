// The block quantizers of the append kernel (SPEC §3): one thread quantizes a whole 32-value
// block held in its registers. Bit-exact with reference/src/quantize.cpp.
//
// The arithmetic goes through the small `ops` layer below: on the device it is the CUDA
// intrinsics with explicit IEEE rounding; host code may instead include
// tests/quantize/quantize_host_ops.hpp first (it defines KVLAYER_QUANTIZE_HOST_OPS and the same
// ops in host f32 arithmetic), so that these exact functions are checked against the reference
// without a GPU.
//
// NOTE: exactness rests on IEEE division and reciprocal, separate f32 multiply and add (no FMA),
// and no flush-to-zero: the device build of this code needs -fmad=false --prec-div=true
// --ftz=false (cuda/CMakeLists.txt), never fast-math.
#pragma once

#include <cstdint>

#include "kvlayer/block_format.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>

#include "mutants.cuh"
#define KVLAYER_QUANTIZE_FN __device__ __forceinline__
// Fully unrolled loops keep a block's 32 values in registers (static indices only).
#define KVLAYER_UNROLL _Pragma("unroll")
#elif defined(KVLAYER_QUANTIZE_HOST_OPS)
#define KVLAYER_QUANTIZE_FN inline
#define KVLAYER_UNROLL
#else
#error "quantize_block.cuh needs nvcc, or quantize_host_ops.hpp included first"
#endif

namespace kvlayer::cuda::detail {

#if defined(__CUDACC__)
namespace ops {
KVLAYER_QUANTIZE_FN unsigned bits(float x) {
  return __float_as_uint(x);
}
KVLAYER_QUANTIZE_FN float div_rn(float a, float b) {
  if (KVLAYER_DEVICE_MUTANT(fast_math_quantization)) {  // planted bug
    const float fast = __fdividef(a, b);
    if (fast != __fdiv_rn(a, b)) KVLAYER_MUTANT_REACHED(MutantSite::append);
    return fast;
  }
  return __fdiv_rn(a, b);
}
KVLAYER_QUANTIZE_FN float rcp_rn(float a) {
  if (KVLAYER_DEVICE_MUTANT(fast_math_quantization)) {  // planted bug
    const float fast = __fdividef(1.0f, a);
    if (fast != __frcp_rn(a)) KVLAYER_MUTANT_REACHED(MutantSite::append);
    return fast;
  }
  return __frcp_rn(a);
}
KVLAYER_QUANTIZE_FN float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
KVLAYER_QUANTIZE_FN float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
KVLAYER_QUANTIZE_FN float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
KVLAYER_QUANTIZE_FN float round_half_away(float x) {
  return roundf(x);
}
KVLAYER_QUANTIZE_FN float fabs(float x) {
  return fabsf(x);
}
/// f32 -> fp16 bits, round-to-nearest-even.
KVLAYER_QUANTIZE_FN unsigned short half_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
/// NOTE: 16-bit stores, never a byte-wise copy: K blocks are only 2-byte aligned, and a memcpy
/// of an fp16 into bytes once miscompiled (FIELD-NOTES).
KVLAYER_QUANTIZE_FN void store_u16(std::uint8_t* p, unsigned short v) {
  *reinterpret_cast<unsigned short*>(p) = v;
}
/// A 64-bit little-endian store at an 8-byte aligned address.
KVLAYER_QUANTIZE_FN void store_u64(std::uint8_t* p, unsigned long long v) {
  *reinterpret_cast<unsigned long long*>(p) = v;
}
/// fma(a, b, c) with one rounding: only the planted q5_1_fma mutant uses it.
KVLAYER_QUANTIZE_FN float fma_rn(float a, float b, float c) {
  return __fmaf_rn(a, b, c);
}
KVLAYER_QUANTIZE_FN unsigned bit_reverse(unsigned x) {
  return __brev(x);
}
}  // namespace ops
#define KVLAYER_QUANTIZE_MUTANT(name) KVLAYER_DEVICE_MUTANT(name)
#define KVLAYER_QUANTIZE_REACHED() KVLAYER_MUTANT_REACHED(MutantSite::append)
#else
#define KVLAYER_QUANTIZE_MUTANT(name) false
#define KVLAYER_QUANTIZE_REACHED() ((void)0)
#endif

namespace qb {

constexpr unsigned short kNaNHalf = 0x7E00;

KVLAYER_QUANTIZE_FN bool is_finite(float x) {
  return (ops::bits(x) & 0x7F800000u) != 0x7F800000u;
}

KVLAYER_QUANTIZE_FN bool is_inf_half(unsigned short h) {
  return (h & 0x7FFFu) == 0x7C00u;
}

/// IEEE reciprocal, or 0 when d is 0 or 1/d is not finite (SPEC §3 degenerate blocks).
KVLAYER_QUANTIZE_FN float safe_reciprocal(float d) {
  if (d == 0.0f) return 0.0f;
  const float r = ops::rcp_rn(d);
  return is_finite(r) ? r : 0.0f;
}

/// The value a bad block is reported with (the reference's offending_value): its first
/// non-finite value, else the first value of largest magnitude.
KVLAYER_QUANTIZE_FN float offending_value(const float (&x)[32]) {
  bool found = false;
  float first_nonfinite = 0.0f;
  KVLAYER_UNROLL
  for (int j = 0; j < 32; ++j)
    if (!found && !is_finite(x[j])) {
      found = true;
      first_nonfinite = x[j];
    }
  if (found) return first_nonfinite;
  float amax = 0.0f, value = x[0];
  KVLAYER_UNROLL
  for (int j = 0; j < 32; ++j)
    if (ops::fabs(x[j]) > amax) {  // strict: the first of equal magnitudes stays
      amax = ops::fabs(x[j]);
      value = x[j];
    }
  return value;
}

KVLAYER_QUANTIZE_FN bool all_finite(const float (&x)[32]) {
  bool ok = true;
  KVLAYER_UNROLL
  for (int j = 0; j < 32; ++j) ok = ok && is_finite(x[j]);
  return ok;
}

/// Bytes 4i..4i+3 of a 32-quant array as one little-endian word.
KVLAYER_QUANTIZE_FN unsigned pack4(unsigned b0, unsigned b1, unsigned b2, unsigned b3) {
  return (b0 & 0xFFu) | ((b1 & 0xFFu) << 8) | ((b2 & 0xFFu) << 16) | ((b3 & 0xFFu) << 24);
}

}  // namespace qb

/// Quantizes the 32 values x into the q8_0 block at blk (34 bytes, 2-byte aligned). Returns true
/// (and the offending value) when the block was written as the canonical bad block.
KVLAYER_QUANTIZE_FN bool quantize_q8_0_block(const float (&x)[32], std::uint8_t* blk,
                                             float* bad_value) {
  const bool finite = qb::all_finite(x);
  float amax = 0.0f;
  KVLAYER_UNROLL
  for (int j = 0; j < 32; ++j) amax = amax < ops::fabs(x[j]) ? ops::fabs(x[j]) : amax;
  const float d = ops::div_rn(amax, 127.0f);
  const unsigned short dh = ops::half_bits(d);
  unsigned short words[kQ8_0BlockWords];  // d, then the quants as little-endian byte pairs
  const bool bad = !finite || qb::is_inf_half(dh);
  if (bad) {
    *bad_value = qb::offending_value(x);
    words[0] = qb::kNaNHalf;
    KVLAYER_UNROLL
    for (int i = 1; i < kQ8_0BlockWords; ++i) words[i] = 0;
  } else {
    const float id = qb::safe_reciprocal(d);
    words[0] = dh;
    KVLAYER_UNROLL
    for (int i = 0; i < 16; ++i) {
      const int q0 = static_cast<int>(ops::round_half_away(ops::mul_rn(x[2 * i], id)));
      const int q1 = static_cast<int>(ops::round_half_away(ops::mul_rn(x[2 * i + 1], id)));
      words[1 + i] = static_cast<unsigned short>((q0 & 0xFF) | ((q1 & 0xFF) << 8));  // |q| ≤ 127
    }
  }
  KVLAYER_UNROLL
  for (int i = 0; i < kQ8_0BlockWords; ++i) ops::store_u16(blk + 2 * i, words[i]);
  return bad;
}

/// Quantizes the 32 values x into the q5_1 block at blk (24 bytes, 8-byte aligned).
KVLAYER_QUANTIZE_FN bool quantize_q5_1_block(const float (&x)[32], std::uint8_t* blk,
                                             float* bad_value) {
  unsigned long long w0 = 0, w1 = 0, w2 = 0;  // d | m << 16 | qh << 32; qs[0..7]; qs[8..15]
  bool bad = true;
  if (!qb::all_finite(x)) {
    *bad_value = qb::offending_value(x);
  } else {
    // NOTE: the reference keeps the FIRST element attaining the min (max): strict comparisons,
    // so that the sign of a zero extreme matches (it reaches fp16(min) and d).
    float lo = x[0], hi = x[0];
    KVLAYER_UNROLL
    for (int j = 1; j < 32; ++j) {
      if (x[j] < lo) lo = x[j];
      if (x[j] > hi) hi = x[j];
    }
    const float d = ops::div_rn(ops::sub_rn(hi, lo), 31.0f);
    const unsigned short dh = ops::half_bits(d);
    const unsigned short mh = ops::half_bits(lo);
    if (qb::is_finite(d) && !qb::is_inf_half(dh) && !qb::is_inf_half(mh)) {
      const float id = qb::safe_reciprocal(d);
      unsigned q[32];
      unsigned qh = 0;
      KVLAYER_UNROLL
      for (int j = 0; j < 32; ++j) {
        const float scaled = ops::mul_rn(ops::sub_rn(x[j], lo), id);  // one f32 multiply ...
        float shifted = ops::add_rn(scaled, 0.5f);                    // ... then one add
        // planted bug
        if (KVLAYER_QUANTIZE_MUTANT(q5_1_fma)) {
          const float fused = ops::fma_rn(ops::sub_rn(x[j], lo), id, 0.5f);
          if (static_cast<unsigned>(fused) != static_cast<unsigned>(shifted))
            KVLAYER_QUANTIZE_REACHED();
          shifted = fused;
        }
        q[j] = static_cast<unsigned>(shifted);  // truncation; 0 ≤ q ≤ 31
        qh |= ((q[j] >> 4) & 1u) << j;
      }
      if (KVLAYER_QUANTIZE_MUTANT(qh_bit_order)) {  // planted bug
        if (ops::bit_reverse(qh) != qh) KVLAYER_QUANTIZE_REACHED();
        qh = ops::bit_reverse(qh);
      }
      w0 = dh | (static_cast<unsigned long long>(mh) << 16) |
           (static_cast<unsigned long long>(qh) << 32);
      unsigned qs[4];
      KVLAYER_UNROLL
      for (int i = 0; i < 4; ++i)
        qs[i] = qb::pack4((q[4 * i] & 0xFu) | ((q[4 * i + 16] & 0xFu) << 4),
                          (q[4 * i + 1] & 0xFu) | ((q[4 * i + 17] & 0xFu) << 4),
                          (q[4 * i + 2] & 0xFu) | ((q[4 * i + 18] & 0xFu) << 4),
                          (q[4 * i + 3] & 0xFu) | ((q[4 * i + 19] & 0xFu) << 4));
      w1 = qs[0] | (static_cast<unsigned long long>(qs[1]) << 32);
      w2 = qs[2] | (static_cast<unsigned long long>(qs[3]) << 32);
      bad = false;
    } else {
      *bad_value = qb::offending_value(x);
    }
  }
  if (bad) w0 = qb::kNaNHalf | (static_cast<unsigned long long>(qb::kNaNHalf) << 16);
  ops::store_u64(blk, w0);
  ops::store_u64(blk + kQ5_1Nibbles, w1);
  ops::store_u64(blk + kQ5_1Nibbles + 8, w2);
  return bad;
}

}  // namespace kvlayer::cuda::detail
