// kvlayer bench: decode, append and graph-step timings on the GPU, in ONE run with the
// streaming-read ceiling they are compared against (CUDA events, warm-up, medians, cold L2).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_accuracy.hpp"
#include "commands.hpp"
#include "decode_step.hpp"
#include "gpu_timing.hpp"
#include "kvlayer/cuda/kv_batch.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

using cuda::DeviceBuffer;
using cuda::Event;
using cuda::Stream;

constexpr std::string_view kUsage =
    "usage: kvlayer bench [--json FILE] [--reps N] [--quick] [--no-accuracy] [--no-verify]\n"
    "                     [--no-batch | --batch-only | --accuracy-only]\n"
    "                     [--decode-only KEYS [--shape S] [--queries T] [--capacity C]]\n"
    "  Times on the GPU, in one run: the streaming-read ceiling; decode (host-len, dc, dcw) for\n"
    "  8x128 gqa 8, 8x128 gqa 4, 4x256 gqa 8, 1x128 gqa 16 at 1K-128K keys and with a 4096-key\n"
    "  window, eager (one call; _b2b: 20 back to back) and graph-replayed; verify decode (SPEC "
    "§11) of T = 1, 2, 4, 8, 16, 32, 64 queries for 8x128 gqa 8 and\n"
    "  4x256 gqa 8 at 4K, 16K and 128K keys and with a 4096-key window, graph-replayed;\n"
    "  batch decode (SPEC §12, one launch for B sequences, see --no-batch) and batch verify\n"
    "  (T = 4 per sequence);\n"
    "  append of 1 row and of a 4096-row chunk; a graph-replayed decode step against\n"
    "  the same step launched eagerly. Reports medians (CUDA events) in µs, bytes moved, GB/s\n"
    "  and % of the measured ceiling. L2 is kept cold by rotating among enough copies.\n"
    "  Each row also gets its floor: the streaming-read kernel on the row's byte count, one\n"
    "  cold launch per event pair (% floor = floor µs / row µs).\n"
    "  Accuracy: for 8x128 gqa 8 and 4x256 gqa 8 at 4K and 32K keys, on N(0,1) K/V and on K\n"
    "  with outlier channels (4 per head, 10-50x), the attention-output error (max abs, RMS\n"
    "  relative to the output's RMS) against a float64 attention over the unquantized values:\n"
    "  kvlayer's GPU decode_dc (q8_0 K, q5_1 V) and host emulations of fp8 e4m3 (scale 1)\n"
    "  and fp16 caches; the same for a verify of T = 8 queries (decode_rows_dc, causal).\n"
    "  --json FILE   also write the results as JSON (for tools/bench-peers)\n"
    "  --reps N      timed repetitions per measurement (default 50)\n"
    "  --quick       one geometry, fewer lengths, accuracy at 4K keys only (a smoke run)\n"
    "  --no-accuracy no accuracy rows (their host float64 attention takes seconds)\n"
    "  --no-verify   no verify rows\n"
    "  --no-batch    no batch rows (KvBatch decode of B = 8, 32, 128 sequences of 8x128 gqa 8,\n"
    "                every sequence at 4K keys, or at lengths log-uniform from 256 to 32K; B = 8\n"
    "                at 128K keys; and batch verifies of T = 4 at B = 8, 32 of the first two;\n"
    "                eager and graph-replayed)\n"
    "  --batch-only  the ceiling and the batch rows alone (for tools/batch_peers.py's run)\n"
    "  --accuracy-only  the accuracy rows alone (no timings)\n"
    "  --decode-only KEYS  only the 8x128 gqa 8 decode at KEYS keys, no ceiling (for a\n"
    "                profiler: few launches; % ceiling is not reported)\n"
    "  --shape KVxDxG  the --decode-only geometry: KV heads x head dim x gqa (default 8x128x8)\n"
    "  --queries T   with --decode-only: the graph-replayed verify decode of T (1..64) queries\n"
    "  --capacity C  with --decode-only: layers of C >= KEYS rows holding KEYS keys (an engine's\n"
    "                short view of a long cache; the grid is planned for C)\n";

/// The batch rows' sequence lengths (tools/batch_peers.py draws the same): "4k" every sequence
/// at 4096 keys, "128k" at 131072, "log" sequence i at round(256 · 2^(7·(i + 0.5)/B)) keys
/// (log-uniform from 256 to 32K, without a random draw so that the peers' rows match).
std::vector<std::int64_t> batch_lengths(const std::string& which, int b) {
  std::vector<std::int64_t> lens(std::size_t(b), which == "128k" ? 131072 : 4096);
  if (which == "log")
    for (int i = 0; i < b; ++i)
      lens[std::size_t(i)] = std::llround(256.0 * std::exp2(7.0 * (i + 0.5) / b));
  return lens;
}

struct Row {
  std::string name, shape;
  int n_kv_heads = 0, head_dim = 0, gqa = 0;
  std::int64_t keys = 0, window = 0;
  double us = 0;
  double bytes = 0;
  int queries = 0;  ///< verify rows: T (0 otherwise)
  int batch = 0;    ///< batch rows: B sequences (0 otherwise); keys: their views' sum
  std::string batch_case = {};  ///< batch rows: "4k", "log" or "128k" (batch_lengths)
};

struct AccuracyRow {
  std::string data, format, source;
  int n_kv_heads = 0, head_dim = 0, gqa = 0;
  std::int64_t keys = 0;
  int queries = 1;  ///< T: 1 a decode, else a verify of T queries (its last T positions)
  ErrorStats e;
};

/// The verify of the accuracy rows: T = 8 draft tokens, the size issue #29's targets name.
inline constexpr int kAccuracyVerifyQueries = 8;

struct Bench {
  Stream stream;
  int reps = 50;
  std::size_t l2_bytes = 0;
  int sms = 0;
  double ceiling_gbs = 0;
  std::vector<Row> rows;
  std::vector<AccuracyRow> accuracy_rows;
  DeviceBuffer stream_data, stream_sink;  ///< the ceiling's 2 GiB, reused by floor_us
  std::map<std::size_t, double> floors;   ///< floor_us by byte count

  Bench() {
    int dev = 0;
    KVLAYER_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    KVLAYER_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    l2_bytes = std::size_t(p.l2CacheSize);
    sms = p.multiProcessorCount;
  }
  cudaStream_t s() const { return stream.get(); }

  void ceiling() {
    const std::size_t bytes = std::size_t(2) << 30;  // 2 GiB: 35× the L2
    stream_data = DeviceBuffer(bytes);
    stream_sink = DeviceBuffer(std::size_t(sms) * 8 * sizeof(unsigned));
    KVLAYER_CUDA_TRY(launch_fill_random(stream_data.as<float>(), bytes / 4, 7, s()));
    const double us = median_us(s(), 3, reps, [&](int) {
      KVLAYER_CUDA_TRY(
          launch_stream_read(stream_data.get(), bytes, stream_sink.as<unsigned>(), sms * 8, s()));
    });
    ceiling_gbs = double(bytes) / us / 1e3;
    rows.push_back(Row{"stream_read", "2 GiB", 0, 0, 0, 0, 0, us, double(bytes)});
  }

  /// The streaming-read kernel on `bytes` (rounded up to 16) of cold memory, one launch per
  /// event pair: what reading a row's bytes once costs at that size, launch included.
  /// NOTE: a one-shot read of tens of MB does not reach the 2 GiB rate (ramp-up, tail and
  /// launch), so each row is also reported against this size-matched floor.
  double floor_us(double bytes) {
    const std::size_t n = (std::size_t(bytes) + 15) / 16 * 16;
    if (auto it = floors.find(n); it != floors.end()) return it->second;
    const std::size_t stride = (n + (std::size_t(1) << 21) - 1) >> 21 << 21;  // 2 MiB steps
    const std::size_t slots = std::max<std::size_t>(1, (stream_data.bytes() - n) / stride + 1);
    const double us = median_us(s(), 3, reps, [&](int i) {
      const auto* base = stream_data.as<std::uint8_t>() + (std::size_t(i) % slots) * stride;
      KVLAYER_CUDA_TRY(launch_stream_read(base, n, stream_sink.as<unsigned>(), sms * 8, s()));
    });
    floors.emplace(n, us);
    return us;
  }

  /// Appends `keys` random rows to `layer` in 4096-row chunks through the staging buffers k and
  /// v (4096 rows each); chunk at row `done` draws K from k_seed + done, V from v_seed + done.
  void fill_rows(cuda::KvLayer& layer, const Geometry& g, std::int64_t keys, DeviceBuffer& k,
                 DeviceBuffer& v, std::uint64_t k_seed, std::uint64_t v_seed) {
    for (std::int64_t done = 0; done < keys; done += kFillChunk) {
      const std::int64_t n = std::min(kFillChunk, keys - done);
      KVLAYER_CUDA_TRY(
          launch_fill_random(k.as<float>(), std::size_t(n * g.kv_dim_k()), k_seed + done, s()));
      KVLAYER_CUDA_TRY(
          launch_fill_random(v.as<float>(), std::size_t(n * g.kv_dim_v()), v_seed + done, s()));
      layer.append(cuda::RowsView{k.get(), v.get(), n, DType::f32});
    }
  }
  static constexpr std::int64_t kFillChunk = 4096;

  /// Layers filled with random rows, enough copies that their planes exceed 4× the L2; verify
  /// decodes of up to max_verify queries.
  std::vector<std::unique_ptr<cuda::KvLayer>> make_layers(
      const Geometry& g, int nq, std::int64_t fill, int max_verify = cuda::kDefaultMaxVerify) {
    // Enough copies of the bytes a decode reads (the filled rows) to keep L2 cold.
    const double layer_bytes =
        double(std::min<std::int64_t>(g.rows(), std::max<std::int64_t>(fill, 1))) *
        double(g.k_tok_bytes() + g.v_tok_bytes());
    const int copies = int(std::clamp(std::ceil(4.0 * double(l2_bytes) / layer_bytes), 2.0, 48.0));
    DeviceBuffer k(std::size_t(kFillChunk * g.kv_dim_k()) * 4),
        v(std::size_t(kFillChunk * g.kv_dim_v()) * 4);
    std::vector<std::unique_ptr<cuda::KvLayer>> layers;
    for (int c = 0; c < copies; ++c) {
      layers.push_back(std::make_unique<cuda::KvLayer>(g, nq, s(), max_verify));
      fill_rows(*layers.back(), g, fill, k, v, 1000 + std::uint64_t(c) * 7919,
                2000 + std::uint64_t(c) * 7919);
    }
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(s()));
    return layers;
  }

  /// capacity > keys: layers of that many rows holding `keys` keys.
  void decode(int n_kv, int hd, int gqa, std::int64_t keys, std::int64_t window,
              std::int64_t capacity = 0) {
    Geometry g;
    g.n_kv_heads = n_kv;
    g.head_dim_k = g.head_dim_v = hd;
    g.max_ctx = std::max(keys, capacity);
    if (window) g.window = window;
    const int nq = n_kv * gqa;
    auto layers = make_layers(g, nq, keys);
    DeviceBuffer q(std::size_t(nq * hd) * 4), out(std::size_t(nq * hd) * 4);
    KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), std::size_t(nq * hd), 99, s()));
    const std::int64_t view = window ? std::min(window, keys) : keys;
    const double bytes = double(view) * n_kv * (hd / 32) * (34 + 24) + 2.0 * nq * hd * 4;
    const auto at = [&](int i) -> cuda::KvLayer& {
      return *layers[std::size_t(i) % layers.size()];
    };
    auto record = [&](const char* name, double us) {
      rows.push_back(Row{name, "", n_kv, hd, gqa, keys, window, us, bytes});
    };
    record("decode",
           median_us(s(), 5, reps, [&](int i) { at(i).decode(q.as<float>(), out.as<float>()); }));
    const auto dc = [&](int i) {
      window ? at(i).decode_dcw(q.as<float>(), out.as<float>())
             : at(i).decode_dc(q.as<float>(), out.as<float>());
    };
    record(window ? "decode_dcw" : "decode_dc", median_us(s(), 5, reps, dc));
    // The same eager calls, 20 back to back between the events (rotating layers), as an
    // engine's host loop enqueues them ahead of the GPU: the row above, one call on an idle
    // stream, also holds the latency of its first launch reaching the GPU.
    record(window ? "decode_dcw_b2b" : "decode_dc_b2b", back_to_back_us(20, dc));
    // The same calls replayed from a graph, 20 per replay (rotating layers): GPU time alone,
    // without the host's launch work between the two events (what an engine's graph sees).
    record(window ? "decode_dcw_graph" : "decode_dc_graph", graph_us(20, dc));
  }

  /// Verify decodes (decode_rows_dc / decode_rows_dcw) of T queries over `keys` keys, replayed
  /// from a graph as the decode_dc_graph rows are; bytes: the union of the T views once, plus
  /// q and out.
  void verify(int n_kv, int hd, int gqa, std::int64_t keys, std::int64_t window,
              const std::vector<int>& ts) {
    Geometry g;
    g.n_kv_heads = n_kv;
    g.head_dim_k = g.head_dim_v = hd;
    g.max_ctx = keys;
    if (window) g.window = window;
    const int nq = n_kv * gqa;
    const int t_max = *std::max_element(ts.begin(), ts.end());
    auto layers = make_layers(g, nq, keys, std::max(t_max, cuda::kDefaultMaxVerify));
    DeviceBuffer q(std::size_t(t_max * nq * hd) * 4), out(std::size_t(t_max * nq * hd) * 4);
    KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), std::size_t(t_max * nq * hd), 98, s()));
    for (int t : ts) {
      const std::int64_t view = window ? std::min(window + t - 1, keys) : keys;
      const double bytes = double(view) * n_kv * (hd / 32) * (34 + 24) + 2.0 * t * nq * hd * 4;
      const auto call = [&](int i) {
        cuda::KvLayer& l = *layers[std::size_t(i) % layers.size()];
        window ? l.decode_rows_dcw(q.as<float>(), out.as<float>(), t)
               : l.decode_rows_dc(q.as<float>(), out.as<float>(), t);
      };
      Row r{window ? "verify_dcw_graph" : "verify_dc_graph",
            "",
            n_kv,
            hd,
            gqa,
            keys,
            window,
            graph_us(20, call),
            bytes};
      r.queries = t;
      rows.push_back(r);
    }
  }

  /// Batch decodes (KvBatch::decode_rows_dc, T = 1), or batch verifies of t queries, of 8x128
  /// gqa 8 sequences of the given lengths, every sequence active, one launch per call; eager and
  /// graph-replayed (20 calls per replay, rotating copies of the batch when one copy's bytes do
  /// not exceed 4× the L2). bytes: every sequence's view once, plus q and out.
  void batch(const std::string& label, const std::vector<std::int64_t>& lens, int t = 1) {
    Geometry g;
    g.n_kv_heads = 8;
    g.head_dim_k = g.head_dim_v = 128;
    g.max_ctx = *std::max_element(lens.begin(), lens.end());
    const int nq = 64, B = int(lens.size());
    std::int64_t keys = 0;
    for (const std::int64_t l : lens) keys += l;
    const double kv_bytes = double(keys) * double(g.k_tok_bytes() + g.v_tok_bytes());
    const double bytes = kv_bytes + 2.0 * B * t * nq * 128 * 4;
    const int copies = int(std::clamp(std::ceil(4.0 * double(l2_bytes) / kv_bytes), 1.0, 8.0));
    DeviceBuffer k(std::size_t(kFillChunk * g.kv_dim_k()) * 4),
        v(std::size_t(kFillChunk * g.kv_dim_v()) * 4);
    std::vector<std::unique_ptr<cuda::KvBatch>> batches;
    std::vector<int> all(std::size_t(B), 0);
    for (int i = 0; i < B; ++i) all[std::size_t(i)] = i;
    for (int c = 0; c < copies; ++c) {
      batches.push_back(std::make_unique<cuda::KvBatch>(g, nq, B, s()));
      for (int i = 0; i < B; ++i) {
        const std::uint64_t seed = 1000 + std::uint64_t(c) * 7919 + std::uint64_t(i) * 131;
        fill_rows(batches.back()->layer(i), g, lens[std::size_t(i)], k, v, seed, seed + 1);
      }
      batches.back()->set_active(all);
    }
    DeviceBuffer q(std::size_t(B) * std::size_t(t) * nq * 128 * 4), out(q.bytes());
    KVLAYER_CUDA_TRY(
        launch_fill_random(q.as<float>(), std::size_t(B) * std::size_t(t) * nq * 128, 97, s()));
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(s()));
    const auto call = [&](int i) {
      batches[std::size_t(i) % batches.size()]->decode_rows_dc(q.as<float>(), out.as<float>(), t);
    };
    // Verify rows are named apart: tools/batch_peers.py and bench-peers stand T = 1 decodes
    // beside the batch peers.
    const std::string name = t > 1 ? "batch_verify_dc" : "batch_dc";
    for (const bool graph : {false, true}) {
      Row r{graph ? name + "_graph" : name,
            "8x128 gqa 8 B " + std::to_string(B) + " " + label,
            8,
            128,
            8,
            keys,
            0,
            graph ? graph_us(20, call) : median_us(s(), 5, reps, call),
            bytes};
      r.batch = B;
      r.batch_case = label;
      r.queries = t > 1 ? t : 0;
      rows.push_back(r);
    }
    for (int i = 0; i < B; ++i)
      if (const LayerStatus st = batches.front()->layer(i).status(); !st.ok())
        throw Error(ErrorKind::device, "batch sequence " + std::to_string(i) + ": " + st.message());
  }

  /// Median per-call µs of `count` calls f(0..count) launched back to back between two events.
  double back_to_back_us(int count, const std::function<void(int)>& f) {
    return median_us(s(), 3, std::max(5, reps / 5),
                     [&](int) {
                       for (int i = 0; i < count; ++i) f(i);
                     }) /
           count;
  }

  /// Median per-call µs of `count` calls f(0..count) captured once into a graph and replayed.
  double graph_us(int count, const std::function<void(int)>& f) {
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(s()));
    KVLAYER_CUDA_TRY(cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < count; ++i) f(i);
    const auto graph = cuda::Graph::end_capture(s());
    return median_us(s(), 3, std::max(5, reps / 5), [&](int) { graph.launch(s()); }) / count;
  }

  void append(std::int64_t n) {
    Geometry g;
    g.n_kv_heads = 8;
    g.head_dim_k = g.head_dim_v = 128;
    g.max_ctx = 8192;
    const int copies = n == 1 ? 2 : 8;  // 8 × 4096 rows × 8 KiB f32 in: 256 MiB, > 4× L2
    std::vector<std::unique_ptr<cuda::KvLayer>> layers;
    std::vector<DeviceBuffer> ks, vs;
    for (int c = 0; c < copies; ++c) {
      layers.push_back(std::make_unique<cuda::KvLayer>(g, 8, s()));
      ks.emplace_back(std::size_t(n * g.kv_dim_k()) * 4);
      vs.emplace_back(std::size_t(n * g.kv_dim_v()) * 4);
      KVLAYER_CUDA_TRY(
          launch_fill_random(ks.back().as<float>(), std::size_t(n * g.kv_dim_k()), 31 + c, s()));
      KVLAYER_CUDA_TRY(
          launch_fill_random(vs.back().as<float>(), std::size_t(n * g.kv_dim_v()), 57 + c, s()));
    }
    const double bytes = double(n) * double(g.kv_dim_k() + g.kv_dim_v()) * 4 +
                         double(n) * double(g.k_tok_bytes() + g.v_tok_bytes());
    // Host-side rewinds between timed appends keep every append at the same rows.
    Event a(true), b(true);
    std::vector<float> ms;
    for (int i = 0; i < reps + 5; ++i) {
      const std::size_t c = std::size_t(i) % layers.size();
      layers[c]->rewind(0);
      KVLAYER_CUDA_TRY(cudaEventRecord(a.get(), s()));
      layers[c]->append(cuda::RowsView{ks[c].get(), vs[c].get(), n, DType::f32});
      KVLAYER_CUDA_TRY(cudaEventRecord(b.get(), s()));
      KVLAYER_CUDA_TRY(cudaEventSynchronize(b.get()));
      float t = 0;
      KVLAYER_CUDA_TRY(cudaEventElapsedTime(&t, a.get(), b.get()));
      if (i >= 5) ms.push_back(t);
    }
    std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
    rows.push_back(Row{n == 1 ? "append_1" : "append_chunk", std::to_string(n) + " rows 8x128 f32",
                       8, 128, 0, n, 0, 1000.0 * ms[ms.size() / 2], bytes});
  }

  /// Attention-output errors (bench_accuracy.hpp) on N(0,1) K/V, then on the same K with its
  /// outlier channels scaled: the values are made on the host, appended to a layer of the timed
  /// decode's geometry, decoded once by decode_dc and verified once by decode_rows_dc (T =
  /// kAccuracyVerifyQueries, each query causal over the keys), read back; the e4m3 and f16
  /// caches are emulated on the host from the same values.
  void accuracy(int n_kv, int hd, int gqa, std::int64_t keys) {
    Geometry g;
    g.n_kv_heads = n_kv;
    g.head_dim_k = g.head_dim_v = hd;
    g.max_ctx = keys;
    const int nq = n_kv * gqa;
    constexpr int kT = kAccuracyVerifyQueries;
    std::vector<float> k(std::size_t(keys * g.kv_dim_k())), v(std::size_t(keys * g.kv_dim_v())),
        q(std::size_t(nq) * hd), out(q.size()), qt(std::size_t(kT) * q.size()), outt(qt.size());
    const std::uint64_t seed = std::uint64_t(keys) * 1000 + std::uint64_t(hd) * 10;
    fill_normal(k, seed);
    fill_normal(v, seed + 1);
    fill_normal(q, seed + 2);
    fill_normal(qt, seed + 3);
    DeviceBuffer dk(k.size() * 4), dv(v.size() * 4), dq(q.size() * 4), dout(out.size() * 4),
        dqt(qt.size() * 4), doutt(outt.size() * 4);
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(dv.get(), v.data(), dv.bytes(), cudaMemcpyHostToDevice, s()));
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(dq.get(), q.data(), dq.bytes(), cudaMemcpyHostToDevice, s()));
    KVLAYER_CUDA_TRY(
        cudaMemcpyAsync(dqt.get(), qt.data(), dqt.bytes(), cudaMemcpyHostToDevice, s()));
    const std::vector<float> v_e4m3 = round_to(v, KvFormat::e4m3),
                             v_f16 = round_to(v, KvFormat::f16);
    for (const bool outliers : {false, true}) {
      if (outliers) scale_outlier_channels(k, n_kv, hd);
      KVLAYER_CUDA_TRY(
          cudaMemcpyAsync(dk.get(), k.data(), dk.bytes(), cudaMemcpyHostToDevice, s()));
      cuda::KvLayer layer(g, nq, s());
      const std::int64_t chunk = kFillChunk;  // the appends make_layers times
      for (std::int64_t done = 0; done < keys; done += chunk)
        layer.append(cuda::RowsView{dk.as<float>() + done * g.kv_dim_k(),
                                    dv.as<float>() + done * g.kv_dim_v(),
                                    std::min(chunk, keys - done), DType::f32});
      layer.decode_dc(dq.as<float>(), dout.as<float>());
      layer.decode_rows_dc(dqt.as<float>(), doutt.as<float>(), kT);
      KVLAYER_CUDA_TRY(
          cudaMemcpyAsync(out.data(), dout.get(), dout.bytes(), cudaMemcpyDeviceToHost, s()));
      KVLAYER_CUDA_TRY(
          cudaMemcpyAsync(outt.data(), doutt.get(), doutt.bytes(), cudaMemcpyDeviceToHost, s()));
      KVLAYER_CUDA_TRY(cudaStreamSynchronize(s()));
      if (const LayerStatus st = layer.status(); !st.ok())
        throw Error(ErrorKind::device, "accuracy layer: " + st.message());

      const std::vector<float> k_e4m3 = round_to(k, KvFormat::e4m3);
      const std::vector<float> k_f16 = round_to(k, KvFormat::f16);
      // The decode (T = 1) and the verify (T = kT) rows, each against its own float64 reference.
      for (const int t : {1, kT}) {
        const std::span<const float> qs = t == 1 ? std::span<const float>(q) : qt;
        const std::vector<float>& got = t == 1 ? out : outt;
        const AttentionInput in{n_kv, hd, gqa, keys, qs, k, v, double(layer.default_scale()), t};
        const std::vector<double> ref = attention_f64(in, false);
        auto record = [&](const char* format, const char* source, const ErrorStats& e) {
          accuracy_rows.push_back(AccuracyRow{outliers ? "k_outliers" : "normal", format, source,
                                              n_kv, hd, gqa, keys, t, e});
        };
        record("q8_0/q5_1", t == 1 ? "kvlayer GPU decode_dc" : "kvlayer GPU decode_rows_dc",
               error_stats(ref, std::vector<double>(got.begin(), got.end())));
        const AttentionInput e4m3{n_kv, hd, gqa, keys, qs, k_e4m3, v_e4m3, in.scale, t};
        record("e4m3", "host emulation", error_stats(ref, attention_f64(e4m3, true)));
        const AttentionInput f16{n_kv, hd, gqa, keys, qs, k_f16, v_f16, in.scale, t};
        record("f16", "host emulation", error_stats(ref, attention_f64(f16, true)));
      }
    }
  }

  /// One decode step (append_dc → inc_seqlen → decode_dc) at 16K keys: replayed from a graph
  /// against launched eagerly; per-step time from 64-step loops.
  void graph_step() {
    Geometry g;
    g.n_kv_heads = 8;
    g.head_dim_k = g.head_dim_v = 128;
    g.max_ctx = 16384 + 64;
    const std::int64_t len0 = 16384;
    auto layers = make_layers(g, 64, len0);
    cuda::KvLayer& L = *layers.front();
    DeviceBuffer k(std::size_t(g.kv_dim_k()) * 4), v(std::size_t(g.kv_dim_v()) * 4),
        q(64 * 128 * 4), out(64 * 128 * 4);
    KVLAYER_CUDA_TRY(launch_fill_random(k.as<float>(), std::size_t(g.kv_dim_k()), 5, s()));
    KVLAYER_CUDA_TRY(launch_fill_random(v.as<float>(), std::size_t(g.kv_dim_v()), 6, s()));
    KVLAYER_CUDA_TRY(launch_fill_random(q.as<float>(), 64 * 128, 8, s()));
    const cuda::RowsView row{k.get(), v.get(), 1, DType::f32};
    auto step = [&] { decode_step(L, row, q.as<float>(), out.as<float>()); };
    const auto graph = capture_decode_step(L, row, q.as<float>(), out.as<float>());
    constexpr int kSteps = 64;
    auto loop = [&](bool replay) {
      return median_us(
                 s(), 2, std::max(5, reps / 5),
                 [&](int) {
                   L.rewind(len0);  // host-side; the loop then advances len_d on the device only
                   for (int i = 0; i < kSteps; ++i) replay ? graph.launch(s()) : step();
                 }) /
             kSteps;
    };
    const double bytes = double(len0) * 8 * 4 * 58 + 64.0 * 128 * 8;
    rows.push_back(Row{"step_eager", "append_dc+inc+decode_dc 8x128 gqa8", 8, 128, 8, len0, 0,
                       loop(false), bytes});
    rows.push_back(Row{"step_graph", "append_dc+inc+decode_dc 8x128 gqa8", 8, 128, 8, len0, 0,
                       loop(true), bytes});
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(s()));
  }
};

int run_bench(const std::vector<std::string>& args) {
  const Options o(args, {"json", "reps", "decode-only", "shape", "queries", "capacity"},
                  {"quick", "no-accuracy", "no-verify", "no-batch", "batch-only", "accuracy-only"});
  if (o.flag("batch-only") && o.flag("no-batch"))
    throw UsageError("--batch-only and --no-batch exclude each other");
  const bool accuracy_only = o.flag("accuracy-only");
  if (accuracy_only && (o.flag("batch-only") || o.flag("no-accuracy") || o.get("decode-only")))
    throw UsageError("--accuracy-only excludes --batch-only, --no-accuracy and --decode-only");
  const int reps = int(o.integer("reps", 50, 5, 100000));
  const std::int64_t decode_only = o.integer("decode-only", 0, 64, 1 << 24);
  const int queries = int(o.integer("queries", 0, 1, cuda::kMaxVerify));
  if (queries > 0 && decode_only == 0) throw UsageError("--queries applies to --decode-only only");
  const std::int64_t capacity = o.integer("capacity", 0, 64, 1 << 24);
  if (capacity > 0 && decode_only == 0)
    throw UsageError("--capacity applies to --decode-only only");
  if (capacity > 0 && (capacity < decode_only || queries > 0))
    throw UsageError("--capacity " + std::to_string(capacity) +
                     " must be at least --decode-only's keys (" + std::to_string(decode_only) +
                     "), without --queries");
  int shape_kv = 8, shape_d = 128, shape_gqa = 8;
  if (auto shape = o.get("shape")) {
    char tail = 0;
    if (std::sscanf(shape->c_str(), "%dx%dx%d%c", &shape_kv, &shape_d, &shape_gqa, &tail) != 3 ||
        shape_kv < 1 || shape_kv > 64 || !cuda::head_dim_supported(shape_d) || shape_gqa < 1 ||
        shape_gqa > 16)
      throw UsageError("--shape '" + *shape + "' must be KVxDxG with KV in [1, 64], D one of " +
                       cuda::supported_head_dims() + ", G in [1, 16]");
    if (decode_only == 0) throw UsageError("--shape applies to --decode-only only");
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw Error(ErrorKind::device, "no CUDA device found (run it on the GPU machine)");
  const auto t0 = std::chrono::steady_clock::now();
  Bench b;
  b.reps = reps;
  const bool quick = o.flag("quick");
  cudaDeviceProp p{};
  KVLAYER_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
  std::printf("kvlayer bench on %s (%d SMs, L2 %zu MiB), %d reps, medians\n", p.name,
              p.multiProcessorCount, b.l2_bytes >> 20, b.reps);
  if (decode_only > 0) {
    if (queries > 0)
      b.verify(shape_kv, shape_d, shape_gqa, decode_only, 0, {queries});
    else
      b.decode(shape_kv, shape_d, shape_gqa, decode_only, 0, capacity);
    // Named as in the full table ("verify_dc_graph T8"), so that tools/bench-ab reads both.
    for (const Row& r : b.rows)
      std::printf("%-16s %dx%d gqa %d %8lld keys %10.2f us %8.0f GB/s%s\n",
                  (r.queries ? r.name + " T" + std::to_string(r.queries) : r.name).c_str(),
                  shape_kv, shape_d, shape_gqa, (long long)r.keys, r.us, r.bytes / r.us / 1e3,
                  capacity > 0 ? (" capacity " + std::to_string(capacity)).c_str() : "");
    return kExitOk;
  }
  if (!accuracy_only) {
    b.ceiling();
    std::printf("streaming-read ceiling: %.0f GB/s\n", b.ceiling_gbs);
  }
  struct G {
    int n_kv, hd, gqa;
  };
  const std::vector<G> geoms =
      quick ? std::vector<G>{{8, 128, 8}}
            : std::vector<G>{{8, 128, 8}, {8, 128, 4}, {4, 256, 8}, {1, 128, 16}};
  const std::vector<std::int64_t> lengths =
      quick ? std::vector<std::int64_t>{4096, 131072}
            : std::vector<std::int64_t>{1024, 4096, 16384, 65536, 131072};
  const bool batch_only = o.flag("batch-only");
  if (!o.flag("no-batch") && !accuracy_only) {
    for (const char* which : {"4k", "log"})
      for (const int bs : quick ? std::vector<int>{8} : std::vector<int>{8, 32, 128})
        b.batch(which, batch_lengths(which, bs));
    if (!quick) b.batch("128k", batch_lengths("128k", 8));
    // Batch verifies (speculative decoding over a batch): T = 4 drafts per sequence.
    for (const char* which : {"4k", "log"})
      for (const int bs : quick ? std::vector<int>{8} : std::vector<int>{8, 32})
        b.batch(which, batch_lengths(which, bs), 4);
  }
  for (const G& g : batch_only || accuracy_only ? std::vector<G>{} : geoms) {
    for (std::int64_t keys : lengths) b.decode(g.n_kv, g.hd, g.gqa, keys, 0);
    b.decode(g.n_kv, g.hd, g.gqa, 131072, 4096);
  }
  if (!o.flag("no-verify") && !batch_only && !accuracy_only) {
    // Up to kMaxVerify: issue #29 times T = 32 and 64 too (layers built for them).
    const std::vector<int> ts = {1, 2, 4, 8, 16, 32, 64};
    const std::vector<G> verify_geoms =
        quick ? std::vector<G>{{8, 128, 8}} : std::vector<G>{{8, 128, 8}, {4, 256, 8}};
    const std::vector<std::int64_t> verify_keys =
        quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{4096, 16384, 131072};
    for (const G& g : verify_geoms) {
      for (std::int64_t keys : verify_keys) b.verify(g.n_kv, g.hd, g.gqa, keys, 0, ts);
      b.verify(g.n_kv, g.hd, g.gqa, 131072, 4096, ts);
    }
  }
  if (!batch_only && !accuracy_only) {
    b.append(1);
    b.append(4096);
    b.graph_step();
  }
  if (!o.flag("no-accuracy") && !batch_only) {
    // One geometry per head dim, a short and a long view: the host's float64 attention is
    // O(keys x query heads x head dim) per format.
    const std::vector<G> acc_geoms =
        quick ? std::vector<G>{{8, 128, 8}} : std::vector<G>{{8, 128, 8}, {4, 256, 8}};
    const std::vector<std::int64_t> acc_keys =
        quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{4096, 32768};
    for (const G& g : acc_geoms)
      for (std::int64_t keys : acc_keys) b.accuracy(g.n_kv, g.hd, g.gqa, keys);
  }

  std::printf("\n%-13s %-34s %7s %6s %10s %12s %8s %9s %9s %8s\n", "kernel", "geometry / shape",
              "keys", "window", "µs", "bytes", "GB/s", "% ceiling", "floor µs", "% floor");
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : b.rows) {
    const double gbs = r.bytes / r.us / 1e3;
    const std::string geom = r.shape.empty()
                                 ? std::to_string(r.n_kv_heads) + "x" + std::to_string(r.head_dim) +
                                       " gqa " + std::to_string(r.gqa)
                                 : r.shape;
    const double floor = b.floor_us(r.bytes);
    const std::string name = r.queries ? r.name + " T" + std::to_string(r.queries) : r.name;
    std::printf("%-13s %-34s %7lld %6s %10.2f %12.0f %8.0f %8.1f%% %9.2f %7.1f%%\n", name.c_str(),
                geom.c_str(), (long long)r.keys, r.window ? std::to_string(r.window).c_str() : "-",
                r.us, r.bytes, gbs, 100.0 * gbs / b.ceiling_gbs, floor, 100.0 * floor / r.us);
    results.push_back({{"name", r.name},
                       {"shape", geom},
                       {"n_kv_heads", r.n_kv_heads},
                       {"head_dim", r.head_dim},
                       {"gqa", r.gqa},
                       {"keys", r.keys},
                       {"window", r.window ? nlohmann::json(r.window) : nlohmann::json(nullptr)},
                       {"queries", r.queries ? nlohmann::json(r.queries) : nlohmann::json(nullptr)},
                       {"batch", r.batch ? nlohmann::json(r.batch) : nlohmann::json(nullptr)},
                       {"case", r.batch ? nlohmann::json(r.batch_case) : nlohmann::json(nullptr)},
                       {"us", r.us},
                       {"bytes", r.bytes},
                       {"gbs", gbs},
                       {"pct_ceiling", 100.0 * gbs / b.ceiling_gbs},
                       {"floor_us", floor},
                       {"pct_floor", 100.0 * floor / r.us}});
  }
  nlohmann::json accuracy = nlohmann::json::array();
  if (!b.accuracy_rows.empty())
    std::printf(
        "\naccuracy: attention output against float64 over the unquantized values\n"
        "%-10s %-12s %7s %3s %-10s %-26s %12s %12s %10s\n",
        "data", "geometry", "keys", "T", "format", "source", "max abs err", "rel RMS err",
        "ref RMS");
  for (const AccuracyRow& a : b.accuracy_rows) {
    const std::string geom = std::to_string(a.n_kv_heads) + "x" + std::to_string(a.head_dim) +
                             " gqa " + std::to_string(a.gqa);
    std::printf("%-10s %-12s %7lld %3d %-10s %-26s %12.3e %12.3e %10.3e\n", a.data.c_str(),
                geom.c_str(), (long long)a.keys, a.queries, a.format.c_str(), a.source.c_str(),
                a.e.max_abs_err, a.e.rel_rms_err(), a.e.ref_rms);
    accuracy.push_back({{"data", a.data},
                        {"shape", geom},
                        {"n_kv_heads", a.n_kv_heads},
                        {"head_dim", a.head_dim},
                        {"gqa", a.gqa},
                        {"keys", a.keys},
                        {"queries", a.queries},
                        {"format", a.format},
                        {"source", a.source},
                        {"max_abs_err", a.e.max_abs_err},
                        {"rms_err", a.e.rms_err},
                        {"rel_rms_err", a.e.rel_rms_err()},
                        {"ref_rms", a.e.ref_rms},
                        {"ref_max_abs", a.e.ref_max_abs}});
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nbench took %.1f s\n", wall_s);
  if (auto path = o.get("json")) {
    char date[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
    nlohmann::json doc = {{"date", date},
                          {"gpu", p.name},
                          {"ceiling_gbs", b.ceiling_gbs},
                          {"reps", b.reps},
                          {"results", results}};
    doc["wall_s"] = wall_s;
    doc["accuracy"] = accuracy;
    if (!accuracy.empty()) {
      doc["accuracy_method"] = std::string(kAccuracyMethod);
      doc["outlier_channels"] = std::string(kOutlierDescription);
    }
    std::ofstream f(*path);
    f << doc.dump(1) << "\n";
    if (!f) throw Error(ErrorKind::io, "cannot write " + *path);
    std::printf("\nwrote %s\n", path->c_str());
  }
  return kExitOk;
}

}  // namespace

const Command& bench_command() {
  static const Command c{"bench",
                         "GPU timings: decode, append, graph step vs the streaming-read ceiling",
                         kUsage, &run_bench};
  return c;
}

}  // namespace kvlayer::cli
