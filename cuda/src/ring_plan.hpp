// Host-side planning of appends and rewinds (SPEC §6), separate from any CUDA call so that a
// host test can check it against the reference without a GPU.
// NOTE: written independently of ref::KvLayer::plan_append (the harness compares two
// implementations); only the refusal messages are the reference's, word for word.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvlayer/error.hpp"
#include "kvlayer/geometry.hpp"

namespace kvlayer::cuda::detail {

/// What an append of n rows will do.
struct Placement {
  bool rebase = false;
  std::int64_t retain = 0;     ///< base after the rebase (== base when none)
  std::int64_t keep = 0;       ///< rows moved to the front by the rebase
  std::int64_t write_row = 0;  ///< physical row of the first new row
};

/// SPEC §6 append planning for n rows at (len, base); refuses (naming `op`) what the reference
/// refuses: n < 1, len + n > max_ctx, or a ring that cannot make room.
inline Placement place_rows(const Geometry& g, std::int64_t len, std::int64_t base, std::int64_t n,
                            const char* op) {
  if (n < 1) refuse(op, "n ", n, " must be at least 1");
  if (len + n > g.max_ctx) refuse(op, "len ", len, " + n ", n, " exceeds max_ctx ", g.max_ctx);
  const std::int64_t rows = g.rows();
  const std::int64_t used = len - base;
  if (!g.is_ring() || used + n <= rows) return Placement{false, base, 0, used};
  // Keep what a window plus a rewind may still need: logical rows from
  // align_down(len − (window − 1) − rewind_slack), never below the current base.
  const std::int64_t oldest_needed = len - (*g.window - 1) - g.rewind_slack;
  const std::int64_t retain = std::max(base, align_down(std::max<std::int64_t>(0, oldest_needed)));
  const std::int64_t keep = len - retain;
  if (keep + n > rows)
    refuse(op, "ring cannot fit n ", n, " rows: ", keep,
           " rows must stay resident (from logical row ", retain, ") and ", keep, " + ", n,
           " exceeds rows ", rows);
  return Placement{true, retain, keep, keep};
}

/// The lowest logical row that a ring must still hold for a rewind to p.
inline std::int64_t rewind_floor(const Geometry& g, std::int64_t p) {
  return align_down(std::max<std::int64_t>(0, p - (*g.window - 1)));
}

/// SPEC §6 can_rewind_to.
inline bool rewind_allowed(const Geometry& g, std::int64_t len, std::int64_t base, std::int64_t p) {
  if (p < 0 || p > len) return false;
  return !g.is_ring() || rewind_floor(g, p) >= base;
}

/// Refuses rewind(new_len) exactly as the reference does.
inline void check_rewind(const Geometry& g, std::int64_t len, std::int64_t base,
                         std::int64_t new_len) {
  if (new_len < 0 || new_len > len)
    refuse("rewind", "new_len ", new_len, " is outside [0, len ", len, "]");
  if (!rewind_allowed(g, len, base, new_len))
    refuse("rewind", "new_len ", new_len, " needs logical row ",
           std::max<std::int64_t>(0, new_len - (*g.window - 1)),
           " resident (the window of the next append), below base ", base,
           " (the ring already dropped it)");
}

/// Refuses account_steps(k) exactly as the reference does.
inline void check_account_steps(const Geometry& g, std::int64_t len, std::int64_t base,
                                std::int64_t k) {
  if (k < 0 || len + k > g.max_ctx)
    refuse("account_steps", "len ", len, " + k ", k, " is outside [len, max_ctx ", g.max_ctx, "]");
  if (len + k - base > g.rows())
    refuse("account_steps", "len ", len, " + k ", k, " - base ", base, " exceeds rows ", g.rows(),
           " (more steps than reserve() made room for)");
}

}  // namespace kvlayer::cuda::detail
