#include "kvlayer/harness/row_data.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "kvlayer/half.hpp"

namespace kvlayer::harness {

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform() {
  return double(next() >> 11) * 0x1.0p-53;
}

std::int64_t Rng::range(std::int64_t lo, std::int64_t hi) {
  return lo + std::int64_t(next() % std::uint64_t(hi - lo + 1));
}

double Rng::normal() {
  const double u1 = 1.0 - uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace {

/// Rounds to what dtype can hold, and writes the encoding.
float encode(float x, DType dtype, std::uint8_t* out) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(out, &x, 4);
      return x;
    case DType::f16: {
      const std::uint16_t h = f32_to_f16_bits(x);
      std::memcpy(out, &h, 2);
      return f16_bits_to_f32(h);
    }
    case DType::bf16: {
      const std::uint16_t b = f32_to_bf16_bits(x);
      std::memcpy(out, &b, 2);
      return bf16_bits_to_f32(b);
    }
  }
  return x;
}

/// The q5_1 quant of x in a block with min 0 and reciprocal scale id, as SPEC §3 demands (a
/// separate f32 multiply, then add) or as one fused multiply-add would compute it.
unsigned q5_1_quant(float x, float id, bool fused) {
  if (fused) return unsigned(std::fma(x, id, 0.5f));
  volatile float scaled = x * id;  // volatile: keep the product rounded on its own
  return unsigned(scaled + 0.5f);
}

/// A q5_1 block (min 0 at lane 1, max at lane 0) whose other lanes sit where the separate
/// multiply-then-add and a fused multiply-add give different quants, so that an FMA-contracted
/// quantizer is caught (only f32 inputs keep these values exactly).
/// A value near (m − 0.5)·d where the two computations differ, or nullopt.
std::optional<float> fma_sensitive_near(int m, float d, float id, float hi) {
  float below = (float(m) - 0.5f) * d, above = below;
  for (int step = 0; step < 24; ++step) {  // walk outwards one ulp at a time
    below = std::nextafter(below, 0.0f);
    above = std::nextafter(above, hi);
    if (q5_1_quant(below, id, false) != q5_1_quant(below, id, true)) return below;
    if (q5_1_quant(above, id, false) != q5_1_quant(above, id, true)) return above;
  }
  return std::nullopt;
}

/// A q5_1 block (min 0 at lane 1, max at lane 0) whose other lanes sit where the separate
/// multiply-then-add and a fused multiply-add give different quants, so that an FMA-contracted
/// quantizer is caught (only f32 inputs keep these values exactly).
/// NOTE: the two differ only where the separate sum lands on an exact tie that rounds (to even)
/// up to a power of two m, i.e. (x − min)·id just below m − 0.5, m in {1, 2, 4, 8, 16}; not
/// every scale has such a value, so the maximum is redrawn until one does.
void fill_fma_sensitive_q5_1(float* x, Rng& rng) {
  constexpr int kPowers[] = {1, 2, 4, 8, 16};
  float hi = 1.0f, d = hi / 31.0f, id = 1.0f / d;
  for (int attempt = 0; attempt < 32; ++attempt) {
    hi = float(0.5 + 1.5 * rng.uniform());
    d = hi / 31.0f;
    id = 1.0f / d;
    if (fma_sensitive_near(kPowers[rng.range(0, 4)], d, id, hi)) break;
  }
  x[0] = hi;
  x[1] = 0.0f;
  for (int j = 2; j < kBlockValues; ++j) {
    const int m = kPowers[rng.range(0, 4)];
    x[j] = fma_sensitive_near(m, d, id, hi).value_or((float(m) - 0.5f) * d);
  }
}

/// Fills one 32-value block according to kind. `k_side` picks q8_0 or q5_1 tie patterns.
void fill_block(float* x, DataKind kind, bool k_side, double sigma, Rng& rng) {
  constexpr int n = kBlockValues;
  switch (kind) {
    case DataKind::gaussian:
    case DataKind::bad:
      for (int j = 0; j < n; ++j) x[j] = float(sigma * rng.normal());
      break;
    case DataKind::wide: {
      // Scales 1e-4 … 1e5. A quarter of the blocks are one-sided with a zero: q5_1's m (0) and
      // d (max / 31) stay in fp16 while the dequantized values reach far beyond 65504.
      const double s = std::pow(10.0, rng.uniform() * 9 - 4);
      const bool one_sided = rng.range(0, 3) == 0;
      for (int j = 0; j < n; ++j)
        x[j] = float(one_sided ? std::fabs(s * rng.normal()) : s * rng.normal());
      if (one_sided) x[rng.range(0, n - 1)] = 0.0f;
      break;
    }
    case DataKind::integers:
      for (int j = 0; j < n; ++j) x[j] = float(rng.range(-20, 20));
      break;
    case DataKind::ties:
      // q8_0: amax 127 → d = 1 exactly, so x·id = k + 0.5 is an exact tie.
      // q5_1: min 0, max 31 → d = 1, so (x − min)·id + 0.5 lands exactly on an integer.
      for (int j = 0; j < n; ++j) {
        if (k_side)
          x[j] = float((rng.range(0, 125) + 0.5) * (rng.next() & 1 ? 1 : -1));
        else
          x[j] = float(rng.range(0, 29) + 0.5);
      }
      if (k_side) {
        x[rng.range(0, n - 1)] = rng.next() & 1 ? 127.0f : -127.0f;
      } else if (rng.next() & 1) {
        x[0] = 31.0f;
        x[1] = 0.0f;
      } else {
        fill_fma_sensitive_q5_1(x, rng);
      }
      break;
    case DataKind::constant: {
      const float c = rng.next() % 3 == 0 ? 0.0f : float(sigma * rng.normal());
      for (int j = 0; j < n; ++j) x[j] = c;
      break;
    }
    case DataKind::tiny:
      for (int j = 0; j < n; ++j) x[j] = float(rng.normal() * 1e-38);
      break;
  }
}

void fill_plane(std::vector<float>& values, std::vector<std::uint8_t>& bytes, std::int64_t n,
                std::int64_t kv_dim, DType dtype, DataKind kind, bool k_side, Rng& rng) {
  const double sigma = std::pow(10.0, rng.uniform() * 4 - 2);
  values.assign(std::size_t(n * kv_dim), 0.0f);
  for (std::int64_t b = 0; b < n * kv_dim / kBlockValues; ++b)
    fill_block(values.data() + b * kBlockValues, kind, k_side, sigma, rng);
  if (kind == DataKind::bad) {
    const std::int64_t at = rng.range(0, n * kv_dim - 1);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), 3.0e9f};
    values[std::size_t(at)] = specials[rng.range(0, 3)];
  }
  bytes.assign(values.size() * dtype_size(dtype), 0);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = encode(values[i], dtype, bytes.data() + i * dtype_size(dtype));
}

}  // namespace

HostRows make_rows(const Geometry& g, DType dtype, std::int64_t n, std::uint64_t seed,
                   DataKind kind) {
  Rng rng(seed);
  HostRows rows;
  rows.n = n;
  rows.dtype = dtype;
  fill_plane(rows.k, rows.k_bytes, n, g.kv_dim_k(), dtype, kind, true, rng);
  fill_plane(rows.v, rows.v_bytes, n, g.kv_dim_v(), dtype, kind, false, rng);
  return rows;
}

std::vector<float> make_query(const Geometry& g, int n_q_heads, std::uint64_t seed) {
  Rng rng(seed ^ 0x51ED270B7E1A5EEDull);
  const double scale = std::pow(10.0, rng.uniform() * 2 - 1);
  std::vector<float> q(std::size_t(n_q_heads) * std::size_t(g.head_dim_k));
  for (auto& x : q) x = float(scale * rng.normal());
  return q;
}

}  // namespace kvlayer::harness
