// can_rewind_to(p): whether rewind(p) would be accepted (SPEC §6).
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int CanRewindTo::weight(const GenView&) {
  return 2;
}

/// Around the legal targets, reaching a little past both ends.
CanRewindTo CanRewindTo::gen(const GenView& v, Draw& d) {
  return CanRewindTo{
      d.in_range64(std::max<std::int64_t>(0, v.lowest_rewind() - 3), v.twin.len() + 3)};
}

/// Changes nothing.
void CanRewindTo::apply(ref::KvLayer&) const {}

std::optional<std::string> CanRewindTo::run(Sides& s) const {
  const auto o = s.both([&] { return s.model().can_rewind_to(p); },
                        [&] { return s.system()->can_rewind_to(p); });
  return o.diff;
}

}  // namespace kvlayer::harness
