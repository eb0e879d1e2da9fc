// cp.async wrappers (sm_80+), shared by the decode's staged kernels and the append.
#pragma once

#include <cuda_runtime.h>

namespace kvlayer::cuda::detail {

/// Copies kBytes (4, 8 or 16) from global to shared memory asynchronously. 16-byte copies use
/// .cg (through L2 only: the data is read once); smaller ones .ca.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(kBytes));
  }
}

/// Closes the calling thread's current group of copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most kPending of the calling thread's groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace kvlayer::cuda::detail
