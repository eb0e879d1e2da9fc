// Programmatic dependent launch (sm_90) between the split grid and the merge.
#pragma once

#include <cuda_runtime.h>

namespace kvlayer::cuda::detail::decode_impl {

/// Split kernels: lets the merge grid, launched with programmatic stream serialization, be
/// scheduled before this grid ends (its blocks then take SM slots as split blocks retire).
/// NOTE: no ordering is given up: the merge waits in wait_for_split_grid for this whole grid.
__device__ __forceinline__ void allow_merge_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/// Merge kernel: waits until the split grid has completed and its writes are visible.
__device__ __forceinline__ void wait_for_split_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

}  // namespace kvlayer::cuda::detail::decode_impl
