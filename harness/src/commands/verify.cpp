// decode_rows: a host-len verify decode of t queries (SPEC §11), each row compared with the
// reference within the bound of its own causal view; illegal t and views refused alike.
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Verify::weight(const GenView&) {
  return 3;
}

/// t in 1 … min(len, max_verify) mostly; now and then 0, max_verify + 1 or len + 1.
Verify Verify::gen(const GenView& v, Draw& d) {
  const std::int64_t top = v.twin.max_verify(), len = v.twin.len();
  const int how = d.in_range(0, 12);
  std::int64_t t = d.in_range64(1, std::max<std::int64_t>(2, std::min(top, len) + 1));
  if (how == 0) t = 0;
  if (how == 1) t = top + 1;
  // len + 1 tests the "len < T" refusal where that is not also "T > max_verify" (a long view's
  // len + 1 would only repeat top + 1, and exceed what a replay file holds).
  if (how == 2) t = len < top ? len + 1 : top + 1;
  return Verify{t, d.seed(), draw_scale(v, d)};
}

/// Changes nothing the generator draws by.
void Verify::apply(ref::KvLayer&) const {}

std::optional<std::string> Verify::run(Sides& s) const {
  return s.verify_both(DecodeVariant::host, s.queries(std::clamp<std::int64_t>(t, 0, 1024), seed),
                       t, scale);
}

}  // namespace kvlayer::harness
