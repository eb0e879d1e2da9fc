// Decode through the layer (SPEC §8) against the float64 reference, within the accuracy bound
// derived in reference/include/kvlayer/reference/accuracy.hpp from the GPU's declared
// precision (fp16 q and p, f32 accumulation over ≤ max_keys_per_split keys, n_splits partials).
// Head dims 64/128/256 × gqa 1/4/8/16, flat, flat windowed and ring layers, view lengths from 1
// to rows. The device-counter variants must give bit-identical outputs to host-len decode on the
// same state (the split depends only on the view length and the geometry).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

/// Compares a GPU output with the reference within the per-element bound; NaN only where the
/// reference has NaN. Returns the largest |error| / bound seen.
/// Every element that passed is recorded in the run's bound tightness.
double expect_within(const std::vector<float>& got, const std::vector<double>& want,
                     const ref::DecodeBound& b, const std::string& what) {
  const std::vector<double>& bound = b.bound;
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  int reported = 0;
  for (std::size_t e = 0; e < got.size() && e < want.size(); ++e) {
    if (std::isnan(want[e])) {
      if (!std::isnan(got[e]) && reported++ < 5)
        ADD_FAILURE() << what << ": element " << e << " is " << got[e]
                      << " where the reference is NaN (a bad block was attended)";
      bound_tightness().skip();
      continue;
    }
    const double err = std::fabs(double(got[e]) - want[e]);
    if (!std::isfinite(got[e]) || !(err <= bound[e])) {
      if (reported++ < 5)
        ADD_FAILURE() << what << ": element " << e << " got " << got[e] << ", reference " << want[e]
                      << ", |error| " << err << " > bound " << bound[e];
      continue;
    }
    if (bound[e] > 0) worst = std::max(worst, err / bound[e]);
    bound_tightness().record(got[e], b, e);
  }
  return worst;
}

struct DecodeCase {
  Geometry g;
  int gqa;
  int rows_per_block = 0;  ///< the plan's, checked where nonzero
};

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> out;
  for (int hd : cuda::kSupportedHeadDims) {
    for (int gqa : {1, 4, 8, 16}) {
      out.push_back({flat(2, hd, 173), gqa});
      out.push_back({flat(2, hd, 150, 77), gqa});
      out.push_back({ring(2, hd, 2000, 61, 16, 4), gqa});  // rows = 61 + 16 + 4 + 31 = 112
    }
  }
  // gqa > 8 splits a KV head's rows over two blocks of 8 where its splits leave slots empty
  // (every case above); enough KV heads keep one block of 16 rows.
  for (int hd : {128, 256}) {
    out.push_back({flat(2, hd, 173), 12, 8});
    out.push_back({flat(48, hd, 300), 16, 16});
  }
  return out;
}

/// One decode of every applicable variant at the current state, checked against the reference.
void check_decode_here(cuda::KvLayer& gpu, ref::KvLayer& ref, Rng& rng, cudaStream_t stream,
                       double& worst) {
  const Geometry& g = ref.geometry();
  const int nq = gpu.n_q_heads();
  const std::size_t qn = std::size_t(nq) * g.head_dim_k, on = std::size_t(nq) * g.head_dim_v;
  std::vector<float> hq(qn);
  const float qmag = std::ldexp(1.0f, int(rng.range(-2, 3)));
  for (float& x : hq) x = qmag * rng.uniform(-1, 1);
  const std::optional<float> scale =
      rng.chance(25) ? std::optional<float>(rng.uniform(0.01f, 0.3f)) : std::nullopt;
  DeviceFloats q(qn), out(on), out_dc(on);
  q.upload(hq);

  out.poison(stream);
  gpu.decode(q.get(), out.get(), scale);
  const std::vector<float> got = out.download(stream);
  const auto [begin, end] = ref.view();
  const std::vector<double> want = ref.decode(hq, nq, scale);
  const ref::DecodeBound bound = ref::decode_bound(
      ref, hq, nq, scale, ref::DecodeView{begin, end, ref.base()}, gpu.accumulation_shape());
  const std::string what = g.describe() + " gqa " + std::to_string(nq / g.n_kv_heads) + " view [" +
                           std::to_string(begin) + ", " + std::to_string(end) + ")";
  worst = std::max(worst, expect_within(got, want, bound, what));
  if (end > begin) {
    double norm = 0;
    for (float x : got) norm += double(x) * x;
    EXPECT_GT(norm, 0.0) << what << ": all-zero output";
  }

  // Device-counter decode on the same state: bit-identical (len_d == len, base_d == base).
  out_dc.poison(stream);
  if (g.window)
    gpu.decode_dcw(q.get(), out_dc.get(), scale);
  else
    gpu.decode_dc(q.get(), out_dc.get(), scale);
  const std::vector<float> got_dc = out_dc.download(stream);
  for (std::size_t e = 0; e < on; ++e) {
    if (std::bit_cast<std::uint32_t>(got_dc[e]) != std::bit_cast<std::uint32_t>(got[e])) {
      ADD_FAILURE() << what << ": device-counter decode differs at " << e << ": " << got_dc[e]
                    << " vs host-len " << got[e];
      break;
    }
  }
  EXPECT_TRUE(gpu.status().ok()) << gpu.status().message();
}

TEST(CudaDecode, MatchesReferenceWithinDerivedTolerance) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xDEC0DE);
  for (const DecodeCase& c : decode_cases()) {
    const Geometry& g = c.g;
    SCOPED_TRACE(g.describe() + " gqa " + std::to_string(c.gqa));
    cuda::KvLayer gpu(g, g.n_kv_heads * c.gqa, stream.get());
    if (c.rows_per_block != 0) {
      ASSERT_EQ(gpu.decode_plan().rows_per_block, c.rows_per_block);
    }
    ref::KvLayer ref(g);
    double worst = 0;
    check_decode_here(gpu, ref, rng, stream.get(), worst);  // empty view: zeros
    {
      DeviceFloats q(std::size_t(gpu.n_q_heads()) * g.head_dim_k),
          out(std::size_t(gpu.n_q_heads()) * g.head_dim_v);
      q.upload(std::vector<float>(q.count, 1.0f));
      out.poison(stream.get());
      gpu.decode(q.get(), out.get());
      for (float x : out.download(stream.get())) ASSERT_EQ(x, 0.0f) << "empty view";
    }
    const std::int64_t stop = g.is_ring() ? 400 : g.max_ctx;
    while (ref.len() < stop && !::testing::Test::HasFatalFailure()) {
      // Mostly single rows near the interesting lengths, bigger chunks in between.
      const std::int64_t len = ref.len();
      const bool near = len < 3 || (len + 1) % 32 <= 2 || stop - len <= 2 ||
                        (g.window && std::abs(len - *g.window) <= 2);
      std::int64_t n = near ? 1 : rng.range(1, g.is_ring() ? g.max_append : 23);
      n = std::min(n, stop - len);
      const HostRows rows =
          make_rows(g, n, kDTypes[rng.range(0, 2)],
                    rng.chance(80) ? Fill::random : Fill::finite_adversarial, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
      // f16 rows of the finite-adversarial patterns may still overflow; keep the data clean.
      if (!ref.status().ok()) {
        gpu.rewind(len);
        ref.rewind(len);
        gpu.clear_status();
        ref.clear_status();
        continue;
      }
      check_decode_here(gpu, ref, rng, stream.get(), worst);
    }
    ASSERT_TRUE(same_state(gpu, ref));
    const cuda::DecodePlanInfo plan = gpu.decode_plan();
    std::printf("  %s gqa %d: worst |error|/bound %.3g, %d splits of <= %lld keys, %s by %d rows\n",
                g.describe().c_str(), c.gqa, worst, plan.n_splits,
                static_cast<long long>(plan.max_keys_per_split), plan.kernel, plan.rows_per_block);
  }
}

/// Every length 1..rows on one small ring and one flat layer (every split boundary).
TEST(CudaDecode, EveryLengthUpToRows) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x1E9);
  for (const DecodeCase& c :
       {DecodeCase{flat(1, 128, 300), 8}, DecodeCase{ring(1, 64, 600, 40, 1, 0), 4}}) {
    SCOPED_TRACE(c.g.describe());
    cuda::KvLayer gpu(c.g, c.gqa, stream.get());
    ref::KvLayer ref(c.g);
    double worst = 0;
    const std::int64_t stop = c.g.is_ring() ? 3 * c.g.rows() : c.g.rows();
    while (ref.len() < stop && !::testing::Test::HasFatalFailure()) {
      const HostRows rows = make_rows(c.g, 1, DType::f32, Fill::random, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
      check_decode_here(gpu, ref, rng, stream.get(), worst);
    }
    std::printf("  %s: worst |error|/bound %.3g\n", c.g.describe().c_str(), worst);
  }
}

/// A canonical bad block attended gives NaN where the reference has NaN, finite elsewhere.
TEST(CudaDecode, BadBlocksPropagateNaN) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xBADB);
  const Geometry g = flat(2, 128, 100);
  cuda::KvLayer gpu(g, 8, stream.get());
  ref::KvLayer ref(g);
  for (int i = 0; i < 3; ++i) {
    const HostRows rows = make_rows(g, 20, DType::f32, Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
  }
  // Row 60: a bad V block 1 of KV head 0 (elements 32..63); row 61: a bad K block of KV head 1.
  std::vector<float> k(std::size_t(2 * g.kv_dim_k())), v(std::size_t(2 * g.kv_dim_v()));
  fill_values(k, Fill::random, rng);
  fill_values(v, Fill::random, rng);
  v[40] = std::numeric_limits<float>::quiet_NaN();
  k[std::size_t(g.kv_dim_k() + 128 + 3)] = std::numeric_limits<float>::infinity();
  const HostRows bad = encode_rows(k, v, 2, DType::f32);
  const DeviceRows d(bad);
  gpu.append(d.view);
  ref.append(bad.view());
  ASSERT_TRUE(same_state(gpu, ref));
  const std::size_t qn = 8 * 128;
  std::vector<float> hq(qn);
  for (float& x : hq) x = rng.uniform(-1, 1);
  DeviceFloats q(qn), out(qn);
  q.upload(hq);
  out.poison(stream.get());
  gpu.decode(q.get(), out.get());
  const auto got = out.download(stream.get());
  const auto want = ref.decode(hq, 8);
  const auto bound = ref::decode_bound(ref, hq, 8, std::nullopt, ref::DecodeView{0, 62, 0},
                                       gpu.accumulation_shape());
  int nan_count = 0;
  for (double w : want) nan_count += std::isnan(w);
  EXPECT_GT(nan_count, 0);
  EXPECT_LT(nan_count, int(want.size()));
  (void)expect_within(got, want, bound, "bad blocks");
}

}  // namespace
}  // namespace kvlayer::testing
