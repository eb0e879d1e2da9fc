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
#include "cuda_raii.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/error.hpp"
#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

using cuda::detail::DeviceBuffer;

constexpr std::string_view kUsage =
    "usage: kvlayer soak [--cycles N] [--steps M] [--chain K]\n"
    "  1. N layer create/destroy cycles (flat and ring geometries, each appended to);\n"
    "  2. M decode steps (append_dcw -> inc_seqlen -> decode_dcw on a ring layer, 8x128, gqa 8,\n"
    "     window 4096) captured once as a CUDA graph and replayed in chains of K, with\n"
    "     reserve(K) before and account_steps(K) after each chain, and a status check.\n"
    "  Reports free device memory before and after each phase; exit 1 on growth or on any\n"
    "  sticky error.\n"
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

int run_soak(const std::vector<std::string>& args) {
  const Options o(args, {"cycles", "steps", "chain"}, {});
  const std::int64_t cycles = o.integer("cycles", 10000, 0, 100000000);
  const std::int64_t steps = o.integer("steps", 1000000, 0, 1000000000);
  const std::int64_t chain = o.integer("chain", 64, 1, 4096);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw Error(ErrorKind::device, "soak: no CUDA device found (run it on the GPU machine)");
  cuda::detail::Stream stream;
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  bool failed = false;

  // ---- 1. create/destroy cycles ----
  DeviceBuffer rows_k(16 * 1024 * 4), rows_v(16 * 1024 * 4);
  KVLAYER_CUDA_TRY(launch_fill_random(rows_k.as<float>(), 16 * 1024, 1, stream.get()));
  KVLAYER_CUDA_TRY(launch_fill_random(rows_v.as<float>(), 16 * 1024, 2, stream.get()));
  const std::size_t free0 = free_bytes();
  for (std::int64_t i = 0; i < cycles; ++i) {
    const Geometry g = cycle_geometry(i);
    cuda::KvLayer layer(g, g.n_kv_heads * (1 + int(i % 8)), stream.get());
    layer.append(cuda::RowsView{rows_k.get(), rows_v.get(), 16, DType::f32});
    if (!layer.status().ok()) {
      std::printf("cycle %lld: unexpected status: %s\n", (long long)i, layer.status().message().c_str());
      failed = true;
      break;
    }
  }
  const std::size_t free1 = free_bytes();
  std::printf("%-40s %lld cycles, free before %zu, after %zu, change %lld bytes, %.1f s\n",
              "create/destroy:", (long long)cycles, free0, free1,
              (long long)free1 - (long long)free0, seconds());
  if (free1 < free0) failed = true;

  // ---- 2. graph-replayed steps ----
  Geometry g;
  g.n_kv_heads = 8;
  g.head_dim_k = g.head_dim_v = 128;
  g.window = 4096;
  g.storage = Storage::ring;
  g.max_append = chain;
  g.rewind_slack = 16;
  g.max_ctx = std::min<std::int64_t>(INT32_MAX, steps + 8192);
  const std::size_t free2 = free_bytes();
  std::int64_t done = 0;
  {
    cuda::KvLayer layer(g, 64, stream.get());
    DeviceBuffer k(std::size_t(g.kv_dim_k()) * 4), v(std::size_t(g.kv_dim_v()) * 4),
        q(64 * 128 * 4), out(64 * 128 * 4);
    KVLAYER_CUDA_TRY(launch_fill_random(k.as<float>(), std::size_t(g.kv_dim_k()), 3, stream.get()));
    KVLAYER_CUDA_TRY(launch_fill_random(v.as<float>(), std::size_t(g.kv_dim_v()), 4, stream.get()));
    KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), 64 * 128, 5, stream.get()));
    layer.reserve(chain);
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    layer.append_dcw(cuda::RowsView{k.get(), v.get(), 1, DType::f32});
    layer.inc_seqlen();
    layer.decode_dcw(q.as<float>(), out.as<float>());
    const auto graph = cuda::detail::Graph::end_capture(stream.get());
    while (done < steps) {
      const std::int64_t kk = std::min(chain, steps - done);
      layer.reserve(kk);
      for (std::int64_t i = 0; i < kk; ++i) graph.launch(stream.get());
      layer.account_steps(kk);
      done += kk;
      if (done % (chain * 1024) == 0 || done == steps) {
        const LayerStatus st = layer.status();  // synchronizes
        if (!st.ok()) {
          std::printf("after %lld steps: sticky error: %s\n", (long long)done, st.message().c_str());
          failed = true;
          break;
        }
      }
    }
    std::printf("%-40s %lld steps in chains of %lld, len %lld, base %lld, status %s, %.1f s\n",
                "graph-replayed decode steps:", (long long)done, (long long)chain,
                (long long)layer.len(), (long long)layer.base(), layer.status().message().c_str(),
                seconds());
  }
  const std::size_t free3 = free_bytes();
  std::printf("%-40s free before %zu, after %zu, change %lld bytes\n", "device memory (steps phase):",
              free2, free3, (long long)free3 - (long long)free2);
  if (free3 < free2) failed = true;
  std::printf("soak: %s\n", failed ? "FAIL" : "PASS");
  return failed ? kExitFailure : kExitOk;
}

}  // namespace

const Command& soak_command() {
  static const Command c{"soak", "GPU soak: create/destroy cycles and a million graph-replayed steps",
                         kUsage, &run_soak};
  return c;
}

}  // namespace kvlayer::cli
