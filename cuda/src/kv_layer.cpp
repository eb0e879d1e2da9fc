// The CUDA KvLayer: refusals and host/device counter bookkeeping; the ring planning lives in
// ring_plan.hpp and the kernels in append_kernel.cu, rebase.cu, counters.cu and decode/.
//
// NOTE: the refusal messages are the reference's, word for word (SPEC §9: the reference is the
// specification of messages); the checks run on the host before any device work.
// NOTE: every CUDA call goes through KVLAYER_CUDA_TRY(_NAMED), so that the fault-injection build
// (kvlayer_cuda_fault) can fail each one; an operation whose CUDA call fails leaves the layer
// as documented in kv_layer.hpp ("CUDA failures").
// NOTE: every public call that makes a CUDA call opens with a DeviceGuard of the layer's device
// (kv_layer.hpp, "several devices"): the buffers, the stream and the decode plan all belong to it.
#include "kvlayer/cuda/kv_layer.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "append_kernel.hpp"
#include "counters.hpp"
#include "decode/decode.hpp"
#include "decode/view_begin.hpp"
#include "device_status.cuh"
#include "kvlayer/accuracy.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "layer_state.hpp"
#include "mutants.hpp"
#include "rebase.hpp"
#include "ring_plan.hpp"

namespace kvlayer::cuda {
namespace {

using cuda::DeviceBuffer;
using detail::AppendArgs;
using detail::AppendMode;
using detail::DeviceStatus;
using detail::Placement;

constexpr const char* kCtor = "cuda::KvLayer";

/// Refuses every legal geometry the CUDA kernels do not support (SPEC §1), naming the value and
/// the supported set.
void check_supported(const Geometry& g, int n_q_heads, int max_verify) {
  if (g.head_dim_k != g.head_dim_v)
    refuse(kCtor, "head_dim_k ", g.head_dim_k, " != head_dim_v ", g.head_dim_v,
           ": the CUDA layer supports equal K and V head dims (supported: ", supported_head_dims(),
           ")");
  if (!head_dim_supported(g.head_dim_k))
    refuse(kCtor, "head_dim ", g.head_dim_k,
           " is not supported (supported: ", supported_head_dims(), ")");
  if (n_q_heads < 1 || n_q_heads % g.n_kv_heads != 0)
    refuse(kCtor, "n_q_heads ", n_q_heads, " must be a positive multiple of n_kv_heads ",
           g.n_kv_heads);
  const int gqa = n_q_heads / g.n_kv_heads;
  if (gqa > kMaxGqa)
    refuse(kCtor, "gqa ", gqa, " (n_q_heads ", n_q_heads, " / n_kv_heads ", g.n_kv_heads,
           ") is not supported (supported: 1..", kMaxGqa, ")");
  if (max_verify < 1 || max_verify > kMaxVerify)
    refuse(kCtor, "max_verify ", max_verify, " is not supported (supported: 1..", kMaxVerify, ")");
}

}  // namespace

KvLayer::KvLayer(const Geometry& geometry, int n_q_heads, cudaStream_t stream, int max_verify,
                 const DecodeOptions& options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  geometry.validate();
  check_supported(geometry, n_q_heads, max_verify);
  detail::arm_device_mutants();  // no-op unless built with KVLAYER_MUTANTS
  s.g = geometry;
  s.n_q_heads = n_q_heads;
  s.max_verify = max_verify;
  s.decode_options = options;
  s.stream = stream;
  s.rows = geometry.rows();

  int device = 0, sms = 0;
  KVLAYER_CUDA_TRY(cudaGetDevice(&device));
  // A kernel launched into a stream of another device than the current one fails: refuse such a
  // stream here, before anything is allocated.
  if (const int sd = stream_device(stream, device); sd != device)
    refuse(kCtor, stream_device_mismatch(sd, device));
  s.device = device;
  KVLAYER_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::int64_t max_view = geometry.window ? std::min(*geometry.window, s.rows) : s.rows;
  s.decode_plan = detail::plan_decode(geometry.n_kv_heads, geometry.head_dim_k,
                                      n_q_heads / geometry.n_kv_heads, max_view, sms, options);
  // A verify decode's views reach max_verify − 1 keys further back than a decode's window.
  const std::int64_t verify_view =
      geometry.window ? std::min<std::int64_t>(*geometry.window + max_verify - 1, s.rows) : s.rows;
  const bool wgmma =
      options.verify == DecodeOptions::Verify::wgmma && wgmma_verify_available(device);
  detail::plan_verify(s.decode_plan, max_verify, verify_view, sms, wgmma);

  const auto k_bytes = std::size_t(s.rows * geometry.k_tok_bytes()) + kPlaneTailBytes;
  const auto v_bytes = std::size_t(s.rows * geometry.v_tok_bytes()) + kPlaneTailBytes;
  s.k_plane = DeviceBuffer(k_bytes);
  s.v_plane = DeviceBuffer(v_bytes);
  s.counters = DeviceBuffer(2 * sizeof(std::int32_t));
  s.status = DeviceBuffer(sizeof(DeviceStatus));
  s.scratch = DeviceBuffer(s.decode_plan.scratch_bytes);
  // SPEC §5: all bytes zero at construction (the reference's planes are zeroed too).
  for (const DeviceBuffer* b : {&s.k_plane, &s.v_plane, &s.counters, &s.status, &s.scratch})
    if (b->bytes() > 0) KVLAYER_CUDA_TRY(cudaMemsetAsync(b->get(), 0, b->bytes(), stream));
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream));
}

// NOTE: ~State waits for the stream, then frees the buffers: on the layer's device, whichever
// device the caller has current.
KvLayer::~KvLayer() {
  if (!s_) return;  // moved from
  const DeviceGuard on(s_->device, std::nothrow);
  s_.reset();
}
KvLayer::KvLayer(KvLayer&&) noexcept = default;
KvLayer& KvLayer::operator=(KvLayer&& o) noexcept {
  if (this != &o) {
    const KvLayer old(std::move(*this));  // released by its destructor, on its own device
    s_ = std::move(o.s_);
  }
  return *this;
}

const Geometry& KvLayer::geometry() const {
  return s_->g;
}
int KvLayer::n_q_heads() const {
  return s_->n_q_heads;
}
cudaStream_t KvLayer::stream() const {
  return s_->stream;
}
void KvLayer::set_stream(cudaStream_t stream) {
  if (stream == s_->stream) return;
  // The stream's device, resolved as the constructor resolves it (the null, legacy and
  // per-thread streams follow the current device, which every call makes the layer's).
  const DeviceGuard on(s_->device);
  // cudaStreamGetDevice is not permitted on a capturing stream, and torch.cuda.graph captures on
  // a side stream of its own: such a stream is taken as given (a launch there from another
  // device's layer fails the capture with the launch's named error).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KVLAYER_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone)
    if (const int sd = stream_device(stream, s_->device); sd != s_->device)
      refuse("set_stream", stream_device_mismatch(sd, s_->device));
  s_->stream = stream;
}
std::int64_t KvLayer::rows() const {
  return s_->rows;
}
int KvLayer::max_verify() const {
  return s_->max_verify;
}
int KvLayer::device() const {
  return s_->device;
}
std::int64_t KvLayer::len() const {
  return s_->len;
}
std::int64_t KvLayer::base() const {
  return s_->base;
}

void KvLayer::append(const RowsView& rows) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_rows(rows, "append");
  const Placement p = s.place(rows.n, "append");
  s.apply(p);
  AppendArgs a = s.append_args(rows);
  a.physical_row0 = p.write_row;
  a.logical_row0 = s.len;
  a.host_len_d_out = s.len_d();  // the kernel sets len_d = len + n (no second launch)
  // NOTE: should this launch fail after a ring rebase, the rebase stays (it cannot be undone):
  // the layer is then as reserve(rows.n) leaves it (kv_layer.hpp, "CUDA failures").
  KVLAYER_CUDA_TRY_NAMED(detail::launch_append(a, AppendMode::host, s.stream), "launch_append");
  s.len += rows.n;
  s.after_rows_step = false;
  s.fresh = false;
}

bool KvLayer::can_rewind_to(std::int64_t p) const {
  return detail::rewind_allowed(s_->g, s_->len, s_->base, p);
}

void KvLayer::rewind(std::int64_t new_len) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  detail::check_rewind(s.g, s.len, s.base, new_len);
  const bool forget = KVLAYER_HOST_MUTANT(rewind_forgets_len_d) ||
                      (s.after_rows_step && KVLAYER_HOST_MUTANT(accept_forgets_len_d));
  if (!forget) s.set_counters(new_len, -1);
  s.len = new_len;
  s.fresh = false;
}

std::pair<std::int64_t, std::int64_t> KvLayer::physical_rows(std::int64_t start,
                                                             std::int64_t end) const {
  const State& s = *s_;
  if (start < s.base || start > end || end - s.base > s.rows)
    refuse("physical_rows", "[", start, ", ", end, ") is not within the resident rows [", s.base,
           ", ", s.base + s.rows, ")");
  return {start - s.base, end - s.base};
}

void KvLayer::reserve(std::int64_t k) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  if (k < 0) refuse("reserve", "k ", k, " must not be negative");
  if (k > 0) s.apply(s.place(k, "reserve"));
  s.fresh = false;
}

std::pair<std::int64_t, std::int64_t> KvLayer::view() const {
  const State& s = *s_;
  return {detail::view_begin(s.len, 1, s.g.window.value_or(0)), s.len};
}

void KvLayer::append_dc(const RowsView& one_row) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_one_row(one_row, "append_dc");
  if (s.g.is_ring()) refuse("append_dc", "ring layers use append_dcw");
  KVLAYER_CUDA_TRY_NAMED(detail::launch_append(s.append_args(one_row), AppendMode::dc, s.stream),
                         "launch_append");
  s.after_rows_step = false;
  s.fresh = false;
}

void KvLayer::append_dcw(const RowsView& one_row) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_one_row(one_row, "append_dcw");
  KVLAYER_CUDA_TRY_NAMED(detail::launch_append(s.append_args(one_row), AppendMode::dcw, s.stream),
                         "launch_append");
  s.after_rows_step = false;
  s.fresh = false;
}

void KvLayer::append_rows_dc(const RowsView& rows) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_rows(rows, "append_rows_dc");
  s.check_verify_count(rows.n, "append_rows_dc");
  if (s.g.is_ring()) refuse("append_rows_dc", "ring layers use append_rows_dcw");
  KVLAYER_CUDA_TRY_NAMED(detail::launch_append(s.append_args(rows), AppendMode::dc, s.stream),
                         "launch_append");
  s.after_rows_step = rows.n > 1;
  s.fresh = false;
}

void KvLayer::append_rows_dcw(const RowsView& rows) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  s.check_rows(rows, "append_rows_dcw");
  s.check_verify_count(rows.n, "append_rows_dcw");
  KVLAYER_CUDA_TRY_NAMED(detail::launch_append(s.append_args(rows), AppendMode::dcw, s.stream),
                         "launch_append");
  s.after_rows_step = rows.n > 1;
  s.fresh = false;
}

void KvLayer::inc_seqlen(int n) {
  const DeviceGuard on(s_->device);
  s_->check_verify_count(n, "inc_seqlen");
  const int by = n > 1 && KVLAYER_HOST_MUTANT(inc_seqlen_adds_one) ? 1 : n;  // (planted bug)
  KVLAYER_CUDA_TRY_NAMED(detail::launch_inc_seqlen(s_->len_d(), by, s_->stream),
                         "launch_inc_seqlen");
  s_->fresh = false;
}

void KvLayer::account_steps(std::int64_t k) {
  State& s = *s_;
  detail::check_account_steps(s.g, s.len, s.base, k);
  s.len += k;
  s.fresh = false;
}

void KvLayer::decode(const float* q, float* out, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode");
  const auto [begin, end] = view();
  if (begin < s.base)
    refuse("decode", "the view starts at logical row ", begin, ", below base ", s.base,
           " (not resident; append before decoding after a rewind this deep)");
  s.decode(q, out, scale, State::ViewSource::host);
}

void KvLayer::decode_dc(const float* q, float* out, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode_dc");
  if (s.g.is_ring()) refuse("decode_dc", "ring layers use decode_dcw");
  if (s.g.window)
    refuse("decode_dc", "attends [0, len_d) and ignores the window ", *s.g.window,
           "; windowed layers use decode_dcw");
  s.decode(q, out, scale, State::ViewSource::len_d);
}

void KvLayer::decode_dcw(const float* q, float* out, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode_dcw");
  if (!s.g.window) refuse("decode_dcw", "the layer has no window; use decode_dc");
  s.decode(q, out, scale, State::ViewSource::len_d_and_base_d);
}

void KvLayer::decode_rows(const float* q, float* out, int T, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode_rows");
  s.check_verify_count(T, "decode_rows");
  if (s.len < T) refuse("decode_rows", "len ", s.len, " is less than T ", T);
  const std::int64_t begin = detail::view_begin(s.len, T, s.g.window.value_or(0));
  if (begin < s.base)
    refuse("decode_rows", "the view of query 0 starts at logical row ", begin, ", below base ",
           s.base, " (not resident)");
  s.decode(q, out, scale, State::ViewSource::host, T);
}

void KvLayer::decode_rows_dc(const float* q, float* out, int T, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode_rows_dc");
  s.check_verify_count(T, "decode_rows_dc");
  if (s.g.is_ring()) refuse("decode_rows_dc", "ring layers use decode_rows_dcw");
  if (s.g.window)
    refuse("decode_rows_dc", "attends [0, len_d) and ignores the window ", *s.g.window,
           "; windowed layers use decode_rows_dcw");
  s.decode(q, out, scale, State::ViewSource::len_d, T);
}

void KvLayer::decode_rows_dcw(const float* q, float* out, int T, std::optional<float> scale) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  State::check_decode_pointers(q, out, "decode_rows_dcw");
  s.check_verify_count(T, "decode_rows_dcw");
  if (!s.g.window) refuse("decode_rows_dcw", "the layer has no window; use decode_rows_dc");
  s.decode(q, out, scale, State::ViewSource::len_d_and_base_d, T);
}

LayerStatus KvLayer::status() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  DeviceStatus h{};
  s.read(&h, s.status.get(), sizeof h);
  LayerStatus out;
  if (h.has_data_error) {
    const auto key = static_cast<unsigned long long>(h.data_key);
    DataError e;
    e.row = static_cast<std::int64_t>(key >> 32);
    e.plane = ((key >> 31) & 1u) != 0 ? Plane::v : Plane::k;
    e.block = static_cast<std::int64_t>(key & 0x7FFFFFFFull);
    e.value = h.data_value;
    out.data_error = e;
  }
  if (h.has_device_error) {
    out.device_error = DeviceError{static_cast<DeviceErrorKind>(h.device_kind), h.device_len_d,
                                   h.device_base_d, h.device_limit};
  }
  return out;
}

void KvLayer::clear_status() {
  const DeviceGuard on(s_->device);
  KVLAYER_CUDA_TRY(cudaMemsetAsync(s_->status.get(), 0, sizeof(DeviceStatus), s_->stream));
}

std::vector<std::uint8_t> KvLayer::k_plane_bytes() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  std::vector<std::uint8_t> out(std::size_t(s.rows * s.g.k_tok_bytes()));
  s.read(out.data(), s.k_plane.get(), out.size());
  return out;
}

std::vector<std::uint8_t> KvLayer::v_plane_bytes() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  std::vector<std::uint8_t> out(std::size_t(s.rows * s.g.v_tok_bytes()));
  s.read(out.data(), s.v_plane.get(), out.size());
  return out;
}

std::vector<std::uint8_t> KvLayer::k_plane_tail_bytes() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  std::vector<std::uint8_t> out(kPlaneTailBytes);
  s.read(out.data(), s.k_plane.as<std::uint8_t>() + s.rows * s.g.k_tok_bytes(), out.size());
  return out;
}

std::vector<std::uint8_t> KvLayer::v_plane_tail_bytes() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  std::vector<std::uint8_t> out(kPlaneTailBytes);
  s.read(out.data(), s.v_plane.as<std::uint8_t>() + s.rows * s.g.v_tok_bytes(), out.size());
  return out;
}

std::int64_t KvLayer::read_len_d() const {
  const DeviceGuard on(s_->device);
  std::int32_t c[2] = {0, 0};
  s_->read(c, s_->counters.get(), sizeof c);
  return c[0];
}

std::int64_t KvLayer::read_base_d() const {
  const DeviceGuard on(s_->device);
  std::int32_t c[2] = {0, 0};
  s_->read(c, s_->counters.get(), sizeof c);
  return c[1];
}

DecodePlanInfo KvLayer::decode_plan() const {
  const auto& p = s_->decode_plan;
  const detail::SplitChoice choice = detail::select_split_kernel(p, 0);
  return DecodePlanInfo{p.max_view_keys,
                        p.n_splits,
                        p.max_keys_per_split,
                        p.scratch_bytes,
                        detail::split_kernel_name(choice.kernel),
                        choice.rows};
}

bool wgmma_verify_available(int device) {
  int major = 0, minor = 0;
  KVLAYER_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVLAYER_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return detail::wgmma_verify_supported(major, minor);
}

std::vector<DecodeInstance> decode_instances(bool wgmma_verify) {
  std::vector<DecodeInstance> all;
  constexpr int kAnySms = 132, kAnyView = 4096;
  for (const int d : kSupportedHeadDims)
    for (int gqa = 1; gqa <= kMaxGqa; ++gqa)
      for (const auto kernel : {DecodeOptions::Kernel::mma, DecodeOptions::Kernel::cuda_core})
        for (const auto rows : {DecodeOptions::Rows::split, DecodeOptions::Rows::whole})
          for (const bool wgmma : {false, true}) {
            if (wgmma && !wgmma_verify) continue;
            DecodeOptions o;
            o.kernel = kernel;
            o.rows = rows;
            detail::DecodePlan plan = detail::plan_decode(1, d, gqa, kAnyView, kAnySms, o);
            detail::plan_verify(plan, kMaxVerify, kAnyView, kAnySms, wgmma);
            for (int t = 0; t <= kMaxVerify; ++t) {
              const detail::SplitChoice c = detail::select_split_kernel(plan, t);
              const DecodeInstance i{detail::split_kernel_name(c.kernel), d, c.rows};
              if (std::find(all.begin(), all.end(), i) == all.end()) all.push_back(i);
            }
          }
  return all;
}

const DecodeOptions& KvLayer::decode_options() const {
  return s_->decode_options;
}

DecodeLaunchInfo KvLayer::decode_launch(int queries, std::int64_t view_keys) const {
  const char* op = "decode_launch";
  if (queries != 0) s_->check_verify_count(queries, op);
  if (view_keys < 0 || view_keys > s_->g.max_ctx)
    refuse(op, "view_keys ", view_keys, " is outside [0, max_ctx ", s_->g.max_ctx, "]");
  const detail::LaunchShape l = detail::launch_shape(s_->decode_plan, queries, view_keys);
  return DecodeLaunchInfo{detail::split_kernel_name(l.choice.kernel),
                          l.choice.rows,
                          l.row_blocks,
                          l.grid.n_splits,
                          l.active_splits,
                          l.keys_per_split,
                          l.loop_trips};
}

kvlayer::AccumulationShape KvLayer::accumulation_shape() const {
  return detail::accumulation_shape(s_->decode_plan);
}

kvlayer::AccumulationShape KvLayer::verify_accumulation_shape(int T) const {
  s_->check_verify_count(T, "verify_accumulation_shape");
  return detail::verify_accumulation_shape(s_->decode_plan, T);
}

float KvLayer::default_scale() const {
  return kvlayer::default_scale(s_->g.head_dim_k);
}

}  // namespace kvlayer::cuda
