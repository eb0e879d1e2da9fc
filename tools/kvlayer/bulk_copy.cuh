// Bulk asynchronous copies (the TMA's 1-D form, sm_90) and the shared-memory barriers that
// count their bytes. A producer thread arms a barrier with the bytes it expects, issues copies
// that complete against it, and consumers wait on the barrier's phase parity.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlayer::cli {

/// Shared-memory address of p, as the barrier and copy instructions take it.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// Initializes a barrier expecting `arrivals` arrivals per phase. Call from one thread, then
/// fence_barrier_init() and a block barrier before any other thread or copy uses it.
__device__ __forceinline__ void barrier_init(std::uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals)
               : "memory");
}

/// Makes initialized barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Arrives once and adds `bytes` to the bytes the current phase waits for.
__device__ __forceinline__ void barrier_arrive_expect_bytes(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

/// Arrives once (release: the caller's earlier shared-memory reads are done).
__device__ __forceinline__ void barrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/// Blocks until the phase of parity `parity` has completed (acquire: its copies are visible).
__device__ __forceinline__ void barrier_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

/// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
/// memory on the copy engine; completion counts against `bar`'s expected bytes.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes,
                                                    std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace kvlayer::cli
