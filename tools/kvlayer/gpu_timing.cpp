#include "gpu_timing.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvlayer/cuda/runtime.hpp"

namespace kvlayer::cli {

using cuda::Event;

/// Median of `reps` timed calls of f(i) after `warmup` untimed ones, each bracketed by events.
double median_us(cudaStream_t s, int warmup, int reps, const std::function<void(int)>& f) {
  for (int i = 0; i < warmup; ++i) f(i);
  Event a(true), b(true);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    KVLAYER_CUDA_TRY(cudaEventRecord(a.get(), s));
    f(warmup + i);
    KVLAYER_CUDA_TRY(cudaEventRecord(b.get(), s));
    KVLAYER_CUDA_TRY(cudaEventSynchronize(b.get()));
    float t = 0;
    KVLAYER_CUDA_TRY(cudaEventElapsedTime(&t, a.get(), b.get()));
    ms.push_back(t);
  }
  std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
  return 1000.0 * double(ms[ms.size() / 2]);
}

}  // namespace kvlayer::cli
