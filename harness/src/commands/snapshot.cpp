// snapshot: the layer's live rows taken out on both sides and compared (SPEC §13).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int TakeSnapshot::weight(const GenView&) {
  return 1;
}

TakeSnapshot TakeSnapshot::gen(const GenView&, Draw&) {
  return {};
}

/// A snapshot changes nothing.
void TakeSnapshot::apply(ref::KvLayer&) const {}

std::optional<std::string> TakeSnapshot::run(Sides& s) const {
  return s.take_snapshots().diff;
}

}  // namespace kvlayer::harness
