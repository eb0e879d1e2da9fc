// The first key a decode or verify launch attends (SPEC §8, §11): one definition for the host
// checks (kv_layer.cpp, launch.cu) and the device's view (view.cuh).
#pragma once

#include <cuda_runtime_api.h>  // __host__/__device__ for host compilers too

namespace kvlayer::cuda::detail {

/// Query 0's view start: its end is len for a decode (queries ≤ 1) and len − queries + 1 for a
/// verify of `queries` rows; a windowed layer (window > 0) attends the window before that end,
/// from key 0 at the earliest; a layer without one attends from key 0.
__host__ __device__ constexpr long long view_begin(long long len, long long queries,
                                                   long long window) {
  const long long first_end = queries > 1 ? len - queries + 1 : len;
  return window > 0 ? (first_end - window > 0 ? first_end - window : 0) : 0;
}

}  // namespace kvlayer::cuda::detail
