// Snapshots and restores of the CUDA layer (SPEC §13) against the reference: a GPU snapshot
// holds the reference's fields and bytes after any history; a restore leaves every plane byte,
// tail, counter and status as the reference's restore does; the restored GPU layer then runs
// host appends, decodes, verify decodes, rewinds, device-counter chains and captured-graph
// replays with bytes identical to the restored reference and decodes within the derived bound,
// while that reference keeps the original's logical rows (logical_diff); refusals are the
// reference's, word for word, and change nothing.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "snapshot/snapshot_testbed.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Graph;
using cuda::Stream;

struct Case {
  const char* name;
  Geometry g;
  int gqa;
};

std::vector<Case> cases() {
  return {
      {"flat hd128", flat(2, 128, 700), 4},
      {"flat windowed hd64", flat(1, 64, 700, 50), 8},
      {"ring hd64", ring(2, 64, 4000, 61, 8, 4), 2},
      {"ring hd256", ring(1, 256, 4000, 100, 16, 8), 16},
      {"ring hd128 window 1", ring(1, 128, 4000, 1, 4, 0), 1},
  };
}

/// A GPU layer and its reference, driven alike.
struct Twin {
  Geometry g;
  int nq;
  cudaStream_t s;
  cuda::KvLayer gpu;
  ref::KvLayer ref;
  Twin(const Geometry& geo, int n_q_heads, cudaStream_t stream)
      : g(geo), nq(n_q_heads), s(stream), gpu(geo, n_q_heads, stream), ref(geo) {}

  void append(std::int64_t n, Rng& rng) {
    const HostRows rows = make_rows(g, n, kDTypes[rng.range(0, 2)], Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
  }
  /// k eager device-counter steps of one row (reserve, steps, account_steps).
  void device_chain(std::int64_t k, Rng& rng) {
    gpu.reserve(k);
    ref.reserve(k);
    for (std::int64_t i = 0; i < k; ++i) {
      const HostRows row = make_rows(g, 1, DType::f32, Fill::random, rng);
      const DeviceRows d(row);
      if (g.window) {
        gpu.append_dcw(d.view);
        ref.append_dcw(row.view());
      } else {
        gpu.append_dc(d.view);
        ref.append_dc(row.view());
      }
      gpu.inc_seqlen();
      ref.inc_seqlen();
    }
    gpu.account_steps(k);
    ref.account_steps(k);
  }
  /// A history of appends, device chains and shallow rewinds up to about `len` rows.
  void history(std::int64_t len, Rng& rng) {
    const std::int64_t max_n = g.is_ring() ? g.max_append : 24;
    while (ref.len() < len) {
      const std::int64_t n = std::min(rng.range(1, max_n), len - ref.len());
      if (rng.chance(20)) {
        device_chain(n, rng);
      } else {
        append(n, rng);
      }
      if (rng.chance(15) && ref.can_rewind_to(ref.len() - 2)) {
        gpu.rewind(ref.len() - 2);
        ref.rewind(ref.len() - 2);
      }
    }
  }
};

std::vector<float> random_q(std::size_t n, Rng& rng) {
  std::vector<float> q(n);
  const float mag = std::ldexp(1.0f, int(rng.range(-2, 3)));
  for (float& x : q) x = mag * rng.uniform(-1, 1);
  return q;
}

/// Every element finite and within its bound (or NaN where the reference is NaN).
void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                   const ref::DecodeBound& b, std::size_t offset, const std::string& what) {
  int reported = 0;
  for (std::size_t e = 0; e < b.bound.size(); ++e) {
    const float x = got[offset + e];
    const double w = want[offset + e];
    if (std::isnan(w)) {
      if (!std::isnan(x) && reported++ < 5) ADD_FAILURE() << what << " element " << e << ": " << x;
      bound_tightness().skip();
      continue;
    }
    const double err = std::fabs(double(x) - w);
    if (!std::isfinite(x) || !(err <= b.bound[e])) {
      if (reported++ < 5)
        ADD_FAILURE() << what << " element " << e << ": " << x << " vs reference " << w
                      << ", |error| " << err << " > bound " << b.bound[e];
      continue;
    }
    bound_tightness().record(x, b, e);
  }
}

/// A host-len decode on both, within the bound of the layer's accumulation shape.
void check_decode(Twin& t, Rng& rng) {
  if (t.ref.view().first < t.ref.base()) return;  // refused on both (a rewind to the limit)
  const std::vector<float> hq = random_q(std::size_t(t.nq) * t.g.head_dim_k, rng);
  DeviceFloats q(hq.size()), out(std::size_t(t.nq) * t.g.head_dim_v);
  q.upload(hq);
  out.poison(t.s);
  t.gpu.decode(q.get(), out.get());
  const std::vector<float> got = out.download(t.s);
  const std::vector<double> want = t.ref.decode(hq, t.nq);
  const auto [begin, end] = t.ref.view();
  const ref::DecodeBound b =
      ref::decode_bound(t.ref, hq, t.nq, std::nullopt, ref::DecodeView{begin, end, t.ref.base()},
                        t.gpu.accumulation_shape());
  expect_within(got, want, b, 0, "decode at len " + std::to_string(t.ref.len()));
}

/// A host-len verify decode of T queries, row by row within its bound.
void check_verify(Twin& t, int T, Rng& rng) {
  if (t.ref.len() < T) return;
  const std::vector<ref::DecodeView> views = t.ref.verify_views(T);
  if (views[0].begin < t.ref.base()) return;  // refused on both
  const std::size_t row = std::size_t(t.nq) * t.g.head_dim_v;
  const std::vector<float> hq = random_q(std::size_t(T) * t.nq * t.g.head_dim_k, rng);
  DeviceFloats q(hq.size()), out(T * row);
  q.upload(hq);
  out.poison(t.s);
  t.gpu.decode_rows(q.get(), out.get(), T);
  const std::vector<float> got = out.download(t.s);
  const std::vector<double> want = t.ref.decode_rows(hq, t.nq, T);
  const std::vector<ref::DecodeBound> b = ref::decode_rows_bound(
      t.ref, hq, t.nq, std::nullopt, views, t.gpu.verify_accumulation_shape(T));
  for (int i = 0; i < T; ++i)
    expect_within(got, want, b[std::size_t(i)], std::size_t(i) * row,
                  "verify T " + std::to_string(T) + " row " + std::to_string(i));
}

/// k device-counter steps replayed from a graph captured on the restored layer: fixed input
/// buffers rewritten before each replay; the reference runs the same steps.
void replay_chain(Twin& t, std::int64_t k, Rng& rng) {
  const std::size_t es = 4;  // f32 rows
  DeviceBuffer k_in(std::size_t(t.g.kv_dim_k()) * es), v_in(std::size_t(t.g.kv_dim_v()) * es);
  const std::size_t qn = std::size_t(t.nq) * t.g.head_dim_k,
                    on = std::size_t(t.nq) * t.g.head_dim_v;
  DeviceFloats q_in(qn), out(on);
  const cuda::RowsView row{k_in.get(), v_in.get(), 1, DType::f32};
  t.gpu.reserve(k);
  t.ref.reserve(k);
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(t.s, cudaStreamCaptureModeThreadLocal));
  try {
    device_counter_step(t.gpu, row, q_in.get(), out.get());
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(t.s, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    throw;
  }
  const Graph graph = Graph::end_capture(t.s);
  const kvlayer::AccumulationShape shape = t.gpu.accumulation_shape();
  for (std::int64_t i = 0; i < k; ++i) {
    const HostRows rows = make_rows(t.g, 1, DType::f32, Fill::random, rng);
    const std::vector<float> hq = random_q(qn, rng);
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(k_in.get(), rows.k_bytes.data(), rows.k_bytes.size(),
                                     cudaMemcpyHostToDevice, t.s));
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(v_in.get(), rows.v_bytes.data(), rows.v_bytes.size(),
                                     cudaMemcpyHostToDevice, t.s));
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(q_in.get(), hq.data(), qn * 4, cudaMemcpyHostToDevice, t.s));
    out.poison(t.s);
    graph.launch(t.s);
    std::optional<std::vector<double>> want;
    ref::DecodeView view;
    if (t.g.window) {
      t.ref.append_dcw(rows.view());
      t.ref.inc_seqlen();
      want = t.ref.decode_dcw(hq, t.nq);
      view = {std::max<std::int64_t>(0, t.ref.len_d() - *t.g.window), t.ref.len_d(),
              t.ref.base_d()};
    } else {
      t.ref.append_dc(rows.view());
      t.ref.inc_seqlen();
      want = t.ref.decode_dc(hq, t.nq);
      view = {0, t.ref.len_d(), 0};
    }
    ASSERT_TRUE(want.has_value()) << t.ref.status().message();
    const std::vector<float> got = out.download(t.s);
    expect_within(got, *want, ref::decode_bound(t.ref, hq, t.nq, std::nullopt, view, shape), 0,
                  "replayed step " + std::to_string(i));
  }
  t.gpu.account_steps(k);
  t.ref.account_steps(k);
}

::testing::AssertionResult same_snapshot(const kvlayer::Snapshot& a, const kvlayer::Snapshot& b) {
  if (!same_layout(a.geometry, b.geometry)) return ::testing::AssertionFailure() << "geometry";
  if (a.len != b.len || a.first != b.first || a.base != b.base)
    return ::testing::AssertionFailure()
           << "len/first/base " << a.len << "/" << a.first << "/" << a.base << " vs " << b.len
           << "/" << b.first << "/" << b.base;
  if (a.k != b.k) return ::testing::AssertionFailure() << "K bytes differ";
  if (a.v != b.v) return ::testing::AssertionFailure() << "V bytes differ";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult tails_zero(const cuda::KvLayer& l) {
  for (const auto& t : {l.k_plane_tail_bytes(), l.v_plane_tail_bytes()})
    for (std::uint8_t b : t)
      if (b != 0) return ::testing::AssertionFailure() << "a plane tail is not zero";
  return ::testing::AssertionSuccess();
}

TEST(CudaSnapshot, SnapshotsEqualTheReferencesAfterAnyHistory) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Rng rng(0x5A90 ^ std::uint64_t(c.g.head_dim_k));
    Twin t(c.g, c.g.n_kv_heads * c.gqa, stream.get());
    EXPECT_TRUE(same_snapshot(t.gpu.snapshot(), t.ref.snapshot())) << "empty";
    for (std::int64_t len : {37, 160, 333}) {
      t.history(len, rng);
      ASSERT_TRUE(same_state(t.gpu, t.ref)) << "len " << len;
      EXPECT_TRUE(same_snapshot(t.gpu.snapshot(), t.ref.snapshot())) << "len " << len;
    }
    EXPECT_TRUE(same_state(t.gpu, t.ref)) << "a snapshot changes nothing";
  }
}

TEST(CudaSnapshot, RestoresEqualTheReferencesInEveryByteAndTail) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("kvlayer_cuda_snapshot_" + std::to_string(::getpid()) + ".gguf");
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Rng rng(0x7E57);
    Twin t(c.g, c.g.n_kv_heads * c.gqa, stream.get());
    t.history(250, rng);
    const kvlayer::Snapshot s = t.gpu.snapshot();
    // From the GPU's own snapshot, and from one through the file.
    save_snapshot(file.string(), s);
    for (const kvlayer::Snapshot& from : {s, load_snapshot(file.string())}) {
      Twin r(c.g, t.nq, stream.get());
      ASSERT_TRUE(r.gpu.fresh());
      r.gpu.restore(from);
      r.ref.restore(from);
      EXPECT_FALSE(r.gpu.fresh());
      EXPECT_TRUE(same_state(r.gpu, r.ref));
      EXPECT_TRUE(tails_zero(r.gpu));
      EXPECT_EQ(r.gpu.len(), s.len);
      EXPECT_EQ(r.gpu.base(), c.g.is_ring() ? plan_first(c.g, s.len) : 0);
      EXPECT_EQ(r.gpu.read_base_d(), r.gpu.base());
      EXPECT_EQ(r.gpu.read_len_d(), s.len);
      EXPECT_TRUE(same_snapshot(r.gpu.snapshot(), r.ref.snapshot()));
    }
  }
  std::filesystem::remove(file);
}

TEST(CudaSnapshot, RestoredLayersContinueAsTheOriginal) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  int replayed = 0, verified = 0, rewound = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Rng rng(0xC0DE ^ std::uint64_t(c.gqa));
    const int nq = c.g.n_kv_heads * c.gqa;
    Twin original(c.g, nq, stream.get());
    original.history(200, rng);
    Twin copy(c.g, nq, stream.get());
    const kvlayer::Snapshot s = original.gpu.snapshot();
    copy.gpu.restore(s);
    copy.ref.restore(s);
    ref::KvLayer& logical = original.ref;  // the original, continued on the reference alone
    const std::int64_t max_n = c.g.is_ring() ? c.g.max_append : 16;
    for (int round = 0; round < 40 && !::testing::Test::HasFailure(); ++round) {
      const std::int64_t room = c.g.max_ctx - copy.ref.len();
      switch (rng.range(0, 5)) {
        case 0: {
          if (room < 1) break;
          const HostRows rows =
              make_rows(c.g, std::min(rng.range(1, max_n), room), DType::f16, Fill::random, rng);
          const DeviceRows d(rows);
          copy.gpu.append(d.view);
          copy.ref.append(rows.view());
          logical.append(rows.view());
          break;
        }
        case 1:
          check_decode(copy, rng);
          break;
        case 2:
          check_verify(copy, int(rng.range(1, 6)), rng);
          ++verified;
          break;
        case 3: {
          const std::int64_t p = copy.ref.len() - rng.range(0, 6);
          if (copy.ref.can_rewind_to(p)) {
            ASSERT_TRUE(logical.can_rewind_to(p));
            copy.gpu.rewind(p);
            copy.ref.rewind(p);
            logical.rewind(p);
            ++rewound;
          }
          break;
        }
        case 4: {
          const std::int64_t k = std::min(rng.range(1, max_n), room);
          if (k < 1) break;
          const Rng saved = rng;
          copy.device_chain(k, rng);
          // The same rows on the original's reference.
          Rng again = saved;
          logical.reserve(k);
          for (std::int64_t i = 0; i < k; ++i) {
            const HostRows row = make_rows(c.g, 1, DType::f32, Fill::random, again);
            c.g.window ? logical.append_dcw(row.view()) : logical.append_dc(row.view());
            logical.inc_seqlen();
          }
          logical.account_steps(k);
          break;
        }
        case 5: {
          const std::int64_t k = std::min(rng.range(1, max_n), room);
          if (k < 1) break;
          const Rng saved = rng;
          replay_chain(copy, k, rng);
          Rng again = saved;
          logical.reserve(k);
          for (std::int64_t i = 0; i < k; ++i) {
            const HostRows row = make_rows(c.g, 1, DType::f32, Fill::random, again);
            (void)random_q(std::size_t(nq) * c.g.head_dim_k, again);
            c.g.window ? logical.append_dcw(row.view()) : logical.append_dc(row.view());
            logical.inc_seqlen();
          }
          logical.account_steps(k);
          ++replayed;
          break;
        }
      }
      ASSERT_TRUE(same_state(copy.gpu, copy.ref)) << "round " << round;
      ASSERT_EQ(logical_diff(logical, copy.ref), "") << "round " << round;
    }
    EXPECT_TRUE(copy.gpu.status().ok()) << copy.gpu.status().message();
  }
  EXPECT_GT(replayed, 5);
  EXPECT_GT(verified, 5);
  EXPECT_GT(rewound, 5);
}

TEST(CudaSnapshot, RefusalsAreTheReferencesAndChangeNothing) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x4EF);
  const Geometry g = ring(1, 64, 1000, 40, 4, 2);
  Twin src(g, 2, stream.get());
  src.history(120, rng);
  const kvlayer::Snapshot s = src.ref.snapshot();

  // Not fresh: after each kind of state-changing call, as the reference defines it.
  const HostRows one = make_rows(g, 1, DType::f32, Fill::random, rng);
  const DeviceRows d_one(one);
  const std::function<void(Twin&)> calls[] = {
      [&](Twin& t) {
        t.gpu.append(d_one.view);
        t.ref.append(one.view());
      },
      [&](Twin& t) {
        t.gpu.append_dcw(d_one.view);
        t.ref.append_dcw(one.view());
      },
      [&](Twin& t) {
        t.gpu.append_rows_dcw(d_one.view);
        t.ref.append_rows_dcw(one.view());
      },
      [&](Twin& t) {
        t.gpu.inc_seqlen();
        t.ref.inc_seqlen();
      },
      [&](Twin& t) {
        t.gpu.reserve(0);
        t.ref.reserve(0);
      },
      [&](Twin& t) {
        t.gpu.rewind(0);
        t.ref.rewind(0);
      },
      [&](Twin& t) {
        t.gpu.account_steps(0);
        t.ref.account_steps(0);
      },
      [&](Twin& t) {
        t.gpu.restore(s);
        t.ref.restore(s);
      },
  };
  for (const auto& call : calls) {
    Twin t(g, 2, stream.get());
    call(t);
    EXPECT_FALSE(t.gpu.fresh());
    const Snapshot before = snapshot(t.gpu);
    const std::string want = refusal_of([&] { t.ref.restore(s); });
    EXPECT_EQ(want.rfind("restore: the layer is not fresh", 0), 0u) << want;
    EXPECT_EQ(refusal_of([&] { t.gpu.restore(s); }), want);
    EXPECT_TRUE(same_state(snapshot(t.gpu), before, g));
  }

  // Another geometry, a malformed snapshot: the layer stays fresh and all zero.
  auto refused_alike = [&](const Geometry& layer_g, const kvlayer::Snapshot& bad) {
    Twin t(layer_g, 2, stream.get());
    const std::string want = refusal_of([&] { t.ref.restore(bad); });
    EXPECT_NE(want, "");
    EXPECT_EQ(refusal_of([&] { t.gpu.restore(bad); }), want);
    EXPECT_TRUE(t.gpu.fresh());
    EXPECT_TRUE(same_state(t.gpu, t.ref));
    EXPECT_TRUE(tails_zero(t.gpu));
  };
  refused_alike(ring(1, 64, 1000, 41, 4, 2), s);
  refused_alike(flat(1, 64, 1000, 40), s);
  kvlayer::Snapshot bad = s;
  bad.first -= 32;
  refused_alike(g, bad);
  bad = s;
  bad.k.resize(bad.k.size() - 34);
  refused_alike(g, bad);

  // A snapshot before replayed steps are accounted for.
  src.gpu.append_dcw(d_one.view);
  src.ref.append_dcw(one.view());
  src.gpu.inc_seqlen();
  src.ref.inc_seqlen();
  const Snapshot before = snapshot(src.gpu);
  const std::string want = refusal_of([&] { (void)src.ref.snapshot(); });
  EXPECT_EQ(want,
            "snapshot: len_d 121 != len 120 (account for replayed device-counter steps "
            "with account_steps first)");
  EXPECT_EQ(refusal_of([&] { (void)src.gpu.snapshot(); }), want);
  EXPECT_TRUE(same_state(snapshot(src.gpu), before, g));
}

}  // namespace
}  // namespace kvlayer::testing
