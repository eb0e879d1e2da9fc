// The commands of a model-based test case: what rapidcheck generates and shrinks, what
// `kvlayer fuzz` draws, and what a replay file stores. No rapidcheck, no CUDA.
//
// Each command is one struct: its arguments, its op name, its fields (its replay-file form and
// its line) and the declarations of the rest, which harness/src/commands/<name>.cpp defines:
//   static int weight(const GenView&)     how often the generator draws it, relative to the
//                                         others (0: never by the weighted choice)
//   static C gen(const GenView&, Draw&)   draws its arguments against the generator's state
//   void apply(ref::KvLayer& twin) const  what it does to that state (the generator's model)
//   run(Sides&) const                     runs it on the model and the system and compares;
//                                         returns the difference, if any
// and optionally
//   static std::optional<C> due(const GenView&, Draw&)      drawn before the weighted choice
//   static std::vector<Command> scenario(const GenView&, Draw&)  a short sequence drawn
//                                         together (one in eight draws, see generate.cpp)
// `Command` lists them; every use dispatches with std::visit, so a command that lacks a member
// does not compile. harness/README.md says how to add one.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"

namespace kvlayer::ref {
class KvLayer;
}

namespace kvlayer::harness {

/// How the values of appended rows are drawn (see row_data.hpp).
enum class DataKind : std::uint8_t {
  gaussian,  ///< N(0, σ²), σ = 10^u with u drawn per command in [−2, 2]
  wide,  ///< every block its own scale 10^u, u in [−4, 5]; a quarter one-sided (V beyond fp16)
  integers,  ///< small integers: exact in every format
  ties,      ///< blocks whose quantization hits exact half-way ties (q8_0 and q5_1)
  constant,  ///< constant blocks (q5_1 d = 0) mixed with zero blocks
  tiny,      ///< subnormal-range blocks (degenerate: quants 0)
  bad,       ///< gaussian plus one NaN, ±Inf or fp16-overflowing block
  /// gaussian plus 1–3 needle rows: each KV head's K a random direction scaled to score
  /// 6–14 standard deviations of the bulk's scores (so any query along it attends almost only
  /// that key, however long the view), V a ±4σ sign pattern (structure no split averages away)
  needles,
};
/// The last DataKind (for iteration).
inline constexpr DataKind kLastDataKind = DataKind::needles;

/// Which decode entry point a Decode command calls.
enum class DecodeVariant : std::uint8_t { host, dc, dcw };

// The commands (defined below). The generator's weighted choice lists them in this order.
struct Append;
struct AppendDc;
struct IncSeqlen;
struct AccountSteps;
struct Reserve;
struct Rewind;
struct Decode;
struct PhysicalRows;
struct CanRewindTo;
struct GraphChain;
struct StatusQuery;
struct DraftStep;
struct Verify;
struct VerifyChain;
struct TakeSnapshot;
struct Restore;
struct BatchSteps;
using Command = std::variant<Append, AppendDc, IncSeqlen, AccountSteps, Reserve, Rewind, Decode,
                             PhysicalRows, CanRewindTo, GraphChain, StatusQuery, DraftStep, Verify,
                             VerifyChain, TakeSnapshot, Restore, BatchSteps>;

struct GenView;  ///< what a generator sees (harness/src/draw.hpp)
class Draw;      ///< the random choices a generator makes (harness/src/draw.hpp)
class Sides;     ///< the model and the system, as a command's run sees them (harness/src/sides.hpp)

// Fields: `fields(c, f)` lists a command's arguments once, in member order (the order a replay
// file's fields are checked in), through calls on f:
//   f.count(key, value[, lo, hi])   an integer; a replay file's must lie in [lo, hi]
//                                   (default ±2^30)
//   f.range(start_key, end_key, start, end)  a half-open range, shown "[start, end)"
//   f.data(value)                   the rows' DataKind, key "data"
//   f.seed(value)                   the seed of its rows or queries, key "seed" (shown last)
//   f.flag(key, value, on, off)     a bool, shown as the word `on` or `off`
//   f.scale(value)                  a decode's softmax scale (std::optional<float>), key
//                                   "scale"; nullopt (the default 1/sqrt(head_dim_k)) is left
//                                   out of the line and the replay file, so files written
//                                   before commands had one still read
// A command's line (describe) is its op name followed by its fields.

/// What every command declares besides its arguments, name and fields (see the top of this file).
#define KVLAYER_HARNESS_COMMAND(C)           \
  bool operator==(const C&) const = default; \
  static int weight(const GenView& v);       \
  static C gen(const GenView& v, Draw& d);   \
  void apply(ref::KvLayer& twin) const;      \
  std::optional<std::string> run(Sides& s) const

/// append(n rows) drawn from (seed, data).
struct Append {
  std::int64_t n;
  std::uint64_t seed;
  DataKind data;
  static constexpr std::string_view name = "append";
  static void fields(auto& c, auto& f) {
    f.count("n", c.n);
    f.seed(c.seed);
    f.data(c.data);
  }
  KVLAYER_HARNESS_COMMAND(Append);
};

/// One device-counter append: append_dcw when `windowed`, else append_dc.
struct AppendDc {
  std::uint64_t seed;
  DataKind data;
  bool windowed;
  static constexpr std::array<std::string_view, 2> names{"append_dc", "append_dcw"};
  static constexpr auto named_by = &AppendDc::windowed;  ///< the index into names
  static void fields(auto& c, auto& f) {
    f.seed(c.seed);
    f.data(c.data);
  }
  KVLAYER_HARNESS_COMMAND(AppendDc);
};

struct IncSeqlen {
  static constexpr std::string_view name = "inc_seqlen";
  static void fields(auto&, auto&) {}
  KVLAYER_HARNESS_COMMAND(IncSeqlen);
};

/// Host accounting for k device-counter steps; due (usually drawn next) while len_d > len.
struct AccountSteps {
  std::int64_t k;
  static constexpr std::string_view name = "account_steps";
  static void fields(auto& c, auto& f) { f.count("k", c.k); }
  static std::optional<AccountSteps> due(const GenView& v, Draw& d);
  KVLAYER_HARNESS_COMMAND(AccountSteps);
};

struct Reserve {
  std::int64_t k;
  static constexpr std::string_view name = "reserve";
  static void fields(auto& c, auto& f) { f.count("k", c.k); }
  KVLAYER_HARNESS_COMMAND(Reserve);
};

struct Rewind {
  std::int64_t to;
  static constexpr std::string_view name = "rewind";
  static void fields(auto& c, auto& f) { f.count("to", c.to); }
  KVLAYER_HARNESS_COMMAND(Rewind);
};

/// A decode of a query drawn from seed, through the entry point `variant` names.
struct Decode {
  DecodeVariant variant;
  std::uint64_t seed;
  std::optional<float> scale = std::nullopt;  ///< softmax scale; nullopt: the default
  static constexpr std::array<std::string_view, 3> names{"decode", "decode_dc", "decode_dcw"};
  static constexpr auto named_by = &Decode::variant;
  static void fields(auto& c, auto& f) {
    f.seed(c.seed);
    f.scale(c.scale);
  }
  KVLAYER_HARNESS_COMMAND(Decode);
};

struct PhysicalRows {
  std::int64_t start, end;
  static constexpr std::string_view name = "physical_rows";
  static void fields(auto& c, auto& f) { f.range("start", "end", c.start, c.end); }
  KVLAYER_HARNESS_COMMAND(PhysicalRows);
};

struct CanRewindTo {
  std::int64_t p;
  static constexpr std::string_view name = "can_rewind_to";
  static void fields(auto& c, auto& f) { f.count("p", c.p); }
  KVLAYER_HARNESS_COMMAND(CanRewindTo);
};

/// A captured device-counter step (append_dc(w) → inc_seqlen → decode_dc(w)), captured once
/// and replayed `steps` times with fresh rows and queries, then account_steps(steps).
struct GraphChain {
  std::int64_t steps;
  std::uint64_t seed;
  bool windowed;
  std::optional<float> scale = std::nullopt;  ///< every step's decode's (captured with it)
  static constexpr std::string_view name = "graph_chain";
  static void fields(auto& c, auto& f) {
    f.count("steps", c.steps, 0, 4096);
    f.seed(c.seed);
    f.flag("windowed", c.windowed, "dcw", "dc");
    f.scale(c.scale);
  }
  /// reserve(steps) then the chain: the headroom a ring needs (SPEC §7).
  static std::vector<Command> scenario(const GenView& v, Draw& d);
  KVLAYER_HARNESS_COMMAND(GraphChain);
};

/// Compares and clears the sticky status on both sides.
struct StatusQuery {
  static constexpr std::string_view name = "status";
  static void fields(auto&, auto&) {}
  KVLAYER_HARNESS_COMMAND(StatusQuery);
};

/// A speculative draft step on the device counters (SPEC §11): append_rows_dc(w) of t rows,
/// inc_seqlen(t), then the verify decode_rows_dc(w) of t queries drawn from seed. Accounting
/// and accepting a prefix are the commands after it (its scenario draws them).
struct DraftStep {
  std::int64_t t;
  std::uint64_t seed;
  DataKind data;
  bool windowed;
  std::optional<float> scale = std::nullopt;  ///< the verify decode's; nullopt: the default
  static constexpr std::string_view name = "draft_step";
  static void fields(auto& c, auto& f) {
    f.count("t", c.t, 0, 1024);
    f.seed(c.seed);
    f.data(c.data);
    f.flag("windowed", c.windowed, "dcw", "dc");
    f.scale(c.scale);
  }
  /// reserve(t), the step, account_steps(t) and an accepted prefix: rewind(len + a).
  static std::vector<Command> scenario(const GenView& v, Draw& d);
  KVLAYER_HARNESS_COMMAND(DraftStep);
};

/// A host-len verify decode_rows of t queries drawn from seed (SPEC §11).
struct Verify {
  std::int64_t t;
  std::uint64_t seed;
  std::optional<float> scale = std::nullopt;  ///< softmax scale; nullopt: the default
  static constexpr std::string_view name = "decode_rows";
  static void fields(auto& c, auto& f) {
    f.count("t", c.t, 0, 1024);
    f.seed(c.seed);
    f.scale(c.scale);
  }
  KVLAYER_HARNESS_COMMAND(Verify);
};

/// A captured verify chain (SPEC §11): append_rows_dc(w) of t rows → inc_seqlen(t) →
/// decode_rows_dc(w) of t queries, captured once; then per round: reserve(t), one replay with
/// fresh drafts and queries, account_steps(t), and an accepted prefix kept by rewind.
struct VerifyChain {
  std::int64_t rounds, t;
  std::uint64_t seed;
  bool windowed;
  std::optional<float> scale = std::nullopt;  ///< every round's decode's (captured with it)
  static constexpr std::string_view name = "verify_chain";
  static void fields(auto& c, auto& f) {
    f.count("rounds", c.rounds, 0, 256);
    f.count("t", c.t, 1, 64);
    f.seed(c.seed);
    f.flag("windowed", c.windowed, "dcw", "dc");
    f.scale(c.scale);
  }
  KVLAYER_HARNESS_COMMAND(VerifyChain);
};

/// A kvlayer::Snapshot (SPEC §13) taken on both sides and compared: geometry, len, first, base
/// and every byte (refused alike while device-counter steps are not accounted for). Changes
/// nothing.
struct TakeSnapshot {
  static constexpr std::string_view name = "snapshot";
  static void fields(auto&, auto&) {}
  KVLAYER_HARNESS_COMMAND(TakeSnapshot);
};

/// A snapshot of the current state on both sides (compared as TakeSnapshot does), restored into
/// a new, fresh layer of the case's geometry on each side, which then replaces the old one: the
/// rest of the case runs on the restored layers. With `into_current`, restored into the current
/// layer instead, which both sides refuse alike unless it is still fresh (SPEC §13).
struct Restore {
  bool into_current = false;
  static constexpr std::string_view name = "restore";
  static void fields(auto& c, auto& f) {
    f.flag("into_current", c.into_current, "into_current", "into_fresh");
  }
  KVLAYER_HARNESS_COMMAND(Restore);
};

/// A batch (SPEC §12) of `sequences` fresh layers of the case's geometry, beside the case's own
/// layer (which it leaves alone), driven through `steps` engine steps drawn from seed and
/// compared with ref::KvBatch after every operation (each sequence's planes, counters and
/// status; each output within its own sequence's bound, nothing written past the list or for
/// a refused view). batch_steps: per step an active list (a subset in random order, empty now
/// and then), reserve(T) and T rows per active sequence, inc_seqlen(T), a decode of T queries
/// (T ≥ 2: a verify), account_steps(T), now and then a rewind. batch_chain: one captured step
/// (T = 1) replayed `steps` times while the membership changes between replays.
struct BatchSteps {
  std::int64_t sequences;
  std::int64_t steps;
  std::uint64_t seed;
  bool chain;
  std::optional<float> scale = std::nullopt;  ///< every decode's (a chain's captured with it)
  static constexpr std::array<std::string_view, 2> names{"batch_steps", "batch_chain"};
  static constexpr auto named_by = &BatchSteps::chain;
  static void fields(auto& c, auto& f) {
    f.count("sequences", c.sequences, 1, 8);
    f.count("steps", c.steps, 0, 64);
    f.seed(c.seed);
    f.scale(c.scale);
  }
  KVLAYER_HARNESS_COMMAND(BatchSteps);
};

#undef KVLAYER_HARNESS_COMMAND

/// How the system under test plans its decode grid (the reference has none): every choice
/// meets the same accuracy contract, and the generator draws them so that long splits (many
/// key-loop trips per warp), fine splits (merges over hundreds of partials) and every kernel
/// instance are reached on purpose. Unset fields take the system's defaults.
struct DecodeChoice {
  enum class Kernel : std::uint8_t { mma, cuda_core };
  enum class Rows : std::uint8_t { automatic, split, whole };
  enum class Verify : std::uint8_t { mma, wgmma };  ///< DecodeOptions::Verify
  std::optional<Kernel> kernel;
  std::optional<Rows> rows;
  std::optional<Verify> verify;
  std::optional<int> split_balance;  ///< 0 … 64
  int max_verify_splits = 0;         ///< 0: no cap
  std::optional<int> batch_waves;    ///< 1 … 64 (a batch decode's schedule)
  bool operator==(const DecodeChoice&) const = default;
};

/// A whole case: a layer and the commands run on it.
struct Case {
  Geometry geometry;
  int n_q_heads = 1;
  DType dtype = DType::f32;
  std::uint64_t seed = 0;  ///< the seed the case was drawn from (informational)
  std::vector<Command> commands;
  int max_verify = 16;  ///< both sides' (SPEC §11); the CUDA layer supports up to 64
  DecodeChoice decode;
};

/// Calls f(std::type_identity<C>{}) for every command type C, in Command's order.
template <typename F>
void for_each_command(F&& f) {
  [&]<typename... Cs>(std::variant<Cs...>*) {
    (f(std::type_identity<Cs>{}), ...);
  }(static_cast<Command*>(nullptr));
}

/// The op names a command type goes by: its `name`, or its `names` (indexed by `named_by`).
template <typename C>
constexpr std::span<const std::string_view> names_of() {
  if constexpr (requires { C::named_by; })
    return C::names;
  else
    return {&C::name, 1};
}

/// A command's op name: the first word of its line, its "op" in a replay file, its kind in the
/// statistics.
template <typename C>
constexpr std::string_view name_of(const C& c) {
  if constexpr (requires { C::named_by; })
    return C::names[std::size_t(c.*C::named_by)];
  else
    return C::name;
}

/// One readable line for a command, e.g. "append n=3 data=ties seed=17".
std::string describe(const Command& command);
/// Short kind name of a command ("append", "decode", ...), for statistics.
std::string kind_name(const Command& command);
std::string data_kind_name(DataKind kind);
std::string decode_variant_name(DecodeVariant variant);
/// The verify decode entry point of a variant ("decode_rows", "decode_rows_dc", ...).
std::string verify_variant_name(DecodeVariant variant);

}  // namespace kvlayer::harness
