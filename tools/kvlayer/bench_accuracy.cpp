#include "bench_accuracy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>

namespace kvlayer::cli {
namespace {

// Known E4M3 encodings (OCP FP8 spec, table of E4M3 values), checked at compile time.
static_assert(f32_to_e4m3_bits(1.0f) == 0x38 && f32_to_e4m3_bits(-1.0f) == 0xB8);
static_assert(f32_to_e4m3_bits(0.5f) == 0x30 && f32_to_e4m3_bits(2.0f) == 0x40);
static_assert(f32_to_e4m3_bits(240.0f) == 0x77 && f32_to_e4m3_bits(256.0f) == 0x78);
static_assert(f32_to_e4m3_bits(448.0f) == 0x7E && f32_to_e4m3_bits(-448.0f) == 0xFE);
static_assert(f32_to_e4m3_bits(0.015625f) == 0x08);     // 2^-6, smallest normal
static_assert(f32_to_e4m3_bits(0.001953125f) == 0x01);  // 2^-9, smallest subnormal
static_assert(f32_to_e4m3_bits(0.3f) == 0x2A);          // 1.2 * 2^-2 -> 1.25 * 2^-2
static_assert(f32_to_e4m3_bits(0.0f) == 0x00 && f32_to_e4m3_bits(-0.0f) == 0x80);
// Ties go to the even code, carries move up an exponent.
static_assert(f32_to_e4m3_bits(1.0625f) == 0x38);        // between 1 and 1.125
static_assert(f32_to_e4m3_bits(1.1875f) == 0x3A);        // between 1.125 and 1.25
static_assert(f32_to_e4m3_bits(3.875f) == 0x48);         // between 3.75 (0x47) and 4
static_assert(f32_to_e4m3_bits(0.0009765625f) == 0x00);  // 2^-10: between 0 and 2^-9
static_assert(f32_to_e4m3_bits(0.0029296875f) == 0x02);  // 1.5 * 2^-9
static_assert(f32_to_e4m3_bits(0.0146484375f) == 0x08);  // 7.5 * 2^-9: subnormal 7 -> 2^-6
// Just off a tie: to the nearer side.
static_assert(f32_to_e4m3_bits(std::bit_cast<float>(0x3F880001u)) == 0x39);  // 1.0625 + ulp
static_assert(f32_to_e4m3_bits(std::bit_cast<float>(0x3F87FFFFu)) == 0x38);  // 1.0625 - ulp
// Saturation (no infinities in E4M3): 464 is the tie with the NaN code's 480.
static_assert(f32_to_e4m3_bits(464.0f) == 0x7E && f32_to_e4m3_bits(1e9f) == 0x7E);
static_assert(f32_to_e4m3_bits(std::numeric_limits<float>::infinity()) == 0x7E);
static_assert(f32_to_e4m3_bits(-std::numeric_limits<float>::infinity()) == 0xFE);
static_assert(f32_to_e4m3_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7F);
static_assert(f32_to_e4m3_bits(1e-30f) == 0x00 && f32_to_e4m3_bits(-1e-30f) == 0x80);
static_assert(e4m3_bits_to_f32(0x7E) == 448.0f && e4m3_bits_to_f32(0x01) == 0.001953125f);
static_assert(e4m3_bits_to_f32(0x2A) == 0.3125f && e4m3_bits_to_f32(0xC4) == -3.0f);
// Every finite code decodes and re-encodes to itself.
static_assert([] {
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7F) != 0x7F && f32_to_e4m3_bits(e4m3_bits_to_f32(std::uint8_t(b))) != b)
      return false;
  return true;
}());
// fp16 through half.hpp's conversion.
static_assert(round_f16(1.0f + 0x1p-12f) == 1.0f &&
              round_f16(1.0f + 0x1p-11f + 0x1p-12f) == 1.0f + 0x1p-10f);

std::uint64_t mix(std::uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<float> round_to(std::span<const float> x, KvFormat format) {
  std::vector<float> r(x.begin(), x.end());
  if (format == KvFormat::e4m3)
    for (float& f : r) f = round_e4m3(f);
  else if (format == KvFormat::f16)
    for (float& f : r) f = round_f16(f);
  return r;
}

namespace {

/// One query position's attention (attention_f64) over the first `keys` keys: q and out are
/// that query's [n_kv_heads * gqa, head_dim].
void attend(const AttentionInput& in, std::int64_t keys, const float* q, bool q_f16, double* out) {
  const int d = in.head_dim, gqa = in.gqa, n_kv = in.n_kv_heads;
  std::vector<double> qt(std::size_t(d) * gqa);    // [dim][query head of the group]
  std::vector<double> s(std::size_t(keys) * gqa);  // [key][query head]
  std::vector<double> acc(std::size_t(gqa) * d);   // [query head][dim]
  for (int h = 0; h < n_kv; ++h) {
    for (int j = 0; j < gqa; ++j)
      for (int e = 0; e < d; ++e) {
        const float qv = q[(std::size_t(h) * gqa + j) * d + e];
        qt[std::size_t(e) * gqa + j] = q_f16 ? double(round_f16(qv)) : double(qv);
      }
    // The inner loops run over independent accumulators (query heads, dims), so they vectorize
    // without reassociating any sum.
    for (std::int64_t t = 0; t < keys; ++t) {
      const float* kr = in.k.data() + (std::size_t(t) * n_kv + h) * d;
      double* st = s.data() + std::size_t(t) * gqa;
      for (int j = 0; j < gqa; ++j) st[j] = 0;
      for (int e = 0; e < d; ++e) {
        const double kv = kr[e];
        const double* qe = qt.data() + std::size_t(e) * gqa;
        for (int j = 0; j < gqa; ++j) st[j] += qe[j] * kv;
      }
    }
    std::vector<double> m(gqa, -std::numeric_limits<double>::infinity()), l(gqa, 0.0);
    for (std::int64_t t = 0; t < keys; ++t)
      for (int j = 0; j < gqa; ++j) {
        double& x = s[std::size_t(t) * gqa + j];
        x *= in.scale;
        m[j] = std::max(m[j], x);
      }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::int64_t t = 0; t < keys; ++t) {
      const float* vr = in.v.data() + (std::size_t(t) * n_kv + h) * d;
      for (int j = 0; j < gqa; ++j) {
        const double p = std::exp(s[std::size_t(t) * gqa + j] - m[j]);
        l[j] += p;
        double* a = acc.data() + std::size_t(j) * d;
        for (int e = 0; e < d; ++e) a[e] += p * double(vr[e]);
      }
    }
    for (int j = 0; j < gqa; ++j)
      for (int e = 0; e < d; ++e)
        out[(std::size_t(h) * gqa + j) * d + e] = acc[std::size_t(j) * d + e] / l[j];
  }
}

}  // namespace

std::vector<double> attention_f64(const AttentionInput& in, bool q_f16) {
  const std::size_t per_query = std::size_t(in.n_kv_heads) * in.gqa * in.head_dim;
  std::vector<double> out(per_query * std::size_t(in.queries), 0.0);
  for (int i = 0; i < in.queries; ++i)
    attend(in, in.keys - in.queries + i + 1, in.q.data() + per_query * i, q_f16,
           out.data() + per_query * i);
  return out;
}

ErrorStats error_stats(std::span<const double> ref, std::span<const double> got) {
  ErrorStats r;
  double se = 0, sr = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    // NaN compares false: count it as an infinite error instead of dropping it.
    r.max_abs_err = err <= r.max_abs_err ? r.max_abs_err : err == err ? err : HUGE_VAL;
    se += err == err ? err * err : HUGE_VAL;
    sr += ref[i] * ref[i];
    r.ref_max_abs = std::max(r.ref_max_abs, std::fabs(ref[i]));
  }
  const double n = double(std::max<std::size_t>(1, ref.size()));
  r.rms_err = std::sqrt(se / n);
  r.ref_rms = std::sqrt(sr / n);
  return r;
}

void fill_normal(std::span<float> out, std::uint64_t seed) {
  constexpr double kTwoPi = 2 * std::numbers::pi;
  const std::uint64_t base = mix(seed + 0x9E3779B97F4A7C15ull);
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const std::uint64_t h = mix(base ^ (std::uint64_t(i) * 0xD1B54A32D192ED03ull));
    // Two 32-bit uniforms in (0, 1] and [0, 1): the log never sees 0.
    const double u1 = (double(h >> 32) + 1.0) * 0x1p-32;
    const double u2 = double(h & 0xFFFFFFFFu) * 0x1p-32;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = float(r * std::cos(kTwoPi * u2));
    if (i + 1 < out.size()) out[i + 1] = float(r * std::sin(kTwoPi * u2));
  }
}

int outlier_channel(int head, int j, int head_dim) {
  const int quarter = head_dim / 4;
  return j * quarter + (5 + 11 * head) % quarter;
}

void scale_outlier_channels(std::span<float> k, int n_kv_heads, int head_dim) {
  const std::size_t row = std::size_t(n_kv_heads) * head_dim;
  for (std::size_t t = 0; t < k.size() / row; ++t)
    for (int h = 0; h < n_kv_heads; ++h)
      for (int j = 0; j < kOutlierChannels; ++j)
        k[t * row + std::size_t(h) * head_dim + std::size_t(outlier_channel(h, j, head_dim))] *=
            kOutlierScales[j];
}

}  // namespace kvlayer::cli
