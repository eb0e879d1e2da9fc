// physical_rows(start, end): where logical rows [start, end) are stored (SPEC §6).
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int PhysicalRows::weight(const GenView&) {
  return 2;
}

/// Around the resident rows, reaching a little past both ends.
PhysicalRows PhysicalRows::gen(const GenView& v, Draw& d) {
  const std::int64_t base = v.twin.base(), len = v.twin.len();
  const std::int64_t a = d.in_range64(std::max<std::int64_t>(0, base - 2), len + 2);
  const std::int64_t b = d.in_range64(a - 1, std::min(len, base + v.geometry.rows()) + 3);
  return PhysicalRows{a, b};
}

/// Changes nothing.
void PhysicalRows::apply(ref::KvLayer&) const {}

std::optional<std::string> PhysicalRows::run(Sides& s) const {
  const auto o = s.both([&] { return s.model().physical_rows(start, end); },
                        [&] { return s.system()->physical_rows(start, end); });
  return o.diff;
}

}  // namespace kvlayer::harness
