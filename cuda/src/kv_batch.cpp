// The CUDA batch (SPEC §12): refusals (the reference batch's and the layers' messages), the
// device table of the layers' planes and counters, the active list, and one launch per batch
// operation (append_kernel.cu, counters.cu, decode/launch.cu with a batch's BatchList).
// NOTE: every call that makes a CUDA call opens with a DeviceGuard of the batch's device, as the
// layer's do (kv_layer.hpp, "several devices").
#include "kvlayer/cuda/kv_batch.hpp"

#include <cstdint>
#include <utility>

#include "append_kernel.hpp"
#include "batch_slots.hpp"
#include "counters.hpp"
#include "decode/decode.hpp"
#include "kvlayer/accuracy.hpp"
#include "kvlayer/batch.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "layer_state.hpp"
#include "mutants.hpp"

namespace kvlayer::cuda {

struct KvBatch::State {
  std::vector<KvLayer> layers;
  cudaStream_t stream = nullptr;
  int device = 0;
  detail::DecodePlan plan;  ///< the layers' plan, for a batch's launches (DecodePlan::batch)
  DeviceBuffer slots;       ///< detail::SequenceSlot[max_batch]
  DeviceBuffer active;      ///< int32[max_batch]
  DeviceBuffer n_active;    ///< int32
  DeviceBuffer scratch;     ///< max_batch · batch_scratch_stride(plan)
  /// A decode's schedule: int32[BatchSchedule::words], laid out by BatchSchedule::in.
  DeviceBuffer schedule;
  std::vector<int> active_host;
  bool list_written = false;  ///< set_active has written the device list (a mutant's state)

  const KvLayer::State& first() const { return *layers.front().s_; }
  int max_batch() const { return int(layers.size()); }
  detail::BatchSchedule batch_schedule() const {
    return detail::BatchSchedule::in(schedule.as<std::int32_t>(), std::size_t(max_batch()),
                                     std::size_t(detail::batch_max_items(plan, max_batch())));
  }
  detail::BatchList list() const {
    return detail::BatchList{slots.as<detail::SequenceSlot>(), active.as<std::int32_t>(),
                             n_active.as<std::int32_t>()};
  }

  // NOTE: work still queued may read the table, list and scratch: wait before they are freed.
  ~State() {
    if (slots.get() != nullptr) (void)cudaStreamSynchronize(stream);
  }

  /// After a batch append or counter step: the layers it touched are no longer fresh (their
  /// restore precondition, kv_layer.hpp), as their own calls would have marked them.
  void touched(bool rows_step) {
    for (const int i : active_host) {
      KvLayer::State& s = *layers[std::size_t(i)].s_;
      s.fresh = false;
      s.after_rows_step = rows_step;
    }
  }

  /// T of a batch operation (ref::KvBatch's message).
  void check_t(std::int64_t t, const char* op) const {
    if (t < 1 || t > first().max_verify)
      refuse(op, "T ", t, " is outside [1, max_verify ", first().max_verify, "]");
  }

  // The layers' own refusals (the layout) come with the layers' operation names, as the
  // reference batch raises them from its first layer.
  void append(const RowsView& rows, bool windowed) {
    const char* op = windowed ? "batch append_rows_dcw" : "batch append_rows_dc";
    const KvLayer::State& f = first();
    check_t(rows.n, op);
    f.check_rows(rows, windowed ? "append_rows_dcw" : "append_rows_dc");
    if (!windowed && f.g.is_ring()) refuse("append_rows_dc", "ring layers use append_rows_dcw");
    detail::AppendArgs a;
    a.k = rows.k;
    a.v = rows.v;
    a.dtype = rows.dtype;
    a.n = rows.n;
    a.kv_dim_k = f.g.kv_dim_k();
    a.kv_dim_v = f.g.kv_dim_v();
    a.k_tok_bytes = f.g.k_tok_bytes();
    a.v_tok_bytes = f.g.v_tok_bytes();
    a.rows = f.rows;
    a.max_ctx = f.g.max_ctx;
    a.batch = list();
    a.max_batch = max_batch();
    KVLAYER_CUDA_TRY_NAMED(
        detail::launch_append(a, windowed ? detail::AppendMode::dcw : detail::AppendMode::dc,
                              stream),
        "launch_append");
    touched(rows.n > 1);
  }

  void decode(const float* q, float* out, int T, std::optional<float> scale, bool windowed) {
    const char* op = windowed ? "batch decode_rows_dcw" : "batch decode_rows_dc";
    const KvLayer::State& f = first();
    KvLayer::State::check_decode_pointers(q, out, op);
    check_t(T, op);
    // The layer call each sequence stands for: decode_dc(w) at T = 1, decode_rows_dc(w) above.
    const char* dc = T == 1 ? "decode_dc" : "decode_rows_dc";
    const char* dcw = T == 1 ? "decode_dcw" : "decode_rows_dcw";
    if (windowed) {
      if (!f.g.window) refuse(dcw, "the layer has no window; use ", dc);
    } else {
      if (f.g.is_ring()) refuse(dc, "ring layers use ", dcw);
      if (f.g.window)
        refuse(dc, "attends [0, len_d) and ignores the window ", *f.g.window,
               "; windowed layers use ", dcw);
    }
    detail::DecodeArgs a;
    a.queries = T == 1 ? 0 : T;  // T = 1: each sequence's decode_dc(w), the decode's grid
    a.rows = f.rows;
    a.max_ctx = f.g.max_ctx;
    a.window = f.g.window.value_or(0);
    a.q = q;
    a.out = out;
    a.scale = scale.value_or(detail::default_scale_mutant(kvlayer::default_scale(f.g.head_dim_k)));
    a.scratch = scratch.get();
    a.batch = list();
    a.max_batch = max_batch();
    a.windowed = windowed;
    a.schedule = batch_schedule();
    KVLAYER_CUDA_TRY_NAMED(detail::launch_decode(a, plan, stream), "launch_decode");
  }
};

KvBatch::KvBatch(const Geometry& geometry, int n_q_heads, int max_batch, cudaStream_t stream,
                 int max_verify, const DecodeOptions& options)
    : s_(std::make_unique<State>()) {
  if (max_batch < 1 || max_batch > kMaxBatch)
    refuse("cuda::KvBatch", "max_batch ", max_batch, " is not supported (supported: 1..", kMaxBatch,
           ")");
  State& s = *s_;
  s.layers.reserve(std::size_t(max_batch));
  // The first layer refuses a bad geometry, stream or option before anything else exists.
  for (int i = 0; i < max_batch; ++i)
    s.layers.emplace_back(geometry, n_q_heads, stream, max_verify, options);
  s.stream = stream;
  s.device = s.first().device;
  const DeviceGuard on(s.device);
  s.plan = s.first().decode_plan;
  s.plan.batch = true;
  std::vector<detail::SequenceSlot> slots;
  for (KvLayer& layer : s.layers) {
    KvLayer::State& l = *layer.s_;
    slots.push_back(detail::SequenceSlot{l.k_plane.as<std::uint8_t>(), l.v_plane.as<std::uint8_t>(),
                                         l.len_d(), l.base_d(), l.dstatus()});
  }
  s.slots = DeviceBuffer(slots.size() * sizeof(detail::SequenceSlot));
  s.active = DeviceBuffer(std::size_t(max_batch) * sizeof(std::int32_t));
  s.n_active = DeviceBuffer(sizeof(std::int32_t));
  s.scratch = DeviceBuffer(std::size_t(max_batch) * detail::batch_scratch_stride(s.plan));
  s.schedule = DeviceBuffer(
      detail::BatchSchedule::words(std::size_t(max_batch),
                                   std::size_t(detail::batch_max_items(s.plan, max_batch))) *
      sizeof(std::int32_t));
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(s.slots.get(), slots.data(), s.slots.bytes(),
                                   cudaMemcpyHostToDevice, stream));
  for (const DeviceBuffer* b : {&s.active, &s.n_active, &s.scratch, &s.schedule})
    KVLAYER_CUDA_TRY(cudaMemsetAsync(b->get(), 0, b->bytes(), stream));
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream));
}

KvBatch::~KvBatch() {
  if (!s_) return;  // moved from
  const DeviceGuard on(s_->device, std::nothrow);
  s_.reset();
}
KvBatch::KvBatch(KvBatch&&) noexcept = default;
KvBatch& KvBatch::operator=(KvBatch&& o) noexcept {
  if (this != &o) {
    const KvBatch old(std::move(*this));
    s_ = std::move(o.s_);
  }
  return *this;
}

const Geometry& KvBatch::geometry() const {
  return s_->first().g;
}
int KvBatch::n_q_heads() const {
  return s_->first().n_q_heads;
}
int KvBatch::max_batch() const {
  return s_->max_batch();
}
int KvBatch::max_verify() const {
  return s_->first().max_verify;
}
cudaStream_t KvBatch::stream() const {
  return s_->stream;
}

KvLayer& KvBatch::layer(int i) {
  return const_cast<KvLayer&>(static_cast<const KvBatch&>(*this).layer(i));
}

const KvLayer& KvBatch::layer(int i) const {
  if (i < 0 || i >= max_batch())
    refuse("batch layer", "sequence ", i, " is outside [0, max_batch ", max_batch(), ")");
  return s_->layers[std::size_t(i)];
}

void KvBatch::set_active(std::span<const int> sequences) {
  State& s = *s_;
  check_active_list("batch set_active", sequences, max_batch());
  const DeviceGuard on(s.device);
  const std::vector<std::int32_t> entries(sequences.begin(), sequences.end());
  // (planted bug: after its first list, the batch never writes the device list again)
  if (KVLAYER_HOST_MUTANT(batch_stale_active_list) && s.list_written) {
    s.active_host.assign(sequences.begin(), sequences.end());
    return;
  }
  s.list_written = true;
  KVLAYER_CUDA_TRY_NAMED(
      detail::launch_set_active(s.active.as<std::int32_t>(), s.n_active.as<std::int32_t>(),
                                entries.data(), int(entries.size()), s.stream),
      "launch_set_active");
  s.active_host.assign(sequences.begin(), sequences.end());
}

const std::vector<int>& KvBatch::active() const {
  return s_->active_host;
}

void KvBatch::append_rows_dc(const RowsView& rows) {
  const DeviceGuard on(s_->device);
  s_->append(rows, false);
}

void KvBatch::append_rows_dcw(const RowsView& rows) {
  const DeviceGuard on(s_->device);
  s_->append(rows, true);
}

void KvBatch::inc_seqlen(int t) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_t(t, "batch inc_seqlen");
  KVLAYER_CUDA_TRY_NAMED(detail::launch_batch_inc_seqlen(s.list(), max_batch(), t, s.stream),
                         "launch_batch_inc_seqlen");
  s.touched(false);
}

void KvBatch::decode_rows_dc(const float* q, float* out, int T, std::optional<float> scale) {
  const DeviceGuard on(s_->device);
  s_->decode(q, out, T, scale, false);
}

void KvBatch::decode_rows_dcw(const float* q, float* out, int T, std::optional<float> scale) {
  const DeviceGuard on(s_->device);
  s_->decode(q, out, T, scale, true);
}

std::vector<kvlayer::AccumulationShape> KvBatch::accumulation_shapes(
    int T, std::span<const std::int64_t> view_keys) const {
  s_->check_t(T, "batch accumulation_shapes");
  if (view_keys.size() > std::size_t(s_->max_batch()))
    refuse("batch accumulation_shapes", "view_keys has ", view_keys.size(),
           " entries, more than max_batch ", s_->max_batch());
  return detail::batch_shapes(s_->plan, T, view_keys);
}

}  // namespace kvlayer::cuda
