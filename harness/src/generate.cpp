#include "kvlayer/harness/generate.hpp"

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <ostream>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/replay_file.hpp"

namespace kvlayer::harness {
namespace {

/// Steers generation: a reference layer with the case's ring parameters but one 32-wide head,
/// so that copying it per command (as rc::state does) is cheap. Its bytes are meaningless.
struct GenModel {
  Geometry geometry;
  std::shared_ptr<const ref::KvLayer> twin;  // copy-on-apply: rc::state copies models often
};

Geometry twin_geometry(Geometry g) {
  g.n_kv_heads = 1;
  g.head_dim_k = g.head_dim_v = kBlockValues;
  return g;
}

void apply_to_twin(ref::KvLayer& t, const Command& command) {
  static const std::vector<std::uint8_t> zeros(4096 * kBlockValues * sizeof(float), 0);
  const auto rows = [&](std::int64_t n) {
    return ref::RowsView{zeros.data(), zeros.data(), std::min<std::int64_t>(n, 4096), DType::f32};
  };
  try {
    if (const auto* c = std::get_if<Append>(&command)) {
      if (c->n >= 1 && c->n <= 4096) t.append(rows(c->n));
    } else if (const auto* c = std::get_if<AppendDc>(&command)) {
      c->windowed ? t.append_dcw(rows(1)) : t.append_dc(rows(1));
    } else if (std::holds_alternative<IncSeqlen>(command)) {
      t.inc_seqlen();
    } else if (const auto* c = std::get_if<AccountSteps>(&command)) {
      t.account_steps(c->k);
    } else if (const auto* c = std::get_if<Reserve>(&command)) {
      t.reserve(c->k);
    } else if (const auto* c = std::get_if<Rewind>(&command)) {
      t.rewind(c->to);
    } else if (const auto* c = std::get_if<GraphChain>(&command)) {
      for (std::int64_t i = 0; i < c->steps; ++i) {
        c->windowed ? t.append_dcw(rows(1)) : t.append_dc(rows(1));
        t.inc_seqlen();
      }
      t.account_steps(c->steps);
    }
  } catch (const Error&) {
    // Refused on the twin: refused on both real sides too; nothing to track.
  }
}

DataKind draw_data_kind() {
  return *rc::gen::weightedElement<DataKind>({{12, DataKind::gaussian},
                                              {2, DataKind::wide},
                                              {2, DataKind::integers},
                                              {2, DataKind::ties},
                                              {1, DataKind::constant},
                                              {1, DataKind::tiny},
                                              {1, DataKind::bad}});
}

std::uint64_t draw_seed() { return *rc::gen::arbitrary<std::uint32_t>(); }

/// One command, drawn against the twin's state: mostly legal, sometimes just past a limit.
Command draw_command(const GenModel& m) {
  const ref::KvLayer& t = *m.twin;
  const Geometry& g = m.geometry;
  const std::int64_t len = t.len(), len_d = t.len_d(), base = t.base();
  const bool flat_full = !g.is_ring() && !g.window;
  const std::int64_t room = g.max_ctx - len;
  const std::int64_t max_n = std::max<std::int64_t>(1, std::min(g.is_ring() ? g.max_append : 48, room));
  // The lowest legal rewind target.
  std::int64_t lowest = len;
  while (lowest > 0 && t.can_rewind_to(lowest - 1)) --lowest;
  if (len_d > len && *rc::gen::inRange(0, 3) != 0) return AccountSteps{len_d - len};
  const int pick = *rc::gen::weightedElement<int>({{g.is_ring() ? 24 : 14, 0}, {6, 1}, {2, 2}, {3, 3}, {4, 4},
                                                   {8, 5}, {2, 6}, {2, 7}, {3, 8}, {1, 9}});
  switch (pick) {
    case 0: {  // append, occasionally one row more than fits
      const bool over = *rc::gen::inRange(0, 20) == 0;
      const std::int64_t n = over ? room + 1 : *rc::gen::inRange<std::int64_t>(1, max_n + 1);
      return Append{std::max<std::int64_t>(n, over ? 1 : 0), draw_seed(), draw_data_kind()};
    }
    case 1: {  // a device-counter append; the next command is usually its inc_seqlen
      const bool windowed = g.is_ring() || (g.window && *rc::gen::inRange(0, 2) == 0) ||
                            (!g.window && *rc::gen::inRange(0, 8) == 0);
      return AppendDc{draw_seed(), draw_data_kind(), windowed};
    }
    case 2: return IncSeqlen{};
    case 3: {  // reserve
      const bool over = *rc::gen::inRange(0, 10) == 0;
      return Reserve{over ? room + 1 : *rc::gen::inRange<std::int64_t>(0, max_n + 1)};
    }
    case 4: {  // rewind: legal, at the limit, or one past it
      const int how = *rc::gen::inRange(0, 6);
      if (how == 0) return Rewind{lowest - 1};
      if (how == 1) return Rewind{len + 1};
      if (how == 2) return Rewind{lowest};
      return Rewind{*rc::gen::inRange<std::int64_t>(lowest, len + 1)};
    }
    case 5: {  // decode, in a variant that suits the layer (rarely one that does not)
      DecodeVariant v = DecodeVariant::host;
      const int how = *rc::gen::inRange(0, 10);
      if (how >= 4) v = flat_full ? DecodeVariant::dc : (g.window ? DecodeVariant::dcw : v);
      if (how == 9) v = flat_full ? DecodeVariant::dcw : DecodeVariant::dc;
      return Decode{v, draw_seed()};
    }
    case 6: {
      const std::int64_t a = *rc::gen::inRange<std::int64_t>(std::max<std::int64_t>(0, base - 2), len + 2);
      const std::int64_t b = *rc::gen::inRange<std::int64_t>(a - 1, std::min(len, base + g.rows()) + 3);
      return PhysicalRows{a, b};
    }
    case 7: return CanRewindTo{*rc::gen::inRange<std::int64_t>(std::max<std::int64_t>(0, lowest - 3), len + 3)};
    case 8: {  // a captured chain of device-counter steps
      const std::int64_t steps = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, std::min<std::int64_t>(24, room + 1)));
      return GraphChain{steps, draw_seed(), !flat_full};
    }
    default: return StatusQuery{};
  }
}

struct Step : rc::state::Command<GenModel, Executor> {
  harness::Command command;
  explicit Step(const GenModel& m) : command(draw_command(m)) {}
  void apply(GenModel& m) const override {
    auto next = std::make_shared<ref::KvLayer>(*m.twin);
    apply_to_twin(*next, command);
    m.twin = std::move(next);
  }
  void run(const GenModel&, Executor& ex) const override {
    if (auto diff = ex.step(command)) RC_FAIL(*diff);
  }
  void show(std::ostream& os) const override { os << describe(command); }
};

/// Before a graph chain on a ring, usually reserve its headroom (SPEC §7); a chain without one
/// is legal too and must be reported as a device error when it overruns.
struct ReserveThenChain : rc::state::Command<GenModel, Executor> {
  std::vector<harness::Command> commands;
  explicit ReserveThenChain(const GenModel& m) {
    const Geometry& g = m.geometry;
    const bool flat_full = !g.is_ring() && !g.window;
    const std::int64_t room = g.max_ctx - m.twin->len();
    const std::int64_t steps = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, std::min<std::int64_t>(24, room + 1)));
    commands = {Reserve{steps}, GraphChain{steps, draw_seed(), !flat_full}};
  }
  void apply(GenModel& m) const override {
    auto next = std::make_shared<ref::KvLayer>(*m.twin);
    for (const auto& c : commands) apply_to_twin(*next, c);
    m.twin = std::move(next);
  }
  void run(const GenModel&, Executor& ex) const override {
    for (const auto& c : commands)
      if (auto diff = ex.step(c)) RC_FAIL(*diff);
  }
  void show(std::ostream& os) const override {
    for (std::size_t i = 0; i < commands.size(); ++i) os << (i ? "; " : "") << describe(commands[i]);
  }
};

}  // namespace

Geometry draw_geometry(const DrawLimits& limits, int* n_q_heads) {
  Geometry g;
  g.n_kv_heads = *rc::gen::inRange(1, limits.max_kv_heads + 1);
  g.head_dim_k = g.head_dim_v = *rc::gen::element(64, 128, 256);
  const int gqa = *rc::gen::inRange(1, 17);
  *n_q_heads = g.n_kv_heads * gqa;
  g.max_ctx = *rc::gen::inRange<std::int64_t>(1, limits.max_ctx + 1);
  const int layout = *rc::gen::element(0, 1, 2);  // flat, flat windowed, ring: uniformly
  if (layout == 1) g.window = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, g.max_ctx + 8));
  if (layout == 2) {
    // Mostly rings much shorter than max_ctx, so that they rebase many times per case.
    g.storage = Storage::ring;
    g.window = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, limits.max_ctx / 12));
    g.max_append = *rc::gen::inRange<std::int64_t>(1, 17);
    g.rewind_slack = *rc::gen::inRange<std::int64_t>(0, 13);
    g.max_ctx = std::max(g.max_ctx, *rc::gen::inRange<std::int64_t>(1, limits.max_ctx + 1));
  }
  return g;
}

void model_based_property(const PropertyOptions& options) {
  Case c;
  c.geometry = draw_geometry(options.limits, &c.n_q_heads);
  c.dtype = *rc::gen::element(DType::f32, DType::f16, DType::bf16);
  c.seed = draw_seed();
  RC_TAG(c.geometry.is_ring() ? "ring" : (c.geometry.window ? "flat windowed" : "flat"));
  std::unique_ptr<System> system = options.make_system ? options.make_system(c) : nullptr;
  Executor executor(c, system.get());
  GenModel model{c.geometry, std::make_shared<ref::KvLayer>(twin_geometry(c.geometry))};
  try {
    rc::state::check(model, executor,
                     rc::state::gen::execOneOfWithArgs<Step, Step, Step, Step, Step, Step, Step, ReserveThenChain>());
  } catch (...) {
    if (!options.replay_path.empty()) {
      c.commands = executor.executed();
      write_replay_file(options.replay_path, c);
    }
    throw;
  }
  if (options.on_case_done) options.on_case_done(executor.stats());
}

}  // namespace kvlayer::harness

namespace kvlayer {
/// Lets rapidcheck print the dtype it drew.
void showValue(DType t, std::ostream& os) { os << dtype_name(t); }
}  // namespace kvlayer
