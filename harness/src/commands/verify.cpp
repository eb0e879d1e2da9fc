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
  if (how == 2) t = len + 1;
  return Verify{t, d.seed()};
}

/// Changes nothing the generator draws by.
void Verify::apply(ref::KvLayer&) const {}

std::optional<std::string> Verify::run(Sides& s) const {
  const auto q = s.queries(std::clamp<std::int64_t>(t, 0, 1024), seed);
  const auto m = attempt([&] { return s.model_decode_rows(DecodeVariant::host, q, t); });
  if (!m.value) ++s.stats().refused;
  std::optional<Sides::Expectation> x;
  if (m.value) x = s.expect_decode_rows(DecodeVariant::host, q, t, *m.value);
  if (x && x->self_check) return x->self_check;
  if (!s.system()) return std::nullopt;
  const auto out = attempt([&] { return s.system()->decode_rows(DecodeVariant::host, q, int(t)); });
  if (auto d = compare_refusal(m, out)) return d;
  if (x) return s.check_decode(*x, *out.value);
  return std::nullopt;
}

}  // namespace kvlayer::harness
