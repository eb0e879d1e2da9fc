// A layer's whole state as the tests and the harness compare it (SPEC §9, §10.1): plane bytes,
// counters and status. The CUDA layer's snapshot is in cuda_snapshot.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::testing {

/// Everything a comparison of two layers looks at.
struct Snapshot {
  std::vector<std::uint8_t> k_plane, v_plane;
  /// The padding past each plane's last row (vector loads may read it): must stay all zero.
  /// Empty unless read (a GPU layer's snapshot with Tails::read).
  std::vector<std::uint8_t> k_tail, v_tail;
  std::int64_t len = 0, len_d = 0, base = 0, base_d = 0;
  LayerStatus status;
};

/// The reference layer's state.
Snapshot snapshot(const ref::KvLayer& layer);

/// Bitwise equality of two statuses (DataError::value by its bits, so that a NaN report equals
/// itself). Written out rather than using LayerStatus::operator== so that a comparison does not
/// rest on the code under test.
bool same_status(const LayerStatus& a, const LayerStatus& b);

}  // namespace kvlayer::testing
