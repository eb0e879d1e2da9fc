// What a command's generator uses: the random choices (Draw) and the state it draws against
// (GenView). Draw is an interface so that every command's generator lives in its own file in
// kvlayer_harness, which does not depend on rapidcheck; kvlayer_harness_rc implements it with
// rapidcheck's generators (generate.cpp), so the choices shrink.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <utility>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::harness {

/// The random choices a generator makes, in the order it makes them (the same order draws the
/// same case from the same seed).
class Draw {
 public:
  virtual ~Draw() = default;
  /// Uniform in [lo, hi); shrinks towards lo.
  virtual int in_range(int lo, int hi) = 0;
  virtual std::int64_t in_range64(std::int64_t lo, std::int64_t hi) = 0;
  /// The value of one (weight, value) pair, with probability proportional to its weight.
  virtual int weighted(std::span<const std::pair<int, int>> choices) = 0;
  int weighted(std::initializer_list<std::pair<int, int>> choices) {
    return weighted(std::span<const std::pair<int, int>>(choices.begin(), choices.size()));
  }
  /// A seed for rows or queries: 32 bits, shrinks towards 0.
  virtual std::uint64_t seed() = 0;
};

/// How an append's rows are drawn: mostly gaussian, the special kinds now and then.
DataKind draw_data_kind(Draw& d);

/// What a command's generator sees: the case's geometry and a twin of the layer's state (the
/// case's ring parameters, one 32-wide head; its bytes are meaningless).
struct GenView {
  const Geometry& geometry;
  const ref::KvLayer& twin;

  /// A flat layer without a window: the one that takes the non-windowed device-counter calls.
  bool flat_full() const { return !geometry.is_ring() && !geometry.window; }
  /// Rows left before max_ctx.
  std::int64_t room() const { return geometry.max_ctx - twin.len(); }
  /// The largest append drawn as a legal one (at least 1).
  std::int64_t max_append() const;
  /// The lowest legal rewind target.
  std::int64_t lowest_rewind() const;
};

/// A decode's softmax scale: half the time nullopt (the default 1/sqrt(head_dim_k)), else the
/// default times a factor in (1/2, 2) whose f32 product is never a power of two. Shrinks
/// towards nullopt.
std::optional<float> draw_scale(const GenView& v, Draw& d);

/// The most rows twin_rows gives at once.
inline constexpr std::int64_t kTwinRows = 4096;
/// The longest prefill an Append draws (flat layers of more than a short view).
inline constexpr std::int64_t kMaxPrefill = 32768;

/// n zero rows (at most kTwinRows) for a twin's append.
ref::RowsView twin_rows(std::int64_t n);

}  // namespace kvlayer::harness
