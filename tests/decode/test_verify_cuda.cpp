// Speculative steps on the CUDA layer (SPEC §11) against the reference: T-row device-counter
// appends give the bytes of T single appends, and a verify decode's row i is, within the derived
// bound of verify_accumulation_shape(T), the decode the reference computes at len p_i + 1 (a
// copy of the reference rewound there: the per-row causal window re-derived from §5–8, not
// taken from the verify code under test). Device-counter variants are bit-identical to the
// host-len verify on the same state; a captured draft-verify step replays like the host calls.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

struct VerifyCase {
  Geometry g;
  int gqa;
};

std::vector<VerifyCase> verify_cases() {
  std::vector<VerifyCase> out;
  for (int hd : cuda::kSupportedHeadDims) {
    for (int gqa : {1, 4, 8, 16}) {
      out.push_back({flat(2, hd, 260), gqa});
      out.push_back({flat(2, hd, 260, 70), gqa});
      out.push_back({ring(2, hd, 3000, 61, 20, 4), gqa});
    }
  }
  return out;
}

/// q for T queries, [T, n_q_heads, head_dim_k], of a random magnitude.
std::vector<float> random_queries(int T, int nq, int hd, Rng& rng) {
  std::vector<float> q(std::size_t(T) * nq * hd);
  const float mag = std::ldexp(1.0f, int(rng.range(-2, 3)));
  for (float& x : q) x = mag * rng.uniform(-1, 1);
  return q;
}

/// Checks a verify decode of T queries at the current state: host-len against the reference
/// row by row, then the device-counter variant bit for bit against it. zero_dims: q is 0 at
/// head dims [first, second) of every head.
void check_verify_here(cuda::KvLayer& gpu, const ref::KvLayer& ref, int T, Rng& rng,
                       cudaStream_t stream, double& worst, std::pair<int, int> zero_dims = {0, 0}) {
  const Geometry& g = ref.geometry();
  const int nq = gpu.n_q_heads(), hd = g.head_dim_k;
  std::vector<float> hq = random_queries(T, nq, hd, rng);
  for (std::size_t i = 0; i < hq.size(); ++i)
    if (int(i % std::size_t(hd)) >= zero_dims.first && int(i % std::size_t(hd)) < zero_dims.second)
      hq[i] = 0.0f;
  const std::optional<float> scale =
      rng.chance(25) ? std::optional<float>(rng.uniform(0.01f, 0.3f)) : std::nullopt;
  const std::size_t row_out = std::size_t(nq) * g.head_dim_v;
  DeviceFloats q(hq.size()), out(T * row_out), out_dc(T * row_out);
  q.upload(hq);
  out.poison(stream);
  gpu.decode_rows(q.get(), out.get(), T, scale);
  const std::vector<float> got = out.download(stream);
  const kvlayer::AccumulationShape shape = gpu.verify_accumulation_shape(T);

  for (int i = 0; i < T && !::testing::Test::HasFailure(); ++i) {
    const std::int64_t end = ref.len() - T + i + 1;  // p_i + 1
    ref::KvLayer at = ref;
    at.rewind(end);
    const auto [begin, view_end] = at.view();
    const std::vector<float> qi(hq.begin() + i * nq * hd, hq.begin() + (i + 1) * nq * hd);
    const std::vector<double> want = at.decode(qi, nq, scale);
    const ref::DecodeBound b =
        ref::decode_bound(at, qi, nq, scale, ref::DecodeView{begin, view_end, at.base()}, shape);
    const std::string what = g.describe() + " gqa " + std::to_string(nq / g.n_kv_heads) + " T " +
                             std::to_string(T) + " row " + std::to_string(i) + " view [" +
                             std::to_string(begin) + ", " + std::to_string(view_end) + ")";
    int reported = 0;
    for (std::size_t e = 0; e < row_out; ++e) {
      const float x = got[i * row_out + e];
      if (std::isnan(want[e])) {
        if (!std::isnan(x) && reported++ < 5)
          ADD_FAILURE() << what << ": element " << e << " is " << x
                        << " where the reference is NaN";
        bound_tightness().skip();
        continue;
      }
      const double err = std::fabs(double(x) - want[e]);
      if (!std::isfinite(x) || !(err <= b.bound[e])) {
        if (reported++ < 5)
          ADD_FAILURE() << what << ": element " << e << " got " << x << ", reference " << want[e]
                        << ", |error| " << err << " > bound " << b.bound[e];
        continue;
      }
      if (b.bound[e] > 0) worst = std::max(worst, err / b.bound[e]);
      bound_tightness().record(x, b, e);
    }
  }

  out_dc.poison(stream);
  if (g.window)
    gpu.decode_rows_dcw(q.get(), out_dc.get(), T, scale);
  else
    gpu.decode_rows_dc(q.get(), out_dc.get(), T, scale);
  const std::vector<float> got_dc = out_dc.download(stream);
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (std::bit_cast<std::uint32_t>(got_dc[e]) != std::bit_cast<std::uint32_t>(got[e])) {
      ADD_FAILURE() << g.describe() << " T " << T << ": device-counter verify differs at " << e
                    << ": " << got_dc[e] << " vs host-len " << got[e];
      break;
    }
  }
  EXPECT_TRUE(gpu.status().ok()) << gpu.status().message();
}

TEST(CudaVerify, RowsMatchSingleQueryDecodesWithinTheirBounds) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x5BEC);
  for (const VerifyCase& c : verify_cases()) {
    const Geometry& g = c.g;
    SCOPED_TRACE(g.describe() + " gqa " + std::to_string(c.gqa));
    cuda::KvLayer gpu(g, g.n_kv_heads * c.gqa, stream.get());
    ref::KvLayer ref(g);
    double worst = 0;
    const std::int64_t stop = g.is_ring() ? 420 : g.max_ctx;
    while (ref.len() < stop && !::testing::Test::HasFailure()) {
      const std::int64_t len = ref.len();
      std::int64_t n = rng.range(1, g.is_ring() ? g.max_append : 29);
      n = std::min(n, stop - len);
      const HostRows rows = make_rows(g, n, kDTypes[rng.range(0, 2)], Fill::random, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
      for (int T : {1, 2, 3, 7, 16}) {
        if (T > ref.len()) continue;
        // The first query's view must be resident (a ring drops rows behind the window).
        const std::int64_t first_end = ref.len() - T + 1;
        if (g.window && first_end - *g.window < ref.base()) continue;
        check_verify_here(gpu, ref, T, rng, stream.get(), worst);
      }
    }
    ASSERT_TRUE(same_state(gpu, ref));
    std::printf("  %s gqa %d: worst |error|/bound %.3g\n", g.describe().c_str(), c.gqa, worst);
  }
}

/// The verify kernel folds each K block's d into fp16 K (accuracy.hpp (1)) except in a tile
/// holding a block whose d is beyond the fold (|d| > 511.75): there it multiplies exact quants.
/// Keys whose block 1 has d ≈ 551 (beyond) or ≈ 472 (the fold's edge, products up to 60,000),
/// with q zero on that block's dims, so that the scores stay finite only where the kernel kept
/// those blocks exact (a folded d ≈ 551 gives ±inf · 0 = NaN) or folded them within range; every
/// row within its bound (the keys near a block beyond the fold may take either K).
TEST(CudaVerify, KBlocksBeyondTheFoldKeepExactQuants) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int hd : cuda::kSupportedHeadDims) {
    const Geometry g = flat(2, hd, 400);
    SCOPED_TRACE(g.describe());
    cuda::KvLayer gpu(g, g.n_kv_heads * 8, stream.get());
    ref::KvLayer ref(g);
    HostRows rows = make_rows(g, 250, DType::f32, Fill::random, rng);
    std::int64_t beyond = 0, edge = 0;
    for (std::int64_t r = 0; r < rows.n; ++r) {
      const int kind = r % 97 == 5 ? 1 : r % 89 == 40 ? 2 : 0;  // rows 5, 102, 199 / 40, 129, 218
      if (kind == 0) continue;
      const float amax = kind == 1 ? 70000.0f : 60000.0f;  // d = 551.2 → 551; 472.4 → 472.5
      for (int kv = 0; kv < g.n_kv_heads; ++kv)
        for (int j = 0; j < kBlockValues; ++j)
          rows.k[std::size_t(r * g.kv_dim_k() + kv * hd + kBlockValues + j)] =
              amax * (j == 7 ? 1.0f : rng.uniform(-1, 1));
      (kind == 1 ? beyond : edge) += g.n_kv_heads;
    }
    rows = encode_rows(rows.k, rows.v, rows.n, DType::f32);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
    ASSERT_EQ(beyond, 3 * g.n_kv_heads);
    ASSERT_EQ(edge, 3 * g.n_kv_heads);
    double worst = 0;
    for (int T : {2, 8, 16}) check_verify_here(gpu, ref, T, rng, stream.get(), worst, {32, 64});
    std::printf("  %s gqa 8, K blocks beyond the fold: worst |error|/bound %.3g\n",
                g.describe().c_str(), worst);
  }
}

/// A T-row device-counter append writes the bytes of T single appends, at len_d … len_d + T − 1,
/// and inc_seqlen(T) moves len_d by T.
TEST(CudaVerify, MultiRowAppendIsTSingleAppends) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xA11);
  for (const Geometry& g : {flat(3, 128, 90), flat(1, 64, 90, 30), ring(2, 256, 500, 40, 16, 2)}) {
    SCOPED_TRACE(g.describe());
    cuda::KvLayer gpu(g, g.n_kv_heads * 4, stream.get());
    ref::KvLayer ref(g);
    for (int step = 0; step < 12; ++step) {
      const int T = int(rng.range(1, 16));
      if (ref.len() + T > (g.is_ring() ? 400 : g.max_ctx)) break;
      const HostRows rows =
          make_rows(g, T, kDTypes[rng.range(0, 2)], Fill::finite_adversarial, rng);
      const DeviceRows d(rows);
      gpu.reserve(T);
      if (g.is_ring() || g.window)
        gpu.append_rows_dcw(d.view);
      else
        gpu.append_rows_dc(d.view);
      gpu.inc_seqlen(T);
      gpu.account_steps(T);
      ref.append(rows.view());  // the reference's T-row append: T single rows' bytes (SPEC §5)
      ASSERT_TRUE(same_state(gpu, ref)) << "after step " << step << " (T " << T << ")";
    }
  }
}

/// The engine's speculative step captured once (T draft rows, inc_seqlen(T), verify) and
/// replayed, with the accepted prefix kept by rewind between replays: the outputs match the
/// host-len calls on the same states bit for bit, and the planes match the reference.
TEST(CudaVerify, CapturedDraftVerifyStepReplays) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xCA97);
  const int T = 5;
  for (const Geometry& g : {flat(2, 128, 400), ring(2, 128, 2000, 64, T, 8)}) {
    SCOPED_TRACE(g.describe());
    const int nq = g.n_kv_heads * 8;
    cuda::KvLayer gpu(g, nq, stream.get());
    ref::KvLayer ref(g);
    const HostRows prefill = make_rows(g, 40, DType::f16, Fill::random, rng);
    {
      const DeviceRows d(prefill);
      gpu.append(d.view);
    }
    ref.append(prefill.view());
    DeviceFloats q(std::size_t(T) * nq * g.head_dim_k), out(std::size_t(T) * nq * g.head_dim_v),
        host_out(std::size_t(T) * nq * g.head_dim_v);
    HostRows draft = make_rows(g, T, DType::f32, Fill::random, rng);
    DeviceRows d(draft);

    gpu.reserve(T);
    KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    if (g.window)
      gpu.append_rows_dcw(d.view);
    else
      gpu.append_rows_dc(d.view);
    gpu.inc_seqlen(T);
    if (g.window)
      gpu.decode_rows_dcw(q.get(), out.get(), T);
    else
      gpu.decode_rows_dc(q.get(), out.get(), T);
    const cuda::Graph graph = cuda::Graph::end_capture(stream.get());

    for (int step = 0; step < 20; ++step) {
      // New draft values and queries in the buffers the graph reads.
      draft = make_rows(g, T, DType::f32, Fill::random, rng);
      KVLAYER_CUDA_TRY(cudaMemcpy(const_cast<void*>(d.view.k), draft.k_bytes.data(),
                                  draft.k_bytes.size(), cudaMemcpyHostToDevice));
      KVLAYER_CUDA_TRY(cudaMemcpy(const_cast<void*>(d.view.v), draft.v_bytes.data(),
                                  draft.v_bytes.size(), cudaMemcpyHostToDevice));
      q.upload(random_queries(T, nq, g.head_dim_k, rng));
      out.poison(stream.get());
      gpu.reserve(T);
      graph.launch(stream.get());
      gpu.account_steps(T);
      ref.append(draft.view());
      ASSERT_TRUE(same_state(gpu, ref)) << "after replay " << step;

      // The host-len verify on the same state gives the same bits.
      host_out.poison(stream.get());
      gpu.decode_rows(q.get(), host_out.get(), T);
      const std::vector<float> a = out.download(stream.get()), b = host_out.download(stream.get());
      for (std::size_t e = 0; e < a.size(); ++e)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(a[e]), std::bit_cast<std::uint32_t>(b[e]))
            << "replay " << step << " element " << e;

      // Accept a random prefix of the drafts.
      const std::int64_t keep = ref.len() - T + rng.range(0, T);
      gpu.rewind(keep);
      ref.rewind(keep);
    }
    EXPECT_TRUE(gpu.status().ok()) << gpu.status().message();
  }
}

/// A bad block in a draft row poisons exactly the verify rows whose own views hold it (SPEC
/// §11): the queries before it stay finite and within their bounds, although the tile they
/// share holds the bad block's NaN values (V bad: the masked keys take no part in PV at all).
TEST(CudaVerify, BadDraftRowPoisonsOnlyTheRowsThatSeeIt) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xBAD5);
  for (const Plane bad_plane : {Plane::k, Plane::v}) {
    for (const Geometry& g : {flat(2, 128, 200), flat(1, 64, 200, 40)}) {
      SCOPED_TRACE(g.describe() + (bad_plane == Plane::k ? " bad K" : " bad V"));
      const int T = 7, bad_row = 4, nq = g.n_kv_heads * 4;
      cuda::KvLayer gpu(g, nq, stream.get());
      ref::KvLayer ref(g);
      const HostRows prefill = make_rows(g, 90, DType::f32, Fill::random, rng);
      HostRows draft = make_rows(g, T, DType::f32, Fill::random, rng);
      std::vector<float>& x = bad_plane == Plane::k ? draft.k : draft.v;
      const std::int64_t dim = bad_plane == Plane::k ? g.kv_dim_k() : g.kv_dim_v();
      x[std::size_t(bad_row * dim + 5)] = std::numeric_limits<float>::quiet_NaN();
      draft = encode_rows(draft.k, draft.v, T, DType::f32);
      for (const HostRows* r : {&prefill, const_cast<const HostRows*>(&draft)}) {
        const DeviceRows d(*r);
        gpu.append(d.view);
        ref.append(r->view());
      }
      ASSERT_FALSE(gpu.status().ok()) << "the bad block was not recorded";
      gpu.clear_status();
      ref.clear_status();
      double worst = 0;
      check_verify_here(gpu, ref, T, rng, stream.get(), worst);
      // Rows before the bad one are finite (check_verify_here compared them with the reference).
      DeviceFloats q(std::size_t(T) * nq * g.head_dim_k), out(std::size_t(T) * nq * g.head_dim_v);
      q.upload(random_queries(T, nq, g.head_dim_k, rng));
      out.poison(stream.get());
      gpu.decode_rows(q.get(), out.get(), T);
      const std::vector<float> got = out.download(stream.get());
      const std::size_t row = std::size_t(nq) * g.head_dim_v;
      for (int i = 0; i < T; ++i) {
        bool any_nan = false;
        for (std::size_t e = 0; e < row; ++e) any_nan = any_nan || std::isnan(got[i * row + e]);
        EXPECT_EQ(any_nan, i >= bad_row) << "row " << i;
      }
    }
  }
}

/// Refused verify requests leave the state untouched; device-counter variants record a sticky
/// error where the host variant would refuse, and write nothing.
TEST(CudaVerify, RefusalsAndDeviceErrors) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x0E5);
  const Geometry g = flat(2, 64, 50);
  cuda::KvLayer gpu(g, 4, stream.get(), 8);
  ref::KvLayer ref(g);
  const HostRows rows = make_rows(g, 3, DType::f32, Fill::random, rng);
  {
    const DeviceRows d(rows);
    gpu.append(d.view);
  }
  ref.append(rows.view());
  DeviceFloats q(std::size_t(9) * 4 * 64), out(std::size_t(9) * 4 * 64);
  q.upload(random_queries(9, 4, 64, rng));
  const Snapshot before = snapshot(gpu);
  EXPECT_EQ(refusal_of([&] { gpu.decode_rows(q.get(), out.get(), 0); }),
            "decode_rows: T 0 must be at least 1");
  EXPECT_EQ(refusal_of([&] { gpu.decode_rows(q.get(), out.get(), 9); }),
            "decode_rows: T 9 exceeds max_verify 8");
  EXPECT_EQ(refusal_of([&] { gpu.decode_rows(q.get(), out.get(), 4); }),
            "decode_rows: len 3 is less than T 4");
  EXPECT_EQ(refusal_of([&] { gpu.inc_seqlen(0); }), "inc_seqlen: T 0 must be at least 1");
  EXPECT_TRUE(same_state(snapshot(gpu), before, g));

  // len_d 3 < T 4: nothing written, decode_view_too_long with the limit T.
  out.poison(stream.get());
  gpu.decode_rows_dc(q.get(), out.get(), 4);
  for (float x : out.download(stream.get())) ASSERT_TRUE(std::isnan(x)) << "out was written";
  const LayerStatus st = gpu.status();
  ASSERT_TRUE(st.device_error.has_value());
  EXPECT_EQ(st.device_error->kind, DeviceErrorKind::decode_view_too_long);
  EXPECT_EQ(st.device_error->len_d, 3);
  EXPECT_EQ(st.device_error->limit, 4);
}

}  // namespace
}  // namespace kvlayer::testing
