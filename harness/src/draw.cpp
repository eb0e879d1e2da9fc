#include "draw.hpp"

#include <algorithm>
#include <vector>

namespace kvlayer::harness {

DataKind draw_data_kind(Draw& d) {
  return DataKind(d.weighted({{12, int(DataKind::gaussian)},
                              {2, int(DataKind::wide)},
                              {2, int(DataKind::integers)},
                              {2, int(DataKind::ties)},
                              {1, int(DataKind::constant)},
                              {1, int(DataKind::tiny)},
                              {1, int(DataKind::bad)}}));
}

std::int64_t GenView::max_append() const {
  return std::max<std::int64_t>(1, std::min(geometry.is_ring() ? geometry.max_append : 48, room()));
}

std::int64_t GenView::lowest_rewind() const {
  std::int64_t lowest = twin.len();
  while (lowest > 0 && twin.can_rewind_to(lowest - 1)) --lowest;
  return lowest;
}

ref::RowsView twin_rows(std::int64_t n) {
  static const std::vector<std::uint8_t> zeros(4096 * kBlockValues * sizeof(float), 0);
  return ref::RowsView{zeros.data(), zeros.data(), std::min<std::int64_t>(n, 4096), DType::f32};
}

}  // namespace kvlayer::harness
