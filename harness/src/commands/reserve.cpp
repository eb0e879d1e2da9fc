// reserve(k): the next k single-row appends made contiguous, rebasing now if needed (SPEC §7).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Reserve::weight(const GenView&) {
  return 3;
}

/// A k that fits, or one in ten times one more than the rows left.
Reserve Reserve::gen(const GenView& v, Draw& d) {
  const bool over = d.in_range(0, 10) == 0;
  return Reserve{over ? v.room() + 1 : d.in_range64(0, v.max_append() + 1)};
}

void Reserve::apply(ref::KvLayer& twin) const {
  twin.reserve(k);
}

std::optional<std::string> Reserve::run(Sides& s) const {
  return s.both([&] { s.model().reserve(k); }, [&] { s.system()->reserve(k); }).diff;
}

}  // namespace kvlayer::harness
