// `kvlayer bench`'s accuracy rows, host half (tools/kvlayer/bench_accuracy.hpp): the float64
// attention the rows measure against, for a decode and for a causal verify of T queries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "bench_accuracy.hpp"

namespace kvlayer::cli {
namespace {

/// softmax(scale·q·K[0, n))·V[0, n) for one query head of KV head h, written out directly
/// (no shared code with attention_f64): the test's independent reference.
std::vector<double> by_hand(const AttentionInput& in, const float* q, int h, std::int64_t n) {
  const int d = in.head_dim;
  std::vector<double> s(std::size_t(n), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    for (int e = 0; e < d; ++e)
      s[std::size_t(t)] +=
          double(q[e]) * double(in.k[(std::size_t(t) * in.n_kv_heads + h) * d + e]);
    s[std::size_t(t)] *= in.scale;
  }
  const double m = *std::max_element(s.begin(), s.end());
  double l = 0;
  std::vector<double> o(std::size_t(d), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    const double p = std::exp(s[std::size_t(t)] - m);
    l += p;
    for (int e = 0; e < d; ++e)
      o[std::size_t(e)] += p * double(in.v[(std::size_t(t) * in.n_kv_heads + h) * d + e]);
  }
  for (double& x : o) x /= l;
  return o;
}

// Query i of a verify of T sees keys [0, keys − T + i], its own KV head, its own q row: every
// output row equals the attention written out by hand over exactly those keys, and differs from
// the one over all keys (so a causal bound ignored, or a wrong query's q, would show).
TEST(BenchAccuracy, VerifyQueriesAttendTheirCausalPrefix) {
  const int n_kv = 2, d = 64, gqa = 3, T = 5;
  const std::int64_t keys = 40;
  std::vector<float> k(std::size_t(keys) * n_kv * d), v(k.size()),
      q(std::size_t(T) * n_kv * gqa * d);
  fill_normal(k, 11);
  fill_normal(v, 12);
  fill_normal(q, 13);
  const AttentionInput in{n_kv, d, gqa, keys, q, k, v, 1.0 / std::sqrt(double(d)), T};
  const std::vector<double> out = attention_f64(in, false);
  ASSERT_EQ(out.size(), q.size());
  int differ_from_full = 0;
  for (int i = 0; i < T; ++i)
    for (int h = 0; h < n_kv; ++h)
      for (int j = 0; j < gqa; ++j) {
        const std::size_t row = (std::size_t(i) * n_kv + h) * gqa + j;
        const float* qr = q.data() + row * d;
        const std::vector<double> want = by_hand(in, qr, h, keys - T + i + 1);
        const std::vector<double> full = by_hand(in, qr, h, keys);
        bool differs = false;
        for (int e = 0; e < d; ++e) {
          const double got = out[row * d + std::size_t(e)];
          EXPECT_NEAR(got, want[std::size_t(e)], 1e-12 * (1 + std::fabs(want[std::size_t(e)])))
              << "query " << i << " KV head " << h << " head " << j << " dim " << e;
          differs = differs || std::fabs(got - full[std::size_t(e)]) > 1e-9;
        }
        differ_from_full += differs;
      }
  // The last query attends every key; the others fewer.
  EXPECT_EQ(differ_from_full, (T - 1) * n_kv * gqa);
}

// T = 1 (the decode's rows) is the attention over every key; q rounded to fp16 when asked.
TEST(BenchAccuracy, DecodeAttendsEveryKeyAndRoundsQWhenAsked) {
  const int n_kv = 1, d = 32, gqa = 2;
  const std::int64_t keys = 17;
  std::vector<float> k(std::size_t(keys) * d), v(k.size()), q(std::size_t(gqa) * d);
  fill_normal(k, 21);
  fill_normal(v, 22);
  fill_normal(q, 23);
  const AttentionInput in{n_kv, d, gqa, keys, q, k, v, 0.25};
  const std::vector<double> out = attention_f64(in, false), out16 = attention_f64(in, true);
  std::vector<float> q16(q);
  for (float& x : q16) x = round_f16(x);
  double moved = 0;
  for (int j = 0; j < gqa; ++j) {
    const std::vector<double> want = by_hand(in, q.data() + std::size_t(j) * d, 0, keys);
    const std::vector<double> want16 = by_hand(in, q16.data() + std::size_t(j) * d, 0, keys);
    for (int e = 0; e < d; ++e) {
      const std::size_t at = std::size_t(j) * d + std::size_t(e);
      EXPECT_NEAR(out[at], want[std::size_t(e)], 1e-12);
      EXPECT_NEAR(out16[at], want16[std::size_t(e)], 1e-12);
      moved = std::max(moved, std::fabs(out16[at] - out[at]));
    }
  }
  EXPECT_GT(moved, 0.0);  // fp16 q is not the f32 q
}

// A NaN output is an infinite error, never a dropped one.
TEST(BenchAccuracy, ANonFiniteOutputIsAnInfiniteError) {
  const std::vector<double> ref = {1.0, -2.0, 0.5};
  const ErrorStats ok = error_stats(ref, std::vector<double>{1.0, -2.0, 0.75});
  EXPECT_DOUBLE_EQ(ok.max_abs_err, 0.25);
  const ErrorStats bad =
      error_stats(ref, std::vector<double>{1.0, std::numeric_limits<double>::quiet_NaN(), 0.5});
  EXPECT_TRUE(std::isinf(bad.max_abs_err));
  EXPECT_TRUE(std::isinf(bad.rms_err));
}

}  // namespace
}  // namespace kvlayer::cli
