// Layout facts of the device planes shared by the layer and its kernels.
#pragma once

#include <cstddef>

namespace kvlayer::cuda::detail {

/// Zeroed bytes allocated past the last row of each plane, so that a kernel may issue 16-byte
/// vector loads that run past a row's end (SPEC §1); never part of any row.
inline constexpr std::size_t kPlaneTailBytes = 256;

}  // namespace kvlayer::cuda::detail
