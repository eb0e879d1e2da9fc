// The CUDA batch (SPEC §12) against the reference batch: every batch operation, one launch over
// the active list, leaves every layer byte for byte as ref::KvBatch does (planes, counters,
// status), each decoded sequence lies within its own bound and nothing is written for a
// position past the list or a sequence whose view the device refused. Engine steps with lists
// that change, reorder and empty, per-sequence rewinds between steps, flat layers at every
// supported head dim and windowed rings that rebase; a captured step replayed while the
// membership changes; refusals that name the value and change nothing; one sequence's overrun
// recorded for it alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/cuda/kv_batch.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_batch.hpp"
#include "kvlayer/testing/batch.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

constexpr int kMaxVerify = 8;

/// Every sequence of the two batches alike ("" when they are).
std::string batch_difference(const cuda::KvBatch& gpu, const ref::KvBatch& want) {
  for (int i = 0; i < gpu.max_batch(); ++i) {
    const ::testing::AssertionResult r = same_state(gpu.layer(i), want.layer(i));
    if (!r) return "sequence " + std::to_string(i) + ": " + r.message();
  }
  return "";
}

/// Whether every element still holds the poison (0xFF bytes) written before the launch.
bool untouched(const std::vector<float>& out) {
  return std::all_of(out.begin(), out.end(),
                     [](float x) { return std::bit_cast<std::uint32_t>(x) == 0xFFFFFFFFu; });
}

/// What one batch decode reached, for the caller's counts.
struct DecodeCounts {
  std::int64_t outputs = 0, refused = 0;
};

/// Checks a batch decode's output buffer (max_batch positions) against the reference batch's
/// outputs: position j within the bound of its sequence's own view, a refused sequence's
/// position and every position past the list untouched (poison).
void expect_batch_outputs(const std::vector<float>& got,
                          const std::vector<std::optional<std::vector<double>>>& want,
                          const ref::KvBatch& model, const std::vector<float>& q, int n_q_heads,
                          int t, const std::vector<AccumulationShape>& shapes,
                          DecodeCounts& counts) {
  const Geometry& g = model.geometry();
  const std::size_t per = std::size_t(t) * std::size_t(n_q_heads) * std::size_t(g.head_dim_v);
  for (std::size_t j = 0; j * per < got.size(); ++j) {
    const std::vector<float> mine(got.begin() + std::ptrdiff_t(j * per),
                                  got.begin() + std::ptrdiff_t((j + 1) * per));
    if (j >= want.size() || !want[j]) {
      EXPECT_TRUE(untouched(mine))
          << "position " << j << " was written"
          << (j < want.size() ? " although its view was refused" : " although it is past the list");
      if (j < want.size()) ++counts.refused;
      continue;
    }
    const ref::KvLayer& layer = model.layer(model.active()[j]);
    const std::span<const float> qj = std::span<const float>(q).subspan(j * per, per);
    const std::vector<ref::DecodeView> views =
        ref::verify_views(g, layer.len_d(), g.window ? layer.base_d() : 0, t);
    const std::vector<ref::DecodeBound> bounds =
        ref::decode_rows_bound(layer, qj, n_q_heads, std::nullopt, views, shapes.at(j));
    const std::vector<double>& w = *want[j];
    ASSERT_EQ(w.size(), per);
    int failures = 0;
    double norm = 0;
    const std::size_t row_values = per / std::size_t(t);
    for (std::size_t i = 0; i < per; ++i) {
      const ref::DecodeBound& b = bounds[i / row_values];
      const std::size_t e = i % row_values;
      norm += double(mine[i]) * mine[i];
      const double err = std::fabs(double(mine[i]) - w[i]);
      if (!std::isfinite(mine[i]) || !(err <= b.bound[e])) {
        if (failures++ < 4)
          ADD_FAILURE() << "position " << j << " (sequence " << model.active()[j] << ") element "
                        << i << ": GPU " << mine[i] << " reference " << w[i] << " |err| " << err
                        << " > bound " << b.bound[e];
        continue;
      }
      systematic_check().record(mine[i], w[i], b, e);
    }
    systematic_check().end_launch();
    EXPECT_GT(norm, 0.0) << "position " << j << ": an all-zero output proves nothing";
    ++counts.outputs;
  }
}

/// The steps an engine takes with a batch, on the GPU and in the reference alike: per step an
/// active list, T rows per active sequence (room made by reserve on a ring), inc_seqlen(T), a
/// decode of T queries, the host's account_steps(T); now and then a sequence is rewound.
/// Compared after every operation.
void run_engine_steps(
    const Geometry& g, int n_q_heads, int max_batch, int steps, std::uint64_t seed,
    const cuda::DecodeOptions& options = cuda::DecodeOptions::from_environment()) {
  SCOPED_TRACE(g.describe() + " n_q_heads " + std::to_string(n_q_heads) + " seed " +
               std::to_string(seed));
  Rng rng(seed);
  Stream stream;
  cuda::KvBatch gpu(g, n_q_heads, max_batch, stream.get(), kMaxVerify, options);
  ref::KvBatch model(g, max_batch, kMaxVerify);
  const bool windowed = g.window.has_value();
  std::int64_t rows_appended = 0, verify_outputs = 0;
  DecodeCounts counts;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<int> active = draw_active(max_batch, rng);
    gpu.set_active(active);
    model.set_active(active);
    ASSERT_EQ(gpu.active(), active);
    const int t =
        int(rng.range(1, g.is_ring() ? std::min<std::int64_t>(kMaxVerify, 8) : kMaxVerify));
    bool room = true;
    for (const int i : active) room = room && model.layer(i).len() + t <= g.max_ctx;
    if (!room) break;
    for (const int i : active) {
      gpu.layer(i).reserve(t);
      model.layer(i).reserve(t);
    }
    const std::int64_t n = std::max<std::int64_t>(1, std::int64_t(active.size())) * t;
    const HostRows rows = make_rows(g, n, DType::f32, Fill::random, rng);
    const DeviceRows device_rows(rows);
    cuda::RowsView per_position = device_rows.view;
    per_position.n = t;
    HostRows used = rows;
    used.n = std::int64_t(active.size()) * t;
    if (windowed) {
      gpu.append_rows_dcw(per_position);
      model.append_rows_dcw(used.view(), t);
    } else {
      gpu.append_rows_dc(per_position);
      model.append_rows_dc(used.view(), t);
    }
    rows_appended += used.n;
    ASSERT_EQ(batch_difference(gpu, model), "") << "after the batch append";
    gpu.inc_seqlen(t);
    model.inc_seqlen(t);
    ASSERT_EQ(batch_difference(gpu, model), "") << "after inc_seqlen";

    const std::size_t per = std::size_t(t) * std::size_t(n_q_heads) * std::size_t(g.head_dim_k);
    std::vector<float> q(active.size() * per);
    for (float& x : q) x = rng.uniform(-1, 1);
    DeviceFloats dq(std::max<std::size_t>(1, std::size_t(max_batch) * per));
    std::vector<float> q_padded(dq.count, 0.0f);
    std::copy(q.begin(), q.end(), q_padded.begin());
    dq.upload(q_padded);
    DeviceFloats out(std::size_t(max_batch) * per);
    out.poison(stream.get());
    if (windowed)
      gpu.decode_rows_dcw(dq.get(), out.get(), t);
    else
      gpu.decode_rows_dc(dq.get(), out.get(), t);
    const auto want =
        windowed ? model.decode_rows_dcw(q, n_q_heads, t) : model.decode_rows_dc(q, n_q_heads, t);
    expect_batch_outputs(out.download(stream.get()), want, model, q, n_q_heads, t,
                         gpu.accumulation_shapes(t, testing::batch_view_keys(model, want, t)),
                         counts);
    if (t > 1) verify_outputs += std::int64_t(active.size());
    ASSERT_EQ(batch_difference(gpu, model), "") << "after the decode";
    for (const int i : active) {
      gpu.layer(i).account_steps(t);
      model.layer(i).account_steps(t);
    }
    if (!active.empty() && rng.chance(30)) {
      const int i = active[std::size_t(rng.range(0, std::int64_t(active.size()) - 1))];
      const std::int64_t to = model.layer(i).len() - rng.range(0, t - 1);
      if (model.layer(i).can_rewind_to(to)) {
        gpu.layer(i).rewind(to);
        model.layer(i).rewind(to);
      }
    }
    ASSERT_EQ(batch_difference(gpu, model), "") << "after the host's accounting";
  }
  // What the run reached: a batch that only ever ran empty lists proves nothing.
  EXPECT_GT(rows_appended, 8 * max_batch);
  EXPECT_GT(counts.outputs, steps / 2);
  EXPECT_GT(verify_outputs, 0);
  if (g.is_ring()) {
    std::int64_t rebased = 0;
    for (int i = 0; i < max_batch; ++i) rebased += model.layer(i).base() > 0;
    EXPECT_GT(rebased, 0) << "no ring rebased: the windowed steps never left the first unit";
  }
}

TEST(CudaBatch, FlatBatchEqualsTheReferenceBatchAtEveryHeadDim) {
  KVLAYER_REQUIRE_GPU();
  for (const int hd : cuda::kSupportedHeadDims) {
    // gqa 8 (the tensor-core decode) and gqa 2; views past a few splits.
    run_engine_steps(flat(2, hd, 4096), 16, 6, 40, fresh_seed());
    run_engine_steps(flat(1, hd, 2048), 2, 3, 30, fresh_seed());
  }
}

TEST(CudaBatch, CudaCoreBatchEqualsTheReferenceBatchAtEveryHeadDim) {
  KVLAYER_REQUIRE_GPU();
  cuda::DecodeOptions options;
  options.kernel = cuda::DecodeOptions::Kernel::cuda_core;
  for (const int hd : cuda::kSupportedHeadDims)
    run_engine_steps(flat(2, hd, 2048), 8, 4, 25, fresh_seed(), options);
}

TEST(CudaBatch, WindowedRingBatchEqualsTheReferenceBatch) {
  KVLAYER_REQUIRE_GPU();
  // Window 48, appends of up to 8 rows, slack 4: rebases every few steps.
  run_engine_steps(ring(2, 128, 100000, 48, 8, 4), 8, 5, 60, fresh_seed());
  run_engine_steps(ring(1, 64, 100000, 64, 8, 8), 4, 4, 80, fresh_seed());
}

// A batch decode's schedule (batch_schedule.hpp) at its extremes: one long view among short
// ones, in a list out of index order, cut into more splits than the plan holds (clamped), into
// one split per view (balance 64 in one wave) and as finely as it goes (balance 0, 64 waves);
// every output within its position's bound, which takes the shape of the splits the schedule's
// host twin computes (a key left out, or cut otherwise than the twin says, fails it).
TEST(CudaBatch, TheScheduleCutsSkewedViewsUnderEveryOption) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat(2, 128, 20000);
  constexpr int kBatch = 5, kHeads = 16;
  const std::int64_t lengths[kBatch] = {19000, 3, 1, 700, 64};
  struct Choice {
    int balance, waves;
  };
  for (const Choice c : {Choice{2, 8}, Choice{0, 64}, Choice{64, 1}, Choice{0, 1}}) {
    SCOPED_TRACE("balance " + std::to_string(c.balance) + " waves " + std::to_string(c.waves));
    cuda::DecodeOptions options;
    options.split_balance = c.balance;
    options.batch_waves = c.waves;
    Rng rng(fresh_seed());
    Stream stream;
    cuda::KvBatch gpu(g, kHeads, kBatch, stream.get(), kMaxVerify, options);
    ref::KvBatch model(g, kBatch, kMaxVerify);
    for (int i = 0; i < kBatch; ++i) {
      const HostRows h = make_rows(g, lengths[i], DType::f32, Fill::random, rng);
      const DeviceRows d(h);
      gpu.layer(i).append(d.view);
      model.layer(i).append(h.view());
    }
    const std::vector<int> active{4, 0, 2, 1, 3};
    gpu.set_active(active);
    model.set_active(active);
    const std::size_t per = std::size_t(kHeads) * std::size_t(g.head_dim_k);
    std::vector<float> q(kBatch * per);
    for (float& x : q) x = rng.uniform(-1, 1);
    DeviceFloats dq(q.size()), out(q.size());
    dq.upload(q);
    out.poison(stream.get());
    gpu.decode_rows_dc(dq.get(), out.get(), 1);
    const auto want = model.decode_rows_dc(q, kHeads, 1);
    const std::vector<AccumulationShape> shapes =
        gpu.accumulation_shapes(1, testing::batch_view_keys(model, want, 1));
    DecodeCounts counts;
    expect_batch_outputs(out.download(stream.get()), want, model, q, kHeads, 1, shapes, counts);
    EXPECT_EQ(counts.outputs, kBatch);
    // The long view is cut into the most splits of any position, the short ones into one.
    EXPECT_GE(shapes[1].n_splits, shapes[3].n_splits);
    EXPECT_EQ(shapes[2].n_splits, 1);
  }
}

TEST(CudaBatch, ACapturedStepServesAChangingMembership) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat(2, 128, 1024);
  constexpr int kBatch = 6, kHeads = 16;
  Rng rng(fresh_seed());
  Stream stream;
  cuda::KvBatch gpu(g, kHeads, kBatch, stream.get(), kMaxVerify);
  ref::KvBatch model(g, kBatch, kMaxVerify);
  // Every sequence at its own length first (host appends, one per layer).
  for (int i = 0; i < kBatch; ++i) {
    const HostRows h = make_rows(g, 5 + 37 * i, DType::f32, Fill::random, rng);
    const DeviceRows d(h);
    gpu.layer(i).append(d.view);
    model.layer(i).append(h.view());
  }
  const std::size_t per = std::size_t(kHeads) * std::size_t(g.head_dim_k);
  // Fixed buffers the graph holds: one row and one query per position.
  DeviceRows rows(make_rows(g, kBatch, DType::f32, Fill::random, rng));
  cuda::RowsView one = rows.view;
  one.n = 1;
  DeviceFloats dq(kBatch * per), out(kBatch * per);
  std::vector<int> active{0, 1, 2, 3, 4, 5};
  gpu.set_active(active);
  model.set_active(active);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  gpu.append_rows_dc(one);
  gpu.inc_seqlen(1);
  gpu.decode_rows_dc(dq.get(), out.get(), 1);
  KVLAYER_CUDA_TRY(cudaStreamEndCapture(stream.get(), &graph));
  KVLAYER_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  DecodeCounts counts;
  std::int64_t changes = 0;
  for (int replay = 0; replay < 24; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay > 0) {
      // Sequences join, finish and reorder between replays; one is rewound now and then.
      const std::vector<int> next = draw_active(kBatch, rng);
      changes += next != active;
      active = next;
      gpu.set_active(active);
      model.set_active(active);
      if (!active.empty() && rng.chance(30)) {
        const int i = active.front();
        const std::int64_t to = model.layer(i).len() - 1;
        if (model.layer(i).can_rewind_to(to)) {
          gpu.layer(i).rewind(to);
          model.layer(i).rewind(to);
        }
      }
    }
    const HostRows h = make_rows(g, kBatch, DType::f32, Fill::random, rng);
    KVLAYER_CUDA_TRY(cudaMemcpy(const_cast<void*>(rows.view.k), h.k_bytes.data(), h.k_bytes.size(),
                                cudaMemcpyHostToDevice));
    KVLAYER_CUDA_TRY(cudaMemcpy(const_cast<void*>(rows.view.v), h.v_bytes.data(), h.v_bytes.size(),
                                cudaMemcpyHostToDevice));
    std::vector<float> q(kBatch * per);
    for (float& x : q) x = rng.uniform(-1, 1);
    dq.upload(q);
    KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
    out.poison(stream.get());
    KVLAYER_CUDA_TRY(cudaGraphLaunch(exec, stream.get()));
    HostRows used = h;
    used.n = std::int64_t(active.size());
    model.append_rows_dc(used.view(), 1);
    model.inc_seqlen(1);
    const std::vector<float> q_used(q.begin(), q.begin() + std::ptrdiff_t(active.size() * per));
    const auto want = model.decode_rows_dc(q_used, kHeads, 1);
    expect_batch_outputs(out.download(stream.get()), want, model, q_used, kHeads, 1,
                         gpu.accumulation_shapes(1, testing::batch_view_keys(model, want, 1)),
                         counts);
    for (const int i : active) {
      gpu.layer(i).account_steps(1);
      model.layer(i).account_steps(1);
    }
    ASSERT_EQ(batch_difference(gpu, model), "");
  }
  KVLAYER_CUDA_TRY(cudaGraphExecDestroy(exec));
  KVLAYER_CUDA_TRY(cudaGraphDestroy(graph));
  EXPECT_GT(changes, 10) << "the membership hardly changed between replays";
  EXPECT_GT(counts.outputs, 24);
}

/// Runs f, expecting a refusal with `message`, and every layer and the active list unchanged.
template <typename F>
void expect_refused_unchanged(cuda::KvBatch& batch, F&& f, const std::string& message) {
  std::vector<Snapshot> before;
  for (int i = 0; i < batch.max_batch(); ++i) before.push_back(snapshot(batch.layer(i)));
  const std::vector<int> active = batch.active();
  EXPECT_EQ(refusal_of(f), message);
  for (int i = 0; i < batch.max_batch(); ++i)
    EXPECT_TRUE(same_state(snapshot(batch.layer(i)), before[std::size_t(i)], batch.geometry()))
        << "a refused call changed sequence " << i;
  EXPECT_EQ(batch.active(), active) << "a refused call changed the active list";
}

TEST(CudaBatch, RefusalsNameTheValueAndChangeNothing) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat(2, 64, 64);
  Rng rng(fresh_seed());
  Stream stream;
  cuda::KvBatch batch(g, 4, 4, stream.get(), 4);
  for (int i = 0; i < 4; ++i) {
    const DeviceRows d(make_rows(g, 3 + i, DType::f32, Fill::random, rng));
    batch.layer(i).append(d.view);
  }
  batch.set_active(std::vector<int>{2, 0, 3});
  // The list: the reference batch's messages.
  expect_refused_unchanged(
      batch,
      [&] {
        batch.set_active(std::vector<int>{0, 1, 2, 3, 0});
      },
      "batch set_active: the list has 5 sequences, more than max_batch 4");
  expect_refused_unchanged(
      batch,
      [&] {
        batch.set_active(std::vector<int>{1, 4});
      },
      "batch set_active: entry 1 is sequence 4, outside [0, max_batch 4)");
  expect_refused_unchanged(
      batch,
      [&] {
        batch.set_active(std::vector<int>{3, 1, 3});
      },
      "batch set_active: sequence 3 appears twice (entries 0 and 2)");
  expect_refused_unchanged(
      batch, [&] { (void)batch.layer(-1); },
      "batch layer: sequence -1 is outside [0, max_batch 4)");
  const DeviceRows rows(make_rows(g, 8, DType::f32, Fill::random, rng));
  cuda::RowsView five = rows.view;
  five.n = 5;
  expect_refused_unchanged(
      batch, [&] { batch.append_rows_dc(five); },
      "batch append_rows_dc: T 5 is outside [1, max_verify 4]");
  expect_refused_unchanged(
      batch, [&] { batch.inc_seqlen(0); }, "batch inc_seqlen: T 0 is outside [1, max_verify 4]");
  DeviceFloats q(4 * 4 * 64), out(4 * 4 * 64);
  expect_refused_unchanged(
      batch, [&] { batch.decode_rows_dc(q.get(), out.get(), 5); },
      "batch decode_rows_dc: T 5 is outside [1, max_verify 4]");
  expect_refused_unchanged(
      batch, [&] { batch.decode_rows_dcw(q.get(), out.get(), 2); },
      "decode_rows_dcw: the layer has no window; use decode_rows_dc");
  expect_refused_unchanged(
      batch, [&] { batch.decode_rows_dc(nullptr, out.get(), 1); },
      "batch decode_rows_dc: q and out must not be null");
  const std::int64_t five_views[] = {3, 5, 0, 7, 9}, two_views[] = {3, 5};
  expect_refused_unchanged(
      batch, [&] { (void)batch.accumulation_shapes(1, five_views); },
      "batch accumulation_shapes: view_keys has 5 entries, more than max_batch 4");
  EXPECT_EQ(batch.accumulation_shapes(1, two_views).size(), 2u);  // any list, not only the active
  expect_refused_unchanged(
      batch, [&] { (void)batch.accumulation_shapes(0, two_views); },
      "batch accumulation_shapes: T 0 is outside [1, max_verify 4]");
  // A ring refuses the flat operations, as its layers do.
  const Geometry rg = ring(2, 64, 1000, 16, 4, 2);
  cuda::KvBatch rings(rg, 4, 3, stream.get(), 4);
  rings.set_active(std::vector<int>{0, 1, 2});
  cuda::RowsView two = rows.view;
  two.n = 2;
  expect_refused_unchanged(
      rings, [&] { rings.append_rows_dc(two); }, "append_rows_dc: ring layers use append_rows_dcw");
  expect_refused_unchanged(
      rings, [&] { rings.decode_rows_dc(q.get(), out.get(), 1); },
      "decode_dc: ring layers use decode_dcw");
  EXPECT_EQ(refusal_of([&] { cuda::KvBatch none(g, 4, 0, stream.get()); }),
            "cuda::KvBatch: max_batch 0 is not supported (supported: 1..1024)");
}

TEST(CudaBatch, OneSequencesOverrunIsRecordedForItAlone) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat(2, 128, 40);
  constexpr int kHeads = 8;
  Rng rng(fresh_seed());
  Stream stream;
  cuda::KvBatch gpu(g, kHeads, 3, stream.get(), 4);
  ref::KvBatch model(g, 3, 4);
  // Sequence 1 sits one row below max_ctx: a two-row step overruns it alone.
  for (int i = 0; i < 3; ++i) {
    const HostRows h = make_rows(g, i == 1 ? 39 : 10 + i, DType::f32, Fill::random, rng);
    const DeviceRows d(h);
    gpu.layer(i).append(d.view);
    model.layer(i).append(h.view());
  }
  const std::vector<int> active{2, 1, 0};
  gpu.set_active(active);
  model.set_active(active);
  const HostRows h = make_rows(g, 6, DType::f32, Fill::random, rng);
  const DeviceRows d(h);
  cuda::RowsView two = d.view;
  two.n = 2;
  gpu.append_rows_dc(two);
  model.append_rows_dc(h.view(), 2);
  gpu.inc_seqlen(2);
  model.inc_seqlen(2);
  ASSERT_EQ(batch_difference(gpu, model), "");
  EXPECT_FALSE(gpu.layer(1).status().ok()) << "the overrun was not recorded";
  EXPECT_TRUE(gpu.layer(0).status().ok());
  EXPECT_TRUE(gpu.layer(2).status().ok());
  const std::size_t per = 2 * kHeads * 128;
  std::vector<float> q(3 * per);
  for (float& x : q) x = rng.uniform(-1, 1);
  DeviceFloats dq(q.size()), out(q.size());
  dq.upload(q);
  out.poison(stream.get());
  gpu.decode_rows_dc(dq.get(), out.get(), 2);
  const auto want = model.decode_rows_dc(q, kHeads, 2);
  ASSERT_FALSE(want[1].has_value()) << "the reference decoded past max_ctx";
  DecodeCounts counts;
  expect_batch_outputs(out.download(stream.get()), want, model, q, kHeads, 2,
                       gpu.accumulation_shapes(2, testing::batch_view_keys(model, want, 2)),
                       counts);
  EXPECT_EQ(counts.outputs, 2);
  EXPECT_EQ(counts.refused, 1);
  ASSERT_EQ(batch_difference(gpu, model), "");
}

}  // namespace
}  // namespace kvlayer::testing
