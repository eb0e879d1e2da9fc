// GPU timing shared by `kvlayer bench` and `kvlayer probe`.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace kvlayer::cli {

/// Median of `reps` timed calls of f(i) after `warmup` untimed ones, each bracketed by events.
double median_us(cudaStream_t s, int warmup, int reps, const std::function<void(int)>& f);

}  // namespace kvlayer::cli
