// Turns CUDA runtime failures into kvlayer::Error(ErrorKind::device, "<call>: <error string>")
// (SPEC §9). Host code only; kernels never throw.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kvlayer/error.hpp"

namespace kvlayer::cuda::detail {

/// Throws kvlayer::Error(device) naming `call` when `err` is not cudaSuccess.
inline void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::device, std::string(call) + ": " + cudaGetErrorString(err));
}

}  // namespace kvlayer::cuda::detail

/// Evaluates a CUDA runtime call and throws kvlayer::Error(device) naming it on failure.
#define KVLAYER_CUDA_TRY(call) ::kvlayer::cuda::detail::check_cuda((call), #call)
