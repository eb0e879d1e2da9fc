// CUDA graphs (SPEC §7, §10.3): one decode step (append_dc(w) → inc_seqlen → decode_dc(w)) is
// captured ONCE and replayed for hundreds of tokens, with new K, V and Q written into the
// captured input buffers before each replay, across window boundaries and reserve()-driven
// rebases between chains of k steps (account_steps(k) after each chain), and occasional
// speculative rewinds. A second layer runs the same steps eagerly, and the reference models
// them: replayed and eager bytes and outputs are bit-identical, bytes equal the reference's, and
// outputs are within the derived decode tolerance.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvlayer/reference/accuracy.hpp"
#include "cuda_testbed.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Graph;
using cuda::Stream;

struct GraphCase {
  const char* name;
  Geometry g;
  int gqa;
  DType dtype;
  int tokens;
};

/// Captures one step of `layer` on `stream`; ends the capture even when a call throws.
Graph capture_step(cuda::KvLayer& layer, const cuda::RowsView& row, const float* q, float* out,
                   cudaStream_t stream) {
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    device_counter_step(layer, row, q, out);
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    throw;
  }
  return Graph::end_capture(stream);
}

void run_case(const GraphCase& c) {
  SCOPED_TRACE(c.name);
  const Geometry& g = c.g;
  const bool windowed = g.window.has_value();
  const int nq = g.n_kv_heads * c.gqa;
  Stream stream;
  const cudaStream_t s = stream.get();
  Rng rng(0x6EA9 ^ std::uint64_t(c.tokens) ^ (std::uint64_t(g.head_dim_k) << 20));
  cuda::KvLayer replayed(g, nq, s), eager(g, nq, s);
  ref::KvLayer ref(g);

  // A prefill on all three.
  {
    const HostRows rows = make_rows(g, 45, c.dtype, Fill::random, rng);
    const DeviceRows d(rows);
    replayed.append(d.view);
    eager.append(d.view);
    ref.append(rows.view());
  }

  // The captured inputs: fixed addresses, rewritten before every replay.
  const std::size_t es = dtype_size(c.dtype);
  DeviceBuffer k_in(std::size_t(g.kv_dim_k()) * es), v_in(std::size_t(g.kv_dim_v()) * es);
  const std::size_t qn = std::size_t(nq) * g.head_dim_k, on = std::size_t(nq) * g.head_dim_v;
  DeviceFloats q_in(qn), out_replayed(on), out_eager(on);
  const cuda::RowsView row{k_in.get(), v_in.get(), 1, c.dtype};

  const Graph graph = capture_step(replayed, row, q_in.get(), out_replayed.get(), s);
  ASSERT_TRUE(same_state(replayed, ref)) << "capture must not execute anything";

  const kvlayer::AccumulationShape shape = replayed.accumulation_shape();
  const std::int64_t max_chain = g.is_ring() ? g.max_append : 24;
  double worst = 0;
  int chains = 0, rewinds = 0;
  std::int64_t rebases = 0, last_base = 0;
  for (int t = 0; t < c.tokens && !::testing::Test::HasFailure();) {
    const std::int64_t k = std::min<std::int64_t>(rng.range(1, max_chain), c.tokens - t);
    replayed.reserve(k);
    eager.reserve(k);
    ref.reserve(k);
    for (std::int64_t i = 0; i < k; ++i, ++t) {
      const HostRows rows = make_rows(g, 1, c.dtype, Fill::random, rng);
      std::vector<float> hq(qn);
      for (float& x : hq) x = rng.uniform(-2, 2);
      KVLAYER_CUDA_TRY(cudaMemcpyAsync(k_in.get(), rows.k_bytes.data(), rows.k_bytes.size(),
                                       cudaMemcpyHostToDevice, s));
      KVLAYER_CUDA_TRY(cudaMemcpyAsync(v_in.get(), rows.v_bytes.data(), rows.v_bytes.size(),
                                       cudaMemcpyHostToDevice, s));
      KVLAYER_CUDA_TRY(cudaMemcpyAsync(q_in.get(), hq.data(), qn * 4, cudaMemcpyHostToDevice, s));
      out_replayed.poison(s);
      out_eager.poison(s);
      graph.launch(s);
      device_counter_step(eager, row, q_in.get(), out_eager.get());

      std::optional<std::vector<double>> want;
      ref::DecodeView view;
      if (windowed) {
        ref.append_dcw(rows.view());
        ref.inc_seqlen();
        want = ref.decode_dcw(hq, nq);
        view = {std::max<std::int64_t>(0, ref.len_d() - *g.window), ref.len_d(), ref.base_d()};
      } else {
        ref.append_dc(rows.view());
        ref.inc_seqlen();
        want = ref.decode_dc(hq, nq);
        view = {0, ref.len_d(), 0};
      }
      ASSERT_TRUE(want.has_value()) << "the reference recorded " << ref.status().message();

      const std::vector<float> got_r = out_replayed.download(s);
      const std::vector<float> got_e = out_eager.download(s);
      for (std::size_t e = 0; e < on; ++e)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got_r[e]), std::bit_cast<std::uint32_t>(got_e[e]))
            << "token " << t << " element " << e << ": replayed " << got_r[e] << " vs eager "
            << got_e[e];
      const ref::DecodeBound b = ref::decode_bound(ref, hq, nq, std::nullopt, view, shape);
      const std::vector<double>& bound = b.bound;
      for (std::size_t e = 0; e < on; ++e) {
        const double err = std::fabs(double(got_r[e]) - (*want)[e]);
        ASSERT_TRUE(std::isfinite(got_r[e]) && err <= bound[e])
            << "token " << t << " element " << e << ": " << got_r[e] << " vs reference "
            << (*want)[e] << ", |error| " << err << " > bound " << bound[e];
        if (bound[e] > 0) worst = std::max(worst, err / bound[e]);
        bound_tightness().record(got_r[e], b, e);
      }
    }
    replayed.account_steps(k);
    eager.account_steps(k);
    ref.account_steps(k);
    ++chains;
    ASSERT_TRUE(same_state(replayed, ref)) << "after chain " << chains << " (token " << t << ")";
    ASSERT_TRUE(same_state(eager, ref)) << "eager, after chain " << chains;
    if (ref.base() != last_base) ++rebases, last_base = ref.base();
    // Now and then a speculative rewind of a few tokens, as far as the ring allows.
    if (rng.chance(20)) {
      const std::int64_t back =
          rng.range(1, g.is_ring() ? std::max<std::int64_t>(g.rewind_slack, 1) : 5);
      const std::int64_t to = ref.len() - back;
      if (ref.can_rewind_to(to)) {
        replayed.rewind(to);
        eager.rewind(to);
        ref.rewind(to);
        ++rewinds;
      }
    }
  }
  EXPECT_TRUE(replayed.status().ok()) << replayed.status().message();
  if (g.is_ring()) {
    EXPECT_GT(rebases, 3) << "the run must cross several rebases";
  }
  std::printf("  %s: %d tokens in %d chains, %lld rebases, %d rewinds, worst |error|/bound %.3g\n",
              c.name, c.tokens, chains, static_cast<long long>(rebases), rewinds, worst);
}

TEST(CudaGraph, RingStepReplayedMatchesEagerAndReference) {
  KVLAYER_REQUIRE_GPU();
  run_case({"ring dcw", ring(2, 128, 4096, 61, 8, 4), 4, DType::f16, 400});
}

TEST(CudaGraph, FlatStepReplayedMatchesEagerAndReference) {
  KVLAYER_REQUIRE_GPU();
  run_case({"flat dc", flat(2, 64, 700, std::nullopt), 8, DType::f32, 300});
}

TEST(CudaGraph, FlatWindowedStepReplayedMatchesEagerAndReference) {
  KVLAYER_REQUIRE_GPU();
  run_case({"flat windowed dcw", flat(1, 256, 600, 100), 16, DType::bf16, 300});
}

}  // namespace
}  // namespace kvlayer::testing
