#include "kvlayer/harness/cuda_system.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "kvlayer/cuda/kv_batch.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/testing/cuda_snapshot.hpp"

namespace kvlayer::harness {
namespace {

using cuda::DeviceBuffer;

/// A kernel instance as the coverage table names it: "mma_direct d128 r8".
std::string instance_name(const char* kernel, int head_dim, int rows) {
  return std::string(kernel) + " d" + std::to_string(head_dim) + " r" + std::to_string(rows);
}

cuda::DecodeOptions decode_options(const DecodeChoice& choice) {
  cuda::DecodeOptions o = cuda::DecodeOptions::from_environment();
  if (choice.kernel)
    o.kernel = *choice.kernel == DecodeChoice::Kernel::cuda_core
                   ? cuda::DecodeOptions::Kernel::cuda_core
                   : cuda::DecodeOptions::Kernel::mma;
  if (choice.rows) o.rows = cuda::DecodeOptions::Rows(int(*choice.rows));
  if (choice.verify) o.verify = cuda::DecodeOptions::Verify(int(*choice.verify));
  if (choice.split_balance) o.split_balance = *choice.split_balance;
  o.max_verify_splits = choice.max_verify_splits;
  if (choice.batch_waves) o.batch_waves = *choice.batch_waves;
  return o;
}

/// Grow-only device staging buffers and the stream, shared by every case of the process.
struct Shared {
  cuda::Stream stream;
  DeviceBuffer k, v, q, out;
  /// A device buffer of at least `bytes`, reallocated (only) when too small.
  static void* ensure(DeviceBuffer& b, std::size_t bytes) {
    if (b.bytes() < bytes) b = DeviceBuffer(std::max<std::size_t>(bytes, 2 * b.bytes()));
    return b.get();
  }
};

Shared& shared() {
  static Shared s;
  return s;
}

void upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

/// A batch (SPEC §12) on the shared stream: cuda::KvBatch behind the harness's interface.
/// NOTE: its launches are not entered into the coverage table (which counts one layer's
/// launches by their view); the batch command counts what it compared itself.
class CudaBatchSystem final : public BatchSystem {
 public:
  CudaBatchSystem(const Geometry& g, int n_q_heads, int sequences, int max_verify,
                  const cuda::DecodeOptions& options)
      : batch_(g, n_q_heads, sequences, shared().stream.get(), max_verify, options),
        per_query_(std::size_t(n_q_heads) * std::size_t(g.head_dim_v)) {}

  void set_active(std::span<const int> sequences) override { batch_.set_active(sequences); }
  void append(int i, const HostRows& rows) override { batch_.layer(i).append(stage(rows)); }
  void reserve(int i, std::int64_t k) override { batch_.layer(i).reserve(k); }
  void account_steps(int i, std::int64_t k) override { batch_.layer(i).account_steps(k); }
  void rewind(int i, std::int64_t to) override { batch_.layer(i).rewind(to); }
  void append_rows_dc(const HostRows& rows, int t, bool windowed) override {
    cuda::RowsView view = stage(rows);
    view.n = t;  // the CUDA batch takes T rows per position
    windowed ? batch_.append_rows_dcw(view) : batch_.append_rows_dc(view);
  }
  void inc_seqlen(int t) override { batch_.inc_seqlen(t); }
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool windowed,
                                    std::optional<float> scale) override {
    const std::size_t n = outputs(t);
    float* dq = static_cast<float*>(
        Shared::ensure(shared().q, std::max<std::size_t>(q.size_bytes(), sizeof(float))));
    upload(dq, q.data(), q.size_bytes(), stream());
    float* dout = static_cast<float*>(Shared::ensure(shared().out, n * sizeof(float)));
    poison(dout, n);
    windowed ? batch_.decode_rows_dcw(dq, dout, t, scale) : batch_.decode_rows_dc(dq, dout, t, scale);
    return download(dout, n);
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override {
    const Geometry& g = batch_.geometry();
    const std::size_t n = outputs(1), positions = std::size_t(batch_.max_batch());
    const std::size_t elem = dtype_size(rows.front().dtype);
    DeviceBuffer k(positions * std::size_t(g.kv_dim_k()) * elem);
    DeviceBuffer v(positions * std::size_t(g.kv_dim_v()) * elem);
    DeviceBuffer q(positions * per_query_ * sizeof(float)), out(n * sizeof(float));
    const cuda::RowsView view{k.get(), v.get(), 1, rows.front().dtype};
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    try {
      windowed ? batch_.append_rows_dcw(view) : batch_.append_rows_dc(view);
      batch_.inc_seqlen(1);
      windowed ? batch_.decode_rows_dcw(q.as<float>(), out.as<float>(), 1, scale)
               : batch_.decode_rows_dc(q.as<float>(), out.as<float>(), 1, scale);
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream(), &partial);
      if (partial) (void)cudaGraphDestroy(partial);
      throw;
    }
    const cuda::Graph graph = cuda::Graph::end_capture(stream());
    std::vector<std::vector<float>> result;
    for (std::size_t r = 0; r < lists.size(); ++r) {
      batch_.set_active(lists[r]);
      for (const int i : lists[r]) batch_.layer(i).reserve(1);
      upload(k.get(), rows[r].k_bytes.data(), rows[r].k_bytes.size(), stream());
      upload(v.get(), rows[r].v_bytes.data(), rows[r].v_bytes.size(), stream());
      upload(q.get(), queries[r].data(), queries[r].size() * sizeof(float), stream());
      poison(out.as<float>(), n);
      graph.launch(stream());
      result.push_back(download(out.as<float>(), n));
      for (const int i : lists[r]) batch_.layer(i).account_steps(1);
    }
    // The graph's buffers are freed when this returns: let the last replay finish first.
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    return result;
  }
  Snapshot snapshot(int i) override {
    return testing::snapshot(batch_.layer(i), testing::Tails::read);
  }
  std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int t, std::span<const std::int64_t> view_keys) override {
    return batch_.accumulation_shapes(t, view_keys);
  }

 private:
  cudaStream_t stream() const { return batch_.stream(); }
  std::size_t outputs(int t) const {
    return std::size_t(batch_.max_batch()) * std::size_t(std::max(t, 1)) * per_query_;
  }
  cuda::RowsView stage(const HostRows& rows) {
    // At least one byte each: an empty active list still passes valid pointers.
    void* dk = Shared::ensure(shared().k, std::max<std::size_t>(rows.k_bytes.size(), 16));
    void* dv = Shared::ensure(shared().v, std::max<std::size_t>(rows.v_bytes.size(), 16));
    upload(dk, rows.k_bytes.data(), rows.k_bytes.size(), stream());
    upload(dv, rows.v_bytes.data(), rows.v_bytes.size(), stream());
    return cuda::RowsView{dk, dv, rows.n, rows.dtype};
  }
  void poison(float* dout, std::size_t n) {
    if (poison_.size() < n) poison_.assign(n, std::bit_cast<float>(kPoisonBits));
    upload(dout, poison_.data(), n * sizeof(float), stream());
  }
  std::vector<float> download(const float* dout, std::size_t n) {
    std::vector<float> host(n);
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(host.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream()));
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    return host;
  }

  cuda::KvBatch batch_;
  std::size_t per_query_;  ///< one query's output values: n_q_heads · head_dim_v
  std::vector<float> poison_;
};

class CudaSystem final : public System {
 public:
  explicit CudaSystem(const Case& c)
      : n_q_heads_(c.n_q_heads),
        max_verify_(c.max_verify),
        options_(decode_options(c.decode)),
        layer_(c.geometry, c.n_q_heads, shared().stream.get(), c.max_verify, options_),
        out_values_(std::size_t(c.n_q_heads) * std::size_t(c.geometry.head_dim_v)),
        poison_(out_values_.size(), std::bit_cast<float>(kPoisonBits)) {}

  void append(const HostRows& rows) override { layer_.append(stage(rows)); }

  void append_dc(const HostRows& row, bool windowed) override {
    const cuda::RowsView view = stage(row);
    windowed ? layer_.append_dcw(view) : layer_.append_dc(view);
  }
  void inc_seqlen() override { layer_.inc_seqlen(); }
  void append_rows_dc(const HostRows& rows, bool windowed) override {
    const cuda::RowsView view = stage(rows);
    windowed ? layer_.append_rows_dcw(view) : layer_.append_rows_dc(view);
  }
  void inc_seqlen(int t) override { layer_.inc_seqlen(t); }

  std::vector<float> decode_rows(DecodeVariant variant, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    const std::size_t n = std::size_t(std::max(t, 0)) * out_values_.size();
    float* dq = static_cast<float*>(Shared::ensure(shared().q, std::max<std::size_t>(q.size_bytes(), 4)));
    float* dout = poisoned_out(n);
    upload(dq, q.data(), q.size_bytes(), stream());
    switch (variant) {
      case DecodeVariant::host: layer_.decode_rows(dq, dout, t, scale); break;
      case DecodeVariant::dc: layer_.decode_rows_dc(dq, dout, t, scale); break;
      case DecodeVariant::dcw: layer_.decode_rows_dcw(dq, dout, t, scale); break;
    }
    record_launch(variant, t);
    return download(dout, n);
  }

  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& queries,
                                               const std::vector<std::int64_t>& accepted, int t,
                                               bool windowed, std::optional<float> scale) override {
    const std::size_t n = std::size_t(t) * out_values_.size();
    // Captured per chain: T, the variant and the scale are fixed at capture (SPEC §11).
    DeviceBuffer k(drafts.front().k_bytes.size()), v(drafts.front().v_bytes.size());
    DeviceBuffer q(queries.front().size() * sizeof(float)), out(n * sizeof(float));
    const cuda::RowsView view{k.get(), v.get(), t, drafts.front().dtype};
    const cuda::Graph graph = capture_graph([&] {
      windowed ? layer_.append_rows_dcw(view) : layer_.append_rows_dc(view);
      layer_.inc_seqlen(t);
      windowed ? layer_.decode_rows_dcw(q.as<float>(), out.as<float>(), t, scale)
               : layer_.decode_rows_dc(q.as<float>(), out.as<float>(), t, scale);
    });
    const std::vector<float> poison(n, std::bit_cast<float>(kPoisonBits));
    std::vector<std::vector<float>> outputs;
    eager_.clear();
    for (std::size_t r = 0; r < drafts.size(); ++r) {
      layer_.reserve(t);
      upload(k.get(), drafts[r].k_bytes.data(), drafts[r].k_bytes.size(), stream());
      upload(v.get(), drafts[r].v_bytes.data(), drafts[r].v_bytes.size(), stream());
      upload(q.get(), queries[r].data(), queries[r].size() * sizeof(float), stream());
      upload(out.get(), poison.data(), n * sizeof(float), stream());
      graph.launch(stream());
      outputs.push_back(download(out.as<float>(), n));
      record_launch(windowed ? DecodeVariant::dcw : DecodeVariant::dc, t);
      // The same verify, eagerly, on the state the replay left (must be bit-identical).
      float* dout = poisoned_out(n);
      windowed ? layer_.decode_rows_dcw(q.as<float>(), dout, t, scale)
               : layer_.decode_rows_dc(q.as<float>(), dout, t, scale);
      eager_.push_back(download(dout, n));
      layer_.account_steps(t);
      if (accepted[r] < t) layer_.rewind(layer_.len() - t + accepted[r]);
    }
    // The graph's buffers are freed when this returns: let the last replay finish first.
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    return outputs;
  }
  void account_steps(std::int64_t k) override { layer_.account_steps(k); }
  void reserve(std::int64_t k) override { layer_.reserve(k); }
  void rewind(std::int64_t to) override { layer_.rewind(to); }
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t s, std::int64_t e) override {
    return layer_.physical_rows(s, e);
  }
  bool can_rewind_to(std::int64_t p) override { return layer_.can_rewind_to(p); }

  std::vector<float> decode(DecodeVariant variant, std::span<const float> q,
                            std::optional<float> scale) override {
    float* dq = static_cast<float*>(Shared::ensure(shared().q, q.size_bytes()));
    float* dout = poisoned_out();
    upload(dq, q.data(), q.size_bytes(), stream());
    run_decode(variant, dq, dout, scale);
    record_launch(variant, 0);
    return download(dout);
  }

  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override {
    // The scale is a kernel argument, baked into the graph: a chain with another one recaptures.
    if (!captured_ || graph_windowed_ != windowed || graph_scale_ != scale)
      capture(rows.front(), queries.front(), windowed, scale);
    std::vector<std::vector<float>> outputs;
    eager_.clear();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      // New inputs into the buffers the graph captured, then one replay.
      upload(chain_k_.get(), rows[i].k_bytes.data(), rows[i].k_bytes.size(), stream());
      upload(chain_v_.get(), rows[i].v_bytes.data(), rows[i].v_bytes.size(), stream());
      upload(chain_q_.get(), queries[i].data(), queries[i].size() * sizeof(float), stream());
      upload(chain_out_.get(), poison_.data(), poison_.size() * sizeof(float), stream());
      graph_.launch(stream());
      outputs.push_back(download(chain_out_.as<float>()));
      record_launch(windowed ? DecodeVariant::dcw : DecodeVariant::dc, 0);
      // The same decode, eagerly, on the state the replay left.
      float* dout = poisoned_out();
      run_decode(windowed ? DecodeVariant::dcw : DecodeVariant::dc, chain_q_.as<float>(), dout,
                 scale);
      eager_.push_back(download(dout));
    }
    return outputs;
  }

  std::vector<std::vector<float>> last_chain_eager() override { return eager_; }

  void clear_status() override { layer_.clear_status(); }

  Snapshot snapshot() override { return testing::snapshot(layer_, testing::Tails::read); }

  kvlayer::Snapshot take_snapshot() override { return layer_.snapshot(); }
  void restore(const kvlayer::Snapshot& s) override { layer_.restore(s); }
  void restore_into_fresh(const kvlayer::Snapshot& s) override {
    // Constructed as the first layer was; the current one stays until the restore succeeded.
    cuda::KvLayer fresh(layer_.geometry(), n_q_heads_, stream(), max_verify_, options_);
    fresh.restore(s);
    // The captured chain's graph points at the old layer's planes and counters: never replay it.
    captured_ = false;
    graph_ = cuda::Graph();
    layer_ = std::move(fresh);
  }

  kvlayer::AccumulationShape accumulation_shape(DecodeVariant) override {
    return layer_.accumulation_shape();
  }
  kvlayer::AccumulationShape verify_accumulation_shape(int t) override {
    return layer_.verify_accumulation_shape(t);
  }

  void take_coverage(Coverage& into) override {
    into.add(coverage_);
    coverage_ = Coverage{};
  }

  std::unique_ptr<BatchSystem> make_batch(int sequences) override {
    return std::make_unique<CudaBatchSystem>(layer_.geometry(), n_q_heads_, sequences,
                                             max_verify_, options_);
  }

 private:
  /// The launch a decode (queries 0) or verify of T queries just made on the current state,
  /// counted by the layer's own launch arithmetic; a view the device refuses or an empty one
  /// runs no split work and counts nothing.
  void record_launch(DecodeVariant variant, int queries) {
    const Geometry& g = layer_.geometry();
    const bool host = variant == DecodeVariant::host;
    const std::int64_t len = host ? layer_.len() : layer_.read_len_d();
    const std::int64_t base = host ? layer_.base() : (g.window ? layer_.read_base_d() : 0);
    const std::int64_t first_end = queries > 1 ? len - queries + 1 : len;
    const std::int64_t begin = g.window ? std::max<std::int64_t>(0, first_end - *g.window) : 0;
    if (len <= begin || len > g.max_ctx || (queries > 0 && len < queries) || begin < base ||
        len - base > layer_.rows())
      return;
    const cuda::DecodeLaunchInfo info = layer_.decode_launch(queries, len - begin);
    coverage_.record(LaunchRecord{instance_name(info.kernel, g.head_dim_k, info.rows_per_block),
                                  info.loop_trips,
                                  info.active_splits, queries, g.is_ring() && base > 0});
  }

  cudaStream_t stream() const { return layer_.stream(); }

  /// The calls f enqueues on the layer's stream, captured into a graph; a call that throws
  /// ends the capture (and drops its partial graph) before the error propagates.
  template <typename F>
  cuda::Graph capture_graph(F&& f) {
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    KVLAYER_CUDA_TRY(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    try {
      f();
    } catch (...) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(stream(), &g);
      if (g) (void)cudaGraphDestroy(g);
      throw;
    }
    return cuda::Graph::end_capture(stream());
  }

  cuda::RowsView stage(const HostRows& rows) {
    void* dk = Shared::ensure(shared().k, rows.k_bytes.size());
    void* dv = Shared::ensure(shared().v, rows.v_bytes.size());
    upload(dk, rows.k_bytes.data(), rows.k_bytes.size(), stream());
    upload(dv, rows.v_bytes.data(), rows.v_bytes.size(), stream());
    return cuda::RowsView{dk, dv, rows.n, rows.dtype};
  }

  /// The shared output buffer for n values (default: one decode's), poisoned.
  float* poisoned_out(std::size_t n = 0) {
    const std::vector<float>* p = &poison_;
    if (n > poison_.size()) {
      if (rows_poison_.size() < n) rows_poison_.assign(n, std::bit_cast<float>(kPoisonBits));
      p = &rows_poison_;
    }
    if (n == 0) n = poison_.size();
    float* dout = static_cast<float*>(Shared::ensure(shared().out, n * sizeof(float)));
    upload(dout, p->data(), n * sizeof(float), stream());
    return dout;
  }

  std::vector<float> download(const float* dout, std::size_t n = 0) {
    std::vector<float> host(n == 0 ? out_values_.size() : n);
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(host.data(), dout, host.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream()));
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream()));
    return host;
  }

  void run_decode(DecodeVariant variant, const float* q, float* out, std::optional<float> scale) {
    switch (variant) {
      case DecodeVariant::host: layer_.decode(q, out, scale); break;
      case DecodeVariant::dc: layer_.decode_dc(q, out, scale); break;
      case DecodeVariant::dcw: layer_.decode_dcw(q, out, scale); break;
    }
  }

  /// Captures append_dc(w) → inc_seqlen → decode_dc(w) on buffers owned by this system.
  void capture(const HostRows& row, const std::vector<float>& q, bool windowed,
               std::optional<float> scale) {
    // Until the new graph exists: the old one points at the buffers replaced below, and a
    // capture that throws must not leave it to be replayed.
    captured_ = false;
    chain_k_ = DeviceBuffer(row.k_bytes.size());
    chain_v_ = DeviceBuffer(row.v_bytes.size());
    chain_q_ = DeviceBuffer(q.size() * sizeof(float));
    chain_out_ = DeviceBuffer(poison_.size() * sizeof(float));
    const cuda::RowsView view{chain_k_.get(), chain_v_.get(), 1, row.dtype};
    graph_ = capture_graph([&] {
      windowed ? layer_.append_dcw(view) : layer_.append_dc(view);
      layer_.inc_seqlen();
      windowed ? layer_.decode_dcw(chain_q_.as<float>(), chain_out_.as<float>(), scale)
               : layer_.decode_dc(chain_q_.as<float>(), chain_out_.as<float>(), scale);
    });
    graph_windowed_ = windowed;
    graph_scale_ = scale;
    captured_ = true;
  }

  int n_q_heads_;
  int max_verify_;
  cuda::DecodeOptions options_;  ///< the case's plan: a layer restored into is built with it
  cuda::KvLayer layer_;
  std::vector<float> out_values_;
  std::vector<float> poison_;       ///< one decode's output of kPoisonBits
  std::vector<float> rows_poison_;  ///< a verify decode's
  DeviceBuffer chain_k_, chain_v_, chain_q_, chain_out_;
  cuda::Graph graph_;
  bool graph_windowed_ = false;
  std::optional<float> graph_scale_;  ///< the scale graph_ was captured with
  bool captured_ = false;
  std::vector<std::vector<float>> eager_;  ///< the last chain's eager decodes
  Coverage coverage_;                      ///< launches since the last take_coverage
};

}  // namespace

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<std::string> cuda_selectable_instances(bool wgmma_verify) {
  int device = 0;
  if (wgmma_verify) KVLAYER_CUDA_TRY(cudaGetDevice(&device));
  const bool wgmma = wgmma_verify && cuda::wgmma_verify_available(device);
  std::vector<std::string> names;
  for (const cuda::DecodeInstance& i : cuda::decode_instances(wgmma))
    names.push_back(instance_name(i.kernel, i.head_dim, i.rows));
  return names;
}

SystemFactory cuda_system_factory() {
  return [](const Case& c) -> std::unique_ptr<System> { return std::make_unique<CudaSystem>(c); };
}

}  // namespace kvlayer::harness
