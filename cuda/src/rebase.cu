// The ring's compacting move (SPEC §6), in one kernel for both planes.
//
// NOTE: why this is overlap-safe without a temporary. Destination unit u (16 bytes) takes
// source unit u + S, with S = shift/16 units. Thread r owns every unit ≡ r (mod S), both as a
// destination and as a source, and walks them in increasing order: it reads unit u + S before
// it overwrites that unit at its next step, and no other thread touches units of its class. So
// the result equals a copy through a temporary, with one launch per rebase instead of
// ⌈keep/(retain−base)⌉ non-overlapping memcpys.
#include <algorithm>

#include "rebase.hpp"

namespace kvlayer::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 4096;

struct MoveArgs {
  PlaneMove plane[2];
};

__global__ void __launch_bounds__(kThreads) rebase_kernel(MoveArgs a) {
  const PlaneMove m = a.plane[blockIdx.y];
  const long long stride = m.shift_bytes / 16;  // S, in 16-byte units
  const long long full = m.keep_bytes / 16;     // whole units to move
  const long long units = (m.keep_bytes + 15) / 16;
  const long long classes = stride < units ? stride : units;
  uint4* dst = reinterpret_cast<uint4*>(m.plane);
  const uint4* src = reinterpret_cast<const uint4*>(m.plane + m.shift_bytes);
  for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < classes;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long u = r;
    // Four loads in flight, then four stores: the units loaded are u+S … u+4S, the units
    // stored u … u+3S, so every unit is read before this thread overwrites it.
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
        for (long long i = 16 * u; i < m.keep_bytes; ++i) m.plane[i] = m.plane[i + m.shift_bytes];
      }
    }
  }
}

}  // namespace

cudaError_t launch_rebase(const PlaneMove& k, const PlaneMove& v, cudaStream_t stream) {
  for (const PlaneMove* m : {&k, &v}) {
    if (m->shift_bytes <= 0 || m->shift_bytes % 16 != 0 || m->keep_bytes < 0 ||
        reinterpret_cast<std::uintptr_t>(m->plane) % 16 != 0)
      return cudaErrorInvalidValue;
  }
  const long long classes = std::max(std::min(k.shift_bytes / 16, (k.keep_bytes + 15) / 16),
                                     std::min(v.shift_bytes / 16, (v.keep_bytes + 15) / 16));
  if (classes == 0) return cudaSuccess;  // nothing to keep
  const dim3 grid(static_cast<unsigned>(std::min((classes + kThreads - 1) / kThreads, kMaxBlocks)),
                  2);
  rebase_kernel<<<grid, kThreads, 0, stream>>>(MoveArgs{{k, v}});
  return cudaGetLastError();
}

}  // namespace kvlayer::cuda::detail
