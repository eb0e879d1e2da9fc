// Fault injection for the failure-path tests (tests/layer/test_failures_cuda.cpp). Only the
// kvlayer_cuda_fault library is built with KVLAYER_FAULT_INJECTION: there every CUDA call that
// KVLAYER_CUDA_TRY / KVLAYER_CUDA_TRY_NAMED checks asks this injector first, and an armed fault
// makes the call return its error WITHOUT running (a failed call has no effect), so that the
// error takes the same checking path (check_cuda) as a real one. The layer's DeviceBuffers are
// also counted, for an exact leak check. kvlayer_cuda compiles none of this.
// NOTE: a test links kvlayer_cuda_fault INSTEAD of kvlayer_cuda and calls these functions; it
// need not (and should not) define KVLAYER_FAULT_INJECTION itself.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvlayer::cuda::fault {

/// Arms one fault: counting from now, the `nth` (1-based) checked call whose call text contains
/// `call` (every call when `call` is empty), and the `times` − 1 matching calls after it, return
/// `error` instead of running. Replaces any fault armed before.
void arm(const std::string& call, int nth, cudaError_t error, int times = 1);
/// Disarms the fault, fired or not.
void disarm();
/// How many calls the armed fault has failed so far.
int fired();

/// The texts of the checked calls since the last clear_trace(), in order, failed ones included
/// (for a test to enumerate the call sites of an operation).
std::vector<std::string> trace();
void clear_trace();

/// Device buffers allocated by the layer's DeviceBuffers and not freed yet, and their bytes.
std::int64_t live_buffers();
std::size_t live_bytes();

/// Arms a fault for one scope.
class ScopedFault {
 public:
  ScopedFault(const std::string& call, int nth, cudaError_t error, int times = 1) {
    arm(call, nth, error, times);
  }
  ~ScopedFault() { disarm(); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
};

namespace internal {

/// Records `call` in the trace; returns the armed fault's error if this call is to fail, else
/// cudaSuccess.
cudaError_t injected(const char* call);

/// `f()` (the CUDA call), unless the armed fault fails `call`: then its error, and f never runs.
template <typename F>
cudaError_t intercept(const char* call, F&& f) {
  const cudaError_t e = injected(call);
  return e != cudaSuccess ? e : f();
}

/// DeviceBuffer's bookkeeping: a successful cudaMalloc, and the free that releases it.
void note_alloc(void* p, std::size_t bytes);
cudaError_t tracked_free(void* p);

}  // namespace internal
}  // namespace kvlayer::cuda::fault
