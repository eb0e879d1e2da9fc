// The injector of fault_injection.hpp: one process-wide armed fault, the call trace and the
// live-buffer table. Compiled into kvlayer_cuda_fault only.
#include "fault_injection.hpp"

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace kvlayer::cuda::fault {
namespace {

struct Injector {
  std::mutex mutex;
  bool armed = false;
  std::string call;       ///< substring to match; empty matches every call
  int until_first = 0;    ///< matching calls still to pass before the first failure
  int failures_left = 0;  ///< failures still to inject
  int fired = 0;          ///< failures injected since arm()
  cudaError_t error = cudaSuccess;
  std::vector<std::string> trace;
  std::unordered_map<void*, std::size_t> live;
};

Injector& injector() {
  static Injector i;
  return i;
}

}  // namespace

void arm(const std::string& call, int nth, cudaError_t error, int times) {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  i.armed = nth >= 1 && times >= 1 && error != cudaSuccess;
  i.call = call;
  i.until_first = nth - 1;
  i.failures_left = times;
  i.fired = 0;
  i.error = error;
}

void disarm() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  i.armed = false;
}

int fired() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  return i.fired;
}

std::vector<std::string> trace() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  return i.trace;
}

void clear_trace() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  i.trace.clear();
}

std::int64_t live_buffers() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  return std::int64_t(i.live.size());
}

std::size_t live_bytes() {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  std::size_t n = 0;
  for (const auto& [p, bytes] : i.live) n += bytes;
  return n;
}

namespace internal {

cudaError_t injected(const char* call) {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  i.trace.emplace_back(call);
  if (!i.armed || i.failures_left == 0) return cudaSuccess;
  if (!i.call.empty() && std::strstr(call, i.call.c_str()) == nullptr) return cudaSuccess;
  if (i.until_first > 0) {
    --i.until_first;
    return cudaSuccess;
  }
  --i.failures_left;
  ++i.fired;
  return i.error;
}

void note_alloc(void* p, std::size_t bytes) {
  Injector& i = injector();
  const std::lock_guard lock(i.mutex);
  i.live[p] = bytes;
}

cudaError_t tracked_free(void* p) {
  {
    Injector& i = injector();
    const std::lock_guard lock(i.mutex);
    i.live.erase(p);
  }
  return cudaFree(p);
}

}  // namespace internal
}  // namespace kvlayer::cuda::fault
