// The shape of one attention layer's KV cache (SPEC §1, §6): heads, head dims, capacity,
// optional sliding window, and flat or ring storage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kvlayer/block_format.hpp"

namespace kvlayer {

inline constexpr std::int64_t kRingAlign = 32;  ///< a ring's base is always a multiple of this

/// How the planes are laid out: every logical row at its own physical row, or a compacting ring.
enum class Storage : std::uint8_t { flat, ring };

/// Everything that fixes a layer's memory layout. Plain data; call validate() before use.
struct Geometry {
  int n_kv_heads = 1;
  int head_dim_k = 128;
  int head_dim_v = 128;
  std::int64_t max_ctx = 0;             ///< most logical rows the layer may ever hold
  std::optional<std::int64_t> window;   ///< sliding-window size, if any (≥ 1)
  Storage storage = Storage::flat;
  std::int64_t max_append = 1;          ///< ring only: largest single append
  std::int64_t rewind_slack = 0;        ///< ring only: rows a speculative rewind may reach back

  std::int64_t kv_dim_k() const { return std::int64_t(n_kv_heads) * head_dim_k; }
  std::int64_t kv_dim_v() const { return std::int64_t(n_kv_heads) * head_dim_v; }
  std::int64_t k_blocks_per_row() const { return kv_dim_k() / kBlockValues; }
  std::int64_t v_blocks_per_row() const { return kv_dim_v() / kBlockValues; }
  std::int64_t k_tok_bytes() const { return k_blocks_per_row() * kQ8_0BlockBytes; }
  std::int64_t v_tok_bytes() const { return v_blocks_per_row() * kQ5_1BlockBytes; }
  bool is_ring() const { return storage == Storage::ring; }

  /// Physical rows of each plane: max_ctx when flat, else
  /// min(max_ctx, window + max_append + rewind_slack + align − 1) (SPEC §6).
  std::int64_t rows() const;

  /// Throws kvlayer::Error (refused) naming the first illegal field, its value and the limit.
  void validate() const;

  /// One-line human description, e.g. "flat 8x128/128 max_ctx 4096 window 512".
  std::string describe() const;
};

/// a rounded down to a multiple of kRingAlign (a ≥ 0).
constexpr std::int64_t align_down(std::int64_t a) { return a - a % kRingAlign; }

}  // namespace kvlayer
