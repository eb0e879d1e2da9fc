// inc_seqlen: the device counter len_d += 1 (SPEC §7).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int IncSeqlen::weight(const GenView&) {
  return 2;
}

IncSeqlen IncSeqlen::gen(const GenView&, Draw&) {
  return {};
}

void IncSeqlen::apply(ref::KvLayer& twin) const {
  twin.inc_seqlen();
}

std::optional<std::string> IncSeqlen::run(Sides& s) const {
  return s.both([&] { s.model().inc_seqlen(); }, [&] { s.system()->inc_seqlen(); }).diff;
}

}  // namespace kvlayer::harness
