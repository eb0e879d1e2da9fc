// Launcher of the ring's compacting move (SPEC §6): both planes' kept rows to the front.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvlayer::cuda::detail {

/// One plane's move: bytes [shift, shift + keep) -> [0, keep), overlapping allowed.
struct PlaneMove {
  std::uint8_t* plane = nullptr;  ///< 16-byte aligned (cudaMalloc gives 256)
  std::int64_t shift_bytes = 0;   ///< (retain − base)·tok_bytes; a multiple of 16
  std::int64_t keep_bytes = 0;    ///< keep·tok_bytes
};

/// Enqueues the move of both planes on `stream`; the result is as if each were copied through
/// a temporary. Returns cudaErrorInvalidValue if a shift is not a multiple of 16 bytes (it
/// always is: retain and base are multiples of 32 rows and token sizes are even).
cudaError_t launch_rebase(const PlaneMove& k, const PlaneMove& v, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
