// kvlayer snapshot-bench: what parking a sequence costs (SPEC §13) on this GPU: snapshot()
// (device to host), save_snapshot (the crash-safe GGUF write), load_snapshot and restore()
// (host to device) of one layer, each the median wall-clock time of several runs, with the
// bytes per token and the rates. The layer is filled with random rows on the GPU first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

/// Median wall-clock seconds of `reps` calls of f (each call complete when f returns).
double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int run(const std::vector<std::string>& args) {
  const Options o(args, {"len", "heads", "head-dim", "reps", "dir"}, {});
  const std::int64_t len = o.integer("len", 131072, 1, std::int64_t(1) << 24);
  const int heads = int(o.integer("heads", 8, 1, 64));
  const int head_dim = int(o.integer("head-dim", 128, 32, 256));
  const int reps = int(o.integer("reps", 5, 1, 100));
  const std::string dir = o.get("dir").value_or(std::filesystem::temp_directory_path().string());
  if (head_dim % 32 != 0)
    throw UsageError("--head-dim " + std::to_string(head_dim) + " must be a multiple of 32");

  Geometry g;
  g.n_kv_heads = heads;
  g.head_dim_k = g.head_dim_v = head_dim;
  g.max_ctx = len;
  cuda::Stream stream;
  cuda::KvLayer layer(g, heads, stream.get());
  const std::int64_t chunk = 4096;
  cuda::DeviceBuffer k(std::size_t(chunk * g.kv_dim_k()) * 4),
      v(std::size_t(chunk * g.kv_dim_v()) * 4);
  for (std::int64_t at = 0, c = 0; at < len; at += chunk, ++c) {
    const std::int64_t n = std::min(chunk, len - at);
    KVLAYER_CUDA_TRY(launch_fill_random(k.as<float>(), std::size_t(n * g.kv_dim_k()),
                                        std::uint64_t(11 + 2 * c), stream.get()));
    KVLAYER_CUDA_TRY(launch_fill_random(v.as<float>(), std::size_t(n * g.kv_dim_v()),
                                        std::uint64_t(12 + 2 * c), stream.get()));
    layer.append(cuda::RowsView{k.get(), v.get(), n, DType::f32});
  }
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream.get()));

  const std::string path = dir + "/kvlayer-snapshot-bench.gguf";
  Snapshot snap;
  const double t_snapshot = median_seconds(reps, [&] { snap = layer.snapshot(); });
  const double t_save = median_seconds(reps, [&] { save_snapshot(path, snap); });
  const auto file_bytes = std::filesystem::file_size(path);
  Snapshot loaded;
  const double t_load = median_seconds(reps, [&] { loaded = load_snapshot(path); });
  std::vector<std::unique_ptr<cuda::KvLayer>> fresh;
  for (int i = 0; i < reps; ++i)
    fresh.push_back(std::make_unique<cuda::KvLayer>(g, heads, stream.get()));
  int next = 0;
  const double t_restore =
      median_seconds(reps, [&] { fresh[std::size_t(next++)]->restore(loaded); });
  // The restored layer holds the same bytes: the timing measured a real copy.
  const Snapshot back = fresh.front()->snapshot();
  if (back.k != snap.k || back.v != snap.v || back.len != snap.len)
    throw Error(ErrorKind::device,
                "snapshot-bench: the restored layer's rows differ from the "
                "saved layer's");
  std::filesystem::remove(path);

  cudaDeviceProp prop{};
  int device = 0;
  KVLAYER_CUDA_TRY(cudaGetDevice(&device));
  KVLAYER_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  const double bytes = double(snap.k.size() + snap.v.size());
  std::printf(
      "snapshot-bench on %s: %s, len %lld, %lld rows held, %.1f MB of K/V, %.0f bytes "
      "per token (K %lld + V %lld), file %.1f MB; median of %d\n",
      prop.name, g.describe().c_str(), (long long)len, (long long)snap.rows(), bytes / 1e6,
      bytes / double(snap.rows()), (long long)g.k_tok_bytes(), (long long)g.v_tok_bytes(),
      double(file_bytes) / 1e6, reps);
  const auto line = [&](const char* what, double s, double moved) {
    std::printf("  %-34s %9.2f ms  %7.2f GB/s\n", what, s * 1e3, moved / s / 1e9);
  };
  line("snapshot() device -> host", t_snapshot, bytes);
  line("save_snapshot (write, fsync, rename)", t_save, double(file_bytes));
  line("load_snapshot (read, CRC, checks)", t_load, double(file_bytes));
  line("restore() host -> device", t_restore, bytes);
  return kExitOk;
}

}  // namespace

const Command& snapshot_bench_command() {
  static const Command c{
      "snapshot-bench", "time snapshot, save, load and restore of one layer on the GPU",
      "usage: kvlayer snapshot-bench [--len N] [--heads H] [--head-dim D] [--reps R] [--dir DIR]\n"
      "  Fills a flat layer of H KV heads x D with N random rows on the\n"
      "  GPU, then prints the median time of snapshot() (device to host), save_snapshot (GGUF,\n"
      "  crash-safe), load_snapshot and restore() into fresh layers (host to device), the bytes\n"
      "  per token and the rates. Defaults: N 131072, H 8, D 128, R 5, DIR the temp folder.\n",
      run};
  return c;
}

}  // namespace kvlayer::cli
