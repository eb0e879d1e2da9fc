// The commands of a model-based test case, as plain data: what rapidcheck generates and
// shrinks, what `kvlayer fuzz` draws, and what a replay file stores. No rapidcheck, no CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"

namespace kvlayer::harness {

/// How the values of appended rows are drawn (see row_data.hpp).
enum class DataKind : std::uint8_t {
  gaussian,   ///< N(0, σ²), σ = 10^u with u drawn per command in [−2, 2]
  wide,       ///< every block its own scale 10^u, u in [−4, 5]; a quarter one-sided (V beyond fp16)
  integers,   ///< small integers: exact in every format
  ties,       ///< blocks whose quantization hits exact half-way ties (q8_0 and q5_1)
  constant,   ///< constant blocks (q5_1 d = 0) mixed with zero blocks
  tiny,       ///< subnormal-range blocks (degenerate: quants 0)
  bad,        ///< gaussian plus one NaN, ±Inf or fp16-overflowing block
};

/// Which decode entry point a Decode command calls.
enum class DecodeVariant : std::uint8_t { host, dc, dcw };

struct Append { std::int64_t n; std::uint64_t seed; DataKind data; };
/// One device-counter append: append_dcw when `windowed`, else append_dc.
struct AppendDc { std::uint64_t seed; DataKind data; bool windowed; };
struct IncSeqlen {};
struct AccountSteps { std::int64_t k; };
struct Reserve { std::int64_t k; };
struct Rewind { std::int64_t to; };
struct Decode { DecodeVariant variant; std::uint64_t seed; };
struct PhysicalRows { std::int64_t start, end; };
struct CanRewindTo { std::int64_t p; };
/// A captured device-counter step (append_dc(w) → inc_seqlen → decode_dc(w)), captured once
/// and replayed `steps` times with fresh rows and queries, then account_steps(steps).
struct GraphChain { std::int64_t steps; std::uint64_t seed; bool windowed; };
/// Compares and clears the sticky status on both sides.
struct StatusQuery {};

using Command = std::variant<Append, AppendDc, IncSeqlen, AccountSteps, Reserve, Rewind, Decode,
                             PhysicalRows, CanRewindTo, GraphChain, StatusQuery>;

/// A whole case: a layer and the commands run on it.
struct Case {
  Geometry geometry;
  int n_q_heads = 1;
  DType dtype = DType::f32;
  std::uint64_t seed = 0;  ///< the seed the case was drawn from (informational)
  std::vector<Command> commands;
};

/// One readable line for a command, e.g. "append n=3 data=ties seed=17".
std::string describe(const Command& command);
/// Short kind name of a command ("append", "decode", ...), for statistics.
std::string kind_name(const Command& command);
std::string data_kind_name(DataKind kind);
std::string decode_variant_name(DecodeVariant variant);

}  // namespace kvlayer::harness
