// Which sides `kvlayer fuzz` and `kvlayer replay` run: the CUDA layer when this build has it
// and a GPU is present, otherwise the reference alone (said plainly).
#pragma once

#include <string>

#include "kvlayer/harness/generate.hpp"

namespace kvlayer::cli {

struct SystemChoice {
  harness::SystemFactory factory;  ///< empty: reference only
  std::string description;         ///< one line for the user
  std::string sides;               ///< "reference + CUDA" or "reference only"
};

/// Picks the CUDA system when possible (and not `reference_only`).
SystemChoice choose_system(bool reference_only);

}  // namespace kvlayer::cli
