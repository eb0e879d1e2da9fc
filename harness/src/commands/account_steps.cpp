// account_steps(k): the host's len catches up with k device-counter steps (SPEC §7).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

/// Drawn only when due.
int AccountSteps::weight(const GenView&) {
  return 0;
}

/// The steps not yet accounted for.
AccountSteps AccountSteps::gen(const GenView& v, Draw&) {
  return AccountSteps{v.twin.len_d() - v.twin.len()};
}

/// Three times in four while device-counter steps are not accounted for.
std::optional<AccountSteps> AccountSteps::due(const GenView& v, Draw& d) {
  if (v.twin.len_d() > v.twin.len() && d.in_range(0, 3) != 0) return gen(v, d);
  return std::nullopt;
}

void AccountSteps::apply(ref::KvLayer& twin) const {
  twin.account_steps(k);
}

std::optional<std::string> AccountSteps::run(Sides& s) const {
  return s.both([&] { s.model().account_steps(k); }, [&] { s.system()->account_steps(k); }).diff;
}

}  // namespace kvlayer::harness
