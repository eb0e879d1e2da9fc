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
  // NOTE: a select, not a.plane[blockIdx.y]: a run-time index would copy the params to the stack.
  const PlaneMove m = blockIdx.y == 0 ? a.plane[0] : a.plane[1];
  const long long classes = move_classes(m);
  for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < classes;
       r += static_cast<long long>(gridDim.x) * blockDim.x)
    move_class(m, r);
}

}  // namespace

cudaError_t launch_rebase(const PlaneMove& k, const PlaneMove& v, cudaStream_t stream) {
  for (const PlaneMove* m : {&k, &v}) {
    if (m->shift_bytes <= 0 || m->shift_bytes % 16 != 0 || m->keep_bytes < 0 ||
        reinterpret_cast<std::uintptr_t>(m->plane) % 16 != 0)
      return cudaErrorInvalidValue;
  }
  const long long classes = std::max(move_classes(k), move_classes(v));
  if (classes == 0) return cudaSuccess;  // nothing to keep
  const dim3 grid(static_cast<unsigned>(std::min((classes + kThreads - 1) / kThreads, kMaxBlocks)),
                  2);
  rebase_kernel<<<grid, kThreads, 0, stream>>>(MoveArgs{{k, v}});
  return cudaGetLastError();
}

}  // namespace kvlayer::cuda::detail
