// Host side of `kvlayer bench`'s accuracy rows: the attention output of a KV cache format
// against a float64 attention over the unquantized f32 values. kvlayer's q8_0/q5_1 output comes
// from the GPU decode (bench_command.cpp); the fp8 e4m3 and fp16 caches the peers use are
// emulated here: K/V rounded to the format, q rounded to fp16 (every peer takes an fp16 query,
// and kvlayer's decode rounds q to fp16 too, accuracy.hpp (1)), then the same float64 attention.
// The emulation leaves out the peers' own kernel arithmetic (fp16 p, f32 sums), so its error is
// what the cache format alone costs: a lower bound on a peer's actual error.
// No CUDA here, so that the math can be checked on a machine without a GPU.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvlayer/half.hpp"

namespace kvlayer::cli {

/// f32 -> OCP FP8 E4M3 ("e4m3fn": bias 7, 3 mantissa bits, no infinities, 0x7F/0xFF NaN,
/// largest finite ±448), round-to-nearest-even, saturating: |f| > 448 and ±Inf give ±448
/// (CUDA's __NV_SATFINITE; torch's .to(float8_e4m3fn) gives NaN from 480 instead, which random
/// data at scale 1 never reaches). NaN gives 0x7F with f's sign.
constexpr std::uint8_t f32_to_e4m3_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint8_t sign = std::uint8_t((x >> 24) & 0x80u);
  const std::uint32_t exp = (x >> 23) & 0xFFu;
  const std::uint32_t mant = x & 0x7FFFFFu;
  constexpr std::uint8_t kMax = 0x7E;  // 1.75 * 2^8 = 448
  if (exp == 0xFF) return std::uint8_t(sign | (mant ? 0x7Fu : kMax));
  if (exp == 0) return sign;         // f32 zero or subnormal: far below half the smallest e4m3 step
  const int e = int(exp) - 127 + 7;  // biased e4m3 exponent
  if (e >= 16) return std::uint8_t(sign | kMax);
  const std::uint32_t m = mant | 0x800000u;  // 24-bit significand
  std::uint32_t r = 0, rest = 0, halfway = 0;
  if (e <= 0) {
    // Subnormal result, in units of 2^-9: m * 2^(exp - 150 + 9) = m >> (21 - e).
    const int shift = 21 - e;
    if (shift > 24) return sign;  // below half of 2^-9
    r = m >> shift;
    rest = m & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1);
  } else {
    r = (std::uint32_t(e) << 3) | (mant >> 20);
    rest = mant & 0xFFFFFu;
    halfway = 0x80000u;
  }
  // A carry out of the mantissa moves to the next exponent (subnormal 8 is the smallest
  // normal, 0x08): still the nearest value.
  if (rest > halfway || (rest == halfway && (r & 1u))) ++r;
  return std::uint8_t(sign | (r > kMax ? kMax : r));
}

/// E4M3 bits -> f32 (exact).
constexpr float e4m3_bits_to_f32(std::uint8_t b) {
  const std::uint32_t sign = std::uint32_t(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> 3) & 0xFu;
  const std::uint32_t m = b & 0x7u;
  if (exp == 0xF && m == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (exp == 0) {
    const float mag = float(m) * 0.001953125f;  // m * 2^-9
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (m << 20));
}

constexpr float round_e4m3(float f) {
  return e4m3_bits_to_f32(f32_to_e4m3_bits(f));
}
constexpr float round_f16(float f) {
  return f16_bits_to_f32(f32_to_f16_bits(f));
}

/// The KV cache formats of the accuracy rows.
enum class KvFormat { exact, e4m3, f16 };
/// Every value of `x` rounded through the format (a copy for exact).
std::vector<float> round_to(std::span<const float> x, KvFormat format);

/// One batch-1 decode, or a verify of `queries` = T (SPEC §11): q [T, n_kv_heads * gqa,
/// head_dim], K and V [keys, n_kv_heads, head_dim] (kvlayer's row layout); query head h attends
/// KV head h / gqa, and query i (position keys − T + i) the keys [0, keys − T + i] (causal).
struct AttentionInput {
  int n_kv_heads = 1, head_dim = 128, gqa = 1;
  std::int64_t keys = 0;
  std::span<const float> q, k, v;
  double scale = 0;  ///< softmax scale (kvlayer's default: f32 1/sqrt(head_dim))
  int queries = 1;   ///< T ≥ 1, at most keys
};

/// softmax(scale * q·K) · V in float64 over each query's keys, q first rounded to fp16 when
/// `q_f16`: [T, n_kv_heads * gqa, head_dim].
std::vector<double> attention_f64(const AttentionInput& in, bool q_f16);

/// An output against the float64 reference over the unquantized values.
struct ErrorStats {
  double max_abs_err = 0;
  double rms_err = 0;
  double ref_rms = 0;
  double ref_max_abs = 0;
  /// RMS error relative to the RMS of the reference output.
  double rel_rms_err() const { return ref_rms > 0 ? rms_err / ref_rms : 0; }
};
/// A non-finite `got` value makes max_abs_err and rms_err infinite.
ErrorStats error_stats(std::span<const double> ref, std::span<const double> got);

/// n values ~ N(0, 1) (Box-Muller on a counter-based hash of (seed, index)): the same values
/// on every machine and in every run.
void fill_normal(std::span<float> out, std::uint64_t seed);

/// The second data set's K: in every KV head, kOutlierChannels channels scaled by
/// kOutlierScales (real post-RoPE K has a few channels 10-50x the others). Channel j of head h
/// is j * head_dim / 4 + 5 + 11 * h (mod head_dim / 4): one per quarter of the head, so that
/// each lands in a different q8_0 block and the heads differ.
inline constexpr int kOutlierChannels = 4;
inline constexpr float kOutlierScales[kOutlierChannels] = {10, 20, 30, 50};
int outlier_channel(int head, int j, int head_dim);
inline constexpr std::string_view kOutlierDescription =
    "k_outliers: in every KV head h, channels j*d/4 + (5 + 11h) mod d/4 (j = 0..3) scaled by "
    "10, 20, 30, 50";
/// k [keys, n_kv_heads, head_dim]: scales the outlier channels in place.
void scale_outlier_channels(std::span<float> k, int n_kv_heads, int head_dim);

/// What the accuracy rows measure, for the JSON and the printed table.
inline constexpr std::string_view kAccuracyMethod =
    "attention-output error against a float64 attention over the unquantized f32 q, K, V "
    "(softmax scale f32 1/sqrt(head_dim)); T = 8 rows: a verify of the last 8 positions, each "
    "query causal over the keys up to its own. q8_0/q5_1: kvlayer's GPU decode_dc (T = 1) or "
    "decode_rows_dc (T = 8) output, copied back. e4m3 (per-tensor scale 1, as peers.py's "
    "FlashInfer/XQA fp8 rows; round-to-nearest-"
    "even, saturating at +-448) and f16 (round-to-nearest-even): emulated on the host, K/V "
    "rounded to the format and q to fp16, then the float64 attention; the peers' own kernel "
    "arithmetic is not emulated, so those errors are lower bounds. rel_rms_err = RMS(out - ref) "
    "/ RMS(ref) over every query head and dim.";

}  // namespace kvlayer::cli
