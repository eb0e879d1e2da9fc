// A batch launch's split schedule (SPEC §12): which (sequence, split) each block of the split
// grid works on, decided on the device at every launch from the active list of the moment, so
// that a replayed graph follows the batch's membership and lengths.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "partition.hpp"

namespace kvlayer::cuda::detail {

/// Written by plan_batch_splits before the split grid, read by begin_split and the merge: per
/// position j of the active list its splits (0: an empty view or one in error) of
/// keys_per_split keys and the index of its first item; per item (one (position, split) pair,
/// a block per KV head) its position; the launch's item count.
/// NOTE: null `n_items`: the launch is positional (a block's position is its blockIdx.z).
struct BatchSchedule {
  std::int32_t* splits = nullptr;          ///< [max_batch]
  std::int32_t* keys_per_split = nullptr;  ///< [max_batch]
  std::int32_t* first_item = nullptr;      ///< [max_batch]
  std::int32_t* item_position = nullptr;   ///< [max_items]
  std::int32_t* n_items = nullptr;         ///< [1]

  /// The schedule's one int32 buffer holds the arrays above in their order.
  static std::size_t words(std::size_t max_batch, std::size_t max_items) {
    return 3 * max_batch + max_items + 1;
  }
  static BatchSchedule in(std::int32_t* base, std::size_t max_batch, std::size_t max_items) {
    return BatchSchedule{base, base + max_batch, base + 2 * max_batch, base + 3 * max_batch,
                         base + 3 * max_batch + max_items};
  }
};

/// The launch's block length: chunk = max(⌈Σ n / items⌉, balance·⌊√Σ n⌋, granule), rounded up
/// to the granule, for views of Σ n keys in all (the device's schedule and its host twin, for
/// the bound's shapes, compute it alike).
__host__ __device__ inline std::int64_t batch_chunk(std::int64_t total, std::int64_t items,
                                                    int balance, int granule) {
  const std::int64_t per = (total + items - 1) / items;
  const auto floor = static_cast<std::int64_t>(balance) *
                     static_cast<std::int64_t>(sqrt(static_cast<double>(total)));
  std::int64_t chunk = per > floor ? per : floor;
  chunk = (chunk + granule - 1) / granule * granule;
  return chunk > granule ? chunk : granule;
}

/// A view of `keys` keys under the launch's chunk: s = min(⌈keys / chunk⌉, max_splits) splits
/// of decode_keys_per_split(keys, s, granule, 0) keys, then as many splits as those keys need
/// (0 splits for no keys).
struct BatchSplits {
  int splits = 0;
  int keys_per_split = 0;
};
__host__ __device__ inline BatchSplits batch_splits(std::int64_t keys, std::int64_t chunk,
                                                    int max_splits, int granule) {
  BatchSplits b;
  if (keys <= 0) return b;
  const std::int64_t want = (keys + chunk - 1) / chunk;
  b.splits = static_cast<int>(want < max_splits ? want : max_splits);
  b.keys_per_split = static_cast<int>(decode_keys_per_split(keys, b.splits, granule, 0));
  b.splits = static_cast<int>((keys + b.keys_per_split - 1) / b.keys_per_split);
  return b;
}

}  // namespace kvlayer::cuda::detail
