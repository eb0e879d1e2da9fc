// The committed golden data, loaded once per test process.
#pragma once

#include <string>
#include <vector>

#include "kvlayer/golden/golden.hpp"

namespace kvlayer::testing {

/// The golden set from the source tree, or nullptr (with load_error() set) if it cannot load.
const kvlayer::golden::GoldenSet* golden_set();
/// Why golden_set() returned nullptr.
const std::string& load_error();

}  // namespace kvlayer::testing
