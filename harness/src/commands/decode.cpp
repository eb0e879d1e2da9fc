// decode / decode_dc / decode_dcw of a query drawn from seed (SPEC §8), compared with the
// reference within the derived bound.
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Decode::weight(const GenView&) {
  return 8;
}

/// A variant that suits the layer, or one in ten times one that does not; a scale now and then.
Decode Decode::gen(const GenView& v, Draw& d) {
  DecodeVariant variant = DecodeVariant::host;
  const int how = d.in_range(0, 10);
  if (how >= 4)
    variant =
        v.flat_full() ? DecodeVariant::dc : (v.geometry.window ? DecodeVariant::dcw : variant);
  if (how == 9) variant = v.flat_full() ? DecodeVariant::dcw : DecodeVariant::dc;
  return Decode{variant, d.seed(), draw_scale(v, d)};
}

/// Changes nothing the generator draws by.
void Decode::apply(ref::KvLayer&) const {}

std::optional<std::string> Decode::run(Sides& s) const {
  const auto q = s.query(seed);
  const auto m = attempt([&] { return s.model_decode(variant, q, scale); });
  if (!m.value) ++s.stats().refused;
  std::optional<Sides::Expectation> x;
  if (m.value) x = s.expect_decode(variant, q, scale, *m.value);
  if (x && x->self_check) return x->self_check;
  if (!s.system()) return std::nullopt;
  const auto out = attempt([&] { return s.system()->decode(variant, q, scale); });
  if (auto d = compare_refusal(m, out)) return d;
  if (x) return s.check_decode(*x, *out.value);
  return std::nullopt;
}

}  // namespace kvlayer::harness
