// Device helpers for `kvlayer bench`: the streaming-read ceiling kernel and a random filler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvlayer::cli {

/// Reads `bytes` (a multiple of 16) once with 16-byte loads; writes one word per block into
/// `sink` so the loads cannot be dropped. The memory-bandwidth ceiling the bench reports.
cudaError_t launch_stream_read(const void* data, std::size_t bytes, unsigned* sink, int blocks,
                               cudaStream_t stream);

/// Fills n floats with N(0,1)-like values from a counter-based hash of (seed, index).
cudaError_t launch_fill_random(float* out, std::size_t n, std::uint64_t seed, cudaStream_t stream);

}  // namespace kvlayer::cli
