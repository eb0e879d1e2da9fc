// NOTE: this file must be compiled without fast-math and with -ffp-contract=off: the q5_1
// expression is a separate multiply and add (SPEC §3), and division must be IEEE.
#include "kvlayer/reference/quantize.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kvlayer/half.hpp"

namespace kvlayer::ref {
namespace {

constexpr std::uint16_t kNaNHalf = 0x7E00;

void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = std::uint8_t(v & 0xFF);
  p[1] = std::uint8_t(v >> 8);
}
std::uint16_t load_u16(const std::uint8_t* p) { return std::uint16_t(p[0] | (p[1] << 8)); }

bool is_inf_half(std::uint16_t h) { return (h & 0x7FFFu) == 0x7C00u; }

/// The value a bad block is reported with: its first non-finite value, else its largest |x|.
float offending_value(std::span<const float, kBlockValues> x) {
  for (float v : x)
    if (!std::isfinite(v)) return v;
  return *std::max_element(x.begin(), x.end(),
                           [](float a, float b) { return std::fabs(a) < std::fabs(b); });
}

bool all_finite(std::span<const float, kBlockValues> x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

/// IEEE reciprocal, or 0 when d is 0 or its reciprocal is not finite (degenerate block).
float safe_reciprocal(float d) {
  if (d == 0.0f) return 0.0f;
  const float id = 1.0f / d;
  return std::isfinite(id) ? id : 0.0f;
}

}  // namespace

std::optional<float> quantize_q8_0_block(std::span<const float, kBlockValues> x,
                                         std::span<std::uint8_t, kQ8_0BlockBytes> out) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float d = amax / 127.0f;
  const std::uint16_t d_half = f32_to_f16_bits(d);
  if (!all_finite(x) || is_inf_half(d_half)) {
    std::fill(out.begin(), out.end(), std::uint8_t{0});
    store_u16(out.data(), kNaNHalf);
    return offending_value(x);
  }
  const float id = safe_reciprocal(d);
  store_u16(out.data(), d_half);
  for (int j = 0; j < kBlockValues; ++j) {
    const float scaled = x[j] * id;
    out[2 + j] = std::uint8_t(std::int8_t(std::roundf(scaled)));  // half away from zero
  }
  return std::nullopt;
}

std::optional<float> quantize_q5_1_block(std::span<const float, kBlockValues> x,
                                         std::span<std::uint8_t, kQ5_1BlockBytes> out) {
  float lo = x[0], hi = x[0];
  for (float v : x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const float d = (hi - lo) / 31.0f;
  const std::uint16_t d_half = f32_to_f16_bits(d);
  const std::uint16_t m_half = f32_to_f16_bits(lo);
  if (!all_finite(x) || !std::isfinite(d) || is_inf_half(d_half) || is_inf_half(m_half)) {
    std::fill(out.begin(), out.end(), std::uint8_t{0});
    store_u16(out.data(), kNaNHalf);
    store_u16(out.data() + 2, kNaNHalf);
    return offending_value(x);
  }
  const float id = safe_reciprocal(d);
  store_u16(out.data(), d_half);
  store_u16(out.data() + 2, m_half);
  std::uint32_t qh = 0;
  std::uint8_t* qs = out.data() + 8;
  std::fill(qs, qs + 16, std::uint8_t{0});
  for (int j = 0; j < kBlockValues; ++j) {
    const float scaled = (x[j] - lo) * id;    // one f32 multiply ...
    const float shifted = scaled + 0.5f;      // ... then one f32 add: never fused
    const auto q = std::uint32_t(shifted);    // truncation; 0 ≤ q ≤ 31
    qh |= ((q >> 4) & 1u) << j;
    qs[j % 16] |= std::uint8_t((q & 0x0Fu) << (j < 16 ? 0 : 4));
  }
  for (int b = 0; b < 4; ++b) out[4 + b] = std::uint8_t(qh >> (8 * b));
  return std::nullopt;
}

void dequantize_q8_0_block(std::span<const std::uint8_t, kQ8_0BlockBytes> in,
                           std::span<float, kBlockValues> out) {
  const float d = f16_bits_to_f32(load_u16(in.data()));
  for (int j = 0; j < kBlockValues; ++j) out[j] = d * float(std::int8_t(in[2 + j]));
}

float q5_1_block_min(std::span<const std::uint8_t, kQ5_1BlockBytes> in) {
  return f16_bits_to_f32(load_u16(in.data() + 2));
}

/// The 32 five-bit quants of a q5_1 block (SPEC §2: low nibbles, then high, and qh's bits).
std::array<std::uint32_t, kBlockValues> q5_1_quants(
    std::span<const std::uint8_t, kQ5_1BlockBytes> in) {
  std::uint32_t qh = 0;
  for (int b = 0; b < 4; ++b) qh |= std::uint32_t(in[4 + b]) << (8 * b);
  std::array<std::uint32_t, kBlockValues> q{};
  for (int j = 0; j < kBlockValues; ++j)
    q[std::size_t(j)] = ((in[8 + j % 16] >> (j < 16 ? 0 : 4)) & 0x0Fu) | (((qh >> j) & 1u) << 4);
  return q;
}

double round_to_f16(double x) {
  if (std::fabs(x) >= 65520.0) return std::copysign(INFINITY, x);  // fp16's overflow (NaN: no)
  // Exact in f32 (the common case): f32's own conversion rounds it once, the same.
  if (const float f = float(x); double(f) == x) return f16_bits_to_f32(f32_to_f16_bits(f));
  if (!std::isfinite(x)) return x;
  // The ulp of x's binade (subnormals: 2^-24); nearbyint rounds ties to even.
  const int ulp = std::max(std::ilogb(x), -14) - 10;
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp)), ulp);
  return std::fabs(r) > 65504.0 ? std::copysign(INFINITY, x) : r;
}

void dequantize_q5_1_block_fused_f16(std::span<const std::uint8_t, kQ5_1BlockBytes> in,
                                     std::span<double, kBlockValues> out) {
  const double d = f16_bits_to_f32(load_u16(in.data()));
  const double m = q5_1_block_min(in);
  const auto q = q5_1_quants(in);
  // Exact in double (d·q + m spans < 41 bits), then rounded once.
  for (int j = 0; j < kBlockValues; ++j) out[j] = round_to_f16(d * double(q[std::size_t(j)]) + m);
}

void dequantize_q8_0_block_folded_f16(std::span<const std::uint8_t, kQ8_0BlockBytes> in,
                                      std::span<double, kBlockValues> out) {
  const double d = f16_bits_to_f32(load_u16(in.data()));
  // d·q is exact in double (an 11-bit by 8-bit product), then rounded once.
  for (int j = 0; j < kBlockValues; ++j)
    out[std::size_t(j)] =
        round_to_f16(d * double(static_cast<std::int8_t>(in[std::size_t(kQ8_0Quants + j)])));
}

bool q8_0_header_may_be_wide(std::span<const std::uint8_t, kQ8_0BlockBytes> in) {
  const double d = f16_bits_to_f32(load_u16(in.data()));
  return !(std::fabs(d) <= f16_bits_to_f32(std::uint16_t(kQ8_0FoldMaxScaleBits)));  // NaN: wide
}

bool q5_1_header_may_be_wide(std::span<const std::uint8_t, kQ5_1BlockBytes> in) {
  const double d = f16_bits_to_f32(load_u16(in.data())), m = q5_1_block_min(in);
  return !(std::fabs(d) <= 1024 && std::fabs(m) <= 32768);  // NaN: wide
}

void dequantize_q5_1_block(std::span<const std::uint8_t, kQ5_1BlockBytes> in,
                           std::span<float, kBlockValues> out) {
  const float d = f16_bits_to_f32(load_u16(in.data()));
  const float m = q5_1_block_min(in);
  const auto q = q5_1_quants(in);
  for (int j = 0; j < kBlockValues; ++j) {
    const float scaled = d * float(q[std::size_t(j)]);
    out[j] = scaled + m;  // SPEC §4: one rounding each, never fused
  }
}

std::optional<BadBlock> quantize_row(BlockType t, std::span<const float> x,
                                     std::span<std::uint8_t> out) {
  assert(x.size() % kBlockValues == 0);
  const std::size_t blocks = x.size() / kBlockValues;
  const std::size_t bb = std::size_t(block_bytes(t));
  assert(out.size() >= blocks * bb);
  std::optional<BadBlock> first;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::span<const float, kBlockValues> in(x.data() + b * kBlockValues, kBlockValues);
    const auto bad =
        t == BlockType::q8_0
            ? quantize_q8_0_block(in, std::span<std::uint8_t, kQ8_0BlockBytes>(out.data() + b * bb, kQ8_0BlockBytes))
            : quantize_q5_1_block(in, std::span<std::uint8_t, kQ5_1BlockBytes>(out.data() + b * bb, kQ5_1BlockBytes));
    if (bad && !first) first = BadBlock{std::int64_t(b), *bad};
  }
  return first;
}

void dequantize_row(BlockType t, std::span<const std::uint8_t> in, std::span<float> out) {
  const std::size_t bb = std::size_t(block_bytes(t));
  const std::size_t blocks = in.size() / bb;
  assert(out.size() >= blocks * kBlockValues);
  for (std::size_t b = 0; b < blocks; ++b) {
    std::span<float, kBlockValues> o(out.data() + b * kBlockValues, kBlockValues);
    if (t == BlockType::q8_0)
      dequantize_q8_0_block(std::span<const std::uint8_t, kQ8_0BlockBytes>(in.data() + b * bb, kQ8_0BlockBytes), o);
    else
      dequantize_q5_1_block(std::span<const std::uint8_t, kQ5_1BlockBytes>(in.data() + b * bb, kQ5_1BlockBytes), o);
  }
}

}  // namespace kvlayer::ref
