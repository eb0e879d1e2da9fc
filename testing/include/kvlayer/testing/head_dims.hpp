// Head dims for refusal tests, from the one table (cuda::kSupportedHeadDims; header-only, so the
// including target needs cuda/include on its path, as every CUDA test and the CLI test have).
#pragma once

#include "kvlayer/cuda/limits.hpp"

namespace kvlayer::testing {

/// The smallest head dim of whole q8_0 blocks that the CUDA kernels are not built for.
inline int unsupported_head_dim() {
  int d = 32;
  while (cuda::head_dim_supported(d)) d += 32;
  return d;
}

}  // namespace kvlayer::testing
