// Multi-row steps and verify decode on the reference (SPEC §11): append_rows_dc(w) writes the
// bytes of T single device-counter appends, inc_seqlen(T), decode_rows* row i is the single-query
// decode at len p_i + 1 (bit for bit: the same float64 code) and matches a naive oracle over the
// independent model's planes (testbed.hpp), the per-row windows on flat and ring layers, NaN only
// in the rows whose own view holds a bad block, every refusal with its message and an unchanged
// state, device-counter overruns (sticky error, nothing written), and accepting a prefix of the
// drafts with a rewind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "testbed.hpp"

namespace {

// NOTE: the test bed's namespace; the helpers are used through this alias (and the declarations
// below) so that a move of testbed.hpp's namespace changes one line here.
namespace tb = kvlayer::testing;

using kvlayer::DeviceError;
using kvlayer::DeviceErrorKind;
using kvlayer::DType;
using kvlayer::Geometry;
using kvlayer::Plane;
using kvlayer::ref::DecodeView;
using kvlayer::ref::KvLayer;
using tb::HostRows;
using tb::Rng;
using tb::Shadow;
using tb::Snapshot;

/// The f32 values of test-bed rows as an append takes them.
kvlayer::ref::RowsView f32(const HostRows& r) {
  return {r.k.data(), r.v.data(), r.n, DType::f32};
}

/// n random f32 rows, convertible to the RowsView an append takes (the values live as long as
/// this temporary: to the end of the append's full expression).
struct RandomRows {
  HostRows rows;
  operator kvlayer::ref::RowsView() const { return f32(rows); }
};
RandomRows rows(const Geometry& g, std::int64_t n, Rng& rng) {
  return {tb::random_rows(g, n, rng)};
}

/// T query rows [T, n_q_heads, head_dim_k].
std::vector<float> queries(const Geometry& g, int n_q_heads, int t, Rng& rng) {
  return tb::random_query(g, n_q_heads * t, rng);
}

/// Query row i of a [T, n_q_heads, head_dim_k] buffer.
std::vector<float> query_row(const std::vector<float>& q, const Geometry& g, int n_q_heads, int i) {
  const std::size_t n = std::size_t(n_q_heads) * std::size_t(g.head_dim_k);
  return {q.begin() + std::ptrdiff_t(i * n), q.begin() + std::ptrdiff_t((i + 1) * n)};
}

/// Output row i of a [T, n_q_heads, head_dim_v] result.
std::vector<double> out_row(const std::vector<double>& out, const Geometry& g, int n_q_heads,
                            int i) {
  const std::size_t n = std::size_t(n_q_heads) * std::size_t(g.head_dim_v);
  return {out.begin() + std::ptrdiff_t(i * n), out.begin() + std::ptrdiff_t((i + 1) * n)};
}

/// SPEC §11's view of query row i, written out here rather than taken from verify_views().
std::pair<std::int64_t, std::int64_t> spec_view(const Geometry& g, std::int64_t len, int t, int i) {
  const std::int64_t end = len - t + i + 1;
  return {g.window ? std::max<std::int64_t>(0, end - *g.window) : 0, end};
}

/// The single-query decode at len `end` (a copy of the layer rewound there).
std::vector<double> single_decode_at(const KvLayer& l, const std::vector<float>& q, int n_q_heads,
                                     std::optional<float> scale, std::int64_t end) {
  KvLayer at = l;
  at.rewind(end);
  return at.decode(q, n_q_heads, scale);
}

/// Checks decode_rows at the current state: every row bit for bit against the single-query
/// decode at len p_i + 1, and within 1e-12 of the naive oracle over `m`'s planes (the model's
/// own bytes, host mapping). Returns how many rows were checked.
int check_rows_here(const KvLayer& l, const Shadow& m, int n_q_heads, int t, Rng& rng,
                    std::optional<float> scale = std::nullopt) {
  const Geometry& g = l.geometry();
  const auto q = queries(g, n_q_heads, t, rng);
  const auto out = l.decode_rows(q, n_q_heads, t, scale);
  EXPECT_EQ(out.size(), std::size_t(t) * std::size_t(n_q_heads) * std::size_t(g.head_dim_v));
  for (int i = 0; i < t; ++i) {
    const auto qi = query_row(q, g, n_q_heads, i);
    const auto got = out_row(out, g, n_q_heads, i);
    const auto [begin, end] = spec_view(g, l.len(), t, i);
    EXPECT_EQ(got, single_decode_at(l, qi, n_q_heads, scale, end))
        << g.describe() << " len " << l.len() << " T " << t << " row " << i;
    const auto want =
        tb::oracle_decode(g, qi, n_q_heads, scale.value_or(tb::default_scale(g)), begin, end,
                          [&](Plane p, std::int64_t key) { return m.dequantized(p, key); });
    EXPECT_EQ(tb::compare_outputs(want, got), "")
        << g.describe() << " len " << l.len() << " T " << t << " row " << i;
  }
  return t;
}

double max_abs(const std::vector<double>& v) {
  double r = 0;
  for (double x : v) r = std::max(r, std::fabs(x));
  return r;
}

// ---- The view rule --------------------------------------------------------------------------

TEST(VerifyViews, CausalAndWindowedPerRow) {
  const Geometry flat = tb::flat_geometry(1, 32, 32, 100);
  EXPECT_EQ(kvlayer::ref::verify_views(flat, 10, 0, 3),
            (std::vector<DecodeView>{{0, 8, 0}, {0, 9, 0}, {0, 10, 0}}));
  const Geometry win = tb::flat_geometry(1, 32, 32, 100, 4);
  EXPECT_EQ(kvlayer::ref::verify_views(win, 10, 0, 3),
            (std::vector<DecodeView>{{4, 8, 0}, {5, 9, 0}, {6, 10, 0}}));
  // Views shorter than the window near the start; T == len puts row 0 at logical row 0.
  EXPECT_EQ(kvlayer::ref::verify_views(win, 3, 0, 3),
            (std::vector<DecodeView>{{0, 1, 0}, {0, 2, 0}, {0, 3, 0}}));
  const Geometry ring = tb::ring_geometry(1, 32, 32, 1000, 61, 5, 3);
  EXPECT_EQ(kvlayer::ref::verify_views(ring, 200, 128, 2),
            (std::vector<DecodeView>{{138, 199, 128}, {139, 200, 128}}));
  // The member form uses the host len and base.
  KvLayer l(win);
  Rng rng(1);
  l.append(rows(win, 10, rng));
  EXPECT_EQ(l.verify_views(3), kvlayer::ref::verify_views(win, 10, 0, 3));
}

// ---- Verify decode against single-query decodes and the oracle ------------------------------

TEST(VerifyDecode, RowsAreSingleQueryDecodesOnFlatLayers) {
  for (const Geometry& g : {tb::flat_geometry(2, 64, 32, 90), tb::flat_geometry(2, 32, 64, 90, 5),
                            tb::flat_geometry(1, 64, 64, 90, 1)}) {
    KvLayer l(g);
    Shadow m(g);
    Rng rng(std::uint64_t(10 + g.window.value_or(0)));
    int rows = 0;
    while (l.len() < 80) {
      const HostRows r = tb::random_rows(g, rng.range(1, 9), rng);
      l.append(f32(r));
      m.append(r);
      for (int t : {1, 2, 7, 16})
        if (t <= l.len()) rows += check_rows_here(l, m, 2 * g.n_kv_heads, t, rng);
    }
    // An explicit scale, and gqa 4.
    rows += check_rows_here(l, m, 4 * g.n_kv_heads, 7, rng, 0.7f);
    EXPECT_GT(rows, 300) << g.describe();
  }
}

TEST(VerifyDecode, RowsOnARingAcrossRebases) {
  // rewind_slack ≥ T − 1 keeps the first row's view resident after every append (SPEC §6: the
  // rows a speculative rewind may reach back); odd window and append sizes.
  for (std::int64_t window : {1, 2, 61}) {
    const Geometry g = tb::ring_geometry(2, 64, 32, 700, window, 7, 15);
    KvLayer l(g);
    Shadow m(g);
    Rng rng(std::uint64_t(20 + window));
    int rows = 0;
    std::int64_t rebases = 0, prev_base = 0;
    while (l.len() < 500) {
      const HostRows r = tb::random_rows(g, rng.range(1, 7), rng);
      l.append(f32(r));
      m.append(r);
      rebases += l.base() != prev_base;
      prev_base = l.base();
      for (int t : {1, 2, 7, 16}) {
        if (t > l.len()) continue;
        ASSERT_GE(spec_view(g, l.len(), t, 0).first, l.base()) << "window " << window;
        rows += check_rows_here(l, m, 2, t, rng);
      }
    }
    EXPECT_GT(rebases, 3) << "window " << window;
    EXPECT_GT(rows, 1000) << "window " << window;
  }
}

TEST(VerifyDecode, WindowedRowsDoNotSeeEachOthersKeys) {
  // Not vacuous: on a windowed layer row i attends its own window, neither the last row's view
  // nor the whole causal prefix. Scale 0 makes every output the mean of V over its view, so
  // views that differ give outputs that differ (random scores are often one-hot).
  const Geometry g = tb::flat_geometry(1, 32, 32, 40, 3);
  KvLayer l(g);
  Rng rng(3);
  l.append(rows(g, 12, rng));
  const auto q = queries(g, 2, 5, rng);
  const float s = 0.0f;
  const auto out = l.decode_rows(q, 2, 5, s);
  const auto row = [&](Plane p, std::int64_t t) { return l.dequantized_row(p, t); };
  for (int i = 0; i < 4; ++i) {
    const auto qi = query_row(q, g, 2, i);
    const auto got = out_row(out, g, 2, i);
    const std::int64_t end = 12 - 5 + i + 1;
    EXPECT_EQ(tb::compare_outputs(tb::oracle_decode(g, qi, 2, s, end - 3, end, row), got), "");
    EXPECT_NE(tb::compare_outputs(tb::oracle_decode(g, qi, 2, s, 9, 12, row), got), "") << i;
    EXPECT_NE(tb::compare_outputs(tb::oracle_decode(g, qi, 2, s, 0, end, row), got), "") << i;
    EXPECT_GT(max_abs(got), 0.0);
  }
}

TEST(VerifyDecode, OneRowIsDecodeAndTheDeviceCounterVariantsAgree) {
  Rng rng(4);
  for (const Geometry& g : {tb::flat_geometry(2, 32, 64, 30), tb::flat_geometry(2, 32, 64, 30, 4),
                            tb::ring_geometry(1, 64, 32, 300, 9, 4, 15)}) {
    KvLayer l(g);
    while (l.len() < (g.is_ring() ? 200 : 25)) l.append(rows(g, rng.range(1, 4), rng));
    const auto q1 = queries(g, 4, 1, rng);
    EXPECT_EQ(l.decode_rows(q1, 4, 1), l.decode(q1, 4)) << g.describe();
    EXPECT_EQ(l.decode_rows(q1, 4, 1, 0.25f), l.decode(q1, 4, 0.25f)) << g.describe();
    for (int t : {1, 3, 16}) {
      const auto q = queries(g, 4, t, rng);
      const auto host = l.decode_rows(q, 4, t);
      const auto dev = g.window ? l.decode_rows_dcw(q, 4, t) : l.decode_rows_dc(q, 4, t);
      ASSERT_TRUE(dev) << g.describe();
      EXPECT_EQ(*dev, host) << g.describe() << " T " << t;
      // compute_output false: the same checks, no output.
      const auto skipped =
          g.window ? l.decode_rows_dcw(q, 4, t, {}, false) : l.decode_rows_dc(q, 4, t, {}, false);
      ASSERT_TRUE(skipped);
      EXPECT_TRUE(skipped->empty());
      // Deterministic for a given state and T.
      EXPECT_EQ(l.decode_rows(q, 4, t), host);
    }
    EXPECT_TRUE(l.status().ok()) << l.status().message();
  }
}

TEST(VerifyDecode, NaNOnlyInTheRowsWhoseViewHoldsABadBlock) {
  // A NaN in draft row 2's K: its block is written as the canonical bad block (SPEC §3); rows 0
  // and 1 do not attend it (causal), rows 2..4 do, and with window 3 row 5 no longer does.
  const Geometry g = tb::flat_geometry(1, 32, 32, 40, 3);
  KvLayer l(g);
  Rng rng(16);
  l.append(rows(g, 4, rng));
  HostRows drafts = tb::random_rows(g, 6, rng);
  drafts.k[2 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();
  l.append_rows_dcw(f32(drafts));
  l.inc_seqlen(6);
  l.account_steps(6);
  ASSERT_TRUE(l.status().data_error);
  EXPECT_EQ(l.status().data_error->row, 6);
  const auto out = l.decode_rows(queries(g, 1, 6, rng), 1, 6);
  for (int i = 0; i < 6; ++i) {
    const auto row = out_row(out, g, 1, i);
    const bool attends_bad = i >= 2 && i <= 4;
    for (double x : row) ASSERT_EQ(std::isnan(x), attends_bad) << "row " << i;
  }
}

TEST(VerifyDecode, BoundOfEveryRowIsThatRowsDecodeBound) {
  const Geometry g = tb::ring_geometry(2, 64, 64, 400, 20, 4, 8);
  KvLayer l(g);
  Rng rng(5);
  while (l.len() < 150) l.append(rows(g, rng.range(1, 4), rng));
  ASSERT_GT(l.base(), 0);
  const int t = 7;
  const auto q = queries(g, 4, t, rng);
  const kvlayer::AccumulationShape shape{24, 2, -1};
  const auto views = l.verify_views(t);
  const auto bounds = kvlayer::ref::decode_rows_bound(l, q, 4, 0.3f, views, shape);
  ASSERT_EQ(bounds.size(), std::size_t(t));
  for (int i = 0; i < t; ++i) {
    const auto one =
        kvlayer::ref::decode_bound(l, query_row(q, g, 4, i), 4, 0.3f, views[std::size_t(i)], shape);
    EXPECT_EQ(bounds[std::size_t(i)].bound, one.bound) << i;
    EXPECT_EQ(bounds[std::size_t(i)].exact_q, one.exact_q) << i;
    EXPECT_EQ(bounds[std::size_t(i)].max_abs_v, one.max_abs_v) << i;
    EXPECT_GT(max_abs(one.bound), 0.0);
  }
  EXPECT_EQ(tb::check_throws_refused(
                [&] {
                  kvlayer::ref::decode_rows_bound(l, std::span(q).first(q.size() - 1), 4, 0.3f,
                                                  views, shape);
                },
                "decode_rows_bound: q has 1791 values, expected T 7 x n_q_heads 4 x head_dim_k "
                "64 = 1792"),
            "");
}

// ---- Multi-row device-counter appends ------------------------------------------------------

/// The model's T single-row device-counter steps (append at len_d, inc_seqlen) for `r`.
void model_single_steps(Shadow& m, const HostRows& r, bool windowed) {
  for (std::int64_t j = 0; j < r.n; ++j) {
    m.append_device(tb::slice(r, m.geometry(), j, 1), windowed);
    m.inc_seqlen();
  }
}

TEST(MultiRowAppend, BytesAreTSingleAppendsAndLenDIsUnchanged) {
  for (const Geometry& g : {tb::flat_geometry(3, 32, 64, 200), tb::flat_geometry(1, 64, 32, 200, 7),
                            tb::ring_geometry(2, 32, 32, 900, 40, 16, 16)}) {
    const bool windowed = g.window.has_value();
    KvLayer a(g), b(g);
    Shadow m(g);
    Rng rng(6);
    int steps = 0;
    while (a.len() + 16 <= (g.is_ring() ? 700 : g.max_ctx)) {
      const int t = int(rng.range(1, 16));
      const HostRows r = tb::random_rows(g, t, rng);
      a.reserve(t);
      b.reserve(t);
      m.reserve(t);
      // The multi-row append alone: T rows at len_d …, len_d unchanged.
      const std::int64_t len_d = a.len_d();
      if (windowed)
        a.append_rows_dcw(f32(r));
      else
        a.append_rows_dc(f32(r));
      EXPECT_EQ(a.len_d(), len_d);
      model_single_steps(m, r, windowed);
      a.inc_seqlen(t);
      EXPECT_EQ(a.len_d(), len_d + t);
      EXPECT_EQ(a.len(), len_d);  // inc_seqlen moves len_d only
      for (std::int64_t j = 0; j < t; ++j) {
        const HostRows one = tb::slice(r, g, j, 1);
        if (windowed)
          b.append_dcw(f32(one));
        else
          b.append_dc(f32(one));
        b.inc_seqlen();
      }
      ASSERT_EQ(tb::snapshot_diff(tb::snapshot(b), tb::snapshot(a), g), "")
          << g.describe() << " step " << steps << " T " << t;
      a.account_steps(t);
      b.account_steps(t);
      m.account_steps(t);
      ASSERT_EQ(tb::state_diff(m, a), "") << g.describe() << " step " << steps;
      ++steps;
    }
    EXPECT_GT(steps, 10) << g.describe();
    EXPECT_EQ(a.base() > 0, g.is_ring()) << g.describe();
    EXPECT_TRUE(a.status().ok()) << a.status().message();
  }
}

TEST(MultiRowAppend, SixteenBitInputsGiveTheSameBytesAsAHostAppend) {
  const Geometry g = tb::flat_geometry(2, 64, 32, 64);
  for (DType t : {DType::f16, DType::bf16}) {
    Rng rng(7);
    const HostRows r = tb::random_rows(g, 16, rng, tb::Values::exact16);
    // The same values as 16-bit elements (exact for Values::exact16).
    std::vector<std::uint16_t> k16, v16;
    const auto bits = [t](float x) {
      return t == DType::f16 ? kvlayer::f32_to_f16_bits(x) : kvlayer::f32_to_bf16_bits(x);
    };
    for (float x : r.k) k16.push_back(bits(x));
    for (float x : r.v) v16.push_back(bits(x));
    KvLayer a(g), host(g);
    host.append(f32(r));
    a.append_rows_dc({k16.data(), v16.data(), 16, t});
    EXPECT_EQ(a.k_plane(), host.k_plane());
    EXPECT_EQ(a.v_plane(), host.v_plane());
  }
}

TEST(MultiRowAppend, IncSeqlenByT) {
  const Geometry g = tb::flat_geometry(1, 32, 32, 100);
  KvLayer l(g, 8);
  l.inc_seqlen(8);
  l.inc_seqlen();
  l.inc_seqlen(3);
  EXPECT_EQ(l.len_d(), 12);
  EXPECT_EQ(l.len(), 0);
  EXPECT_EQ(l.max_verify(), 8);
  EXPECT_EQ(KvLayer(g).max_verify(), kvlayer::ref::kDefaultMaxVerify);
  EXPECT_EQ(kvlayer::ref::kDefaultMaxVerify, 16);
}

// ---- Refusals: message and unchanged state ---------------------------------------------------

TEST(VerifyRefusals, DecodeRows) {
  const Geometry g = tb::flat_geometry(2, 32, 32, 50);
  KvLayer l(g, 8);
  Rng rng(8);
  l.append(rows(g, 3, rng));
  const auto q9 = queries(g, 4, 9, rng);
  const auto q4 = queries(g, 4, 4, rng);
  const auto q2 = queries(g, 4, 2, rng);
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q4, 4, 0); }, "decode_rows: T 0 must be at least 1");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q4, 4, -3); }, "decode_rows: T -3 must be at least 1");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q9, 4, 9); }, "decode_rows: T 9 exceeds max_verify 8");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q4, 4, 4); }, "decode_rows: len 3 is less than T 4");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q4, 4, 2); },
      "decode_rows: q has 512 values, expected T 2 x n_q_heads 4 x "
      "head_dim_k 32 = 256");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q2, 3, 2); },
      "decode_rows: n_q_heads 3 must be a positive multiple of "
      "n_kv_heads 2");
  // The device-counter variants refuse the same host-known requests the same way.
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows_dc(q9, 4, 9); }, "decode_rows_dc: T 9 exceeds max_verify 8");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows_dc(q4, 4, 2); },
      "decode_rows_dc: q has 512 values, expected T 2 x n_q_heads 4 x "
      "head_dim_k 32 = 256");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows_dcw(q2, 4, 2); },
      "decode_rows_dcw: the layer has no window; use decode_rows_dc");
  // T = 1 at len 0: decode gives zeros, but a verify needs its query's own row (L ≥ T).
  KvLayer empty(g);
  const auto q1 = queries(g, 2, 1, rng);
  EXPECT_EQ(empty.decode(q1, 2), std::vector<double>(64, 0.0));
  tb::expect_refused_unchanged(
      empty, [&] { empty.decode_rows(q1, 2, 1); }, "decode_rows: len 0 is less than T 1");
  // Accepted at the limits: T == len, T == max_verify.
  EXPECT_NO_THROW(l.decode_rows(queries(g, 4, 3, rng), 4, 3));
  l.append(rows(g, 5, rng));
  EXPECT_NO_THROW(l.decode_rows(queries(g, 4, 8, rng), 4, 8));
}

TEST(VerifyRefusals, DeviceCounterVariantsOnTheWrongStorage) {
  Rng rng(9);
  const Geometry ring = tb::ring_geometry(1, 32, 32, 100, 10, 4, 4);
  KvLayer r(ring);
  r.append(rows(ring, 4, rng));
  const auto q = queries(ring, 1, 2, rng);
  tb::expect_refused_unchanged(
      r, [&] { r.decode_rows_dc(q, 1, 2); }, "decode_rows_dc: ring layers use decode_rows_dcw");
  const HostRows two = tb::random_rows(ring, 2, rng);
  tb::expect_refused_unchanged(
      r, [&] { r.append_rows_dc(f32(two)); }, "append_rows_dc: ring layers use append_rows_dcw");
  const Geometry win = tb::flat_geometry(1, 32, 32, 100, 6);
  KvLayer w(win);
  w.append(rows(win, 4, rng));
  tb::expect_refused_unchanged(
      w, [&] { w.decode_rows_dc(q, 1, 2); },
      "decode_rows_dc: attends [0, len_d) and ignores the window 6; "
      "windowed layers use decode_rows_dcw");
}

TEST(VerifyRefusals, RingFirstViewBelowBase) {
  // rewind_slack 0: right after a rebase the ring keeps exactly the window of the next single
  // append, so a verify of T ≥ 2 rows would need rows the ring dropped.
  const Geometry g = tb::ring_geometry(1, 32, 32, 1000, 32, 1, 0);  // rows 64
  KvLayer l(g);
  Rng rng(10);
  for (int i = 0; i < 65; ++i) l.append(rows(g, 1, rng));
  ASSERT_EQ(l.base(), 32);
  ASSERT_EQ(l.len(), 65);
  EXPECT_NO_THROW(l.decode_rows(queries(g, 1, 2, rng), 1, 2));  // s_0 = 65 − 2 + 1 − 32 = 32
  const auto q3 = queries(g, 1, 3, rng);
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q3, 1, 3); },
      "decode_rows: the view of query 0 starts at logical row 31, below "
      "base 32 (not resident)");
  // The device-counter variant records the error instead and writes nothing.
  const Snapshot before = tb::snapshot(l);
  EXPECT_FALSE(l.decode_rows_dcw(q3, 1, 3));
  const DeviceError want{DeviceErrorKind::decode_view_too_long, 65, 32, 64};
  EXPECT_EQ(l.status().device_error, want);
  l.clear_status();
  EXPECT_EQ(tb::snapshot_diff(before, tb::snapshot(l), g), "");
  // After a rewind to the can_rewind_to limit even T = 1 is refused, as decode is.
  l.append(rows(g, 30, rng));
  std::int64_t p = l.len();
  while (l.can_rewind_to(p - 1)) --p;
  l.rewind(p);
  const auto q1 = queries(g, 1, 1, rng);
  tb::expect_refused_unchanged(
      l, [&] { l.decode(q1, 1); },
      "decode: the view starts at logical row " + std::to_string(p - 32) + ", below base " +
          std::to_string(l.base()) +
          " (not resident; append before decoding after a rewind this "
          "deep)");
  tb::expect_refused_unchanged(
      l, [&] { l.decode_rows(q1, 1, 1); },
      "decode_rows: the view of query 0 starts at logical row " + std::to_string(p - 32) +
          ", below base " + std::to_string(l.base()) + " (not resident)");
}

TEST(VerifyRefusals, MultiRowAppendsAndIncSeqlen) {
  const Geometry g = tb::flat_geometry(1, 32, 32, 50, 5);
  KvLayer l(g, 4);
  Rng rng(11);
  l.append(rows(g, 3, rng));
  const HostRows five = tb::random_rows(g, 5, rng);
  const HostRows two = tb::random_rows(g, 2, rng);
  tb::expect_refused_unchanged(
      l, [&] { l.append_rows_dc(f32(five)); }, "append_rows_dc: T 5 exceeds max_verify 4");
  tb::expect_refused_unchanged(
      l, [&] { l.append_rows_dcw(f32(five)); }, "append_rows_dcw: T 5 exceeds max_verify 4");
  tb::expect_refused_unchanged(
      l,
      [&] {
        l.append_rows_dcw({two.k.data(), two.v.data(), 0});
      },
      "append_rows_dcw: n 0 must be at least 1");
  tb::expect_refused_unchanged(
      l,
      [&] {
        l.append_rows_dc({nullptr, two.v.data(), 2});
      },
      "append_rows_dc: k and v must not be null");
  tb::expect_refused_unchanged(
      l,
      [&] {
        l.append_rows_dcw({two.k.data(), two.v.data(), 2, DType(7)});
      },
      "append_rows_dcw: dtype 7 is not f32, f16 or bf16");
  tb::expect_refused_unchanged(
      l, [&] { l.inc_seqlen(0); }, "inc_seqlen: T 0 must be at least 1");
  tb::expect_refused_unchanged(
      l, [&] { l.inc_seqlen(5); }, "inc_seqlen: T 5 exceeds max_verify 4");
  // The single-row calls keep their own refusals.
  tb::expect_refused_unchanged(
      l, [&] { l.append_dcw(f32(two)); }, "append_dcw: n 2 must be 1");
  EXPECT_EQ(tb::check_throws_refused([&] { KvLayer bad(g, 0); },
                                     "ref::KvLayer: max_verify 0 must be at least 1"),
            "");
}

// ---- Device-counter overruns: sticky error, nothing written ----------------------------------

TEST(VerifyDeviceErrors, MultiRowAppendPastMaxCtxWritesNoRow) {
  const Geometry g = tb::flat_geometry(1, 32, 64, 10);
  KvLayer l(g);
  Rng rng(12);
  l.append(rows(g, 8, rng));
  const Snapshot before = tb::snapshot(l);
  // Rows 8 and 9 would fit, row 10 would not: none is written.
  l.append_rows_dc(rows(g, 3, rng));
  const DeviceError want{DeviceErrorKind::append_past_max_ctx, 8, 0, 10};
  EXPECT_EQ(l.status().device_error, want);
  EXPECT_EQ(l.status().message(),
            "device error: device-counter append at len_d 8: reaches max_ctx 10; nothing was "
            "written");
  l.clear_status();
  EXPECT_EQ(tb::snapshot_diff(before, tb::snapshot(l), g), "");
  // Exactly filling max_ctx is fine.
  l.append_rows_dc(rows(g, 2, rng));
  EXPECT_TRUE(l.status().ok()) << l.status().message();
  EXPECT_NE(tb::snapshot_diff(before, tb::snapshot(l), g), "");
}

TEST(VerifyDeviceErrors, MultiRowAppendOutsideTheRingRowsWritesNoRow) {
  const Geometry g = tb::ring_geometry(1, 32, 32, 1000, 61, 5, 3);  // rows 100
  KvLayer l(g);
  Shadow m(g);
  Rng rng(13);
  const HostRows fill = tb::random_rows(g, 98, rng);
  l.append(f32(fill));
  m.append(fill);
  // Physical rows 98, 99 fit, 100 does not (no reserve): nothing written, sticky error.
  const HostRows three = tb::random_rows(g, 3, rng);
  l.append_rows_dcw(f32(three));
  const DeviceError want{DeviceErrorKind::append_outside_rows, 98, 0, 100};
  EXPECT_EQ(l.status().device_error, want);
  // A later, different overrun does not replace it.
  l.inc_seqlen(16);
  EXPECT_FALSE(l.decode_rows_dcw(queries(g, 1, 2, rng), 1, 2));
  EXPECT_EQ(l.status().device_error, want);
  l.clear_status();
  for (int i = 0; i < 16; ++i) m.inc_seqlen();
  EXPECT_EQ(tb::state_diff(m, l), "");  // nothing written, len_d moved
  // After reserve the same step fits and writes the bytes T single appends write.
  l.rewind(98);
  m.rewind(98);
  l.reserve(3);
  m.reserve(3);
  l.append_rows_dcw(f32(three));
  model_single_steps(m, three, true);
  l.inc_seqlen(3);
  EXPECT_TRUE(l.status().ok()) << l.status().message();
  EXPECT_EQ(tb::state_diff(m, l), "");
}

TEST(VerifyDeviceErrors, DecodeRowsDcRecordsWhereTheHostVariantRefuses) {
  const Geometry g = tb::flat_geometry(2, 32, 32, 20);
  KvLayer l(g);
  Rng rng(14);
  l.append(rows(g, 3, rng));
  const auto q4 = queries(g, 2, 4, rng);
  const Snapshot before = tb::snapshot(l);
  EXPECT_FALSE(l.decode_rows_dc(q4, 2, 4));  // len_d 3 < T 4
  const DeviceError few{DeviceErrorKind::decode_view_too_long, 3, 0, 4};
  EXPECT_EQ(l.status().device_error, few);
  EXPECT_EQ(l.status().message(),
            "device error: device-counter decode at len_d 3, base_d 0: the view exceeds its "
            "limit of 4 keys or resident rows; nothing was written");
  l.clear_status();
  EXPECT_EQ(tb::snapshot_diff(before, tb::snapshot(l), g), "");
  // len_d past max_ctx (a chain longer than its headroom): limit max_ctx.
  l.inc_seqlen(16);
  l.inc_seqlen(2);
  ASSERT_EQ(l.len_d(), 21);
  EXPECT_FALSE(l.decode_rows_dc(q4, 2, 4));
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::decode_view_too_long, 21, 0, 20}));
  // decode_rows_dcw on a flat windowed layer: the same rules with base_d 0.
  const Geometry w = tb::flat_geometry(2, 32, 32, 20, 4);
  KvLayer lw(w);
  lw.append(rows(w, 2, rng));
  EXPECT_FALSE(lw.decode_rows_dcw(q4, 2, 4));
  EXPECT_EQ(lw.status().device_error,
            (DeviceError{DeviceErrorKind::decode_view_too_long, 2, 0, 4}));
}

// ---- Accepting a prefix ---------------------------------------------------------------------

TEST(VerifyStep, AcceptAPrefixThenTheNextStepOverwritesAsSingleAppendsWould) {
  // The engine's loop on device counters: reserve(T), T draft rows, inc_seqlen(T), verify,
  // account_steps(T), then keep a of the T drafts with rewind(L − T + a). The model does the
  // same with single-row device appends; every step's state equals it byte for byte (the
  // rejected rows' bytes stay until the next step overwrites them), and every verify row
  // matches the oracle over the model's planes at the device mapping.
  for (const Geometry& g :
       {tb::flat_geometry(2, 32, 32, 600), tb::flat_geometry(1, 64, 32, 600, 23),
        tb::ring_geometry(2, 32, 64, 2000, 45, 9, 16)}) {
    const bool windowed = g.window.has_value();
    KvLayer l(g, 9);
    Shadow m(g);
    Rng rng(15);
    const HostRows prefill = tb::random_rows(g, 30, rng);
    l.append(f32(prefill));
    m.append(prefill);
    int steps = 0, rejected = 0;
    while (l.len() + 9 <= (g.is_ring() ? 1500 : g.max_ctx)) {
      const int t = int(rng.range(1, 9));
      const HostRows draft = tb::random_rows(g, t, rng);
      l.reserve(t);
      m.reserve(t);
      if (windowed)
        l.append_rows_dcw(f32(draft));
      else
        l.append_rows_dc(f32(draft));
      l.inc_seqlen(t);
      model_single_steps(m, draft, windowed);
      const auto q = queries(g, 2 * g.n_kv_heads, t, rng);
      const auto out = windowed ? l.decode_rows_dcw(q, 2 * g.n_kv_heads, t)
                                : l.decode_rows_dc(q, 2 * g.n_kv_heads, t);
      ASSERT_TRUE(out) << l.status().message();
      for (int i = 0; i < t; ++i) {
        const auto [begin, end] = spec_view(g, m.len_d(), t, i);
        const auto want = tb::oracle_decode(
            g, query_row(q, g, 2 * g.n_kv_heads, i), 2 * g.n_kv_heads, tb::default_scale(g), begin,
            end, [&](Plane p, std::int64_t key) { return m.dequantized(p, key, true); });
        ASSERT_EQ(tb::compare_outputs(want, out_row(*out, g, 2 * g.n_kv_heads, i)), "")
            << g.describe() << " step " << steps << " row " << i;
      }
      l.account_steps(t);
      m.account_steps(t);
      // The host-len verify on the accounted state gives the same bits.
      EXPECT_EQ(l.decode_rows(q, 2 * g.n_kv_heads, t), *out);
      const int a = int(rng.range(0, t));
      const std::int64_t keep = l.len() - t + a;
      ASSERT_TRUE(l.can_rewind_to(keep)) << g.describe() << " step " << steps;
      l.rewind(keep);
      m.rewind(keep);
      rejected += t - a;
      ASSERT_EQ(tb::state_diff(m, l), "") << g.describe() << " step " << steps;
      ++steps;
    }
    EXPECT_GT(steps, 50) << g.describe();
    EXPECT_GT(rejected, 50) << g.describe();
    EXPECT_EQ(l.base() > 0, g.is_ring()) << g.describe();
    EXPECT_TRUE(l.status().ok()) << l.status().message();
  }
}

}  // namespace
