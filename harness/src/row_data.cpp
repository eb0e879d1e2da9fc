#include "kvlayer/harness/row_data.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

namespace kvlayer::harness {
namespace {

/// The q5_1 quant of x in a block with min 0 and reciprocal scale id, as SPEC §3 demands (a
/// separate f32 multiply, then add) or as one fused multiply-add would compute it.
unsigned q5_1_quant(float x, float id, bool fused) {
  if (fused) return unsigned(std::fma(x, id, 0.5f));
  volatile float scaled = x * id;  // volatile: keep the product rounded on its own
  return unsigned(scaled + 0.5f);
}

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
    case DataKind::needles:
      for (int j = 0; j < n; ++j) x[j] = float(sigma * rng.normal());
      break;
    case DataKind::wide: {
      // A quarter of the blocks are one-sided with a zero, scales 1e-4 … 1e5: q5_1's m (0) and
      // d (max / 31) stay in fp16 while the dequantized values reach far beyond 65504. The
      // others are two-sided, scales 1e-4 … 1e4: past that their minimum leaves fp16 and the
      // block is bad (m = −inf), and a view holding one is NaN whatever the kernel did with its
      // wide blocks (DataKind::bad covers bad blocks).
      const bool one_sided = rng.range(0, 3) == 0;
      const double s = std::pow(10.0, rng.uniform() * (one_sided ? 9 : 8) - 4);
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

/// n rows of kv_dim values of `kind` (K-side tie patterns when k_side).
std::vector<float> plane_values(std::int64_t n, std::int64_t kv_dim, DataKind kind, bool k_side,
                                Rng& rng) {
  const double sigma = std::pow(10.0, rng.uniform() * 4 - 2);
  std::vector<float> values(std::size_t(n * kv_dim), 0.0f);
  for (std::int64_t b = 0; b < n * kv_dim / kBlockValues; ++b)
    fill_block(values.data() + b * kBlockValues, kind, k_side, sigma, rng);
  if (kind == DataKind::bad) {
    const std::int64_t at = rng.range(0, n * kv_dim - 1);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), 3.0e9f};
    values[std::size_t(at)] = specials[rng.range(0, 3)];
  }
  return values;
}

/// Needle rows (DataKind::needles) over gaussian planes: a score of q·K·scale ~ N(0, (σ_q·σ)²)
/// for the bulk keys of K ~ N(0, σ²) becomes g·σ·(q·u) ~ N(0, (g·σ_q·σ)²) for a needle K =
/// g·σ·√D·u (u a unit direction), so half the queries put it g standard deviations above
/// every other key.
void plant_needles(const Geometry& g, std::int64_t n, std::vector<float>& k, std::vector<float>& v,
                   Rng& rng) {
  double sigma_k = 0, sigma_v = 0;  // the planes' own scale (their RMS)
  for (const float x : k) sigma_k += double(x) * x;
  for (const float x : v) sigma_v += double(x) * x;
  sigma_k = std::sqrt(sigma_k / double(k.size()));
  sigma_v = std::sqrt(sigma_v / double(v.size()));
  const std::int64_t needles = std::min<std::int64_t>(n, rng.range(1, 3));
  for (std::int64_t j = 0; j < needles; ++j) {
    const std::int64_t row = rng.range(0, n - 1);
    for (int h = 0; h < g.n_kv_heads; ++h) {
      float* kr = k.data() + row * g.kv_dim_k() + std::int64_t(h) * g.head_dim_k;
      std::vector<double> u(std::size_t(g.head_dim_k));
      double norm = 0;
      for (double& x : u) {
        x = rng.normal();
        norm += x * x;
      }
      const double gain = (6 + 8 * rng.uniform()) * sigma_k * std::sqrt(double(g.head_dim_k));
      for (int d = 0; d < g.head_dim_k; ++d)
        kr[d] = float(gain * u[std::size_t(d)] / std::sqrt(norm));
      float* vr = v.data() + row * g.kv_dim_v() + std::int64_t(h) * g.head_dim_v;
      for (int e = 0; e < g.head_dim_v; ++e)
        vr[e] = float((rng.uniform() < 0.5 ? -4 : 4) * sigma_v);
    }
  }
}

}  // namespace

HostRows make_rows(const Geometry& g, DType dtype, std::int64_t n, std::uint64_t seed,
                   DataKind kind) {
  Rng rng(seed);
  std::vector<float> k = plane_values(n, g.kv_dim_k(), kind, true, rng);  // K draws first
  std::vector<float> v = plane_values(n, g.kv_dim_v(), kind, false, rng);
  if (kind == DataKind::needles) plant_needles(g, n, k, v, rng);
  return testing::encode_rows(std::move(k), std::move(v), n, dtype);
}

std::vector<float> make_query(const Geometry& g, int n_q_heads, std::uint64_t seed) {
  Rng rng(seed ^ 0x51ED270B7E1A5EEDull);
  const double scale = std::pow(10.0, rng.uniform() * 2 - 1);
  std::vector<float> q(std::size_t(n_q_heads) * std::size_t(g.head_dim_k));
  for (auto& x : q) x = float(scale * rng.normal());
  return q;
}

}  // namespace kvlayer::harness
