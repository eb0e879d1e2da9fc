// Launchers for the device counters len_d and base_d (SPEC §5–7): the single-thread kernels
// that keep them in step with the host, stream-ordered and capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvlayer::cuda::detail {

/// *len_d += 1, saturating at INT32_MAX like the reference model (one thread; capturable).
/// len_d += n (n ≥ 1), saturating below INT32_MAX + 1 (the counter's type; SPEC §1).
cudaError_t launch_inc_seqlen(std::int32_t* len_d, std::int32_t n, cudaStream_t stream);

/// Stream-ordered counter writes from host operations: *len_d = len when len ≥ 0, and
/// *base_d = base when base ≥ 0 (a negative value leaves that counter alone).
/// NOTE: a kernel with the values as arguments rather than a host-to-device copy: it needs no
/// pinned host staging, stays ordered with the kernels around it, and is legal under capture.
cudaError_t launch_set_counters(std::int32_t* len_d, std::int32_t* base_d, std::int64_t len,
                                std::int64_t base, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
