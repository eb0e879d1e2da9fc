// Decode attention (SPEC §8): hand-checkable cases, empty views, GQA mapping, windowed views on
// flat and ring layers, scale override, all against a naive float64 loop (testbed.hpp) over
// dequantized rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kvlayer/reference/accuracy.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

/// The oracle over a reference layer's own dequantized rows (host view: physical = t − base).
std::vector<double> oracle_for(const KvLayer& l, const std::vector<float>& q, int heads,
                               float scale) {
  const auto [b, e] = l.view();
  return oracle_decode(l.geometry(), q, heads, scale, b, e,
                       [&](Plane p, std::int64_t t) { return l.dequantized_row(p, t - l.base()); });
}

/// Largest |x| of a vector: an output must be non-trivial for a comparison to mean anything.
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(Decode, OneKeyReturnsItsValueForEveryHead) {
  const Geometry g = flat_geometry(2, 32, 64, 4);
  KvLayer l(g);
  Rng rng(1);
  l.append(random_rows(g, 1, rng).f32_view());
  const auto q = random_query(g, 6, rng);
  const auto out = l.decode(q, 6);
  const auto v = l.dequantized_row(Plane::v, 0);
  ASSERT_EQ(out.size(), std::size_t(6 * 64));
  for (int h = 0; h < 6; ++h)  // gqa 3: query head h reads KV head h / 3
    for (int d = 0; d < 64; ++d)
      EXPECT_EQ(out[std::size_t(h * 64 + d)], double(v[std::size_t((h / 3) * 64 + d)]))
          << h << " " << d;
  EXPECT_GT(max_abs(out), 0.0);
}

TEST(Decode, TwoKeysWithEqualScoresGiveTheMean) {
  const Geometry g = flat_geometry(1, 32, 32, 4);
  KvLayer l(g);
  Rng rng(2);
  HostRows r = random_rows(g, 2, rng);
  std::copy(r.k.begin(), r.k.begin() + 32, r.k.begin() + 32);  // identical keys
  l.append(r.f32_view());
  const auto q = random_query(g, 1, rng);
  const auto out = l.decode(q, 1);
  const auto v0 = l.dequantized_row(Plane::v, 0), v1 = l.dequantized_row(Plane::v, 1);
  for (int d = 0; d < 32; ++d)
    EXPECT_NEAR(out[std::size_t(d)], (double(v0[std::size_t(d)]) + v1[std::size_t(d)]) / 2, 1e-15)
        << d;
  // The same with scale 0: every score is 0 whatever the keys.
  HostRows s = random_rows(g, 3, rng);
  KvLayer m(g);
  m.append(s.f32_view());
  const auto flat = m.decode(q, 1, 0.0f);
  for (int d = 0; d < 32; ++d) {
    double mean = 0;
    for (int t = 0; t < 3; ++t) mean += m.dequantized_row(Plane::v, t)[std::size_t(d)];
    EXPECT_NEAR(flat[std::size_t(d)], mean / 3, 1e-15) << d;
  }
}

TEST(Decode, EmptyViewGivesZeros) {
  const Geometry g = flat_geometry(2, 64, 32, 8);
  KvLayer l(g);
  Rng rng(3);
  const auto q = random_query(g, 2, rng);
  EXPECT_EQ(l.decode(q, 2), std::vector<double>(2 * 32, 0.0));
  const auto dc = l.decode_dc(q, 2);
  ASSERT_TRUE(dc);
  EXPECT_EQ(*dc, std::vector<double>(2 * 32, 0.0));
  // After a rewind to 0 the stale rows are not attended either.
  l.append(random_rows(g, 3, rng).f32_view());
  l.rewind(0);
  EXPECT_EQ(l.decode(q, 2), std::vector<double>(2 * 32, 0.0));
  const Geometry w = ring_geometry(1, 32, 32, 100, 5, 1, 0);
  KvLayer rl(w);
  const auto q1 = random_query(w, 1, rng);
  EXPECT_EQ(rl.decode(q1, 1), std::vector<double>(32, 0.0));
  const auto dcw = rl.decode_dcw(q1, 1);
  ASSERT_TRUE(dcw);
  EXPECT_EQ(*dcw, std::vector<double>(32, 0.0));
}

TEST(Decode, GqaMapsConsecutiveQueryHeadsToOneKvHead) {
  // 3 KV heads with very different V per head; 12 query heads (gqa 4). Query heads 4..7 must
  // equal what a one-head layer holding only KV head 1 gives.
  const Geometry g = flat_geometry(3, 32, 32, 16);
  KvLayer l(g);
  Rng rng(4);
  HostRows r = random_rows(g, 9, rng);
  for (std::int64_t t = 0; t < 9; ++t)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 32; ++d)
        r.v[std::size_t(t * 96 + h * 32 + d)] = float(10 * h) + rng.uniform(-1.0f, 1.0f);
  l.append(r.f32_view());
  const auto q = random_query(g, 12, rng);
  const auto out = l.decode(q, 12);
  EXPECT_EQ(compare_outputs(oracle_for(l, q, 12, default_scale(g)), out), "");
  const Geometry one = flat_geometry(1, 32, 32, 16);
  for (int kvh = 0; kvh < 3; ++kvh) {
    HostRows s;
    s.n = 9;
    for (std::int64_t t = 0; t < 9; ++t) {
      s.k.insert(s.k.end(), r.k.begin() + t * 96 + kvh * 32, r.k.begin() + t * 96 + kvh * 32 + 32);
      s.v.insert(s.v.end(), r.v.begin() + t * 96 + kvh * 32, r.v.begin() + t * 96 + kvh * 32 + 32);
    }
    KvLayer single(one);
    single.append(s.f32_view());
    for (int j = 0; j < 4; ++j) {
      const int h = kvh * 4 + j;
      const std::vector<float> qh(q.begin() + h * 32, q.begin() + h * 32 + 32);
      const auto o = single.decode(qh, 1);
      for (int d = 0; d < 32; ++d)
        ASSERT_NEAR(out[std::size_t(h * 32 + d)], o[std::size_t(d)], 1e-12) << h << " " << d;
      // ... and the values really are per-head: head kvh's outputs are near 10·kvh.
      EXPECT_NEAR(o[0], 10.0 * kvh, 1.5);
    }
  }
}

TEST(Decode, WindowedFlatViewAttendsOnlyTheLastWindowKeys) {
  const Geometry g = flat_geometry(2, 32, 32, 40, 3);
  KvLayer l(g);
  Rng rng(5);
  l.append(random_rows(g, 5, rng).f32_view());
  const auto q = random_query(g, 4, rng);
  const auto out = l.decode(q, 4);
  const auto want = oracle_decode(g, q, 4, default_scale(g), 2, 5,
                                  [&](Plane p, std::int64_t t) { return l.dequantized_row(p, t); });
  EXPECT_EQ(compare_outputs(want, out), "");
  // Not vacuous: attending all five keys gives something else.
  const auto all = oracle_decode(g, q, 4, default_scale(g), 0, 5,
                                 [&](Plane p, std::int64_t t) { return l.dequantized_row(p, t); });
  EXPECT_NE(compare_outputs(all, out), "");
  // decode_dcw on a flat windowed layer: base_d 0, the same view.
  const auto dcw = l.decode_dcw(q, 4);
  ASSERT_TRUE(dcw);
  EXPECT_EQ(compare_outputs(want, *dcw), "");
}

TEST(Decode, RingViewsAcrossRebasesMatchTheOracleOverTheWrittenValues) {
  // The oracle here reads the model's copy (quantized from the values the test appended and
  // placed by the model's own rebases), not the layer's bytes.
  for (std::int64_t window : {1, 2, 61, 63}) {
    const Geometry g = ring_geometry(2, 64, 32, 600, window, 3, 2);
    KvLayer l(g);
    Shadow m(g);
    Rng rng(std::uint64_t(60 + window));
    int checked = 0;
    while (l.len() < 400) {
      const HostRows r = random_rows(g, rng.range(1, 3), rng);
      l.append(r.f32_view());
      m.append(r);
      const auto q = random_query(g, 4, rng);
      const auto [b, e] = m.view();
      const auto want = oracle_decode(g, q, 4, default_scale(g), b, e,
                                      [&](Plane p, std::int64_t t) { return m.dequantized(p, t); });
      const auto got = l.decode(q, 4);
      ASSERT_EQ(compare_outputs(want, got), "") << "window " << window << " len " << l.len();
      ASSERT_GT(max_abs(got), 0.0);
      ++checked;
    }
    EXPECT_GT(l.base(), 0) << "window " << window;
    EXPECT_GT(checked, 100);
  }
}

TEST(Decode, ScaleOverrideAndDefault) {
  const Geometry g = flat_geometry(1, 96, 32, 10);  // 1/sqrt(96) is not exact in f32
  KvLayer l(g);
  Rng rng(6);
  l.append(random_rows(g, 10, rng).f32_view());
  const auto q = random_query(g, 2, rng);
  for (float scale : {0.01f, 0.5f, 2.5f, -1.0f})
    EXPECT_EQ(compare_outputs(oracle_for(l, q, 2, scale), l.decode(q, 2, scale)), "") << scale;
  // Default: 1/sqrt(head_dim_k) rounded to f32 first.
  EXPECT_EQ(compare_outputs(oracle_for(l, q, 2, 1.0f / std::sqrt(96.0f)), l.decode(q, 2)), "");
  // Not vacuous: a different scale gives a different result.
  EXPECT_NE(compare_outputs(oracle_for(l, q, 2, 2.5f), l.decode(q, 2)), "");
}

TEST(Decode, LargeScoresDoNotOverflow) {
  // Scores around 1e4: a softmax without max subtraction would overflow exp.
  const Geometry g = flat_geometry(1, 32, 32, 8);
  KvLayer l(g);
  Rng rng(7);
  HostRows r = random_rows(g, 8, rng);
  for (float& x : r.k) x *= 100.0f;
  l.append(r.f32_view());
  const auto q = random_query(g, 1, rng);
  const auto out = l.decode(q, 1, 1000.0f);
  for (double x : out) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(compare_outputs(oracle_for(l, q, 1, 1000.0f), out), "");
}

TEST(DecodeTolerance, FiniteWhenScoresAreUnboundedAndExactWhereAVColumnIsZero) {
  // Huge K and q: every score's perturbation bound is far beyond the score gaps, so any
  // probabilities are possible; the bound is still finite (each p̂ lies in [0, 1]). V's first
  // block is all zero: those columns have no error at all, so their bound is exactly e_q = 0.
  const Geometry g = flat_geometry(1, 64, 64, 16);
  KvLayer l(g);
  Rng rng(11);
  HostRows r = random_rows(g, 16, rng);
  for (float& x : r.k) x *= 50.0f;
  for (std::int64_t t = 0; t < 16; ++t)
    for (int j = 0; j < 32; ++j) r.v[std::size_t(t * 64 + j)] = 0.0f;
  l.append(r.f32_view());
  ASSERT_TRUE(l.status().ok()) << l.status().message();
  auto q = random_query(g, 2, rng);
  for (float& x : q) x *= 1000.0f;
  const auto b = kvlayer::ref::decode_bound(l, q, 2, 0.3f, {0, 16, 0}, {16, 1, -1});
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 64; ++e) {
      const std::size_t i = std::size_t(h * 64 + e);
      EXPECT_TRUE(std::isfinite(b.bound[i])) << "head " << h << " column " << e;
      if (e < 32) {
        EXPECT_EQ(b.bound[i], 0.0) << "zero column " << e;
        EXPECT_EQ(b.max_abs_v[i], 0.0);
      }
    }
}

TEST(DecodeTolerance, AdmitsAnyMixtureWhenTiedScoresAreBeyondResolution) {
  // Identical huge keys: the scores tie, each is known only to within far more than 1, so the
  // GPU may legitimately put its weight anywhere; the bound must admit that (here it is the
  // one place a vacuous bound is right).
  const Geometry g = flat_geometry(1, 64, 64, 8);
  KvLayer l(g);
  Rng rng(13);
  HostRows r = random_rows(g, 8, rng);
  for (std::int64_t t = 0; t < 8; ++t)
    for (int d = 0; d < 64; ++d) r.k[std::size_t(t * 64 + d)] = 3.0e4f;
  l.append(r.f32_view());
  std::vector<float> q(64, 100.0f);
  const auto b = kvlayer::ref::decode_bound(l, q, 1, 1.0f, {0, 8, 0}, {8, 1, -1});
  for (std::size_t i = 0; i < 64; ++i) EXPECT_GE(b.bound[i], 0.5 * b.max_abs_v[i]) << i;
}

TEST(DecodeTolerance, StaysSharpWhenScoresAreWideButWellSeparated) {
  // Scores of magnitude ~1e4 (an absolute score error of a few units) but gaps of hundreds:
  // the attention is one-hot, and a key far below the maximum contributes nothing however
  // large its own score error, so the bound stays a small fraction of max|V|.
  const Geometry g = flat_geometry(1, 64, 64, 32);
  KvLayer l(g);
  Rng rng(12);
  HostRows r = random_rows(g, 32, rng);
  for (std::int64_t t = 0; t < 32; ++t)
    for (int d = 0; d < 64; ++d) r.k[std::size_t(t * 64 + d)] = float(100 + 10 * t);
  l.append(r.f32_view());
  std::vector<float> q(64, 8.0f);
  const auto b = kvlayer::ref::decode_bound(l, q, 1, 1.0f, {0, 32, 0}, {32, 1, -1});
  for (std::size_t i = 0; i < 64; ++i) {
    ASSERT_GT(b.max_abs_v[i], 0.0);
    EXPECT_LT(b.bound[i], 1e-2 * b.max_abs_v[i]) << "column " << i;
  }
}

TEST(Decode, HostAndDeviceCounterDecodesAgreeWhenTheCountersAgree) {
  const Geometry g = flat_geometry(2, 32, 64, 20);
  KvLayer l(g);
  Rng rng(8);
  l.append(random_rows(g, 11, rng).f32_view());
  const auto q = random_query(g, 4, rng);
  const auto dc = l.decode_dc(q, 4);
  ASSERT_TRUE(dc);
  EXPECT_EQ(l.decode(q, 4), *dc);  // same code path, same order: bit-identical
}

// The tightness figures (SPEC §10.6): resolution percentiles from log bins that never
// understate (a bin's upper edge, capped at the largest value), vacuity against the convex
// reach, NaN skips counted apart, and sums that equal one record of everything.
TEST(BoundTightness, PercentilesVacuityAndSkips) {
  ref::BoundTightness t, a, b;
  // 100 elements: bound 1, e_q 0, õ 0, got i/100 · 2^-10 for i = 1..100; reach 2 (not vacuous).
  for (int i = 1; i <= 100; ++i) {
    const ref::DecodeBound e{{1.0}, {0.0}, {1.0}, {0.0}, {2.0}};
    const double got = i / 100.0 * std::ldexp(1.0, -10);
    t.record(got, e, 0);
    (i % 2 ? a : b).record(got, e, 0);
  }
  // One vacuous element (bound ≥ its reach) and one whose bound is all exact-q term.
  t.record(0.1, ref::DecodeBound{{3.0}, {0.0}, {1.0}, {0.0}, {2.0}}, 0);
  t.record(0.1, ref::DecodeBound{{0.5}, {0.5}, {1.0}, {0.0}, {2.0}}, 0);
  t.skip();
  EXPECT_EQ(t.elements(), 102);
  EXPECT_EQ(t.skipped(), 1);
  EXPECT_EQ(t.vacuous(), 1);
  const double p50 = t.resolution(0.5), p99 = t.resolution(0.99);
  // 101 resolved elements: the 51st smallest is 0.50 · 2^-10; a bin is 2^(1/8) wide.
  EXPECT_GE(p50, 0.50 * std::ldexp(1.0, -10));
  EXPECT_LE(p50, 0.50 * std::ldexp(1.0, -10) * std::exp2(0.125));
  EXPECT_GE(p99, 0.99 * std::ldexp(1.0, -10));
  EXPECT_DOUBLE_EQ(t.resolution_max(), 0.1 / 3.0);
  EXPECT_LE(t.resolution(1.0), t.resolution_max());
  a.add(b);
  EXPECT_EQ(a.elements(), 100);
  EXPECT_DOUBLE_EQ(a.resolution(0.5), [&] {
    ref::BoundTightness c;
    for (int i = 1; i <= 100; ++i)
      c.record(i / 100.0 * std::ldexp(1.0, -10),
               ref::DecodeBound{{1.0}, {0.0}, {1.0}, {0.0}, {2.0}}, 0);
    return c.resolution(0.5);
  }());
  EXPECT_NE(t.summary().find("skipped 1 (NaN reference), vacuous 1"), std::string::npos)
      << t.summary();
}

}  // namespace
}  // namespace kvlayer::testing
