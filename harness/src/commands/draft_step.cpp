// draft_step: a speculative step on the device counters (SPEC §11): t draft rows appended at
// len_d by append_rows_dc(w), inc_seqlen(t), and the verify decode_rows_dc(w) of t queries,
// each row compared with the reference within the bound of its own causal view.
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int DraftStep::weight(const GenView&) {
  return 3;
}

/// t in 1 … max_verify mostly; one in twelve times 0 or max_verify + 1 (refused on both sides).
/// The variant that suits the layer, one in ten times the other one.
DraftStep DraftStep::gen(const GenView& v, Draw& d) {
  const std::int64_t top = v.twin.max_verify();
  const int how = d.in_range(0, 12);
  std::int64_t t = d.in_range64(1, top + 1);
  if (how == 0) t = 0;
  if (how == 1) t = top + 1;
  bool windowed = !v.flat_full();
  if (d.in_range(0, 10) == 0) windowed = !windowed;
  return DraftStep{t, d.seed(), draw_data_kind(d), windowed, draw_scale(v, d)};
}

/// reserve(t), the step, its accounting and an accepted prefix: what an engine's step does.
std::vector<Command> DraftStep::scenario(const GenView& v, Draw& d) {
  DraftStep step = gen(v, d);
  step.t = std::clamp<std::int64_t>(step.t, 1, v.twin.max_verify());
  step.windowed = !v.flat_full();
  const std::int64_t accepted = d.in_range64(0, step.t + 1);
  return {Reserve{step.t}, step, AccountSteps{step.t}, Rewind{v.twin.len() + accepted}};
}

void DraftStep::apply(ref::KvLayer& twin) const {
  windowed ? twin.append_rows_dcw(twin_rows(t)) : twin.append_rows_dc(twin_rows(t));
  twin.inc_seqlen(int(t));
}

std::optional<std::string> DraftStep::run(Sides& s) const {
  // t = 0 (refused on both sides for its count): one row's buffers, n = 0.
  HostRows rows = s.rows(std::clamp<std::int64_t>(t, 1, 1024), seed, data);
  rows.n = t;
  const std::int64_t at = s.model().len_d();
  const bool writes = s.rows_append_writes(t, windowed);
  auto o = s.both([&] { s.model_append_rows_dc(rows, windowed); },
                  [&] { s.system()->append_rows_dc(rows, windowed); });
  if (o.accepted && writes) s.remember_rows(rows, at);
  if (o.diff || !o.accepted) return o.diff;
  o = s.both([&] { s.model().inc_seqlen(int(t)); }, [&] { s.system()->inc_seqlen(int(t)); });
  if (o.diff || !o.accepted) return o.diff;

  return s.verify_both(windowed ? DecodeVariant::dcw : DecodeVariant::dc,
                       s.queries(t, seed ^ 0x9E3779B97F4A7C15ull), t, scale);
}

}  // namespace kvlayer::harness
