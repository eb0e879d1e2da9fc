// graph_chain: a device-counter step (append_dc(w) → inc_seqlen → decode_dc(w)) captured once
// and replayed `steps` times with fresh rows and queries, then account_steps(steps) (SPEC §7).
#include <algorithm>
#include <bit>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int GraphChain::weight(const GenView&) {
  return 3;
}

/// Up to 24 steps, in the variant that suits the layer.
GraphChain GraphChain::gen(const GenView& v, Draw& d) {
  const std::int64_t steps =
      d.in_range64(1, std::max<std::int64_t>(2, std::min<std::int64_t>(24, v.room() + 1)));
  return GraphChain{steps, d.seed(), !v.flat_full(), draw_scale(v, d)};
}

/// reserve(steps) first makes a ring's chain fit (SPEC §7); gen alone draws chains without it,
/// which must be reported as a device error where they overrun.
std::vector<Command> GraphChain::scenario(const GenView& v, Draw& d) {
  const GraphChain chain = gen(v, d);
  return {Reserve{chain.steps}, chain};
}

void GraphChain::apply(ref::KvLayer& twin) const {
  for (std::int64_t i = 0; i < steps; ++i) {
    windowed ? twin.append_dcw(twin_rows(1)) : twin.append_dc(twin_rows(1));
    twin.inc_seqlen();
  }
  twin.account_steps(steps);
}

std::optional<std::string> GraphChain::run(Sides& s) const {
  const Geometry& g = s.geometry();
  // A chain whose variant does not suit the layer is a no-op on both sides (the generator
  // never draws one; shrinking can make one by dropping earlier commands).
  const bool suits = windowed ? g.window.has_value() : (!g.is_ring() && !g.window);
  if (!suits || steps <= 0) return std::nullopt;
  std::optional<std::string> diff;
  std::vector<HostRows> rows;
  std::vector<std::vector<float>> queries;
  std::vector<Sides::Expectation> expected;
  Rng rng(seed);
  // The model runs the steps eagerly; each step's expectation (and bound) is taken on the
  // state that step decoded.
  const auto variant = windowed ? DecodeVariant::dcw : DecodeVariant::dc;
  for (std::int64_t i = 0; i < steps; ++i) {
    rows.push_back(s.rows(1, rng.next(), DataKind::gaussian));
    queries.push_back(s.query(rng.next()));
    const std::int64_t at = s.model().len_d();
    if (s.dc_append_writes(windowed)) s.remember_rows(rows.back(), at);
    s.model_append_dc(rows.back(), windowed);
    s.model().inc_seqlen();
    auto out = s.model_decode(variant, queries.back(), scale);
    expected.push_back(s.expect_decode(variant, queries.back(), scale, std::move(out)));
    if (expected.back().self_check && !diff) diff = expected.back().self_check;
  }
  s.stats().graph_replays += steps;
  if (s.system() && !diff) {
    const auto outputs = s.system()->graph_chain(rows, queries, windowed, scale);
    diff = s.check_replays("step", expected, outputs, s.system()->last_chain_eager());
  }
  const auto m = attempt([&] { s.model().account_steps(steps); });
  if (s.system()) {
    const auto accounted = attempt([&] { s.system()->account_steps(steps); });
    if (!diff) diff = compare_refusal(m, accounted);
  }
  return diff;
}

}  // namespace kvlayer::harness
