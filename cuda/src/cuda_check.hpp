// Turns CUDA runtime failures into kvlayer::Error(ErrorKind::device, "<call>: <error string>")
// (SPEC §9). Host code only; kernels never throw.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kvlayer/error.hpp"

#ifdef KVLAYER_FAULT_INJECTION
#include "fault_injection.hpp"
#endif

namespace kvlayer::cuda::detail {

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

}  // namespace kvlayer::cuda::detail

/// Evaluates a CUDA runtime call (or a launcher returning cudaError_t) and throws
/// kvlayer::Error(device) naming it `name` on failure.
/// NOTE: in the fault-injection build (kvlayer_cuda_fault, tests only) an armed fault makes the
/// call return its error without running; the normal build evaluates the call and nothing else.
#ifdef KVLAYER_FAULT_INJECTION
#define KVLAYER_CUDA_TRY_NAMED(call, name)                                                  \
  ::kvlayer::cuda::detail::check_cuda(::kvlayer::cuda::fault::internal::intercept(          \
                                          (name), [&]() -> cudaError_t { return (call); }), \
                                      (name))
#else
#define KVLAYER_CUDA_TRY_NAMED(call, name) ::kvlayer::cuda::detail::check_cuda((call), (name))
#endif

/// Evaluates a CUDA runtime call and throws kvlayer::Error(device) naming it on failure.
#define KVLAYER_CUDA_TRY(call) KVLAYER_CUDA_TRY_NAMED(call, #call)
