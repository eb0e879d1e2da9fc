#include "system_choice.hpp"

#ifdef KVLAYER_WITH_CUDA
#include "kvlayer/harness/cuda_system.hpp"
#endif

namespace kvlayer::cli {

SystemChoice choose_system(bool reference_only) {
  if (reference_only)
    return {{}, "CUDA side skipped (--reference-only): the reference runs alone", "reference only"};
#ifdef KVLAYER_WITH_CUDA
  if (harness::cuda_device_available())
    return {harness::cuda_system_factory(),
            "comparing the reference (model) with the CUDA KvLayer (system) after every command",
            "reference + CUDA"};
  return {{},
          "CUDA side SKIPPED: no CUDA device found; the reference runs alone (its invariants "
          "and an independent float64 recomputation of decodes)",
          "reference only (no GPU)"};
#else
  return {{},
          "CUDA side SKIPPED: this build has no CUDA layer; the reference runs alone",
          "reference only (built without CUDA)"};
#endif
}

}  // namespace kvlayer::cli
