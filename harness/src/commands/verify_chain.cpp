// verify_chain: the captured speculative loop (SPEC §7, §11): append_rows_dc(w) of t drafts →
// inc_seqlen(t) → decode_rows_dc(w) of t queries captured once, then per round reserve(t), a
// replay with fresh drafts and queries, account_steps(t) and an accepted prefix kept by rewind.
// Every round's rows are compared with the reference within their bounds, and bit for bit with
// the same verify run eagerly on the state the replay left.
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int VerifyChain::weight(const GenView&) {
  return 2;
}

/// Up to 12 rounds of t in 1 … max_verify, in the variant that suits the layer.
VerifyChain VerifyChain::gen(const GenView& v, Draw& d) {
  const std::int64_t t = d.in_range64(1, v.twin.max_verify() + 1);
  const std::int64_t rounds = d.in_range64(1, 13);
  return VerifyChain{rounds, t, d.seed(), !v.flat_full(), draw_scale(v, d)};
}

/// Each round appends t rows and keeps a prefix; the twin keeps them all (an upper bound on
/// the length the generator steers by).
void VerifyChain::apply(ref::KvLayer& twin) const {
  for (std::int64_t r = 0; r < rounds; ++r) {
    twin.reserve(t);
    windowed ? twin.append_rows_dcw(twin_rows(t)) : twin.append_rows_dc(twin_rows(t));
    twin.inc_seqlen(int(t));
    twin.account_steps(t);
  }
}

std::optional<std::string> VerifyChain::run(Sides& s) const {
  const Geometry& g = s.geometry();
  // A chain whose variant or t does not suit the layer is a no-op on both sides (shrinking can
  // make one).
  const bool suits = windowed ? g.window.has_value() : (!g.is_ring() && !g.window);
  if (!suits || rounds <= 0 || t < 1 || t > s.model().max_verify()) return std::nullopt;
  const auto variant = windowed ? DecodeVariant::dcw : DecodeVariant::dc;
  Rng rng(seed);
  std::vector<HostRows> drafts;
  std::vector<std::vector<float>> queries;
  std::vector<std::int64_t> accepted;
  std::vector<Sides::Expectation> expected;
  std::optional<std::string> diff;
  // The model runs the rounds eagerly; a round that reserve(t) refuses (no room left) ends the
  // chain there on both sides.
  for (std::int64_t r = 0; r < rounds && !diff; ++r) {
    if (!attempt([&] { s.model().reserve(t); }).value) break;
    // A rebase keeps the rows below len only: unaccounted rows past it are not tracked.
    s.forget_rows_from(s.model().len());
    drafts.push_back(s.rows(t, rng.next(), DataKind::gaussian));
    queries.push_back(s.queries(t, rng.next()));
    const std::int64_t at = s.model().len_d();
    if (s.rows_append_writes(t, windowed)) s.remember_rows(drafts.back(), at);
    s.model_append_rows_dc(drafts.back(), windowed);
    s.model().inc_seqlen(int(t));
    auto out = s.model_decode_rows(variant, queries.back(), t, scale);
    expected.push_back(s.expect_decode_rows(variant, queries.back(), t, scale, std::move(out)));
    if (expected.back().self_check) diff = expected.back().self_check;
    s.model().account_steps(t);
    // Accept a prefix where the layer can rewind that far (a ring keeps rewind_slack rows).
    std::int64_t a = rng.range(0, t);
    while (a < t && !s.model().can_rewind_to(s.model().len() - t + a)) ++a;
    if (a < t) s.model().rewind(s.model().len() - t + a);
    accepted.push_back(a);
  }
  s.stats().graph_replays += std::int64_t(drafts.size());
  if (!s.system() || diff || drafts.empty()) return diff;
  const auto outputs = s.system()->verify_chain(drafts, queries, accepted, int(t), windowed, scale);
  return s.check_replays("round", expected, outputs, s.system()->last_chain_eager());
}

}  // namespace kvlayer::harness
