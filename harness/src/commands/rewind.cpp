// rewind(to): len (and len_d) moved back; bytes untouched (SPEC §6).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Rewind::weight(const GenView&) {
  return 4;
}

/// Legal, at the limit, or one past it.
Rewind Rewind::gen(const GenView& v, Draw& d) {
  const std::int64_t lowest = v.lowest_rewind(), len = v.twin.len();
  const int how = d.in_range(0, 6);
  if (how == 0) return Rewind{lowest - 1};
  if (how == 1) return Rewind{len + 1};
  if (how == 2) return Rewind{lowest};
  return Rewind{d.in_range64(lowest, len + 1)};
}

void Rewind::apply(ref::KvLayer& twin) const {
  twin.rewind(to);
}

std::optional<std::string> Rewind::run(Sides& s) const {
  const auto o = s.both([&] { s.model().rewind(to); }, [&] { s.system()->rewind(to); });
  if (o.accepted) ++s.stats().rewinds;
  return o.diff;
}

}  // namespace kvlayer::harness
