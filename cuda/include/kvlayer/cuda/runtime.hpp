// CUDA runtime plumbing shared by the layer, its tools and tests: CUDA failures as
// kvlayer::Error (kind device, "<call>: <error string>", SPEC §9), owning wrappers for
// device memory, streams, events and graphs, each released by its destructor on every path and
// none copyable, and a scoped current device (DeviceGuard). Host code only; kernels never throw.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <string>
#include <utility>

#include "kvlayer/error.hpp"

// NOTE: only the fault-injection build of the layer (kvlayer_cuda_fault, tests) defines
// KVLAYER_FAULT_INJECTION, privately; a consumer of this header never sees that branch.
#ifdef KVLAYER_FAULT_INJECTION
#include "fault_injection.hpp"
#endif

namespace kvlayer::cuda {

/// Throws kvlayer::Error(device) naming `call` when `err` is not cudaSuccess.
/// NOTE: the runtime also keeps a failed call's error as its "last error", which the launchers
/// return after every launch (cudaGetLastError): it is cleared here, so that a caught failure
/// (say an out-of-memory construction) is not reported again by the next, unrelated launch.
/// Sticky errors stay: every later call reports them.
inline void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(ErrorKind::device, std::string(call) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace kvlayer::cuda

/// Evaluates a CUDA runtime call (or a launcher returning cudaError_t) and throws
/// kvlayer::Error(device) naming it `name` on failure.
/// NOTE: in the fault-injection build (kvlayer_cuda_fault, tests only) an armed fault makes the
/// call return its error without running; the normal build evaluates the call and nothing else.
#ifdef KVLAYER_FAULT_INJECTION
#define KVLAYER_CUDA_TRY_NAMED(call, name)                                          \
  ::kvlayer::cuda::check_cuda(::kvlayer::cuda::fault::internal::intercept(          \
                                  (name), [&]() -> cudaError_t { return (call); }), \
                              (name))
#else
#define KVLAYER_CUDA_TRY_NAMED(call, name) ::kvlayer::cuda::check_cuda((call), (name))
#endif

/// Evaluates a CUDA runtime call and throws kvlayer::Error(device) naming it on failure.
#define KVLAYER_CUDA_TRY(call) KVLAYER_CUDA_TRY_NAMED(call, #call)

namespace kvlayer::cuda {
// The fault-injection build compiles these classes with armable checks (cuda_check.hpp): a
// namespace of their own keeps the linker from merging them with the normal build's inline
// definitions in a test that uses both.
#ifdef KVLAYER_FAULT_INJECTION
inline namespace fault_injection {
#endif

/// Owns one handle; `Free` releases it. Destructors ignore errors: they cannot throw, and a
/// failed release after a sticky device error has nothing left to protect.
template <typename Handle, cudaError_t (*Free)(Handle)>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(Handle h) : h_(h) {}
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, Handle{})) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, Handle{});
    }
    return *this;
  }
  ~UniqueHandle() { reset(); }

  Handle get() const { return h_; }
  explicit operator bool() const { return h_ != Handle{}; }
  /// Releases the handle now (no-op when empty).
  void reset() {
    if (h_ != Handle{}) (void)Free(std::exchange(h_, Handle{}));
  }

 private:
  Handle h_{};
};

/// cudaMalloc'd bytes; size 0 allocates nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    KVLAYER_CUDA_TRY(cudaMalloc(&p, bytes));
#ifdef KVLAYER_FAULT_INJECTION
    ::kvlayer::cuda::fault::internal::note_alloc(p, bytes);
#endif
    mem_ = Memory(p);
  }
  void* get() const {
    return mem_.get();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(mem_.get());
  }
  std::size_t bytes() const {
    return bytes_;
  }

 private:
#ifdef KVLAYER_FAULT_INJECTION
  using Memory = UniqueHandle<void*, ::kvlayer::cuda::fault::internal::tracked_free>;
#else
  using Memory = UniqueHandle<void*, cudaFree>;
#endif
  Memory mem_;
  std::size_t bytes_ = 0;
};

/// A non-blocking stream.
class Stream {
 public:
  Stream() {
    cudaStream_t s = nullptr;
    KVLAYER_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    s_ = Handle(s);
  }
  cudaStream_t get() const { return s_.get(); }

 private:
  using Handle = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
  Handle s_;
};

/// An event (timing disabled unless asked for).
class Event {
 public:
  explicit Event(bool timing = false) {
    cudaEvent_t e = nullptr;
    KVLAYER_CUDA_TRY(
        cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    e_ = Handle(e);
  }
  cudaEvent_t get() const { return e_.get(); }

 private:
  using Handle = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
  Handle e_;
};

/// Makes `device` the calling thread's current device for its lifetime and then restores the
/// device that was current before, also when the scope is left by an exception.
/// NOTE: cudaSetDevice is called only when the current device differs, so that the common
/// single-device case costs one cudaGetDevice (a thread-local read). Neither call is a stream
/// operation: both are legal while a stream is being captured. The restore cannot report a
/// failure (a destructor); it can only fail when the context is already broken.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KVLAYER_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) {
      KVLAYER_CUDA_TRY(cudaSetDevice(device));
      switched_ = true;
    }
  }
  /// For destructors: the same without throwing; on a failure the device stays as it was.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
      // A failed switch is left as the last error: cleared here. A guard that switches nothing
      // leaves the caller's own last error alone.
      if (!switched_) (void)cudaGetLastError();
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// The tail of the refusal of a stream that belongs to another device than the layer's:
/// "stream is on device S but the layer is on device L".
inline std::string stream_device_mismatch(int stream_device, int layer_device) {
  return "stream is on device " + std::to_string(stream_device) + " but the layer is on device " +
         std::to_string(layer_device);
}

/// The device `stream` belongs to, or `current` for the legacy, per-thread and null streams
/// (they resolve to whichever device is current when work is enqueued).
inline int stream_device(cudaStream_t stream, int current) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return current;
  int device = current;
  KVLAYER_CUDA_TRY(cudaStreamGetDevice(stream, &device));
  return device;
}

/// A captured graph and its executable instance.
class Graph {
 public:
  Graph() = default;
  /// Ends the capture begun on `stream` and instantiates the graph.
  static Graph end_capture(cudaStream_t stream) {
    Graph g;
    cudaGraph_t graph = nullptr;
    KVLAYER_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    g.graph_ = GraphHandle(graph);
    cudaGraphExec_t exec = nullptr;
    KVLAYER_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    g.exec_ = ExecHandle(exec);
    return g;
  }
  /// Enqueues one replay on `stream`.
  void launch(cudaStream_t stream) const { KVLAYER_CUDA_TRY(cudaGraphLaunch(exec_.get(), stream)); }
  /// Number of nodes in the captured graph.
  std::size_t node_count() const {
    std::size_t n = 0;
    KVLAYER_CUDA_TRY(cudaGraphGetNodes(graph_.get(), nullptr, &n));
    return n;
  }

 private:
  using GraphHandle = UniqueHandle<cudaGraph_t, cudaGraphDestroy>;
  using ExecHandle = UniqueHandle<cudaGraphExec_t, cudaGraphExecDestroy>;
  GraphHandle graph_;
  ExecHandle exec_;
};

#ifdef KVLAYER_FAULT_INJECTION
}  // namespace fault_injection
#endif
}  // namespace kvlayer::cuda
