// Owning wrappers for CUDA resources: device memory, streams, events, graphs. Every one is
// released by its destructor on every path (SPEC §9), and none can be copied.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda_check.hpp"

namespace kvlayer::cuda::detail {
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
}  // namespace kvlayer::cuda::detail
