#include "kvlayer/harness/generate.hpp"

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <ostream>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "draw.hpp"
#include "kvlayer/cuda/limits.hpp"
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

/// A command's effect on the twin; a refusal there is one on both real sides too (nothing to
/// track).
void apply_to_twin(ref::KvLayer& t, const Command& command) {
  try {
    std::visit([&](const auto& c) { c.apply(t); }, command);
  } catch (const Error&) {
  }
}

std::uint64_t draw_seed() {
  return *rc::gen::arbitrary<std::uint32_t>();
}

/// The choices of a command's generator, drawn with rapidcheck (so they shrink).
class RcDraw final : public Draw {
 public:
  int in_range(int lo, int hi) override { return *rc::gen::inRange(lo, hi); }
  std::int64_t in_range64(std::int64_t lo, std::int64_t hi) override {
    return *rc::gen::inRange<std::int64_t>(lo, hi);
  }
  int weighted(std::span<const std::pair<int, int>> choices) override {
    // What rc::gen::weightedElement builds from its initializer list.
    std::vector<std::size_t> weights;
    std::vector<int> values;
    for (const auto& [weight, value] : choices) {
      weights.push_back(std::size_t(weight));
      values.push_back(value);
    }
    return *rc::Gen<int>(
        rc::gen::detail::WeightedElementGen<int>(std::move(weights), std::move(values)));
  }
  std::uint64_t seed() override { return draw_seed(); }
};

/// The command type at `index` in Command, its arguments drawn by its gen.
Command gen_command(int index, const GenView& v, Draw& d) {
  std::optional<Command> command;
  int i = 0;
  for_each_command([&]<typename C>(std::type_identity<C>) {
    if (i++ == index) command = C::gen(v, d);
  });
  return *command;
}

/// One command, drawn against the twin's state: the first one due (in Command's order), else
/// one picked by the commands' weights.
Command draw_command(const GenModel& m) {
  const GenView v{m.geometry, *m.twin};
  RcDraw d;
  std::optional<Command> due;
  for_each_command([&]<typename C>(std::type_identity<C>) {
    if constexpr (requires { C::due(v, d); })
      if (!due)
        if (auto c = C::due(v, d)) due = *c;
  });
  if (due) return *due;
  std::vector<std::pair<int, int>> choices;  // (weight, index in Command)
  int index = 0;
  for_each_command([&]<typename C>(std::type_identity<C>) {
    if (const int weight = C::weight(v); weight > 0) choices.emplace_back(weight, index);
    ++index;
  });
  return gen_command(d.weighted(choices), v, d);
}

/// What rapidcheck's state machine draws, shrinks and runs: commands drawn together.
struct Drawn : rc::state::Command<GenModel, Executor> {
  std::vector<harness::Command> commands;
  void apply(GenModel& m) const override {
    auto next = std::make_shared<ref::KvLayer>(*m.twin);
    for (const auto& c : commands) apply_to_twin(*next, c);
    m.twin = std::move(next);
  }
  void run(const GenModel&, Executor& ex) const override {
    for (const auto& c : commands) {
      // A difference the harness found, or an exception from a side (a CUDA failure, a crash
      // the system reported): both fail the case, and the report says which (tools/mutants
      // counts a mutant caught only by a difference).
      std::optional<std::string> diff;
      std::optional<std::string> thrown;
      try {
        diff = ex.step(c);
      } catch (const std::exception& e) {
        thrown = e.what();
      }
      if (thrown) RC_FAIL(std::string(kExceptionPrefix) + *thrown);
      if (diff) RC_FAIL(std::string(kDifferencePrefix) + *diff);
    }
  }
  void show(std::ostream& os) const override {
    for (std::size_t i = 0; i < commands.size(); ++i)
      os << (i ? "; " : "") << describe(commands[i]);
  }
};

/// One command.
struct Step : Drawn {
  explicit Step(const GenModel& m) { commands = {draw_command(m)}; }
};

/// The commands of C's scenario.
template <typename C>
struct Scenario : Drawn {
  explicit Scenario(const GenModel& m) {
    RcDraw d;
    commands = C::scenario(GenView{m.geometry, *m.twin}, d);
  }
};

/// The next draw: one of seven Steps or one Scenario per command that has one, picked
/// uniformly (one draw in eight a scenario while GraphChain's is the only one).
template <typename... Scenarios>
auto exec_one_of(std::tuple<Scenarios...>*) {
  return rc::state::gen::execOneOfWithArgs<Step, Step, Step, Step, Step, Step, Step,
                                           Scenarios...>();
}

template <typename C>
concept HasScenario = requires {
  &C::scenario;
};

/// The Scenario of every command that has one, as a std::tuple type.
template <typename V>
struct Scenarios;
template <typename... Cs>
struct Scenarios<std::variant<Cs...>> {
  template <typename C>
  using Of = std::conditional_t<HasScenario<C>, std::tuple<Scenario<C>>, std::tuple<>>;
  using type = decltype(std::tuple_cat(std::declval<Of<Cs>>()...));
};

}  // namespace

Geometry draw_geometry(const DrawLimits& limits, int* n_q_heads) {
  Geometry g;
  // Short views mostly; medium and long ones now and then (DrawLimits says what each reaches).
  enum { kShort, kMedium, kLong };
  const int length = *rc::gen::weightedElement<int>(
      {{12, kShort},
       {limits.medium_ctx > limits.max_ctx ? 5 : 0, kMedium},
       {limits.long_ctx >= limits.long_ctx_min && limits.long_ctx > 0 ? 1 : 0, kLong}});
  const int most_kv = length == kShort ? limits.max_kv_heads
                                       : (length == kMedium ? std::min(limits.max_kv_heads, 4) : 1);
  g.n_kv_heads = *rc::gen::inRange(1, most_kv + 1);
  g.head_dim_k = g.head_dim_v =
      limits.head_dim > 0
          ? limits.head_dim
          : *rc::gen::elementOf(std::vector<int>(std::begin(cuda::kSupportedHeadDims),
                                                 std::end(cuda::kSupportedHeadDims)));
  // gqa by powers of two first, so that every rows-per-block instance (1, 2, 4, 8, 16) is drawn
  // alike: (2^(p−1), 2^p] for p uniform in 0..4, then clamped to the limits.
  const int p = *rc::gen::inRange(0, 5);
  const int gqa = std::clamp(p == 0 ? 1 : *rc::gen::inRange((1 << (p - 1)) + 1, (1 << p) + 1),
                             limits.min_gqa, limits.max_gqa);
  *n_q_heads = g.n_kv_heads * gqa;
  const auto draw_ctx = [&] {
    switch (length) {
      case kMedium:
        return *rc::gen::inRange<std::int64_t>(limits.max_ctx + 1, limits.medium_ctx + 1);
      case kLong:
        return *rc::gen::inRange<std::int64_t>(limits.long_ctx_min, limits.long_ctx + 1);
      default:
        return *rc::gen::inRange<std::int64_t>(1, limits.max_ctx + 1);
    }
  };
  g.max_ctx = draw_ctx();
  const int layout = *rc::gen::element(0, 1, 2);  // flat, flat windowed, ring: uniformly
  if (layout == 1)
    g.window = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, g.max_ctx + 8));
  if (layout == 2) {
    // Mostly rings much shorter than max_ctx, so that they rebase many times per case; appends
    // of up to ~100 rows now and then, so that a rebase moves base by several 32-row units.
    g.storage = Storage::ring;
    g.max_ctx = std::max(g.max_ctx, draw_ctx());
    g.window = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, g.max_ctx / 12));
    g.max_append = *rc::gen::element(0, 0, 1) == 1 ? *rc::gen::inRange<std::int64_t>(17, 101)
                                                   : *rc::gen::inRange<std::int64_t>(1, 17);
    g.rewind_slack = *rc::gen::inRange<std::int64_t>(0, 13);
  }
  return g;
}

DecodeChoice draw_decode_choice(const DrawLimits& limits) {
  DecodeChoice d;
  // Each field: the system's default half the time or more (shrinks there), else a choice that
  // reaches a path the default does not at short views.
  if (*rc::gen::inRange(0, 6) == 5) d.kernel = DecodeChoice::Kernel::cuda_core;
  if (const int r = *rc::gen::inRange(0, 4); r >= 2)
    d.rows = r == 2 ? DecodeChoice::Rows::split : DecodeChoice::Rows::whole;
  switch (*rc::gen::inRange(0, 8)) {
    case 4:
    case 5:
      d.split_balance = 64;
      break;  // one split per view up to 4096 keys
    case 6:
      d.split_balance = 0;
      break;  // one tile per split: the most splits
    case 7:
      d.split_balance = *rc::gen::inRange(1, 64);
      break;
    default:
      break;
  }
  if (const int v = *rc::gen::inRange(0, 4); v >= 2)
    d.max_verify_splits = v == 2 ? 1 : *rc::gen::inRange(2, 9);
  // Warpgroup MMA for T·gqa > 16 at head dim 128 (an sm_90a build on a 9.0 device; elsewhere
  // the layer runs the mma.sync verify and the choice changes nothing).
  if (*rc::gen::inRange(0, 2) == 1) d.verify = DecodeChoice::Verify::wgmma;
  // A batch decode's schedule: one wave (the longest blocks, one split per view where the batch
  // is large) or 64 (the finest cut the balance allows).
  if (const int w = *rc::gen::inRange(0, 6); w >= 4) d.batch_waves = w == 4 ? 1 : 64;
  if (limits.rows) d.rows = limits.rows;
  if (limits.kernel) d.kernel = limits.kernel;
  if (limits.verify) d.verify = limits.verify;
  return d;
}

void model_based_property(const PropertyOptions& options) {
  Case c;
  c.geometry = draw_geometry(options.limits, &c.n_q_heads);
  c.dtype = *rc::gen::element(DType::f32, DType::f16, DType::bf16);
  if (*rc::gen::inRange(0, 2) == 1)
    c.max_verify = *rc::gen::inRange(1, std::max(2, options.limits.max_verify + 1));
  c.decode = draw_decode_choice(options.limits);
  c.seed = draw_seed();
  RC_TAG(c.geometry.is_ring() ? "ring" : (c.geometry.window ? "flat windowed" : "flat"));
  std::unique_ptr<System> system = options.make_system ? options.make_system(c) : nullptr;
  // Set before the first call the watchdog sees; on_hang reads the commands run so far while
  // this thread is blocked inside the hung call.
  const Executor* running = nullptr;
  std::optional<HangWatchdog> watchdog;
  if (system && options.hang_seconds > 0)
    watchdog.emplace(options.hang_seconds, [&](double seconds) {
      Case hung = c;
      hung.commands = running->executed();
      if (options.on_hang) options.on_hang(hung, seconds);
    });
  Executor executor(c, system.get(), watchdog ? &*watchdog : nullptr);
  running = &executor;
  GenModel model{c.geometry,
                 std::make_shared<ref::KvLayer>(twin_geometry(c.geometry), c.max_verify)};
  try {
    rc::state::check(model, executor, exec_one_of(static_cast<Scenarios<Command>::type*>(nullptr)));
  } catch (...) {
    if (!options.replay_path.empty()) {
      c.commands = executor.executed();
      write_replay_file(options.replay_path, c);
    }
    throw;
  }
  if (options.on_case_done) options.on_case_done(executor.stats());
  if (options.on_case_passed) {
    c.commands = executor.executed();
    options.on_case_passed(c);
  }
}

}  // namespace kvlayer::harness

namespace kvlayer {
/// Lets rapidcheck print the dtype it drew.
void showValue(DType t, std::ostream& os) {
  os << dtype_name(t);
}
}  // namespace kvlayer
