// What a batch launch (SPEC §12) reads of its sequences: one slot per sequence (its layer's
// planes, counters and status) and the active list, all in device memory, so that a replayed
// graph reads the list of the moment. Shared by the batch's append, counter and decode kernels.
#pragma once

#include <cuda_runtime_api.h>  // __host__/__device__ for host compilers too

#include <cstdint>

#include "device_status.cuh"

namespace kvlayer::cuda::detail {

/// One sequence of a batch as its kernels read it.
struct SequenceSlot {
  std::uint8_t* k_plane;
  std::uint8_t* v_plane;
  std::int32_t* len_d;
  std::int32_t* base_d;
  DeviceStatus* status;
};

/// The batch's device table: slots[max_batch], and the active list: position j < *n_active
/// works for sequence active[j].
struct BatchList {
  const SequenceSlot* slots;
  const std::int32_t* active;
  const std::int32_t* n_active;
};

}  // namespace kvlayer::cuda::detail
