// The CUDA KvLayer: the KV cache of one attention layer kept on the GPU as q8_0 K and q5_1 V
// planes (SPEC §2–9). Its API mirrors kvlayer::ref::KvLayer call for call, so that a harness can
// drive both the same way and compare planes, counters, status and decode outputs.
//
// Two families of calls:
//  - host-len calls (append, rewind, reserve, decode, ...) keep host `len`/`base` and write the
//    device counters `len_d`/`base_d` to match, stream-ordered;
//  - device-counter calls (append_dc, append_dcw, inc_seqlen, decode_dc, decode_dcw) take every
//    per-token scalar from device memory or from construction: no sync, no allocation, no host
//    read, so one decode step can be captured into a CUDA graph once and replayed per token.
//    After k replayed steps the host calls account_steps(k).
// Every refusal is checked on the host before any device work and leaves the state untouched;
// the messages are the reference's.
//
// CUDA failures: a failing CUDA call throws kvlayer::Error (kind device) whose message is
// "<call>: <CUDA error string>", e.g. "launch_append: too many resources requested for launch"
// or "cudaMalloc(&p, bytes): out of memory". A constructor that throws has released every
// buffer it allocated. An operation whose CUDA call fails (the call itself having had no
// effect, as a failed launch, copy or allocation has none) leaves the layer exactly as it was
// (planes, tails, len, len_d, base, base_d, status), with one exception: when append's
// kernel launch fails after a ring rebase, the rebase stays (it overwrote the dropped rows) and
// nothing is written, i.e. the layer is as reserve(rows.n) leaves it. A sticky error (the
// context is corrupt, e.g. after an illegal address) fails every later call: such a layer can
// only be destroyed. tests/layer/test_failures_cuda.cpp injects each failure.
//
// Devices: a layer belongs to the device current at its construction (device()); every call
// that touches CUDA makes it current for the call and restores the caller's afterwards
// (tests/layer/test_multi_gpu_cuda.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kvlayer/cuda/decode_options.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer {
struct AccumulationShape;
}

namespace kvlayer::cuda {

/// Rows handed to an append: `n` rows of K (n × kv_dim_k elements) and of V (n × kv_dim_v),
/// row-major, of element type `dtype`, in DEVICE memory (same fields as ref::RowsView).
/// The pointers must be aligned to the element size and stay valid until the stream reaches
/// the append (for a captured append: for every replay).
struct RowsView {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t n = 0;
  DType dtype = DType::f32;
};

/// The decode grid fixed at construction (for the accuracy contract, SPEC §8).
struct DecodePlanInfo {
  std::int64_t max_view_keys = 0;       ///< longest view the grid serves
  int n_splits = 0;                     ///< thread blocks per KV head along the keys
  std::int64_t max_keys_per_split = 0;  ///< longest sequential accumulation
  std::size_t scratch_bytes = 0;        ///< split scratch, allocated once
  const char* kernel = "";              ///< the split kernel a decode runs ("mma_direct", …)
  int rows_per_block = 0;  ///< query rows per split block (a KV head's gqa rows in ≥ 1 blocks)
};

/// What one decode or verify decode of T queries runs over a view of `view_keys` keys (a
/// verify's union of its rows' views): the launch's own arithmetic, for reports and for the
/// harness's count of the kernel paths it reached.
struct DecodeLaunchInfo {
  const char* kernel = "";          ///< the split kernel ("mma_direct", "mma_verify", …)
  int rows_per_block = 0;           ///< its query rows per block (the instance)
  int row_blocks = 0;               ///< blocks along the query rows per (KV head, split)
  int n_splits = 0;                 ///< splits the grid holds
  int active_splits = 0;            ///< of them, those with keys
  std::int64_t keys_per_split = 0;  ///< the partition's split length
  std::int64_t loop_trips = 0;      ///< trips of one warp's key loop in the longest split
};

/// A compiled split-kernel instance a plan can select (for coverage reports).
struct DecodeInstance {
  const char* kernel = "";
  int head_dim = 0;
  int rows = 0;  ///< query rows per block
  bool operator==(const DecodeInstance&) const = default;
};

/// Every instance select_split_kernel can name, over every supported head dim, gqa, option and
/// T in [1, kMaxVerify]; with `wgmma_verify` false, those of a device or build without warpgroup
/// MMA (wgmma_verify_available). Pure host arithmetic.
std::vector<DecodeInstance> decode_instances(bool wgmma_verify);

/// Whether verify decodes may run on warpgroup MMA (DecodeOptions::Verify::wgmma) on `device`:
/// this build holds the sm_90a kernel and the device is compute capability 9.0. Elsewhere that
/// option runs the mma.sync verify. Throws kvlayer::Error when the device cannot be queried.
bool wgmma_verify_available(int device);

/// Bytes allocated past the last row of each plane, zeroed at construction and never written
/// (kernels may issue 16-byte loads running past a row's end; SPEC §1).
inline constexpr std::size_t kPlaneTailBytes = 256;

/// The GPU layer. Move-only; every device buffer is allocated once at construction, on the
/// device current at that time, and released by the destructor.
/// NOTE: not thread-safe; all work is enqueued on the stream given at construction, which must
/// outlive the layer.
/// NOTE: several devices. The layer records the device current at construction (device()), and
/// every call that makes a CUDA call (the destructor, status(), clear_status() and the read-back
/// calls included) makes that device current for its duration and restores the caller's device
/// afterwards, also when it throws; cudaSetDevice is called only when the caller's device
/// differs, and enqueues nothing (legal while the layer's stream is being captured). Host-only
/// accessors (len(), view(), geometry(), ...) touch no CUDA state. The stream must belong to the
/// layer's device: a stream of another device is refused at construction ("cuda::KvLayer: stream
/// is on device 1 but the layer is on device 0"), before anything is allocated. The null
/// (legacy) stream, cudaStreamLegacy and cudaStreamPerThread are accepted: they resolve to the
/// layer's device, which is current whenever the layer enqueues. The caller's own CUDA calls
/// (uploads, capture, graph launches) are its own: a graph holding a layer's nodes is launched
/// on a stream of that layer's device.
class KvLayer {
 public:
  /// Builds an empty layer (planes zeroed, counters 0) on the current device. Refuses an illegal
  /// geometry (the reference's messages) and any the CUDA kernels do not support: head_dim_k !=
  /// head_dim_v, head dims outside kSupportedHeadDims, n_q_heads not a multiple of n_kv_heads,
  /// gqa > 16, max_verify outside [1, kMaxVerify]; and a stream of another device. max_verify
  /// (SPEC §11) is the most queries a verify decode takes; the decode grid and scratch are sized
  /// for it here, once.
  /// `options` (read once, here) choose among grids that all meet the accuracy contract; the
  /// default takes the environment's (DecodeOptions::from_environment) and refuses bad values.
  KvLayer(const Geometry& geometry, int n_q_heads, cudaStream_t stream = nullptr,
          int max_verify = kDefaultMaxVerify,
          const DecodeOptions& options = DecodeOptions::from_environment());
  ~KvLayer();
  KvLayer(KvLayer&&) noexcept;
  KvLayer& operator=(KvLayer&&) noexcept;
  KvLayer(const KvLayer&) = delete;
  KvLayer& operator=(const KvLayer&) = delete;

  const Geometry& geometry() const;
  int n_q_heads() const;
  cudaStream_t stream() const;
  /// Makes `stream` the stream of every later call (and of the destructor's wait). For callers
  /// whose stream changes from call to call, as a framework's "current stream" does (PyTorch's
  /// side streams, its graph capture stream): the Python binding sets it before each call.
  /// Refused (stream unchanged) for a stream of another device than the layer's, as the
  /// constructor refuses it ("set_stream: stream is on device 1 but the layer is on device 0"),
  /// except a stream being captured, whose device CUDA does not tell (a launch there from
  /// another device's layer then fails the capture with that launch's named error).
  /// Host state only: it enqueues nothing and does not synchronize, so it is legal while either
  /// stream is being captured.
  /// NOTE: work already enqueued on the old stream is not ordered before later work on the new
  /// one: the caller orders the two streams (an event, or a synchronization), as it would for
  /// any buffer it hands from one stream to another. The new stream must outlive its use.
  void set_stream(cudaStream_t stream);
  /// Physical rows of each plane (SPEC §6).
  std::int64_t rows() const;
  /// The most queries a verify decode takes (fixed at construction).
  int max_verify() const;
  /// The CUDA device the layer lives on (current at construction).
  int device() const;

  // ---- Host-len operations (not capturable: they plan on host state) ---------------------

  /// Quantizes and appends rows (SPEC §5, §6), rebasing a ring first when needed; then
  /// len += n and len_d = len. Refused if the pointers are null or misaligned, the dtype is
  /// unknown, n < 1, len + n > max_ctx, or a ring cannot make room. When the append kernel's
  /// launch fails after a rebase, the layer is left as reserve(rows.n) leaves it.
  void append(const RowsView& rows);
  /// len = len_d = new_len; bytes untouched. Refused if new_len is outside [0, len] or, on a
  /// ring, can_rewind_to(new_len) is false.
  void rewind(std::int64_t new_len);
  /// Physical rows [start − base, end − base) of logical rows [start, end); refused outside
  /// the resident rows.
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t start, std::int64_t end) const;
  /// True iff rewind(p) would be accepted.
  bool can_rewind_to(std::int64_t p) const;
  /// Makes the next k single-row appends contiguous, rebasing now if needed (SPEC §7). Call it
  /// before capturing or replaying a chain of k windowed device-counter steps.
  void reserve(std::int64_t k);
  /// Logical key range [begin, end) that decode() attends.
  std::pair<std::int64_t, std::int64_t> view() const;

  // ---- Device-counter operations (capturable) ---------------------------------------------

  /// Writes one row at physical len_d; len_d unchanged. Flat layers only. At len_d ≥ max_ctx
  /// it writes nothing and records DeviceErrorKind::append_past_max_ctx.
  void append_dc(const RowsView& one_row);
  /// Writes one row at physical len_d − base_d; len_d unchanged. Writes nothing and records a
  /// device error when len_d ≥ max_ctx, else when the row is outside the plane.
  void append_dcw(const RowsView& one_row);
  /// Writes rows.n = T draft rows (1 ≤ T ≤ max_verify) at physical len_d … len_d + T − 1 (SPEC
  /// §11), bytes identical to T append_dc calls; len_d unchanged. Flat layers only. When any
  /// row would reach max_ctx it writes nothing and records append_past_max_ctx.
  void append_rows_dc(const RowsView& rows);
  /// The same at physical len_d − base_d …: writes nothing and records a device error when any
  /// row would reach max_ctx, else when any row is outside the plane.
  void append_rows_dcw(const RowsView& rows);
  /// len_d += n on the device (1 ≤ n ≤ max_verify; saturating at INT32_MAX).
  void inc_seqlen(int n = 1);
  /// Host accounting after k replayed device-counter steps: len += k. Refused when k < 0,
  /// len + k > max_ctx, or len + k − base > rows (more steps than reserve() made room for).
  /// Not capturable (host state only; enqueues nothing).
  void account_steps(std::int64_t k);

  // ---- Decode (SPEC §8): q f32 [n_q_heads, head_dim], out f32 [n_q_heads, head_dim] ---------

  /// Host-len decode over view() (host len and base). scale defaults to 1/sqrt(head_dim_k).
  /// Refused when the view starts below base (after a deep rewind, before the next append).
  void decode(const float* q, float* out, std::optional<float> scale = std::nullopt);
  /// Device-counter decode over [0, len_d). Flat, window-less layers only. When len_d > max_ctx
  /// it writes nothing and records decode_view_too_long. Capturable.
  void decode_dc(const float* q, float* out, std::optional<float> scale = std::nullopt);
  /// Device-counter decode over [max(0, len_d − window), len_d) at physical key − base_d.
  /// Windowed layers only. A view outside the resident rows writes nothing and records
  /// decode_view_too_long. Capturable.
  void decode_dcw(const float* q, float* out, std::optional<float> scale = std::nullopt);

  // ---- Verify decode (SPEC §11): q f32 [T, n_q_heads, head_dim], out the same --------------
  // Query i (0 ≤ i < T) sits at p_i = L − T + i (L = len, or len_d) and attends
  // [s_i, p_i + 1), s_i = max(0, p_i + 1 − window) on a windowed layer, else 0: row i is the
  // decode a single query would get at len p_i + 1, within the same accuracy contract
  // (verify_accumulation_shape). Every K/V byte is read from memory once per call for all T
  // queries; runs on tensor cores whatever KVLAYER_DECODE_KERNEL says.

  /// Host-len verify. Refused when T < 1, T > max_verify, len < T, or s_0 < base (ring).
  void decode_rows(const float* q, float* out, int T, std::optional<float> scale = std::nullopt);
  /// Device-counter verify over L = len_d. Flat, window-less layers only. Capturable (T fixed
  /// at capture). Where the host variant would refuse (len_d < T, past max_ctx) it writes
  /// nothing and records decode_view_too_long.
  void decode_rows_dc(const float* q, float* out, int T, std::optional<float> scale = std::nullopt);
  /// Device-counter verify over L = len_d at physical key − base_d. Windowed layers only.
  /// Capturable. A first view outside the resident rows writes nothing and records
  /// decode_view_too_long.
  void decode_rows_dcw(const float* q, float* out, int T,
                       std::optional<float> scale = std::nullopt);

  // ---- Snapshot and restore (SPEC §13; synchronize the stream; never inside a capture) ----

  /// The live state (ref::KvLayer::snapshot): geometry, len, base and the bytes of logical
  /// rows [first, len), downloaded on the layer's stream. Refused as the reference refuses
  /// (len_d != len, read back from the device; a lapped ring).
  Snapshot snapshot() const;
  /// Restores `s` into this fresh layer (ref::KvLayer::restore): uploads the rows on the
  /// layer's stream to physical row logical − base (base = first on a ring, 0 on a flat
  /// layer), then sets len = len_d = s.len and base = base_d = base, and waits for the stream.
  /// Refused (layer unchanged) for another layout, a malformed snapshot or a layer that is not
  /// fresh(). A failing CUDA call leaves the layer as it was (rows already uploaded are zeroed
  /// again; should that fail too, the message says the layer is unusable).
  void restore(const Snapshot& s);
  /// Fresh, as ref::KvLayer::fresh() defines it (no state-changing call accepted since
  /// construction). Host state only.
  bool fresh() const;

  // ---- Status and read-back (synchronize the stream; never inside a capture) --------------

  /// Sticky errors recorded since construction or the last clear_status(), with the same
  /// values the reference records. Synchronizes the stream.
  LayerStatus status() const;
  /// Forgets the recorded errors (stream-ordered).
  void clear_status();

  std::int64_t len() const;
  std::int64_t base() const;
  /// The whole K plane, rows() × k_tok_bytes bytes (tail padding excluded). Synchronizes.
  std::vector<std::uint8_t> k_plane_bytes() const;
  /// The whole V plane, rows() × v_tok_bytes bytes. Synchronizes.
  std::vector<std::uint8_t> v_plane_bytes() const;
  /// The kPlaneTailBytes bytes past the K plane's last row (zero unless a kernel wrote past the
  /// plane). Synchronizes.
  std::vector<std::uint8_t> k_plane_tail_bytes() const;
  /// The kPlaneTailBytes bytes past the V plane's last row. Synchronizes.
  std::vector<std::uint8_t> v_plane_tail_bytes() const;
  /// The device counters as the device sees them now. Synchronizes.
  std::int64_t read_len_d() const;
  std::int64_t read_base_d() const;

  /// The decode grid fixed at construction, and the options it was planned with.
  DecodePlanInfo decode_plan() const;
  const DecodeOptions& decode_options() const;
  /// What a launch runs over a view of view_keys keys: queries 0 a decode (decode, decode_dc,
  /// decode_dcw), T ≥ 1 a decode_rows* of T queries (whose grid differs from a decode's even at
  /// T = 1). Refused for T above max_verify or view_keys outside [0, max_ctx].
  DecodeLaunchInfo decode_launch(int queries, std::int64_t view_keys) const;
  std::int64_t max_keys_per_split() const { return decode_plan().max_keys_per_split; }
  /// The accumulation shape of this layer's decode (the kernel, its longest chains, rescales
  /// and merged partials), from which ref::decode_bound derives the accuracy bound (include
  /// kvlayer/accuracy.hpp to use it).
  kvlayer::AccumulationShape accumulation_shape() const;
  /// The accumulation shape of a verify decode of T queries (every output row's bound).
  kvlayer::AccumulationShape verify_accumulation_shape(int T) const;
  /// 1/sqrt(head_dim_k) computed in f32, the scale used when none is given.
  float default_scale() const;

 private:
  friend class KvBatch;  // its launches read the layers' planes, counters and status
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kvlayer::cuda
