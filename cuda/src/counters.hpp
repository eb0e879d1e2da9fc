// Launchers for the device counters len_d and base_d (SPEC §5–7): the single-thread kernels
// that keep them in step with the host, stream-ordered and capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "batch_slots.hpp"

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

/// A batch's inc_seqlen (SPEC §12): len_d += n for the sequence of every position of the active
/// list (as launch_inc_seqlen; one thread per position of max_batch).
cudaError_t launch_batch_inc_seqlen(const BatchList& list, int max_batch, std::int32_t n,
                                    cudaStream_t stream);

/// Writes a batch's active list, stream-ordered: active[j] = sequences[j], then *n_active =
/// count. Kernels with the entries as arguments (as launch_set_counters), kActiveChunk a
/// launch; the count goes with the last (a list of none is one launch).
inline constexpr int kActiveChunk = 256;
cudaError_t launch_set_active(std::int32_t* active, std::int32_t* n_active,
                              const std::int32_t* sequences, int count, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
