#include "kvlayer/testing/snapshot.hpp"

#include <bit>

namespace kvlayer::testing {

Snapshot snapshot(const ref::KvLayer& layer) {
  Snapshot s;
  s.k_plane = layer.k_plane();
  s.v_plane = layer.v_plane();
  s.len = layer.len();
  s.len_d = layer.len_d();
  s.base = layer.base();
  s.base_d = layer.base_d();
  s.status = layer.status();
  return s;
}

bool same_status(const LayerStatus& a, const LayerStatus& b) {
  if (a.device_error != b.device_error) return false;
  if (a.data_error.has_value() != b.data_error.has_value()) return false;
  if (!a.data_error) return true;
  const DataError &x = *a.data_error, &y = *b.data_error;
  return x.row == y.row && x.plane == y.plane && x.block == y.block &&
         std::bit_cast<std::uint32_t>(x.value) == std::bit_cast<std::uint32_t>(y.value);
}

}  // namespace kvlayer::testing
