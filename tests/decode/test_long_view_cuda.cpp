// Decode and verify decode at 64K and 128K keys (SPEC §8, §11) against the float64 reference
// within the derived bound: the benchmark geometries (8×128 gqa 8, 4×256 gqa 8, 1×128 gqa 16),
// T = 1, 4, 16 and 64, on a flat layer and on a ring with a 4096-key window after rebases of
// 4096-row appends (base far above 0, every view cut into many splits). Each check prints the
// resolution it had: the largest error/bound and the 99th percentile over its elements.
// Its own binary: the reference side of 128K keys takes minutes of CPU (its verify rows run on
// every core).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

struct LongGeometry {
  int n_kv, head_dim, gqa;
};
constexpr LongGeometry kGeometries[] = {{8, 128, 8}, {4, 256, 8}, {1, 128, 16}};
constexpr std::int64_t kLengths[] = {65536, 131072};
constexpr int kQueries[] = {1, 4, 16, 64};
constexpr std::int64_t kChunk = 4096;  // rows per append (and the ring's max_append)
constexpr std::int64_t kWindow = 4096;
constexpr int kMaxVerify = 64;

/// What one check reached: its largest error/bound, the 99th percentile, elements compared.
struct Resolution {
  double worst = 0, p99 = 0;
  std::int64_t elements = 0;
};

/// A decode (T = 1) or verify of T queries at the current state, every element compared with
/// the reference within its bound.
Resolution check_here(cuda::KvLayer& gpu, const ref::KvLayer& ref, int T, Rng& rng,
                      cudaStream_t stream, const std::string& what) {
  const Geometry& g = ref.geometry();
  const int nq = gpu.n_q_heads();
  std::vector<float> hq(std::size_t(T) * nq * g.head_dim_k);
  for (float& x : hq) x = rng.uniform(-1, 1);
  const std::size_t row_out = std::size_t(nq) * g.head_dim_v;
  DeviceFloats q(hq.size()), out(T * row_out);
  q.upload(hq);
  out.poison(stream);
  std::vector<double> want;
  std::vector<ref::DecodeBound> bounds;
  if (T == 1) {
    gpu.decode(q.get(), out.get());
    want = ref.decode(hq, nq, std::nullopt);
    const auto [begin, end] = ref.view();
    bounds.push_back(ref::decode_bound(ref, hq, nq, std::nullopt,
                                       ref::DecodeView{begin, end, ref.base()},
                                       gpu.accumulation_shape()));
  } else {
    gpu.decode_rows(q.get(), out.get(), T);
    want = ref.decode_rows(hq, nq, T, std::nullopt);
    const std::vector<ref::DecodeView> views = ref.verify_views(T);
    bounds =
        ref::decode_rows_bound(ref, hq, nq, std::nullopt, views, gpu.verify_accumulation_shape(T));
  }
  const std::vector<float> got = out.download(stream);
  EXPECT_TRUE(gpu.status().ok()) << what << ": " << gpu.status().message();
  Resolution r;
  std::vector<double> ratios;
  int reported = 0;
  for (int i = 0; i < T; ++i)
    for (std::size_t e = 0; e < row_out; ++e) {
      const std::size_t at = std::size_t(i) * row_out + e;
      const double b = bounds[std::size_t(i)].bound[e];
      const double err = std::fabs(double(got[at]) - want[at]);
      ++r.elements;
      // Finite data: the reference is never NaN here, and neither may the GPU be.
      if (!std::isfinite(want[at]) || !std::isfinite(got[at]) || !(err <= b)) {
        if (reported++ < 5)
          ADD_FAILURE() << what << " row " << i << " element " << e << ": got " << got[at]
                        << ", reference " << want[at] << ", |error| " << err << " > bound " << b;
        continue;
      }
      if (b > 0) ratios.push_back(err / b);
      bound_tightness().record(got[at], bounds[std::size_t(i)], e);
      systematic_check().record(got[at], want[at], bounds[std::size_t(i)], e);
    }
  systematic_check().end_launch();
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    r.worst = ratios.back();
    r.p99 = ratios[std::min(ratios.size() - 1, std::size_t(0.99 * double(ratios.size())))];
  }
  return r;
}

/// Fills the layer up to each of kLengths in kChunk-row appends and checks every T there.
void run_long(const Geometry& g, int gqa, Rng& rng) {
  Stream stream;
  cuda::KvLayer gpu(g, g.n_kv_heads * gqa, stream.get(), kMaxVerify);
  ref::KvLayer ref(g, kMaxVerify);
  for (const std::int64_t length : kLengths) {
    while (ref.len() < length && !::testing::Test::HasFatalFailure()) {
      const HostRows rows = make_rows(g, std::min(kChunk, length - ref.len()),
                                      kDTypes[rng.range(0, 2)], Fill::random, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
    }
    ASSERT_TRUE(same_state(gpu, ref));
    if (g.is_ring()) {
      ASSERT_GT(ref.base(), 0) << "the ring never rebased";
    }
    for (const int T : kQueries) {
      // The keys the launch attends: the union of its rows' views.
      const std::int64_t first_end = ref.len() - T + 1;
      const std::int64_t union_begin =
          g.window ? std::max<std::int64_t>(0, first_end - *g.window) : 0;
      const std::string what = g.describe() + " gqa " + std::to_string(gqa) + " len " +
                               std::to_string(ref.len()) + " T " + std::to_string(T);
      const cuda::DecodeLaunchInfo launch =
          gpu.decode_launch(T == 1 ? 0 : T, ref.len() - union_begin);
      const Resolution r = check_here(gpu, ref, T, rng, stream.get(), what);
      std::printf(
          "  %-48s %-20s splits %4d x %6lld keys: %9lld elements, worst error/bound %.3g, "
          "p99 %.3g\n",
          what.c_str(), launch.kernel, launch.active_splits, (long long)launch.keys_per_split,
          (long long)r.elements, r.worst, r.p99);
      std::fflush(stdout);  // progress shows even when a time limit stops the run
      EXPECT_GT(r.elements, 0) << what;
    }
  }
}

TEST(CudaLongView, FlatDecodeAndVerifyWithinTheirBoundsAt64KAnd128K) {
  KVLAYER_REQUIRE_GPU();
  Rng rng(0x128C0DE);
  for (const LongGeometry& lg : kGeometries) {
    SCOPED_TRACE(std::to_string(lg.n_kv) + "x" + std::to_string(lg.head_dim));
    run_long(flat(lg.n_kv, lg.head_dim, kLengths[1]), lg.gqa, rng);
  }
}

TEST(CudaLongView, RingWindowAfterRebasesWithinTheirBoundsAt64KAnd128K) {
  KVLAYER_REQUIRE_GPU();
  Rng rng(0x41196);
  for (const LongGeometry& lg : kGeometries) {
    SCOPED_TRACE(std::to_string(lg.n_kv) + "x" + std::to_string(lg.head_dim));
    // rewind_slack ≥ the largest T: after an append of kChunk rows, the first verify row's
    // window [len − T + 1 − window, …) stays resident.
    run_long(ring(lg.n_kv, lg.head_dim, kLengths[1], kWindow, kChunk, kMaxVerify), lg.gqa, rng);
  }
}

}  // namespace
}  // namespace kvlayer::testing
