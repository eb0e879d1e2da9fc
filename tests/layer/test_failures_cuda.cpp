// CUDA failure paths (SPEC §9; kv_layer.hpp, "CUDA failures"), on the fault-injection build of
// the layer (kvlayer_cuda_fault, cuda/src/fault_injection.hpp): every checked CUDA call of the
// constructor and of each host operation is failed in turn, the failed call not running, as a
// real failed allocation, launch or copy does not. The error must name the call and the CUDA
// error string; a throwing constructor must leave no device memory behind (the layer's live
// buffers exactly, and cudaMemGetInfo over 50 failing constructions); an operation must leave
// the layer as documented (planes, tails, len, len_d, base, base_d, status: the reference's) and
// the layer must work on afterwards.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fault_injection.hpp"
#include "cuda_testbed.hpp"

namespace kvlayer::testing {
namespace {

namespace fault = cuda::fault;
using cuda::Stream;

constexpr int kFailingConstructions = 50;
/// Every operation first asks for the current device (cuda::DeviceGuard; one device here, so
/// it never switches): a failure there too must leave the layer unchanged.
constexpr const char* kGuard = "cudaGetDevice(&previous_)";

/// The error injected into `call`: what that kind of call returns when it really fails.
cudaError_t error_for(const std::string& call) {
  if (call.find("cudaMalloc") != std::string::npos) return cudaErrorMemoryAllocation;
  if (call.rfind("launch_", 0) == 0) return cudaErrorLaunchOutOfResources;
  return cudaErrorInvalidValue;
}

/// The message check_cuda gives `call` failing with `e`.
std::string message_for(const std::string& call, cudaError_t e) {
  return call + ": " + cudaGetErrorString(e);
}

::testing::AssertionResult tails_zero(const cuda::KvLayer& l) {
  const auto zero = [](const std::vector<std::uint8_t>& t) {
    return t.size() == cuda::kPlaneTailBytes &&
           std::all_of(t.begin(), t.end(), [](std::uint8_t b) { return b == 0; });
  };
  if (!zero(l.k_plane_tail_bytes())) return ::testing::AssertionFailure() << "K tail not zero";
  if (!zero(l.v_plane_tail_bytes())) return ::testing::AssertionFailure() << "V tail not zero";
  return ::testing::AssertionSuccess();
}

std::size_t free_device_bytes() {
  KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
  std::size_t free = 0, total = 0;
  KVLAYER_CUDA_TRY(cudaMemGetInfo(&free, &total));
  return free;
}

/// Success when `round` does not lower the device's free memory by `tolerance` or more.
/// NOTE: cudaMemGetInfo counts every process on the device, and tools/device-check runs the
/// test binaries in parallel: a drop is measured again, up to 5 rounds. A real leak drops it in
/// every round (each round leaks again); another process's allocation does not stay in step.
::testing::AssertionResult no_device_memory_drop(const std::function<void()>& round,
                                                 std::size_t tolerance) {
  std::string drops;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::size_t before = free_device_bytes();
    round();
    const std::size_t after = free_device_bytes();
    if (after + tolerance > before) return ::testing::AssertionSuccess();
    drops += ' ';  // two appends: GCC 12 warns (-Wrestrict) on " " + to_string here
    drops += std::to_string(before - after);
  }
  return ::testing::AssertionFailure() << "free device memory dropped by" << drops
                                       << " bytes in 5 rounds (tolerance " << tolerance << ")";
}

/// A whole layer life (construct, append, decode, read back, destroy) of geometry g: code and
/// driver memory that the first use loads once per process are in place before any measurement.
void warm_up(const Geometry& g, int nq, cudaStream_t s) {
  Rng rng(0x3A7E);
  cuda::KvLayer l(g, nq, s);
  const HostRows rows = make_rows(g, 40, DType::f16, Fill::random, rng);
  const DeviceRows d(rows);
  l.append(d.view);
  DeviceFloats q(std::size_t(nq) * g.head_dim_k), out(std::size_t(nq) * g.head_dim_v);
  q.upload(std::vector<float>(q.count, 0.5f));
  l.decode(q.get(), out.get());
  EXPECT_TRUE(l.status().ok());
  (void)l.read_len_d();
}

/// Appends rows to both layers, a fresh layer's smoke test: same state as the reference.
void append_both(cuda::KvLayer& gpu, ref::KvLayer& ref, std::int64_t n, Rng& rng,
                 Fill fill = Fill::random) {
  const HostRows rows = make_rows(ref.geometry(), n, DType::f32, fill, rng);
  const DeviceRows d(rows);
  gpu.append(d.view);
  ref.append(rows.view());
}

class CudaFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    KVLAYER_REQUIRE_GPU();
    fault::disarm();
    fault::clear_trace();
  }
  void TearDown() override { fault::disarm(); }
};

// ---- construction ------------------------------------------------------------------------------

TEST_F(CudaFailures, ConstructionFailingAtEachCheckedCallNamesItAndLeavesNothing) {
  // Planes of 71 and 50 MB: a construction that leaked what it had allocated before failing
  // would leak at least one plane, 50 times.
  const Geometry g = flat(8, 128, 65536);
  const int nq = 32;
  Stream stream;
  warm_up(g, nq, stream.get());
  ASSERT_EQ(fault::live_buffers(), 0);

  fault::clear_trace();
  std::int64_t buffers = 0;
  {
    const cuda::KvLayer l(g, nq, stream.get());
    buffers = fault::live_buffers();
  }
  const std::vector<std::string> calls = fault::trace();
  EXPECT_EQ(fault::live_buffers(), 0);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "cudaMalloc(&p, bytes)"), buffers)
      << "one checked cudaMalloc per device buffer";
  EXPECT_GE(buffers, 4) << "K and V planes, counters, status (and the decode scratch)";
  ASSERT_FALSE(calls.empty());

  const std::size_t tolerance = std::size_t(g.rows() * g.v_tok_bytes());  // the smaller plane
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const std::string& call = calls[i];
    const cudaError_t e = error_for(call);
    SCOPED_TRACE("constructor's checked call " + std::to_string(i + 1) + ": " + call);
    int wrong_messages = 0, leaking = 0;
    std::string first_message;
    EXPECT_TRUE(no_device_memory_drop(
        [&] {
          for (int r = 0; r < kFailingConstructions; ++r) {
            const fault::ScopedFault f("", int(i) + 1, e);
            const std::string m = device_error_of([&] { cuda::KvLayer l(g, nq, stream.get()); });
            if (first_message.empty()) first_message = m;
            wrong_messages += m != message_for(call, e) || fault::fired() != 1;
            leaking += fault::live_buffers() != 0;
          }
        },
        tolerance));
    EXPECT_EQ(first_message, message_for(call, e));
    EXPECT_EQ(wrong_messages, 0);
    EXPECT_EQ(leaking, 0) << "constructions that left device buffers allocated";
    if (call.find("cudaMalloc") != std::string::npos) {
      EXPECT_EQ(first_message, "cudaMalloc(&p, bytes): out of memory");
    }
  }

  // Nothing of the failed constructions remains: a fresh layer works.
  Rng rng(0xF00D);
  cuda::KvLayer gpu(g, nq, stream.get());
  ref::KvLayer ref(g);
  EXPECT_EQ(fault::live_buffers(), buffers);
  append_both(gpu, ref, 100, rng);
  append_both(gpu, ref, 3, rng);
  EXPECT_TRUE(same_state(gpu, ref));
  EXPECT_TRUE(tails_zero(gpu));
  EXPECT_TRUE(gpu.status().ok());
}

TEST_F(CudaFailures, RealOutOfMemoryConstructionIsReportedOnceAndLeavesNothing) {
  // No injection: a K plane of twice the device's memory really fails to allocate.
  Stream stream;
  const Geometry small = flat(2, 128, 256);
  warm_up(small, 8, stream.get());
  std::size_t free = 0, total = 0;
  KVLAYER_CUDA_TRY(cudaMemGetInfo(&free, &total));
  Geometry huge = flat(8, 256, 1);
  huge.max_ctx = std::int64_t(std::min<std::size_t>(2 * total / std::size_t(huge.k_tok_bytes()),
                                                    std::numeric_limits<std::int32_t>::max()));
  ASSERT_GT(std::size_t(huge.max_ctx) * std::size_t(huge.k_tok_bytes()), total);
  const std::string m = device_error_of([&] { cuda::KvLayer l(huge, 8, stream.get()); });
  EXPECT_EQ(m, "cudaMalloc(&p, bytes): out of memory");
  EXPECT_EQ(fault::live_buffers(), 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the reported failure is still the last error";
  // The next launches are not blamed for it: a fresh layer appends, decodes and reads back.
  Rng rng(0xBEEF);
  cuda::KvLayer gpu(small, 8, stream.get());
  ref::KvLayer ref(small);
  append_both(gpu, ref, 33, rng);
  DeviceFloats q(8 * 128), out(8 * 128);
  q.upload(std::vector<float>(q.count, 0.25f));
  gpu.decode(q.get(), out.get());
  EXPECT_TRUE(same_state(gpu, ref));
}

// ---- host operations
// -----------------------------------------------------------------------------

/// One host operation, run from a starting state that `setup` gives a fresh layer and its
/// reference twin alike.
struct OpCase {
  std::string name;
  Geometry g;
  int nq = 0;
  std::function<void(cuda::KvLayer&, ref::KvLayer&)> setup;
  std::function<void(cuda::KvLayer&)> on_gpu;
  std::function<void(ref::KvLayer&)> on_ref;  ///< the operation's effect on the reference
  std::vector<std::string> calls;             ///< the checked CUDA calls it makes, in order
  /// The reference's state after `call` failed, from the starting state (default: unchanged).
  std::function<void(ref::KvLayer&, const std::string& call)> after_failure = nullptr;
  /// The operation's output (decode), compared bit for bit between the first and the retried run.
  std::function<std::vector<float>()> output = nullptr;
};

std::vector<std::uint32_t> bits(const std::vector<float>& x) {
  std::vector<std::uint32_t> b(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(x[i]);
  return b;
}

/// Fails each checked call of the operation in turn, on a fresh layer each time: the error names
/// the call, the state is the documented one, nothing is allocated or freed, the tails stay zero,
/// and the operation then succeeds with the reference's result.
void sweep(const OpCase& c, cudaStream_t s) {
  SCOPED_TRACE(c.name);
  std::vector<float> first_output;
  {
    cuda::KvLayer gpu(c.g, c.nq, s);
    ref::KvLayer ref(c.g);
    c.setup(gpu, ref);
    fault::clear_trace();
    c.on_gpu(gpu);
    const std::vector<std::string> calls = fault::trace();
    ASSERT_EQ(calls, c.calls) << "the operation's checked CUDA calls";
    c.on_ref(ref);
    ASSERT_TRUE(same_state(gpu, ref)) << "the operation without a fault";
    if (c.output) first_output = c.output();
  }
  for (std::size_t i = 0; i < c.calls.size(); ++i) {
    const std::string& call = c.calls[i];
    const cudaError_t e = error_for(call);
    SCOPED_TRACE("failing checked call " + std::to_string(i + 1) + ": " + call);
    cuda::KvLayer gpu(c.g, c.nq, s);
    ref::KvLayer ref(c.g);
    c.setup(gpu, ref);
    const std::int64_t buffers = fault::live_buffers();
    std::string m;
    {
      const fault::ScopedFault f("", int(i) + 1, e);
      m = device_error_of([&] { c.on_gpu(gpu); });
      EXPECT_EQ(fault::fired(), 1);
    }
    EXPECT_EQ(m, message_for(call, e));
    EXPECT_EQ(fault::live_buffers(), buffers);
    if (c.after_failure) c.after_failure(ref, call);
    EXPECT_TRUE(same_state(gpu, ref)) << "the state after the failure";
    EXPECT_TRUE(tails_zero(gpu));
    c.on_gpu(gpu);
    c.on_ref(ref);
    EXPECT_TRUE(same_state(gpu, ref)) << "the operation retried";
    EXPECT_TRUE(tails_zero(gpu));
    if (c.output) {
      EXPECT_EQ(bits(c.output()), bits(first_output)) << "the retried output";
    }
  }
}

/// Shared inputs of the operation cases (device rows, q, out), alive for the whole test.
struct Inputs {
  Inputs(const Geometry& g, int nq, Rng& rng)
      : rows(make_rows(g, 16, DType::f16, Fill::random, rng)),
        one(make_rows(g, 1, DType::bf16, Fill::random, rng)),
        d_rows(rows),
        d_one(one),
        q(std::size_t(nq) * g.head_dim_k),
        out(std::size_t(nq) * g.head_dim_v) {
    std::vector<float> hq(q.count);
    for (float& x : hq) x = rng.uniform(-2, 2);
    q.upload(hq);
  }
  HostRows rows, one;
  DeviceRows d_rows, d_one;
  DeviceFloats q, out;
};

/// 61 rows of random data, then one row holding a NaN (a data error in the status).
void flat_setup(cuda::KvLayer& gpu, ref::KvLayer& ref) {
  Rng rng(0x5E7);
  append_both(gpu, ref, 61, rng);
  HostRows bad = make_rows(ref.geometry(), 1, DType::f32, Fill::random, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.k_bytes.data() + 4 * 40, &nan, 4);
  const DeviceRows d(bad);
  gpu.append(d.view);
  ref.append(bad.view());
}

/// 16-row appends until the next one rebases the ring with rows to move (keep > 0, retain >
/// base).
void ring_setup(cuda::KvLayer& gpu, ref::KvLayer& ref) {
  Rng rng(0x7196);
  while (!ref.plan_append(16).rebase) append_both(gpu, ref, 16, rng);
  const ref::AppendPlan p = ref.plan_append(16);
  ASSERT_GT(p.keep, 0);
  ASSERT_GT(p.retain, ref.base());
}

TEST_F(CudaFailures, EveryHostOperationLeavesTheLayerAsDocumented) {
  Stream stream;
  const cudaStream_t s = stream.get();
  Rng rng(0xFA11);
  const Geometry fg = flat(2, 64, 300);
  const Geometry rg = ring(2, 128, 2000, 40, 16, 4);  // rows 91
  const int nq = 8;
  const Inputs fi(fg, nq, rng), ri(rg, nq, rng);
  const std::vector<std::string> read = {kGuard, "cudaMemcpyAsync (device to host)",
                                         "cudaStreamSynchronize"};
  const auto none = [](ref::KvLayer&) {};

  const auto decoded = [s](const DeviceFloats& out) {
    return [s, &out] { return out.download(s); };
  };
  const auto ring_reserved = [](cuda::KvLayer& l, ref::KvLayer& r) {
    ring_setup(l, r);
    l.reserve(1);
    r.reserve(1);
  };

  const std::vector<OpCase> cases = {
      {.name = "append (flat)",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.append(fi.d_rows.view); },
       .on_ref = [&](ref::KvLayer& r) { r.append(fi.rows.view()); },
       .calls = {kGuard, "launch_append"}},
      {.name = "append (ring, rebasing first)",
       .g = rg,
       .nq = nq,
       .setup = ring_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.append(ri.d_rows.view); },
       .on_ref = [&](ref::KvLayer& r) { r.append(ri.rows.view()); },
       .calls = {kGuard, "launch_set_counters", "launch_rebase", "launch_append"},
       // The rebase ran and cannot be undone; nothing was written.
       .after_failure =
           [](ref::KvLayer& r, const std::string& call) {
             if (call == "launch_append") r.reserve(16);
           }},
      {.name = "reserve (ring, rebasing)",
       .g = rg,
       .nq = nq,
       .setup = ring_setup,
       .on_gpu = [](cuda::KvLayer& l) { l.reserve(16); },
       .on_ref = [](ref::KvLayer& r) { r.reserve(16); },
       .calls = {kGuard, "launch_set_counters", "launch_rebase"}},
      {.name = "rewind",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { l.rewind(50); },
       .on_ref = [](ref::KvLayer& r) { r.rewind(50); },
       .calls = {kGuard, "launch_set_counters"}},
      {.name = "append_dc",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.append_dc(fi.d_one.view); },
       .on_ref = [&](ref::KvLayer& r) { r.append_dc(fi.one.view()); },
       .calls = {kGuard, "launch_append"}},
      {.name = "inc_seqlen",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { l.inc_seqlen(); },
       .on_ref = [](ref::KvLayer& r) { r.inc_seqlen(); },
       .calls = {kGuard, "launch_inc_seqlen"}},
      {.name = "append_dcw (ring)",
       .g = rg,
       .nq = nq,
       .setup = ring_reserved,
       .on_gpu = [&](cuda::KvLayer& l) { l.append_dcw(ri.d_one.view); },
       .on_ref = [&](ref::KvLayer& r) { r.append_dcw(ri.one.view()); },
       .calls = {kGuard, "launch_append"}},
      {.name = "decode",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.decode(fi.q.get(), fi.out.get()); },
       .on_ref = none,
       .calls = {kGuard, "launch_decode"},
       .output = decoded(fi.out)},
      {.name = "decode_dc",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.decode_dc(fi.q.get(), fi.out.get()); },
       .on_ref = none,
       .calls = {kGuard, "launch_decode"},
       .output = decoded(fi.out)},
      {.name = "decode_dcw (ring)",
       .g = rg,
       .nq = nq,
       .setup = ring_setup,
       .on_gpu = [&](cuda::KvLayer& l) { l.decode_dcw(ri.q.get(), ri.out.get()); },
       .on_ref = none,
       .calls = {kGuard, "launch_decode"},
       .output = decoded(ri.out)},
      {.name = "clear_status",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { l.clear_status(); },
       .on_ref = [](ref::KvLayer& r) { r.clear_status(); },
       .calls = {kGuard, "cudaMemsetAsync(s_->status.get(), 0, sizeof(DeviceStatus), s_->stream)"}},
      {.name = "status",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.status(); },
       .on_ref = none,
       .calls = read},
      {.name = "k_plane_bytes",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.k_plane_bytes(); },
       .on_ref = none,
       .calls = read},
      {.name = "v_plane_bytes (ring)",
       .g = rg,
       .nq = nq,
       .setup = ring_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.v_plane_bytes(); },
       .on_ref = none,
       .calls = read},
      {.name = "k_plane_tail_bytes",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.k_plane_tail_bytes(); },
       .on_ref = none,
       .calls = read},
      {.name = "v_plane_tail_bytes",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.v_plane_tail_bytes(); },
       .on_ref = none,
       .calls = read},
      {.name = "read_len_d",
       .g = fg,
       .nq = nq,
       .setup = flat_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.read_len_d(); },
       .on_ref = none,
       .calls = read},
      {.name = "read_base_d (ring)",
       .g = rg,
       .nq = nq,
       .setup = ring_setup,
       .on_gpu = [](cuda::KvLayer& l) { (void)l.read_base_d(); },
       .on_ref = none,
       .calls = read},
  };
  for (const OpCase& c : cases) sweep(c, s);
}

// ---- the named sites, their messages verbatim ---------------------------------------------------

TEST_F(CudaFailures, EachKindOfSiteNamesTheCallAndTheCudaErrorString) {
  Stream stream;
  const cudaStream_t s = stream.get();
  Rng rng(0x9A3E);
  const Geometry fg = flat(2, 64, 300);
  const Geometry rg = ring(2, 128, 2000, 40, 16, 4);
  const Inputs fi(fg, 8, rng), ri(rg, 8, rng);
  {  // an allocation at construction: the V plane's
    const fault::ScopedFault f("cudaMalloc", 2, cudaErrorMemoryAllocation);
    EXPECT_EQ(device_error_of([&] { cuda::KvLayer l(fg, 8, s); }),
              "cudaMalloc(&p, bytes): out of memory");
    EXPECT_EQ(fault::live_buffers(), 0);
  }
  {  // the append kernel
    cuda::KvLayer l(fg, 8, s);
    const fault::ScopedFault f("launch_append", 1, cudaErrorLaunchOutOfResources);
    EXPECT_EQ(device_error_of([&] { l.append(fi.d_rows.view); }),
              "launch_append: too many resources requested for launch");
    EXPECT_EQ(l.len(), 0);
  }
  {  // the ring's rebase
    cuda::KvLayer l(rg, 8, s);
    ref::KvLayer r(rg);
    ring_setup(l, r);
    const fault::ScopedFault f("launch_rebase", 1, cudaErrorLaunchOutOfResources);
    EXPECT_EQ(device_error_of([&] { l.append(ri.d_rows.view); }),
              "launch_rebase: too many resources requested for launch");
    EXPECT_TRUE(same_state(l, r));
  }
  {  // the decode
    cuda::KvLayer l(fg, 8, s);
    l.append(fi.d_rows.view);
    const fault::ScopedFault f("launch_decode", 1, cudaErrorLaunchOutOfResources);
    EXPECT_EQ(device_error_of([&] { l.decode(fi.q.get(), fi.out.get()); }),
              "launch_decode: too many resources requested for launch");
  }
  {  // a read-back copy
    cuda::KvLayer l(fg, 8, s);
    const fault::ScopedFault f("cudaMemcpy", 1, cudaErrorInvalidValue);
    EXPECT_EQ(device_error_of([&] { (void)l.k_plane_bytes(); }),
              "cudaMemcpyAsync (device to host): invalid argument");
  }
}

TEST_F(CudaFailures, ARebaseWhoseBaseDRestoreFailsTooSaysTheLayerIsUnusable) {
  Stream stream;
  Rng rng(0x0DD);
  const Geometry rg = ring(2, 128, 2000, 40, 16, 4);
  const Inputs ri(rg, 8, rng);
  cuda::KvLayer l(rg, 8, stream.get());
  ref::KvLayer r(rg);
  ring_setup(l, r);
  // base_d written (passes), the move (fails), base_d restored (fails).
  const fault::ScopedFault f("launch_", 2, cudaErrorLaunchOutOfResources, 2);
  EXPECT_EQ(device_error_of([&] { l.append(ri.d_rows.view); }),
            "launch_rebase: too many resources requested for launch; restoring base_d failed too "
            "(launch_set_counters: too many resources requested for launch): the layer is "
            "unusable");
  EXPECT_EQ(fault::fired(), 2);
  EXPECT_EQ(l.len(), r.len());
  EXPECT_EQ(l.base(), r.base());
}

}  // namespace
}  // namespace kvlayer::testing
