// CUDA failures of snapshot() and restore() (kv_layer.hpp, "CUDA failures"), on the
// fault-injection build (kvlayer_cuda_fault): each checked CUDA call is failed in turn, the
// failed call not running. A failed restore leaves the layer fresh, all zero (planes, tails,
// counters) as the reference's fresh layer, and a retry then restores it; a failed undo says
// the layer is unusable; a failed snapshot changes nothing and a retry gives the reference's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "fault_injection.hpp"
#include "kvlayer/snapshot.hpp"

namespace kvlayer::testing {
namespace {

namespace fault = cuda::fault;
using cuda::Stream;

constexpr const char* kGuard = "cudaGetDevice(&previous_)";
constexpr const char* kUpload = "cudaMemcpyAsync (host to device)";
constexpr const char* kDownload = "cudaMemcpyAsync (device to host)";
constexpr const char* kSync = "cudaStreamSynchronize";
constexpr const char* kCounters = "launch_set_counters";

cudaError_t error_for(const std::string& call) {
  return call.rfind("launch_", 0) == 0 ? cudaErrorLaunchOutOfResources : cudaErrorInvalidValue;
}

::testing::AssertionResult tails_zero(const cuda::KvLayer& l) {
  for (const auto& t : {l.k_plane_tail_bytes(), l.v_plane_tail_bytes()})
    for (std::uint8_t b : t)
      if (b != 0) return ::testing::AssertionFailure() << "a plane tail is not zero";
  return ::testing::AssertionSuccess();
}

class CudaSnapshotFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    KVLAYER_REQUIRE_GPU();
    fault::disarm();
    fault::clear_trace();
  }
  void TearDown() override { fault::disarm(); }

  /// A ring snapshot of 150 rows (first 96 for window 40) from the reference.
  static kvlayer::Snapshot ring_snapshot(const Geometry& g) {
    ref::KvLayer l(g);
    Rng rng(0xFA17);
    while (l.len() < 150)
      l.append(make_rows(g, std::min<std::int64_t>(4, 150 - l.len()), DType::f32, Fill::random, rng)
                   .view());
    return l.snapshot();
  }
};

TEST_F(CudaSnapshotFailures, ARestoreFailingAtEachCallLeavesAFreshLayer) {
  const Geometry g = ring(2, 64, 1000, 40, 4, 2);
  const kvlayer::Snapshot s = ring_snapshot(g);
  Stream stream;
  ref::KvLayer fresh(g), restored(g);
  restored.restore(s);
  {
    cuda::KvLayer gpu(g, 4, stream.get());
    fault::clear_trace();
    gpu.restore(s);
    ASSERT_EQ(fault::trace(),
              (std::vector<std::string>{kGuard, kUpload, kUpload, kCounters, kSync}));
    ASSERT_TRUE(same_state(gpu, restored));
  }
  const std::vector<std::string> calls = {kGuard, kUpload, kUpload, kCounters, kSync};
  for (std::size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE("failing checked call " + std::to_string(i + 1) + ": " + calls[i]);
    cuda::KvLayer gpu(g, 4, stream.get());
    const cudaError_t e = error_for(calls[i]);
    std::string m;
    {
      const fault::ScopedFault f("", int(i) + 1, e);
      m = device_error_of([&] { gpu.restore(s); });
      EXPECT_EQ(fault::fired(), 1);
    }
    EXPECT_EQ(m, calls[i] + ": " + cudaGetErrorString(e));
    EXPECT_TRUE(gpu.fresh());
    EXPECT_EQ(gpu.len(), 0);
    EXPECT_EQ(gpu.base(), 0);
    EXPECT_TRUE(same_state(gpu, fresh)) << "every byte and counter zero again";
    EXPECT_TRUE(tails_zero(gpu));
    gpu.restore(s);
    EXPECT_TRUE(same_state(gpu, restored)) << "the restore retried";
  }
}

TEST_F(CudaSnapshotFailures, AFailedUndoSaysTheLayerIsUnusable) {
  const Geometry g = ring(2, 64, 1000, 40, 4, 2);
  const kvlayer::Snapshot s = ring_snapshot(g);
  Stream stream;
  cuda::KvLayer gpu(g, 4, stream.get());
  // The V upload fails, and so does the first call of the undo (zeroing the K rows).
  std::string m;
  {
    const fault::ScopedFault f("", 3, cudaErrorInvalidValue, 2);
    m = device_error_of([&] { gpu.restore(s); });
  }
  EXPECT_EQ(m, std::string(kUpload) +
                   ": invalid argument; undoing the partial restore failed "
                   "too (cudaMemsetAsync(k_dst, 0, snap.k.size(), s.stream): "
                   "invalid argument): the layer is unusable");
}

TEST_F(CudaSnapshotFailures, ASnapshotFailingAtEachCallChangesNothing) {
  const Geometry g = ring(2, 64, 1000, 40, 4, 2);
  const kvlayer::Snapshot s = ring_snapshot(g);
  Stream stream;
  cuda::KvLayer gpu(g, 4, stream.get());
  ref::KvLayer ref(g);
  gpu.restore(s);
  ref.restore(s);
  fault::clear_trace();
  (void)gpu.snapshot();
  const std::vector<std::string> calls = {kGuard,    kGuard, kDownload, kSync,
                                          kDownload, kSync,  kDownload, kSync};
  ASSERT_EQ(fault::trace(), calls);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE("failing checked call " + std::to_string(i + 1) + ": " + calls[i]);
    std::string m;
    {
      const fault::ScopedFault f("", int(i) + 1, cudaErrorInvalidValue);
      m = device_error_of([&] { (void)gpu.snapshot(); });
    }
    EXPECT_EQ(m, calls[i] + ": invalid argument");
    EXPECT_TRUE(same_state(gpu, ref));
    const kvlayer::Snapshot again = gpu.snapshot();
    EXPECT_EQ(again.k, s.k);
    EXPECT_EQ(again.v, s.v);
    EXPECT_EQ(again.len, s.len);
  }
}

}  // namespace
}  // namespace kvlayer::testing
