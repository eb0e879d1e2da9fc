// append(n): n host rows drawn from (seed, data), quantized into the layer (SPEC §5, §6).
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Append::weight(const GenView& v) {
  return v.geometry.is_ring() ? 24 : 14;
}

/// A legal n, or one in twenty times one row more than fits.
Append Append::gen(const GenView& v, Draw& d) {
  const bool over = d.in_range(0, 20) == 0;
  const std::int64_t n = over ? v.room() + 1 : d.in_range64(1, v.max_append() + 1);
  return Append{std::max<std::int64_t>(n, over ? 1 : 0), d.seed(), draw_data_kind(d)};
}

void Append::apply(ref::KvLayer& twin) const {
  if (n >= 1 && n <= 4096) twin.append(twin_rows(n));
}

std::optional<std::string> Append::run(Sides& s) const {
  const HostRows rows = s.rows(n, seed, data);
  const std::int64_t first = s.model().len();
  const auto o =
      s.both([&] { s.model().append(view_of(rows)); }, [&] { s.system()->append(rows); });
  if (o.accepted) s.remember_rows(rows, first);
  return o.diff;
}

}  // namespace kvlayer::harness
