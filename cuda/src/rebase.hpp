// Launcher of the ring's compacting move (SPEC §6): both planes' kept rows to the front.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>

namespace kvlayer::cuda::detail {

/// One plane's move: bytes [shift, shift + keep) -> [0, keep), overlapping allowed.
struct PlaneMove {
  std::uint8_t* plane = nullptr;  ///< 16-byte aligned (cudaMalloc gives 256)
  std::int64_t shift_bytes = 0;   ///< (retain − base)·tok_bytes; a multiple of 16
  std::int64_t keep_bytes = 0;    ///< keep·tok_bytes
};

/// Moves every 16-byte unit u ≡ r (mod shift/16) of one plane, in increasing u: the work of
/// thread r of the rebase kernel (rebase.cu says why this is overlap-safe). Host-callable so
/// that a host test can run the classes in any order against memmove.
__host__ __device__ inline void move_class(const PlaneMove& m, std::int64_t r) {
  const std::int64_t stride = m.shift_bytes / 16;  // S, in 16-byte units
  const std::int64_t full = m.keep_bytes / 16;     // whole units to move
  const std::int64_t units = (m.keep_bytes + 15) / 16;
  uint4* dst = reinterpret_cast<uint4*>(m.plane);
  const uint4* src = reinterpret_cast<const uint4*>(m.plane + m.shift_bytes);
  std::int64_t u = r;
  // Four loads in flight, then four stores: the units loaded are u+S … u+4S, the units stored
  // u … u+3S, so every unit is read before this thread overwrites it.
  for (; u + 3 * stride < full; u += 4 * stride) {
    const uint4 t0 = src[u], t1 = src[u + stride], t2 = src[u + 2 * stride],
                t3 = src[u + 3 * stride];
    dst[u] = t0;
    dst[u + stride] = t1;
    dst[u + 2 * stride] = t2;
    dst[u + 3 * stride] = t3;
  }
  for (; u < units; u += stride) {
    if (u < full) {
      dst[u] = src[u];
    } else {  // the last, partial unit: bytes [16u, keep)
      for (std::int64_t i = 16 * u; i < m.keep_bytes; ++i) m.plane[i] = m.plane[i + m.shift_bytes];
    }
  }
}

/// Number of independent classes (threads) of a move.
__host__ __device__ inline std::int64_t move_classes(const PlaneMove& m) {
  const std::int64_t stride = m.shift_bytes / 16, units = (m.keep_bytes + 15) / 16;
  return stride < units ? stride : units;
}

/// Enqueues the move of both planes on `stream`; the result is as if each were copied through
/// a temporary. Returns cudaErrorInvalidValue if a shift is not a multiple of 16 bytes (it
/// always is: retain and base are multiples of 32 rows and token sizes are even).
cudaError_t launch_rebase(const PlaneMove& k, const PlaneMove& v, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
