// Bulk asynchronous copies (sm_90 cp.async.bulk, the copy engine behind TMA) and the mbarriers
// that count their bytes: the decode's bulk instance (decode/decode_mma_direct.cu) fills a
// per-warp ring of shared-memory stages with them, and `kvlayer probe` (tools/kvlayer) times
// access patterns with them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlayer::cuda::detail {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// Initialises the mbarrier at `bar` (shared) for `count` arrivals per phase, and makes the
/// initialisation visible to the copy engine (the async proxy) before any copy signals it.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// One arrival on `bar` that also expects `bytes` more bytes of copies in its current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}

/// One arrival on `bar` (release: the caller's earlier shared-memory reads are done).
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

/// Waits until the phase of `bar` with parity `parity` has completed (its arrivals and bytes;
/// acquire: the copies counted on it are visible).
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
  const unsigned a = shared_address(bar);
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (done == 0);
}

/// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
/// memory on the copy engine; completion is counted in bytes on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

/// Copies the box at element coordinates (x, y) of the 2-D tensor map `map` (a kernel
/// parameter: __grid_constant__) to shared memory on the copy engine, counted on `bar`.
__device__ __forceinline__ void tensor_copy_2d_to_shared(void* dst, const void* map, int x, int y,
                                                         std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(shared_address(bar))
      : "memory");
}

}  // namespace kvlayer::cuda::detail
