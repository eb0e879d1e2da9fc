// Single-thread kernels for the device counters (see counters.hpp).
#include <climits>

#include "counters.hpp"

namespace kvlayer::cuda::detail {
namespace {

__global__ void inc_seqlen_kernel(std::int32_t* len_d, std::int32_t n) {
  *len_d = *len_d > INT_MAX - n ? INT_MAX : *len_d + n;  // the counters are int32 (SPEC §1)
}

__global__ void set_counters_kernel(std::int32_t* len_d, std::int32_t* base_d, long long len,
                                    long long base) {
  if (len >= 0) *len_d = static_cast<std::int32_t>(len);
  if (base >= 0) *base_d = static_cast<std::int32_t>(base);
}

__global__ void batch_inc_seqlen_kernel(const BatchList list, int max_batch, std::int32_t n) {
  const int j = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= max_batch || j >= *list.n_active) return;
  std::int32_t* len_d = list.slots[list.active[j]].len_d;
  *len_d = *len_d > INT_MAX - n ? INT_MAX : *len_d + n;
}

struct ActiveChunk {
  std::int32_t first, count, total;
  bool last;
  std::int32_t entries[kActiveChunk];
};

__global__ void set_active_kernel(std::int32_t* active, std::int32_t* n_active,
                                  const ActiveChunk c) {
  const int i = int(threadIdx.x);
  if (i < c.count) active[c.first + i] = c.entries[i];
  if (c.last && i == 0) *n_active = c.total;
}

}  // namespace

cudaError_t launch_batch_inc_seqlen(const BatchList& list, int max_batch, std::int32_t n,
                                    cudaStream_t stream) {
  constexpr int kThreads = 128;
  batch_inc_seqlen_kernel<<<(max_batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      list, max_batch, n);
  return cudaGetLastError();
}

cudaError_t launch_set_active(std::int32_t* active, std::int32_t* n_active,
                              const std::int32_t* sequences, int count, cudaStream_t stream) {
  int first = 0;
  do {
    ActiveChunk c{};
    c.first = first;
    c.count = count - first < kActiveChunk ? count - first : kActiveChunk;
    c.total = count;
    c.last = first + c.count >= count;
    for (int i = 0; i < c.count; ++i) c.entries[i] = sequences[first + i];
    set_active_kernel<<<1, kActiveChunk, 0, stream>>>(active, n_active, c);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    first += c.count;
  } while (first < count);
  return cudaSuccess;
}

cudaError_t launch_inc_seqlen(std::int32_t* len_d, std::int32_t n, cudaStream_t stream) {
  inc_seqlen_kernel<<<1, 1, 0, stream>>>(len_d, n);
  return cudaGetLastError();
}

cudaError_t launch_set_counters(std::int32_t* len_d, std::int32_t* base_d, std::int64_t len,
                                std::int64_t base, cudaStream_t stream) {
  set_counters_kernel<<<1, 1, 0, stream>>>(len_d, base_d, len, base);
  return cudaGetLastError();
}

}  // namespace kvlayer::cuda::detail
