#include "mma_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvlayer/half.hpp"

namespace kvlayer::cli {
namespace {

using i128 = __int128;

/// Fixed point: x · 2^kShift. fp16 products reach down to 2^-48 and C's lowest significand bit
/// to 2^-64 (make_mma_tiles keeps |C| ≥ 2^-41 or 0); the largest sums (2^41) fit in 2^105.
constexpr int kShift = 64;

/// An exactly representable finite f32 (|x| ≥ 2^-41 or 0) in fixed point.
i128 fixed(float x) {
  if (x == 0) return 0;
  int e = 0;
  const float m = std::frexp(x, &e);                            // x = m · 2^e, |m| in [0.5, 1)
  const auto q = static_cast<std::int64_t>(std::ldexp(m, 24));  // exact: 24 bits
  const int s = e - 24 + kShift;  // x = q · 2^(e − 24) = q · 2^(s − kShift)
  return s >= 0 ? i128(q) << s : i128(q) >> -s;
}

long double to_long_double(i128 x) {
  const bool neg = x < 0;
  unsigned __int128 m =
      neg ? -static_cast<unsigned __int128>(x) : static_cast<unsigned __int128>(x);
  const long double hi = static_cast<long double>(static_cast<std::uint64_t>(m >> 64));
  const long double lo = static_cast<long double>(static_cast<std::uint64_t>(m));
  const long double v = std::ldexp(hi, 64) + lo;
  return std::ldexp(neg ? -v : v, -kShift);
}

/// The 16 products and C of element (i, j) in fixed point (the products are exact: 22 bits).
void addends(const MmaTile& t, int i, int j, i128 (&out)[MmaTile::kK + 1]) {
  for (int k = 0; k < MmaTile::kK; ++k) {
    const float a = f16_bits_to_f32(t.a[i][k]), b = f16_bits_to_f32(t.b[k][j]);
    // Each factor is q · 2^(e − 11) with 11-bit q: the product's bits are exact in 2^-48 units.
    int ea = 0, eb = 0;
    const float ma = std::frexp(a, &ea), mb = std::frexp(b, &eb);
    const auto qa = static_cast<std::int64_t>(std::ldexp(ma, 11));
    const auto qb = static_cast<std::int64_t>(std::ldexp(mb, 11));
    const int s = ea + eb - 22 + kShift;
    const i128 p = i128(qa * qb);
    out[k] = a == 0 || b == 0 ? 0 : (s >= 0 ? p << s : p >> -s);
  }
  out[MmaTile::kK] = fixed(t.c[i][j]);
}

i128 magnitude(i128 x) {
  return x < 0 ? -x : x;
}

/// floor(log2 |x|) in fixed-point units (bit index), −1 for 0.
int top_bit(i128 x) {
  unsigned __int128 m = static_cast<unsigned __int128>(magnitude(x));
  int b = -1;
  while (m != 0) {
    m >>= 1;
    ++b;
  }
  return b;
}

i128 truncate_to(i128 x, int bit) {  // toward zero, to a multiple of 2^bit (bit ≥ 0)
  if (bit <= 0) return x;
  const i128 m = (magnitude(x) >> bit) << bit;
  return x < 0 ? -m : m;
}

std::uint64_t mix(std::uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Element (i, j)'s exact Σ addends and Σ|addends| in fixed point.
struct FixedDot {
  i128 sum = 0, abs_sum = 0;
};
FixedDot fixed_dot(const MmaTile& t, int i, int j) {
  i128 add[MmaTile::kK + 1];
  addends(t, i, j, add);
  FixedDot d;
  for (const i128 x : add) {
    d.sum += x;
    d.abs_sum += magnitude(x);
  }
  return d;
}

}  // namespace

ExactDot exact_dot(const MmaTile& t, int i, int j) {
  const FixedDot d = fixed_dot(t, i, j);
  return {to_long_double(d.sum), to_long_double(d.abs_sum)};
}

double error_ratio(const MmaTile& t, int i, int j, float got) {
  if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
  const auto [sum, abs_sum] = fixed_dot(t, i, j);
  // got is an f32 near the sum: exact in fixed point unless it is below 2^-41 (then the long
  // double difference is accurate to far below what the ratio resolves).
  const long double err = std::fabs(got) >= 0x1p-41f || got == 0
                              ? std::fabs(to_long_double(fixed(got) - sum))
                              : std::fabs(static_cast<long double>(got) - to_long_double(sum));
  const long double denom = std::ldexp(to_long_double(abs_sum), -24);
  return denom > 0 ? static_cast<double>(err / denom) : (err == 0 ? 0.0 : HUGE_VAL);
}

float truncation_model(const MmaTile& t, int i, int j, int p) {
  i128 add[MmaTile::kK + 1];
  addends(t, i, j, add);
  int e_max = -1;
  for (const i128 x : add) e_max = std::max(e_max, top_bit(x));
  if (e_max < 0) return 0.0f;
  i128 sum = 0;
  for (const i128 x : add) sum += truncate_to(x, e_max - p + 1);
  const int top = top_bit(sum);
  if (top < 0) return 0.0f;
  sum = truncate_to(sum, top - 23);
  return static_cast<float>(to_long_double(sum));
}

std::vector<MmaTile> make_mma_tiles(int n, std::uint64_t seed) {
  std::vector<MmaTile> tiles(static_cast<std::size_t>(n));
  std::uint64_t counter = 0;
  const auto next = [&] { return mix(seed * 0x9E3779B97F4A7C15ull + ++counter); };
  const auto uniform = [&](int lo, int hi) {  // integer in [lo, hi]
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  // A random fp16 of exponent in [lo, hi] (normal numbers), random sign and significand.
  const auto f16 = [&](int lo, int hi) {
    const float m = 1.0f + static_cast<float>(next() % 1024) / 1024.0f;
    const float x = std::ldexp(m, uniform(lo, hi));
    return f32_to_f16_bits(next() & 1 ? -x : x);
  };
  for (int ti = 0; ti < n; ++ti) {
    MmaTile& t = tiles[static_cast<std::size_t>(ti)];
    const int kind = ti % kMmaTileKinds;
    for (int k = 0; k < MmaTile::kK; ++k)
      for (int j = 0; j < MmaTile::kN; ++j)
        t.b[k][j] = kind == 0 ? f32_to_f16_bits(float(uniform(-8, 8))) : f16(-6, 4);
    for (int i = 0; i < MmaTile::kM; ++i) {
      for (int k = 0; k < MmaTile::kK; ++k) {
        if (kind == 0)
          t.a[i][k] = f32_to_f16_bits(float(uniform(-8, 8)));
        else if (kind == 3)
          t.a[i][k] = k == i % MmaTile::kK ? f16(6, 8) : f16(-14, -4);
        else
          t.a[i][k] = f16(-14, 8);
      }
      for (int j = 0; j < MmaTile::kN; ++j) {
        float c = 0;
        if (kind == 0) {
          c = float(uniform(-64, 64));
        } else if (kind == 1) {
          const float m = 1.0f + static_cast<float>(next() % (1u << 23)) / float(1u << 23);
          c = std::ldexp(next() & 1 ? -m : m, uniform(-20, 12));
        } else if (kind == 2) {
          t.c[i][j] = 0;
          c = -static_cast<float>(exact_dot(t, i, j).value);  // RN to f32, then negated
          if (c != 0 && std::fabs(c) < 0x1p-41f) c = 0;
        } else {
          const float m = 1.0f + static_cast<float>(next() % (1u << 23)) / float(1u << 23);
          c = next() % 2 ? 0.0f : std::ldexp(next() & 1 ? -m : m, uniform(8, 16));
        }
        t.c[i][j] = c;
      }
    }
  }
  return tiles;
}

}  // namespace kvlayer::cli
