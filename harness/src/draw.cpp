#include "draw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::harness {

DataKind draw_data_kind(Draw& d) {
  return DataKind(d.weighted({{12, int(DataKind::gaussian)},
                              {2, int(DataKind::wide)},
                              {2, int(DataKind::integers)},
                              {2, int(DataKind::ties)},
                              {1, int(DataKind::constant)},
                              {1, int(DataKind::tiny)},
                              {1, int(DataKind::bad)},
                              {2, int(DataKind::needles)}}));
}

std::optional<float> draw_scale(const GenView& v, Draw& d) {
  if (d.in_range(0, 2) == 0) return std::nullopt;
  // A power-of-two scale folds into an fp16 operand without rounding, so it hides kernels that
  // apply the scale at the wrong precision; at head dims 64 and 256 the default is one. The
  // factor 2^u, u = (2k + 1)/1024 − 1, is never 1 or 2^±1/2, so the product is a power of two
  // neither at those head dims nor at 128 (default ≈ 2^−3.5).
  const int k = d.in_range(0, 1024);
  const float def = ref::default_scale(v.geometry.head_dim_k);
  float s = float(double(def) * std::exp2(double(2 * k + 1) / 1024.0 - 1.0));
  int e = 0;
  // Other head dims (replayed or future geometries) could still land on one: step off it by
  // 3/2 or 3/4, staying within the factor's range.
  if (std::frexp(s, &e) == 0.5f) s *= s < def ? 1.5f : 0.75f;
  return s;
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
  static const std::vector<std::uint8_t> zeros(kTwinRows * kBlockValues * sizeof(float), 0);
  return ref::RowsView{zeros.data(), zeros.data(), std::min(n, kTwinRows), DType::f32};
}

}  // namespace kvlayer::harness
