// The declared statistical check's noise model (kvlayer/accuracy.hpp (N0)–(N4)):
// DecodeBound::expected and ::sigma from ref::decode_bound, each term on a case built to isolate
// it, and the q5_1 values the tensor-core kernels multiply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

const double u16 = std::ldexp(1.0, -11);

/// A tensor-core launch shape: one split of `keys` keys.
AccumulationShape tensor_core_shape(std::int64_t keys) {
  return AccumulationShape{keys, 1, (keys + 15) / 16 + 1, true, (keys + 63) / 64};
}

/// The fused fp16 values of one stored V row (KV head 0), as the kernels multiply them.
std::vector<double> fused_row(const KvLayer& l, std::int64_t row, int head_dim) {
  std::vector<double> out(static_cast<std::size_t>(head_dim));
  const auto bytes = l.head_bytes(Plane::v, row, 0);
  for (int b = 0; b < head_dim / kBlockValues; ++b)
    kvlayer::ref::dequantize_q5_1_block_fused_f16(
        std::span<const std::uint8_t, kQ5_1BlockBytes>(bytes.data() + b * kQ5_1BlockBytes,
                                                       kQ5_1BlockBytes),
        std::span<double, kBlockValues>(out.data() + b * kBlockValues, kBlockValues));
  return out;
}

/// A one-KV-head layer whose key t lies along one random unit direction u with score
/// scores[t] for the query q = √D·u (gqa 1), V ~ N(0, 1) (no block near fp16's range).
struct AlignedKeys {
  KvLayer layer;
  std::vector<float> q;
  /// p_t from the stored (quantized) keys and fp16(q), as the reference computes it.
  std::vector<double> p() const;
};

AlignedKeys aligned_keys(const std::vector<double>& scores, int D, Rng& rng) {
  const auto n = std::int64_t(scores.size());
  const Geometry g = flat_geometry(1, D, D, n);
  std::vector<double> u(static_cast<std::size_t>(D));
  double norm = 0;
  for (double& x : u) {
    x = rng.normal();
    norm += x * x;
  }
  HostRows r = random_rows(g, n, rng);
  for (float& x : r.v) x = float(rng.normal());
  AlignedKeys a{KvLayer(g), std::vector<float>(static_cast<std::size_t>(D))};
  for (int d = 0; d < D; ++d) {
    const double ud = u[std::size_t(d)] / std::sqrt(norm);
    for (std::int64_t t = 0; t < n; ++t)
      r.k[std::size_t(t * D + d)] = float(scores[std::size_t(t)] * ud);
    a.q[std::size_t(d)] = float(std::sqrt(double(D)) * ud);
  }
  a.layer.append(r.f32_view());
  return a;
}

std::vector<double> AlignedKeys::p() const {
  const int D = layer.geometry().head_dim_k;
  const std::int64_t n = layer.len();
  std::vector<double> s(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    const auto k = layer.dequantized_row(Plane::k, t);
    for (int d = 0; d < D; ++d)
      s[std::size_t(t)] += double(k[std::size_t(d)]) *
                           f16_bits_to_f32(f32_to_f16_bits(q[std::size_t(d)])) /
                           std::sqrt(double(D));
  }
  const double top = *std::max_element(s.begin(), s.end());
  double total = 0;
  for (double& x : s) total += (x = std::exp(x - top));
  for (double& x : s) x /= total;
  return s;
}

TEST(RoundToF16, MatchesTheF32ConversionAndRoundsTiesToEven) {
  Rng rng(fresh_seed());
  for (int i = 0; i < 100000; ++i) {
    const float x = float(std::ldexp(rng.normal(), int(rng.uniform() * 44) - 28));
    ASSERT_EQ(kvlayer::ref::round_to_f16(x), double(f16_bits_to_f32(f32_to_f16_bits(x)))) << x;
  }
  EXPECT_EQ(kvlayer::ref::round_to_f16(1 + std::ldexp(1.0, -11)), 1.0);  // tie: to even
  EXPECT_EQ(kvlayer::ref::round_to_f16(1 + 3 * std::ldexp(1.0, -11)), 1 + std::ldexp(1.0, -9));
  // A double just above a tie rounds up (f32 first would have rounded it to the tie).
  EXPECT_EQ(kvlayer::ref::round_to_f16(1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)),
            1 + std::ldexp(1.0, -10));
  EXPECT_EQ(kvlayer::ref::round_to_f16(std::ldexp(3.0, -26)), std::ldexp(1.0, -24));  // subnormal
  EXPECT_EQ(kvlayer::ref::round_to_f16(65519.0), 65504.0);
  EXPECT_EQ(kvlayer::ref::round_to_f16(-65520.0), -INFINITY);
}

TEST(NoiseModel, SigmaIsBelowTheBoundAndFarBelowItAtALongView) {
  // The model takes each rounding at its RMS, independent, where the bound takes it at its worst
  // and aligned: never above the bound's allowance, and at 4096 keys of N(0, 1) data a small
  // fraction of it, as sqrt(keys) predicts.
  const Geometry g = flat_geometry(1, 64, 64, 4096);
  KvLayer l(g);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<float> k(std::size_t(4096 * g.kv_dim_k())), v(std::size_t(4096 * g.kv_dim_v()));
  for (float& x : k) x = float(rng.normal());
  for (float& x : v) x = float(rng.normal());
  l.append(encode_rows(std::move(k), std::move(v), 4096, DType::f32).f32_view());
  const auto q = random_query(g, 2, rng);
  for (const bool tensor_core : {true, false}) {
    const AccumulationShape shape{256, 16, 17, tensor_core, tensor_core ? 4 : 0};
    const auto b = kvlayer::ref::decode_bound(l, q, 2, std::nullopt, {0, 4096, 0}, shape);
    ASSERT_EQ(b.sigma.size(), b.bound.size());
    ASSERT_EQ(b.expected.size(), b.bound.size());
    double widest = 0;
    for (std::size_t i = 0; i < b.bound.size(); ++i) {
      ASSERT_GT(b.sigma[i], 0.0) << i;
      widest = std::max(widest, b.sigma[i] / (b.bound[i] - b.exact_q[i]));
    }
    EXPECT_LT(widest, 1.0 / 8) << "tensor_core " << tensor_core;
  }
}

TEST(NoiseModel, ExpectedMultipliesTheValuesTheKernelsMultiply) {
  // One key: p = 1, so expected is that key's V as the path multiplies it (N0): fused to fp16
  // on tensor cores, the f32 dequantization on CUDA cores.
  const Geometry g = flat_geometry(1, 64, 64, 4);
  KvLayer l(g);
  Rng rng(fresh_seed());
  // A row some of whose values fp16 does not hold (about 1 in 300 varied rows it holds all).
  for (int attempt = 0; attempt < 100; ++attempt) {
    l = KvLayer(g);
    l.append(random_rows(g, 1, rng).f32_view());
    const auto f = l.dequantized_row(Plane::v, 0);
    const auto h = fused_row(l, 0, 64);
    if (!std::equal(h.begin(), h.end(), f.begin(), [](double a, float b) { return a == b; })) break;
  }
  const auto q = random_query(g, 1, rng);
  const auto f32 = l.dequantized_row(Plane::v, 0);
  const auto fused = fused_row(l, 0, 64);
  const auto tc =
      kvlayer::ref::decode_bound(l, q, 1, std::nullopt, {0, 1, 0}, tensor_core_shape(1));
  AccumulationShape cc;
  const auto cuda_core = kvlayer::ref::decode_bound(l, q, 1, std::nullopt, {0, 1, 0}, cc);
  int differ = 0;
  for (int e = 0; e < 64; ++e) {
    EXPECT_EQ(tc.expected[std::size_t(e)], fused[std::size_t(e)]) << e;
    EXPECT_EQ(cuda_core.expected[std::size_t(e)], double(f32[std::size_t(e)])) << e;
    differ += fused[std::size_t(e)] != double(f32[std::size_t(e)]);
  }
  EXPECT_GT(differ, 0) << "no value changed by its fp16 rounding: the case proves nothing";
}

TEST(NoiseModel, AKeyAtTheTopOfItsFrameIsNotRounded) {
  // Two keys scoring 4 and 3: in frames of one key each both p are e^0 = 1, exact; in one frame
  // the second key's p = e^-1 is rounded to fp16, and (N1) adds exactly u16²/3·p̂²·V² for it.
  const int D = 64;
  Rng rng(fresh_seed());
  const AlignedKeys a = aligned_keys({4, 3}, D, rng);
  const auto apart =
      kvlayer::ref::decode_bound(a.layer, a.q, 1, std::nullopt, {0, 2, 0}, tensor_core_shape(1));
  const auto together =
      kvlayer::ref::decode_bound(a.layer, a.q, 1, std::nullopt, {0, 2, 0}, tensor_core_shape(2));
  const auto v1 = fused_row(a.layer, 1, D);
  const double p1 = a.p()[1];  // near e^-1 / (1 + e^-1); K is quantized
  double added = 0, predicted = 0;
  for (int e = 0; e < D; ++e) {
    added += std::pow(together.sigma[std::size_t(e)], 2) - std::pow(apart.sigma[std::size_t(e)], 2);
    predicted += u16 * u16 / 3 * std::pow(p1 * v1[std::size_t(e)], 2);
  }
  EXPECT_NEAR(added, predicted, 0.01 * predicted);
  // Apart, both p exact: what is left (score errors, chains) is far below that one rounding.
  double left = 0;
  for (int e = 0; e < D; ++e) left += std::pow(apart.sigma[std::size_t(e)], 2);
  EXPECT_LT(left, predicted / 100);
}

TEST(NoiseModel, AFrameReachesMaxKeysPerSplitMinusOneKeysEachWay) {
  // Scores 5 at key 0 and 4 at key 4, −3 elsewhere: with splits of 5 keys a frame may hold keys
  // 0 and 4 (4 apart), so key 4's p may be e^-1 and rounded; with splits of 4 it cannot, and key
  // 4 tops every frame that holds it. Between the two, (N1) differs by key 4's term alone.
  const int D = 64, n = 8;
  Rng rng(fresh_seed());
  const AlignedKeys a = aligned_keys({5, -3, -3, -3, 4, -3, -3, -3}, D, rng);
  const auto sigma2 = [&](std::int64_t split) {
    const auto b = kvlayer::ref::decode_bound(a.layer, a.q, 1, std::nullopt, {0, n, 0},
                                              AccumulationShape{split, 2, 2, true, 1});
    double sum = 0;
    for (const double s : b.sigma) sum += s * s;
    return sum;
  };
  const double p4 = a.p()[4];
  const auto v4 = fused_row(a.layer, 4, D);
  double predicted = 0;
  for (int e = 0; e < D; ++e) predicted += u16 * u16 / 3 * std::pow(p4 * v4[std::size_t(e)], 2);
  EXPECT_NEAR(sigma2(5) - sigma2(4), predicted, 0.01 * predicted);
}

TEST(NoiseModel, KeysOfOneScoreRoundTogether) {
  // 64 copies of one row: one p, one fp16 rounding, so (N1) adds up coherently to u16/√3 of
  // |Σ p·V| = |V|, not |V|/8 as 64 independent roundings would.
  const int D = 64, n = 64;
  const Geometry g = flat_geometry(1, D, D, n);
  KvLayer l(g);
  Rng rng(fresh_seed());
  HostRows r = random_rows(g, n, rng);
  for (int t = 1; t < n; ++t) {
    std::copy(r.k.begin(), r.k.begin() + D, r.k.begin() + t * D);
    std::copy(r.v.begin(), r.v.begin() + D, r.v.begin() + t * D);
  }
  l.append(r.f32_view());
  const auto q = random_query(g, 1, rng);
  const auto b = kvlayer::ref::decode_bound(l, q, 1, std::nullopt, {0, n, 0}, tensor_core_shape(n));
  const auto v = fused_row(l, 0, D);
  for (int e = 0; e < D; ++e)
    EXPECT_GE(b.sigma[std::size_t(e)],
              (1 - 1e-9) * u16 / std::sqrt(3.0) * std::fabs(v[std::size_t(e)]))
        << e;
}

TEST(NoiseModel, AWideBlockSendsItsKeysNeighboursToTheF32Path) {
  // A V block with |m| > 32768 takes its key tile to the f32 path (N0): every key within 64
  // positions keeps its f32 value in expected, the fp16 candidate's difference in sigma (N3).
  const int D = 64;
  const Geometry g = flat_geometry(1, D, D, 200);
  Rng rng(fresh_seed());
  HostRows r = random_rows(g, 200, rng);
  for (int d = 0; d < 32; ++d) r.v[std::size_t(100 * D + d)] = float(40000 + 100 * rng.uniform());
  KvLayer l(g);
  l.append(r.f32_view());
  const auto q = random_query(g, 1, rng);
  const auto near = [&](std::int64_t key) {  // a one-key view
    return kvlayer::ref::decode_bound(l, q, 1, std::nullopt, {key, key + 1, 0},
                                      tensor_core_shape(1));
  };
  for (const std::int64_t key : {std::int64_t(37), std::int64_t(163), std::int64_t(20)}) {
    const bool within = key >= 100 - 63 && key <= 100 + 63;
    const auto b = near(key);
    const auto f32 = l.dequantized_row(Plane::v, key);
    const auto fused = fused_row(l, key, D);
    for (int e = 0; e < D; ++e) {
      const double want = within ? double(f32[std::size_t(e)]) : fused[std::size_t(e)];
      EXPECT_EQ(b.expected[std::size_t(e)], want) << "key " << key << " element " << e;
      if (within) {
        EXPECT_GE(b.sigma[std::size_t(e)], std::fabs(fused[std::size_t(e)] - f32[std::size_t(e)]))
            << "key " << key << " element " << e;
      }
    }
  }
}

TEST(FusedShape, KTildeIsWhatTheRowIsRoundedWithExceptNearABlockBeyondTheFold) {
  // accuracy.hpp (1), fused form: õ (rounded, the centre of the bound) is the decode of q̃ with
  // K̃ = fp16(d·q), except for keys within 63 positions of a K block whose d is beyond the fold
  // (key 100, block 2: d ≈ 551), which keep exact K. A GPU that folded those neighbours anyway
  // (another tile alignment) must be inside the bound: their scores carry both candidates.
  // Built so that K̃ moves the output coherently: every K block constant (all quants 127), with
  // d_A = 2^-7 + 63·2^-17 on even keys (127·d_A rounds up to fp16 by 0.49 of its spacing) and
  // d_B = 2^-7 + 65·2^-17 on odd keys (down by 0.49), V = +1 on even keys and −1 on odd ones,
  // q = 4 (0 on block 2): K̃ moves the two groups' scores apart by 0.033.
  const int D = 128, n = 200, gqa = 2;
  const Geometry g = flat_geometry(1, D, D, n);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double d_a = std::ldexp(1.0, -7) + 63 * std::ldexp(1.0, -17),
               d_b = std::ldexp(1.0, -7) + 65 * std::ldexp(1.0, -17);
  std::vector<float> k(std::size_t(n * D)), v(std::size_t(n * D)), q(std::size_t(gqa * D), 4.0f);
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < D; ++d) {
      k[std::size_t(t * D + d)] = float(127 * (t % 2 == 0 ? d_a : d_b));
      v[std::size_t(t * D + d)] = t % 2 == 0 ? 1.0f : -1.0f;
    }
  for (int j = 0; j < kBlockValues; ++j)
    k[std::size_t(100 * D + 64 + j)] = float(j == 3 ? 70000 : 70000 * rng.uniform(-1, 1));
  for (int h = 0; h < gqa; ++h)
    for (int j = 0; j < kBlockValues; ++j) q[std::size_t(h * D + 64 + j)] = 0.0f;  // block 2
  KvLayer l(g);
  l.append(encode_rows(std::move(k), std::move(v), n, DType::f32).f32_view());
  AccumulationShape fused{n, 1, n / 64 + 2, true, n / 16, true};
  AccumulationShape unfused = fused;
  unfused.k_fused_f16 = false;
  const auto bf = kvlayer::ref::decode_bound(l, q, gqa, std::nullopt, {0, n, 0}, fused);
  const auto bu = kvlayer::ref::decode_bound(l, q, gqa, std::nullopt, {0, n, 0}, unfused);
  const std::vector<double> want = l.decode(q, gqa, std::nullopt);

  // The decode of q̃ over K chosen per key: exact (0), K̃ outside key 100's reach (1), or K̃ for
  // every key but 100 (2).
  const double scale = kvlayer::default_scale(D);
  const auto decode_with = [&](int k_kind) {
    std::vector<double> out(std::size_t(gqa) * D, 0.0);
    for (int h = 0; h < gqa; ++h) {
      std::vector<double> s(static_cast<std::size_t>(n), 0.0);
      for (std::int64_t t = 0; t < n; ++t) {
        const auto kr = l.dequantized_row(Plane::k, t);
        const bool exact =
            k_kind == 0 || (k_kind == 1 && std::abs(t - 100) <= 63) || (k_kind == 2 && t == 100);
        for (int d = 0; d < D; ++d) {
          const double kd = exact ? double(kr[std::size_t(d)])
                                  : kvlayer::ref::round_to_f16(double(kr[std::size_t(d)]));
          s[std::size_t(t)] += kd * f16_bits_to_f32(f32_to_f16_bits(q[std::size_t(h * D + d)]));
        }
        s[std::size_t(t)] *= scale;
      }
      const double top = *std::max_element(s.begin(), s.end());
      double total = 0;
      for (double& x : s) total += (x = std::exp(x - top));
      for (std::int64_t t = 0; t < n; ++t) {
        const auto vr = l.dequantized_row(Plane::v, t);
        for (int e = 0; e < D; ++e)
          out[std::size_t(h * D + e)] += s[std::size_t(t)] / total * vr[std::size_t(e)];
      }
    }
    return out;
  };
  const std::vector<double> exact_k = decode_with(0), centre = decode_with(1),
                            folded_all = decode_with(2);
  int k_tilde_moved = 0;
  for (std::size_t e = 0; e < want.size(); ++e) {
    const double tol = 1e-12 * (1 + std::fabs(centre[e]));
    EXPECT_NEAR(bf.rounded[e], centre[e], tol) << e;
    EXPECT_NEAR(bu.rounded[e], exact_k[e], tol) << e;
    k_tilde_moved += std::fabs(centre[e] - exact_k[e]) > 1e-4;
    EXPECT_LE(std::fabs(folded_all[e] - want[e]), bf.bound[e]) << e;
    EXPECT_LE(std::fabs(centre[e] - want[e]), bf.bound[e]) << e;
  }
  EXPECT_EQ(k_tilde_moved, int(want.size())) << "K̃ must move every output: the case proves nothing";
}

}  // namespace
}  // namespace kvlayer::testing
