// Several devices (kv_layer.hpp, "several devices"): a layer belongs to the device current at
// its construction, makes it current for every call that touches CUDA and restores the caller's
// device afterwards, also when the call throws; a stream of another device is refused.
//
// Suites and what they need:
//  - DeviceMessages: host only (no GPU): the refusal's wording, the streams that resolve to the
//    current device;
//  - CurrentDevice: one GPU or more: after every kind of call the caller's device is still
//    current, also after a throw (with two GPUs also with the other device current);
//    set_stream moves every later call, a captured step included, to the new stream;
//  - MultiGpu: two GPUs (skipped, saying so, with fewer): layers on devices 0 and 1 used
//    alternately from one thread with the other device current, against the reference; graphs
//    captured per device and replayed interleaved; destruction with the wrong device current;
//    a stream of device 1 refused for a layer on device 0, by the constructor and set_stream.
// tools/device-check-remote.sh runs this binary whole on two GPUs or more, and with
// --gtest_filter=-MultiGpu.* on one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::testing {
namespace {

using cuda::DeviceGuard;
using cuda::Graph;
using cuda::Stream;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int current_device() {
  int d = -1;
  KVLAYER_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

/// f() with device d current, the previous device restored afterwards (the test's own CUDA
/// calls: uploads, downloads, capture, launches belong to the buffers' and streams' device).
template <typename F>
decltype(auto) on_device(int d, F&& f) {
  const DeviceGuard on(d);
  return f();
}

/// The devices the CurrentDevice tests put layers and callers on: 0, and 1 when visible.
std::vector<int> test_devices() {
  return device_count() >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0};
}

/// Put first in a test that needs two devices: skips with a visible reason on fewer.
#define KVLAYER_REQUIRE_TWO_GPUS()                                                  \
  do {                                                                              \
    if (const int n = device_count(); n < 2)                                        \
      GTEST_SKIP() << "needs 2 CUDA devices, " << n << " visible (multi-GPU test)"; \
  } while (0)

/// Compares a decode output with the reference within the per-element bound (every element
/// finite here: the inputs hold no bad blocks) and records the bound's tightness.
void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                   const ref::DecodeBound& b, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double err = std::fabs(double(got[e]) - want[e]);
    if (!std::isfinite(got[e]) || !(err <= b.bound[e])) {
      if (reported++ < 5)
        ADD_FAILURE() << what << ": element " << e << " got " << got[e] << ", reference " << want[e]
                      << ", |error| " << err << " > bound " << b.bound[e];
      continue;
    }
    bound_tightness().record(got[e], b, e);
  }
}

/// One layer on one device, its stream and its reference twin. Built and torn down with its
/// device current; used in between with any device current.
struct Side {
  int device;
  int nq;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<cuda::KvLayer> gpu;
  ref::KvLayer ref;

  Side(int d, const Geometry& g, int n_q_heads) : device(d), nq(n_q_heads), ref(g) {
    const DeviceGuard on(d);
    stream = std::make_unique<Stream>();
    gpu = std::make_unique<cuda::KvLayer>(g, nq, stream->get());
  }
  ~Side() {
    const DeviceGuard on(device, std::nothrow);
    gpu.reset();
    stream.reset();
  }
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  const Geometry& g() const { return ref.geometry(); }
  cudaStream_t s() const { return stream->get(); }
};

/// Appends n fresh rows of a random dtype to both sides of x; the rows are uploaded to x's
/// device, the append runs with whatever device the caller has current.
void append_rows(Side& x, std::int64_t n, Rng& rng) {
  const HostRows rows = make_rows(x.g(), n, kDTypes[rng.range(0, 2)], Fill::random, rng);
  auto d = on_device(x.device, [&] { return std::make_unique<DeviceRows>(rows); });
  x.gpu->append(d->view);
  x.ref.append(rows.view());
  on_device(x.device, [&] { d.reset(); });
}

/// A host-len decode of fresh queries on x, output poisoned first, against the reference.
void check_decode(Side& x, Rng& rng, const std::string& what) {
  const Geometry& g = x.g();
  const std::size_t qn = std::size_t(x.nq) * g.head_dim_k, on = std::size_t(x.nq) * g.head_dim_v;
  std::vector<float> hq(qn);
  for (float& v : hq) v = rng.uniform(-2, 2);
  auto q = on_device(x.device, [&] { return std::make_unique<DeviceFloats>(qn); });
  auto out = on_device(x.device, [&] { return std::make_unique<DeviceFloats>(on); });
  on_device(x.device, [&] {
    q->upload(hq);
    out->poison(x.s());
  });
  x.gpu->decode(q->get(), out->get());
  const std::vector<float> got = on_device(x.device, [&] { return out->download(x.s()); });
  const auto [begin, end] = x.ref.view();
  const std::vector<double> want = x.ref.decode(hq, x.nq);
  const ref::DecodeBound b =
      ref::decode_bound(x.ref, hq, x.nq, std::nullopt, ref::DecodeView{begin, end, x.ref.base()},
                        x.gpu->accumulation_shape());
  expect_within(got, want, b, what);
  on_device(x.device, [&] {
    q.reset();
    out.reset();
  });
}

std::size_t free_bytes(int d) {
  return on_device(d, [] {
    KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
    std::size_t free = 0, total = 0;
    KVLAYER_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
  });
}

/// A small layer life on device d, so that the context and the code loaded on first use are in
/// place before free memory is measured.
void warm_up(int d) {
  Rng rng(0x3A7E + std::uint64_t(d));
  Side x(d, flat(2, 64, 128), 8);
  append_rows(x, 40, rng);
  check_decode(x, rng, "warm-up");
}

// ---- host only ---------------------------------------------------------------------------------

TEST(DeviceMessages, StreamDeviceMismatchNamesBothDevices) {
  EXPECT_EQ(cuda::stream_device_mismatch(1, 0),
            "stream is on device 1 but the layer is on device 0");
  EXPECT_EQ(cuda::stream_device_mismatch(0, 7),
            "stream is on device 0 but the layer is on device 7");
}

TEST(DeviceMessages, NullLegacyAndPerThreadStreamsResolveToTheCurrentDevice) {
  // No CUDA call is made for these: they are whatever device is current when work is enqueued.
  for (int current : {0, 1, 5}) {
    EXPECT_EQ(cuda::stream_device(nullptr, current), current);
    EXPECT_EQ(cuda::stream_device(cudaStreamLegacy, current), current);
    EXPECT_EQ(cuda::stream_device(cudaStreamPerThread, current), current);
  }
}

// ---- one GPU or more
// ------------------------------------------------------------------------------

/// Every public call of a layer on device `layer_dev`, made with `caller` current: after each
/// the caller's device is current again; the state then equals the reference's.
void every_call(int layer_dev, int caller, const Geometry& g) {
  SCOPED_TRACE(g.describe() + ", layer on device " + std::to_string(layer_dev) + ", caller on " +
               std::to_string(caller));
  const bool ring = g.is_ring(), windowed = g.window.has_value();
  const int nq = 8, T = 3;
  const DeviceGuard at_layer(layer_dev);  // the layer and its inputs live here
  Rng rng(0xC0DE ^ (std::uint64_t(layer_dev) << 8) ^ std::uint64_t(caller) ^
          (std::uint64_t(g.head_dim_k) << 16));
  Stream stream;
  const HostRows rows = make_rows(g, 16, DType::f16, Fill::random, rng);
  const HostRows one = make_rows(g, 1, DType::bf16, Fill::random, rng);
  const HostRows draft = make_rows(g, T, DType::f32, Fill::random, rng);
  const DeviceRows d_rows(rows), d_one(one), d_draft(draft);
  const std::size_t qn = std::size_t(nq) * g.head_dim_k, on = std::size_t(nq) * g.head_dim_v;
  DeviceFloats q(qn), out(on), q_rows(T * qn), out_rows(T * on);
  std::vector<float> hq(T * qn);
  for (float& v : hq) v = rng.uniform(-2, 2);
  q.upload(std::vector<float>(hq.begin(), hq.begin() + std::ptrdiff_t(qn)));
  q_rows.upload(hq);
  auto gpu = std::make_unique<cuda::KvLayer>(g, nq, stream.get());
  ASSERT_EQ(current_device(), layer_dev) << "construction";
  ASSERT_EQ(gpu->device(), layer_dev);
  ref::KvLayer ref(g);

  struct Call {
    std::string name;
    std::function<void()> run;
  };
  cuda::KvLayer& l = *gpu;
  const std::vector<Call> calls = {
      {"append",
       [&] {
         l.append(d_rows.view);
         ref.append(rows.view());
       }},
      {"append again",
       [&] {
         l.append(d_rows.view);
         ref.append(rows.view());
       }},
      {"rewind",
       [&] {
         l.rewind(l.len() - 2);
         ref.rewind(ref.len() - 2);
       }},
      {"reserve",
       [&] {
         l.reserve(1);
         ref.reserve(1);
       }},
      {ring || windowed ? "append_dcw" : "append_dc",
       [&] {
         if (ring || windowed) {
           l.append_dcw(d_one.view);
           ref.append_dcw(one.view());
         } else {
           l.append_dc(d_one.view);
           ref.append_dc(one.view());
         }
       }},
      {"inc_seqlen",
       [&] {
         l.inc_seqlen();
         ref.inc_seqlen();
       }},
      {"account_steps",
       [&] {
         l.account_steps(1);
         ref.account_steps(1);
       }},
      {"reserve T",
       [&] {
         l.reserve(T);
         ref.reserve(T);
       }},
      {ring || windowed ? "append_rows_dcw" : "append_rows_dc",
       [&] {
         if (ring || windowed) {
           l.append_rows_dcw(d_draft.view);
           ref.append_rows_dcw(draft.view());
         } else {
           l.append_rows_dc(d_draft.view);
           ref.append_rows_dc(draft.view());
         }
       }},
      {"inc_seqlen T",
       [&] {
         l.inc_seqlen(T);
         ref.inc_seqlen(T);
       }},
      {"account_steps T",
       [&] {
         l.account_steps(T);
         ref.account_steps(T);
       }},
      {"decode", [&] { l.decode(q.get(), out.get()); }},
      {windowed ? "decode_dcw" : "decode_dc",
       [&] {
         if (windowed) {
           l.decode_dcw(q.get(), out.get());
         } else {
           l.decode_dc(q.get(), out.get());
         }
       }},
      {"decode_rows", [&] { l.decode_rows(q_rows.get(), out_rows.get(), T); }},
      {windowed ? "decode_rows_dcw" : "decode_rows_dc",
       [&] {
         if (windowed) {
           l.decode_rows_dcw(q_rows.get(), out_rows.get(), T);
         } else {
           l.decode_rows_dc(q_rows.get(), out_rows.get(), T);
         }
       }},
      {"status", [&] { EXPECT_TRUE(l.status().ok()) << l.status().message(); }},
      {"clear_status",
       [&] {
         l.clear_status();
         ref.clear_status();
       }},
      {"k_plane_bytes", [&] { EXPECT_EQ(l.k_plane_bytes(), ref.k_plane()); }},
      {"v_plane_bytes", [&] { EXPECT_EQ(l.v_plane_bytes(), ref.v_plane()); }},
      {"k_plane_tail_bytes", [&] { (void)l.k_plane_tail_bytes(); }},
      {"v_plane_tail_bytes", [&] { (void)l.v_plane_tail_bytes(); }},
      {"read_len_d", [&] { EXPECT_EQ(l.read_len_d(), ref.len_d()); }},
      {"read_base_d", [&] { EXPECT_EQ(l.read_base_d(), ref.base_d()); }},
      {"host accessors",
       [&] {
         EXPECT_EQ(l.len(), ref.len());
         EXPECT_EQ(l.base(), ref.base());
         EXPECT_EQ(l.view(), ref.view());
         EXPECT_EQ(l.rows(), ref.rows());
         EXPECT_EQ(l.can_rewind_to(l.len()), ref.can_rewind_to(ref.len()));
         EXPECT_EQ(l.physical_rows(l.len() - 1, l.len()),
                   ref.physical_rows(ref.len() - 1, ref.len()));
         EXPECT_EQ(l.geometry().describe(), g.describe());
         EXPECT_EQ(l.n_q_heads(), nq);
         EXPECT_EQ(l.stream(), stream.get());
         EXPECT_EQ(l.device(), layer_dev);
         (void)l.max_verify();
         (void)l.decode_plan();
         (void)l.accumulation_shape();
         (void)l.verify_accumulation_shape(T);
         (void)l.default_scale();
       }},
      {"snapshot", [&] { EXPECT_TRUE(same_state(l, ref)); }},
  };
  {
    const DeviceGuard at_caller(caller);
    for (const Call& c : calls) {
      c.run();
      ASSERT_EQ(current_device(), caller) << "after " << c.name;
    }
    // The decode outputs are the reference's (the last host-len decode saw this state).
    on_device(layer_dev, [&] { out.poison(stream.get()); });
    l.decode(q.get(), out.get());
    const std::vector<float> got = on_device(layer_dev, [&] { return out.download(stream.get()); });
    const std::vector<float> q0(hq.begin(), hq.begin() + std::ptrdiff_t(qn));
    const auto [begin, end] = ref.view();
    expect_within(
        got, ref.decode(q0, nq),
        ref::decode_bound(ref, q0, nq, std::nullopt, ref::DecodeView{begin, end, ref.base()},
                          l.accumulation_shape()),
        "decode");
    ASSERT_EQ(current_device(), caller) << "after the checked decode";

    // Moves: construction, then assignment (which releases the old layer on its own device).
    cuda::KvLayer moved(std::move(*gpu));
    ASSERT_EQ(current_device(), caller) << "after the move construction";
    EXPECT_TRUE(same_state(moved, ref));
    auto fresh = on_device(layer_dev, [&] { return cuda::KvLayer(g, nq, stream.get()); });
    moved = std::move(fresh);
    ASSERT_EQ(current_device(), caller) << "after the move assignment";
    EXPECT_EQ(moved.len(), 0);
    EXPECT_EQ(moved.read_len_d(), 0);
    gpu.reset();  // moved from: nothing to release
    ASSERT_EQ(current_device(), caller) << "after destroying a moved-from layer";
    {
      cuda::KvLayer doomed(std::move(moved));
      doomed.append(d_rows.view);
    }
    ASSERT_EQ(current_device(), caller) << "after the destructor";
  }
  EXPECT_EQ(current_device(), layer_dev);
}

TEST(CurrentDevice, EveryKindOfCallLeavesTheCallersDeviceCurrent) {
  KVLAYER_REQUIRE_GPU();
  const int before = current_device();
  for (int layer_dev : test_devices()) {
    for (int caller : test_devices()) {
      every_call(layer_dev, caller, flat(2, 64, 300));
      every_call(layer_dev, caller, flat(1, 128, 300, 40));
      every_call(layer_dev, caller, ring(2, 128, 2000, 40, 16, 4));
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(current_device(), before);
}

TEST(CurrentDevice, TheCallersDeviceIsRestoredWhenACallThrows) {
  KVLAYER_REQUIRE_GPU();
  for (int layer_dev : test_devices()) {
    for (int caller : test_devices()) {
      SCOPED_TRACE("layer on device " + std::to_string(layer_dev) + ", caller on " +
                   std::to_string(caller));
      const DeviceGuard at_layer(layer_dev);
      Stream stream;
      const Geometry g = flat(2, 64, 100);
      Rng rng(0x7A20 + std::uint64_t(2 * layer_dev + caller));
      const HostRows rows = make_rows(g, 10, DType::f32, Fill::random, rng);
      const DeviceRows d(rows);
      DeviceFloats q(8 * 64), out(8 * 64);
      cuda::KvLayer l(g, 8, stream.get());
      ref::KvLayer ref(g);
      l.append(d.view);
      ref.append(rows.view());
      const DeviceGuard at_caller(caller);
      const std::vector<std::pair<std::string, std::function<void()>>> refused = {
          {"append",
           [&] {
             l.append({nullptr, nullptr, 1, DType::f32});
           }},
          {"rewind", [&] { l.rewind(11); }},
          {"reserve", [&] { l.reserve(-1); }},
          {"append_dc", [&] { l.append_dc(d.view); }},  // 10 rows, not 1
          {"decode_dcw", [&] { l.decode_dcw(q.get(), out.get()); }},
          {"decode_rows", [&] { l.decode_rows(q.get(), out.get(), 0); }},
          {"account_steps", [&] { l.account_steps(1000); }},
          {"physical_rows", [&] { (void)l.physical_rows(0, 1000); }},
          {"verify_accumulation_shape", [&] { (void)l.verify_accumulation_shape(0); }},
      };
      for (const auto& [name, f] : refused) {
        EXPECT_NE(refusal_of(f), "") << name << " must be refused";
        EXPECT_EQ(current_device(), caller) << "after the refused " << name;
      }
      EXPECT_TRUE(same_state(l, ref)) << "refusals leave the layer as it was";
      // The guard itself, left by an exception.
      try {
        const DeviceGuard inner(layer_dev);
        EXPECT_EQ(current_device(), layer_dev);
        throw Error(ErrorKind::device, "thrown inside the guard");
      } catch (const Error&) {
      }
      EXPECT_EQ(current_device(), caller) << "after leaving a guard by an exception";
      // A refused construction (unsupported head dim) changes nothing either.
      const int hd = unsupported_head_dim();
      EXPECT_EQ(refusal_of([&] { cuda::KvLayer bad(flat(2, hd, 100), 8, stream.get()); }),
                "cuda::KvLayer: head_dim " + std::to_string(hd) +
                    " is not supported (supported: " + cuda::supported_head_dims() + ")");
      EXPECT_EQ(current_device(), caller);
    }
  }
}

TEST(CurrentDevice, AGuardForADeviceThatDoesNotExistThrowsAndChangesNothing) {
  KVLAYER_REQUIRE_GPU();
  const int before = current_device(), missing = device_count();
  try {
    const DeviceGuard g(missing);
    ADD_FAILURE() << "device " << missing << " does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::device);
    EXPECT_EQ(std::string(e.what()),
              std::string("cudaSetDevice(device): ") + cudaGetErrorString(cudaErrorInvalidDevice));
  }
  EXPECT_EQ(current_device(), before);
  {
    const DeviceGuard g(missing, std::nothrow);  // for destructors: no throw, no switch
    EXPECT_EQ(current_device(), before);
  }
  EXPECT_EQ(current_device(), before);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failure is not left as the last error";
}

// A destructor's guard on the device already current switches nothing, so a non-sticky error
// the caller has not read yet stays its last error.
TEST(CurrentDevice, ANoThrowGuardLeavesTheCallersLastErrorAlone) {
  KVLAYER_REQUIRE_GPU();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, std::size_t(1) << 60), cudaErrorMemoryAllocation);  // 1 EiB
  { const DeviceGuard g(current_device(), std::nothrow); }
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---- two GPUs
// --------------------------------------------------------------------------------------

// set_stream (the Python binding's per-call stream): every later call, a captured step
// included, runs on the new stream, also when it was set while capturing; a stream of another
// device is refused (MultiGpu below).
TEST(CurrentDevice, SetStreamMovesEveryLaterCallToTheNewStream) {
  KVLAYER_REQUIRE_GPU();
  Rng rng(0x5E75);
  Side x(0, flat(2, 64, 300), 8);
  append_rows(x, 40, rng);  // on the construction stream
  auto other = std::make_unique<Stream>();
  x.gpu->set_stream(other->get());
  EXPECT_EQ(x.gpu->stream(), other->get());
  x.gpu->set_stream(other->get());  // the same stream again: nothing to check, nothing changes
  append_rows(x, 17, rng);
  EXPECT_TRUE(same_state(*x.gpu, x.ref));  // status() and the read-back wait on the new stream
  // A device-counter step captured on the new stream: had the layer launched on its old stream,
  // the capture would hold no node (the old stream is not capturing) and the replay would leave
  // len_d where it was.
  DeviceBuffer k_in(std::size_t(x.g().kv_dim_k()) * 4), v_in(std::size_t(x.g().kv_dim_v()) * 4);
  DeviceFloats q(std::size_t(x.nq) * 64), out(std::size_t(x.nq) * 64);
  q.upload(std::vector<float>(q.count, 0.5f));  // defined input (compute-sanitizer initcheck)
  const HostRows row = make_rows(x.g(), 1, DType::f32, Fill::random, rng);
  KVLAYER_CUDA_TRY(
      cudaMemcpy(k_in.get(), row.k_bytes.data(), row.k_bytes.size(), cudaMemcpyHostToDevice));
  KVLAYER_CUDA_TRY(
      cudaMemcpy(v_in.get(), row.v_bytes.data(), row.v_bytes.size(), cudaMemcpyHostToDevice));
  KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
  // The stream set while it is capturing, as torch.cuda.graph does (global mode, its default):
  // CUDA forbids asking a capturing stream's device, so set_stream must not.
  x.gpu->set_stream(x.s());
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(other->get(), cudaStreamCaptureModeGlobal));
  x.gpu->set_stream(other->get());
  device_counter_step(*x.gpu, cuda::RowsView{k_in.get(), v_in.get(), 1, DType::f32}, q.get(),
                      out.get());
  const Graph graph = Graph::end_capture(other->get());
  EXPECT_GT(graph.node_count(), 0u);
  graph.launch(other->get());
  x.ref.append_dc(row.view());
  x.ref.inc_seqlen(1);
  EXPECT_EQ(x.gpu->read_len_d(), x.ref.len_d());
  x.gpu->account_steps(1);
  x.ref.account_steps(1);
  EXPECT_TRUE(same_state(*x.gpu, x.ref));
  // Back to the construction stream before `other` is destroyed (the layer's destructor waits
  // on its stream).
  x.gpu->set_stream(x.s());
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(other->get()));
  other.reset();
  check_decode(x, rng, "after set_stream back");
}

TEST(MultiGpu, LayersOnTwoDevicesUsedAlternatelyMatchTheReference) {
  KVLAYER_REQUIRE_TWO_GPUS();
  std::vector<std::unique_ptr<Side>> sides;
  for (int d : {0, 1}) {
    sides.push_back(std::make_unique<Side>(d, flat(2, 128, 600), 8));
    sides.push_back(std::make_unique<Side>(d, ring(2, 64, 4000, 61, 16, 4), 16));
    sides.push_back(std::make_unique<Side>(d, flat(1, 256, 400, 77), 4));
  }
  Rng rng(0x2D3F1);
  for (int round = 0; round < 40 && !HasFatalFailure(); ++round) {
    for (auto& xp : sides) {
      Side& x = *xp;
      const int other = 1 - x.device;
      const std::string what = x.g().describe() + " on device " + std::to_string(x.device) +
                               ", round " + std::to_string(round);
      SCOPED_TRACE(what);
      const DeviceGuard at_other(other);
      const Geometry& g = x.g();
      std::int64_t n = rng.range(1, g.is_ring() ? g.max_append : 24);
      if (!g.is_ring() && x.ref.len() + n > g.max_ctx) {  // a flat layer is full: start over
        const std::int64_t to = rng.range(0, x.ref.len() / 4);
        x.gpu->rewind(to);
        x.ref.rewind(to);
      }
      append_rows(x, n, rng);
      ASSERT_EQ(current_device(), other);
      if (rng.chance(25)) {  // a speculative rewind, as far as the ring allows
        const std::int64_t to = x.ref.len() - rng.range(1, 4);
        if (to >= 0 && x.ref.can_rewind_to(to)) {
          x.gpu->rewind(to);
          x.ref.rewind(to);
        }
      }
      if (x.ref.view().first >= x.ref.base() && x.ref.len() > 0) check_decode(x, rng, what);
      ASSERT_EQ(current_device(), other);
      ASSERT_TRUE(same_state(*x.gpu, x.ref));
      ASSERT_EQ(current_device(), other);
    }
  }
  for (auto& x : sides) {
    EXPECT_TRUE(x->gpu->status().ok()) << x->gpu->status().message();
    EXPECT_EQ(x->gpu->device(), x->device);
  }
}

TEST(MultiGpu, GraphsCapturedPerDeviceReplayInterleaved) {
  KVLAYER_REQUIRE_TWO_GPUS();
  struct Captured {
    std::unique_ptr<Side> x;
    DType dtype;
    std::unique_ptr<DeviceBuffer> k_in, v_in;
    std::unique_ptr<DeviceFloats> q_in, out;
    Graph graph;
  };
  std::vector<Captured> cs;
  cs.push_back({std::make_unique<Side>(0, flat(2, 64, 700), 8), DType::f32, {}, {}, {}, {}, {}});
  cs.push_back(
      {std::make_unique<Side>(1, flat(1, 256, 600, 100), 16), DType::bf16, {}, {}, {}, {}, {}});
  Rng rng(0x6EA9D);
  for (Captured& c : cs) {
    Side& x = *c.x;
    const int other = 1 - x.device;
    append_rows(x, 45, rng);  // a prefill
    const Geometry& g = x.g();
    const std::size_t es = dtype_size(c.dtype);
    on_device(x.device, [&] {
      c.k_in = std::make_unique<DeviceBuffer>(std::size_t(g.kv_dim_k()) * es);
      c.v_in = std::make_unique<DeviceBuffer>(std::size_t(g.kv_dim_v()) * es);
      c.q_in = std::make_unique<DeviceFloats>(std::size_t(x.nq) * g.head_dim_k);
      c.out = std::make_unique<DeviceFloats>(std::size_t(x.nq) * g.head_dim_v);
      KVLAYER_CUDA_TRY(cudaStreamBeginCapture(x.s(), cudaStreamCaptureModeThreadLocal));
    });
    // The layer's calls are captured with the other device current: each makes its own current
    // (not a stream operation, legal inside the capture) and leaves the other current again.
    const cuda::RowsView row{c.k_in->get(), c.v_in->get(), 1, c.dtype};
    try {
      const DeviceGuard at_other(other);
      device_counter_step(*x.gpu, row, c.q_in->get(), c.out->get());
      EXPECT_EQ(current_device(), other);
    } catch (...) {
      on_device(x.device, [&] {
        cudaGraph_t partial = nullptr;
        (void)cudaStreamEndCapture(x.s(), &partial);
        if (partial != nullptr) (void)cudaGraphDestroy(partial);
      });
      throw;
    }
    c.graph = on_device(x.device, [&] { return Graph::end_capture(x.s()); });
    ASSERT_TRUE(on_device(other, [&] { return same_state(*x.gpu, x.ref); }))
        << "capture must not execute anything";
  }

  const int tokens = 200;
  for (int t = 0; t < tokens && !HasFatalFailure(); ++t) {
    // Both devices' replays in flight at once, then both compared.
    std::vector<std::vector<float>> queries(cs.size());
    for (std::size_t i = 0; i < cs.size(); ++i) {
      Captured& c = cs[i];
      Side& x = *c.x;
      const Geometry& g = x.g();
      const HostRows rows = make_rows(g, 1, c.dtype, Fill::random, rng);
      queries[i].resize(std::size_t(x.nq) * g.head_dim_k);
      for (float& v : queries[i]) v = rng.uniform(-2, 2);
      on_device(x.device, [&] {
        KVLAYER_CUDA_TRY(cudaMemcpyAsync(c.k_in->get(), rows.k_bytes.data(), rows.k_bytes.size(),
                                         cudaMemcpyHostToDevice, x.s()));
        KVLAYER_CUDA_TRY(cudaMemcpyAsync(c.v_in->get(), rows.v_bytes.data(), rows.v_bytes.size(),
                                         cudaMemcpyHostToDevice, x.s()));
        KVLAYER_CUDA_TRY(cudaMemcpyAsync(c.q_in->get(), queries[i].data(), queries[i].size() * 4,
                                         cudaMemcpyHostToDevice, x.s()));
        c.out->poison(x.s());
        c.graph.launch(x.s());
        // The pageable copies may read the host buffers after returning: wait before they go.
        KVLAYER_CUDA_TRY(cudaStreamSynchronize(x.s()));
      });
      if (g.window) {
        x.ref.append_dcw(rows.view());
      } else {
        x.ref.append_dc(rows.view());
      }
      x.ref.inc_seqlen();
    }
    for (std::size_t i = 0; i < cs.size(); ++i) {
      Captured& c = cs[i];
      Side& x = *c.x;
      const Geometry& g = x.g();
      const int other = 1 - x.device;
      SCOPED_TRACE(g.describe() + " on device " + std::to_string(x.device) + ", token " +
                   std::to_string(t));
      const std::optional<std::vector<double>> want =
          g.window ? x.ref.decode_dcw(queries[i], x.nq) : x.ref.decode_dc(queries[i], x.nq);
      ASSERT_TRUE(want.has_value()) << x.ref.status().message();
      const ref::DecodeView view{
          g.window ? std::max<std::int64_t>(0, x.ref.len_d() - *g.window) : 0, x.ref.len_d(),
          x.ref.base_d()};
      const std::vector<float> got = on_device(x.device, [&] { return c.out->download(x.s()); });
      const DeviceGuard at_other(other);
      expect_within(got, *want,
                    ref::decode_bound(x.ref, queries[i], x.nq, std::nullopt, view,
                                      x.gpu->accumulation_shape()),
                    "replayed decode");
      x.gpu->account_steps(1);
      x.ref.account_steps(1);
      if (t % 25 == 24 || t + 1 == tokens) {
        ASSERT_TRUE(same_state(*x.gpu, x.ref));
      }
      ASSERT_EQ(current_device(), other);
    }
  }
  for (Captured& c : cs) {
    on_device(c.x->device, [&] {
      c.graph = Graph();
      c.k_in.reset();
      c.v_in.reset();
      c.q_in.reset();
      c.out.reset();
    });
  }
}

TEST(MultiGpu, DestructionWithTheOtherDeviceCurrentFreesTheLayersDevice) {
  KVLAYER_REQUIRE_TWO_GPUS();
  warm_up(0);
  warm_up(1);
  // Planes of 71 and 50 MB: far above what other processes' churn on device 0 moves.
  const Geometry g = flat(8, 128, 65536);
  const std::size_t planes = std::size_t(g.rows() * (g.k_tok_bytes() + g.v_tok_bytes()));
  const std::size_t tolerance = std::size_t(g.rows() * g.v_tok_bytes()) / 2;
  // NOTE: cudaMemGetInfo counts every process on the device (device-check runs binaries in
  // parallel): a measurement that another process disturbed is taken again, up to 5 times.
  std::string log;
  bool ok = false;
  for (int attempt = 0; attempt < 5 && !ok; ++attempt) {
    const std::size_t free0 = free_bytes(0), free1 = free_bytes(1);
    std::size_t free0_live = 0, free1_live = 0, free0_after = 0, free1_after = 0;
    {
      auto x = std::make_unique<Side>(1, g, 32);
      free0_live = free_bytes(0);
      free1_live = free_bytes(1);
      const DeviceGuard at_other(0);
      x->gpu.reset();  // the layer's destructor with device 0 current
      EXPECT_EQ(current_device(), 0);
      free0_after = free_bytes(0);
      free1_after = free_bytes(1);
    }
    const auto drop = [](std::size_t before, std::size_t after) {
      return after >= before ? 0 : before - after;
    };
    ok = drop(free1, free1_live) >= planes && drop(free0, free0_live) < tolerance &&
         drop(free1, free1_after) < tolerance && drop(free0, free0_after) < tolerance;
    log += " [device 1: " + std::to_string(drop(free1, free1_live)) + " allocated, " +
           std::to_string(drop(free1, free1_after)) +
           " left; device 0: " + std::to_string(drop(free0, free0_live)) + " while live, " +
           std::to_string(drop(free0, free0_after)) + " after]";
  }
  EXPECT_TRUE(ok) << "the layer's planes (" << planes
                  << " bytes) must be allocated on device 1 and freed there; drops in bytes:" << log
                  << " (tolerance " << tolerance << ")";

  // A move assignment with device 0 current releases the old layer on device 1 as well.
  ok = false;
  log.clear();
  for (int attempt = 0; attempt < 5 && !ok; ++attempt) {
    const std::size_t free1 = free_bytes(1);
    auto big = std::make_unique<Side>(1, g, 32);
    auto small = std::make_unique<Side>(0, flat(2, 64, 128), 8);
    const std::size_t free1_live = free_bytes(1);
    {
      const DeviceGuard at_other(0);
      *big->gpu = std::move(*small->gpu);
    }
    const std::size_t free1_after = free_bytes(1);
    EXPECT_EQ(big->gpu->device(), 0);
    // big's Side now owns a device-0 layer: release it before its device-1 stream.
    on_device(0, [&] { big->gpu.reset(); });
    ok = free1 >= free1_live + planes && free1_after + tolerance > free1;
    log += " [" + std::to_string(free1) + " -> " + std::to_string(free1_live) + " -> " +
           std::to_string(free1_after) + "]";
  }
  EXPECT_TRUE(ok) << "device 1 free bytes before, with the layer, after the assignment:" << log;
}

TEST(MultiGpu, AStreamOfAnotherDeviceIsRefusedAndChangesNothing) {
  KVLAYER_REQUIRE_TWO_GPUS();
  warm_up(0);
  warm_up(1);
  Rng rng(0x57E4);
  Side x(0, ring(2, 128, 2000, 40, 16, 4), 8);  // a layer with data on device 0
  for (int i = 0; i < 6; ++i) append_rows(x, rng.range(1, 16), rng);
  const Snapshot before = on_device(0, [&] { return snapshot(*x.gpu, Tails::read); });
  auto s1 = on_device(1, [] { return std::make_unique<Stream>(); });
  auto s0 = on_device(0, [] { return std::make_unique<Stream>(); });
  const std::size_t free0 = free_bytes(0), free1 = free_bytes(1);
  const Geometry g = flat(8, 128, 65536);  // 121 MB of planes, were anything allocated
  {
    const DeviceGuard at(0);
    EXPECT_EQ(refusal_of([&] { cuda::KvLayer l(g, 32, s1->get()); }),
              "cuda::KvLayer: stream is on device 1 but the layer is on device 0");
    EXPECT_EQ(current_device(), 0);
  }
  {
    const DeviceGuard at(1);
    EXPECT_EQ(refusal_of([&] { cuda::KvLayer l(g, 32, s0->get()); }),
              "cuda::KvLayer: stream is on device 0 but the layer is on device 1");
    EXPECT_EQ(current_device(), 1);
  }
  {
    const DeviceGuard at(0);
    const cudaStream_t before_stream = x.gpu->stream();
    EXPECT_EQ(refusal_of([&] { x.gpu->set_stream(s1->get()); }),
              "set_stream: stream is on device 1 but the layer is on device 0");
    EXPECT_EQ(x.gpu->stream(), before_stream);
  }
  const std::size_t tolerance = std::size_t(g.rows() * g.v_tok_bytes()) / 2;
  EXPECT_LT(free0 - std::min(free0, free_bytes(0)), tolerance) << "nothing allocated on device 0";
  EXPECT_LT(free1 - std::min(free1, free_bytes(1)), tolerance) << "nothing allocated on device 1";
  // The existing layer is exactly as it was (planes, tails, counters, status).
  {
    const DeviceGuard at(1);
    const Snapshot after = snapshot(*x.gpu, Tails::read);
    EXPECT_TRUE(same_state(after, before, x.g()));
    EXPECT_EQ(after.k_tail, before.k_tail);
    EXPECT_EQ(after.v_tail, before.v_tail);
    EXPECT_TRUE(same_state(*x.gpu, x.ref));
  }
  // The null stream is accepted on either device and resolves to the layer's.
  for (int d : {0, 1}) {
    const DeviceGuard at(d);
    const Geometry fg = flat(2, 64, 200);
    cuda::KvLayer l(fg, 8, nullptr);
    ref::KvLayer r(fg);
    EXPECT_EQ(l.device(), d);
    const HostRows rows = make_rows(fg, 37, DType::f16, Fill::random, rng);
    const DeviceRows dr(rows);
    const DeviceGuard at_other(1 - d);
    l.append(dr.view);
    r.append(rows.view());
    EXPECT_TRUE(same_state(l, r)) << "null stream, layer on device " << d;
    EXPECT_EQ(current_device(), 1 - d);
    on_device(d, [] { KVLAYER_CUDA_TRY(cudaDeviceSynchronize()); });  // before dr is freed
  }
  on_device(1, [&] { s1.reset(); });
  on_device(0, [&] { s0.reset(); });
}

}  // namespace
}  // namespace kvlayer::testing
