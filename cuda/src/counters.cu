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

}  // namespace

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
