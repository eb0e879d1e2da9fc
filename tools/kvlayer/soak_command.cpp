// kvlayer soak: many layer create/destroy cycles, then a long run of graph-replayed decode
// steps on a ring layer, checking that device memory does not grow (cudaMemGetInfo before and
// after) and that no sticky error appears.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "decode_step.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/error.hpp"
#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

using cuda::DeviceBuffer;

constexpr std::string_view kUsage =
    "usage: kvlayer soak [--cycles N] [--steps M] [--chain K]\n"
    "  1. N layer create/destroy cycles (flat and ring geometries, each appended to and\n"
    "     given a captured append/inc/decode graph that is replayed twice);\n"
    "  2. M decode steps (append_dcw -> inc_seqlen -> decode_dcw on a ring layer, 8x128, gqa 8,\n"
    "     window 4096) captured once as a CUDA graph and replayed in chains of K, with\n"
    "     reserve(K) before and account_steps(K) after each chain, and a status check.\n"
    "  Reports free device memory before and after each phase (after a warm-up pass of it:\n"
    "  first use loads code once per process); exit 1 on growth or on any sticky error.\n"
    "  --cycles N   create/destroy cycles (default 10000)\n"
    "  --steps M    graph-replayed steps (default 1000000)\n"
    "  --chain K    steps per chain between host accounting (default 64)\n";

std::size_t free_bytes() {
  KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
  std::size_t free = 0, total = 0;
  KVLAYER_CUDA_TRY(cudaMemGetInfo(&free, &total));
  return free;
}

Geometry cycle_geometry(std::int64_t i) {
  Geometry g;
  g.n_kv_heads = 1 + int(i % 4);
  g.head_dim_k = g.head_dim_v = (i % 3 == 0) ? 64 : (i % 3 == 1 ? 128 : 256);
  g.max_ctx = 512 + (i % 7) * 100;
  if (i % 2 == 1) {
    g.storage = Storage::ring;
    g.window = 61 + i % 50;
    g.max_append = 16;
    g.rewind_slack = 4;
  }
  return g;
}

/// One create/destroy cycle: a layer of cycle_geometry(i), a 16-row append, and a captured
/// append_dc(w) → inc_seqlen → decode_dc(w) graph replayed twice. Returns false (and prints
/// why) on an unexpected status.
bool one_cycle(std::int64_t i, const DeviceBuffer& rows_k, const DeviceBuffer& rows_v,
               DeviceBuffer& q, DeviceBuffer& out, cudaStream_t stream) {
  const Geometry g = cycle_geometry(i);
  const int nq = g.n_kv_heads * (1 + int(i % 8));
  cuda::KvLayer layer(g, nq, stream);
  layer.append(cuda::RowsView{rows_k.get(), rows_v.get(), 16, DType::f32});
  layer.reserve(2);
  const auto graph =
      capture_decode_step(layer, cuda::RowsView{rows_k.get(), rows_v.get(), 1, DType::f32},
                          q.as<float>(), out.as<float>());
  graph.launch(stream);
  graph.launch(stream);
  layer.account_steps(2);
  const LayerStatus st = layer.status();
  if (!st.ok())
    std::printf("cycle %lld: unexpected status: %s\n", (long long)i, st.message().c_str());
  return st.ok();
}

/// `steps` decode steps on the soak's ring layer (8 × 128, gqa 8, window 4096): the step is
/// captured once and replayed in chains. Returns false on a sticky error.
bool replay_steps(std::int64_t steps, std::int64_t chain, cudaStream_t stream, bool report) {
  Geometry g;
  g.n_kv_heads = 8;
  g.head_dim_k = g.head_dim_v = 128;
  g.window = 4096;
  g.storage = Storage::ring;
  g.max_append = chain;
  g.rewind_slack = 16;
  g.max_ctx = std::min<std::int64_t>(INT32_MAX, steps + 8192);
  cuda::KvLayer layer(g, 64, stream);
  DeviceBuffer k(std::size_t(g.kv_dim_k()) * 4), v(std::size_t(g.kv_dim_v()) * 4), q(64 * 128 * 4),
      out(64 * 128 * 4);
  KVLAYER_CUDA_TRY(launch_fill_random(k.as<float>(), std::size_t(g.kv_dim_k()), 3, stream));
  KVLAYER_CUDA_TRY(launch_fill_random(v.as<float>(), std::size_t(g.kv_dim_v()), 4, stream));
  KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), 64 * 128, 5, stream));
  layer.reserve(chain);
  const auto graph = capture_decode_step(layer, cuda::RowsView{k.get(), v.get(), 1, DType::f32},
                                         q.as<float>(), out.as<float>());
  std::int64_t done = 0;
  while (done < steps) {
    const std::int64_t kk = std::min(chain, steps - done);
    layer.reserve(kk);
    for (std::int64_t i = 0; i < kk; ++i) graph.launch(stream);
    layer.account_steps(kk);
    done += kk;
    if (done % (chain * 1024) == 0 || done == steps) {
      const LayerStatus st = layer.status();  // synchronizes
      if (!st.ok()) {
        std::printf("after %lld steps: sticky error: %s\n", (long long)done, st.message().c_str());
        return false;
      }
    }
  }
  if (report)
    std::printf("%-40s %lld steps in chains of %lld, len %lld, base %lld, status %s\n",
                "graph-replayed decode steps:", (long long)done, (long long)chain,
                (long long)layer.len(), (long long)layer.base(), layer.status().message().c_str());
  return true;
}

/// Prints a phase's device-memory line; true when free memory did not shrink.
bool memory_unchanged(const char* phase, std::size_t before, std::size_t after, double seconds) {
  std::printf("%-40s free before %zu, after %zu, change %lld bytes, %.1f s\n", phase, before, after,
              (long long)after - (long long)before, seconds);
  return after >= before;
}

int run_soak(const std::vector<std::string>& args) {
  const Options o(args, {"cycles", "steps", "chain"}, {});
  const std::int64_t cycles = o.integer("cycles", 10000, 0, 100000000);
  const std::int64_t steps = o.integer("steps", 1000000, 0, 1000000000);
  const std::int64_t chain = o.integer("chain", 64, 1, 4096);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw Error(ErrorKind::device, "no CUDA device found (run it on the GPU machine)");
  cuda::Stream stream;
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  bool ok = true;
  DeviceBuffer rows_k(16 * 1024 * 4), rows_v(16 * 1024 * 4), q(64 * 256 * 4), out(64 * 256 * 4);
  KVLAYER_CUDA_TRY(launch_fill_random(rows_k.as<float>(), 16 * 1024, 1, stream.get()));
  KVLAYER_CUDA_TRY(launch_fill_random(rows_v.as<float>(), 16 * 1024, 2, stream.get()));
  KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), 64 * 256, 6, stream.get()));

  // NOTE: a warm-up pass of each phase comes before its baseline. The first use of a kernel or
  // of graph instantiation loads code and sets up driver pools once per process (2 MiB was seen
  // on the H200); that is not growth. Growth is what repeating the phase adds afterwards.
  for (std::int64_t i = 0; i < 12 && ok; ++i)
    ok = one_cycle(i, rows_k, rows_v, q, out, stream.get());
  const std::size_t free0 = free_bytes();
  for (std::int64_t i = 0; i < cycles && ok; ++i)
    ok = one_cycle(i, rows_k, rows_v, q, out, stream.get());
  std::printf("%-40s %lld cycles (each: layer, append, captured graph replayed twice)\n",
              "create/destroy:", (long long)cycles);
  ok = memory_unchanged("device memory (cycles phase):", free0, free_bytes(), seconds()) && ok;

  // The steps phase's warm-up runs as the phase does: chains of `chain` graph launches queued
  // up to chain · 1024 deep between host syncs, and ring rebases. NOTE: a shorter warm-up (no
  // rebase, queue never deep) leaves the driver to grow a pool by 2 MiB inside the measured
  // phase; that is warm-up, not growth.
  if (ok) ok = replay_steps(std::min(steps, 2 * chain * 1024), chain, stream.get(), false);
  const std::size_t free2 = free_bytes();
  if (ok) ok = replay_steps(steps, chain, stream.get(), true);
  ok = memory_unchanged("device memory (steps phase):", free2, free_bytes(), seconds()) && ok;
  std::printf("soak: %s\n", ok ? "PASS" : "FAIL");
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

const Command& soak_command() {
  static const Command c{"soak",
                         "GPU soak: create/destroy cycles and a million graph-replayed steps",
                         kUsage, &run_soak};
  return c;
}

}  // namespace kvlayer::cli
