// status: the sticky status compared on both sides, then cleared on both.
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int StatusQuery::weight(const GenView&) {
  return 1;
}

StatusQuery StatusQuery::gen(const GenView&, Draw&) {
  return {};
}

/// Clears only the status, which the generator does not draw by.
void StatusQuery::apply(ref::KvLayer&) const {}

std::optional<std::string> StatusQuery::run(Sides& s) const {
  std::optional<std::string> diff;
  if (s.system() && !(s.system()->snapshot().status == s.model().status()))
    diff = "status differs:\n  model:  " + s.model().status().message() +
           "\n  system: " + s.system()->snapshot().status.message();
  s.model().clear_status();
  if (s.system()) s.system()->clear_status();
  return diff;
}

}  // namespace kvlayer::harness
