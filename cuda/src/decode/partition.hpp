// The split-K partition shared by the planner (host) and the kernels (device): one formula, so
// the plan's max_keys_per_split bounds what the kernels actually do.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace kvlayer::cuda::detail {

/// Threads per split block: one (key, 32-value block) pair each in the score phase.
inline constexpr int kDecodeThreads = 128;
/// Upper bound on n_splits (the merge kernel keeps one weight per split in shared memory).
inline constexpr int kDecodeMaxSplits = 1024;
/// Split blocks the planner aims for per multiprocessor at max_view_keys.
inline constexpr int kDecodeBlocksPerSm = 4;

/// Tensor-core kernel (decode_mma_staged.cu): 4 warps, each owning every 4th 16-key warp tile of
/// the split, so the partition granule (tile_keys of its plan) is 64 keys for every head dim.
inline constexpr int kDecodeMmaWarps = 4;
inline constexpr int kDecodeMmaWarpKeys = 16;
inline constexpr int kDecodeMmaTileKeys = kDecodeMmaWarps * kDecodeMmaWarpKeys;

/// Query rows of a verify decode (SPEC §11) one staged verify block holds (decode_mma_staged.cu).
inline constexpr int kVerifyRowsPerBlock = 16;

/// decode_mma_verify.cu (head dims 128 and 256): keys per block tile (its fp16 stage), query
/// rows per warp row group (its accumulators: 16 at head dim 128, 8 at 256).
__host__ __device__ constexpr int verify_tile_keys(int head_dim) {
  return head_dim == 128 ? 64 : 32;
}
__host__ __device__ constexpr int verify_group_rows(int head_dim) {
  return head_dim == 128 ? 16 : 8;
}

/// decode_wgmma_verify.cu (head dim 128): keys per block tile, and query rows per warpgroup
/// (wgmma's M); a block has one or two warpgroups.
inline constexpr int kWgmmaVerifyTileKeys = 64;
inline constexpr int kWgmmaVerifyRows = 64;

/// Whether decode_mma_verify.cu folds each K block's d into its fp16 K (accuracy.hpp (1), fused
/// form; the plan's AccumulationShape::k_fused_f16): at head dim 128. At 256 the 16-step chain
/// would leave the declared check short of its resolution target (bench/NOTES.md).
__host__ __device__ constexpr bool verify_folds_k(int head_dim) {
  return head_dim == 128;
}

/// Warp row groups per decode_mma_verify.cu block for T·gqa = rows: 1, 2 or 4 (at least 2 at
/// head dim 256, whose 32-key tile has two m-tiles for at most two key groups), the other
/// factor of its kDecodeMmaWarps warps splitting each tile's keys.
__host__ __device__ constexpr int verify_row_groups(int head_dim, int rows) {
  const int per_group = verify_group_rows(head_dim);
  const int groups = rows <= per_group ? 1 : rows <= 2 * per_group ? 2 : 4;
  return head_dim == 256 && groups < 2 ? 2 : groups;
}

/// 16-key m-tiles a decode_mma_verify.cu warp takes per block tile (one PV mma step each).
__host__ __device__ constexpr int verify_warp_mtiles(int head_dim, int rows) {
  return verify_tile_keys(head_dim) / 16 / (kDecodeMmaWarps / verify_row_groups(head_dim, rows));
}

/// m-tiles per online-softmax step (one max update) of decode_mma_verify.cu: 2 (two independent
/// chains per warp, 4–9% faster than 1, bench/NOTES.md) where a warp has two or more per tile.
inline constexpr int kVerifyPairs = 2;

/// Max updates per block tile of one decode_mma_verify.cu accumulator.
__host__ __device__ constexpr int verify_softmax_steps(int head_dim, int rows) {
  const int mtiles = verify_warp_mtiles(head_dim, rows);
  return mtiles >= kVerifyPairs ? mtiles / kVerifyPairs : mtiles;
}

/// Rows per block of a verify grid of `z` row blocks (blockIdx.z) over `rows` query rows.
__host__ __device__ constexpr int verify_rows_per_block(int rows, int z) {
  return z <= 1 ? rows : (rows + z - 1) / z;
}

/// Keys per tile for a head dim: tile × (head_dim / 32) = kDecodeThreads.
__host__ __device__ constexpr int decode_tile_keys(int head_dim) {
  return kDecodeThreads / (head_dim / 32);
}

/// ⌊√n⌋ for n < 2^32: the f32 root is within one of it (f32 keeps 24 bits of n), and the
/// integer correction makes it exact, so that host and device agree bit for bit.
/// NOTE: on the split and merge kernels' critical path before their first load, hence no
/// bitwise 64-bit loop.
__host__ __device__ inline std::uint32_t isqrt(std::uint32_t n) {
  std::uint32_t r = static_cast<std::uint32_t>(sqrtf(static_cast<float>(n)));
  if (std::uint64_t(r) * r > n)
    --r;
  else if (std::uint64_t(r + 1) * (r + 1) <= n)
    ++r;
  return r;
}

/// Decode plans' split balance (DecodeOptions::split_balance, default 2): a view of n keys takes
/// splits of at least balance·√n keys, about √n / 2 of them at the default. The split grid's
/// work per split falls as n / splits while the merge's grows with the splits: without the
/// floor, a short view over one KV head takes hundreds of splits whose merge costs more than
/// their keys.

/// Keys per split for a view of n ≥ 1 keys: the larger of ceil(n / n_splits) and balance·⌊√n⌋
/// (balance 0: no floor), rounded up to a whole tile.
/// NOTE: depends only on the view length and the geometry (SPEC §8 determinism), and never
/// falls as n grows, so the longest view bounds every launch's splits.
/// NOTE: 32-bit arithmetic (views hold at most 2^31 − 1 keys, plan_decode's bound): 64-bit
/// divisions are long subroutines on the device, on the kernels' critical path.
__host__ __device__ inline std::int64_t decode_keys_per_split(std::int64_t n, int n_splits,
                                                              int tile_keys, int balance) {
  const auto m = static_cast<std::uint32_t>(n);
  const auto splits = static_cast<std::uint32_t>(n_splits);
  const auto tile = static_cast<std::uint32_t>(tile_keys);
  const std::uint32_t per = (m + splits - 1) / splits;  // < 2^32 for n_splits ≤ 2^31
  const std::uint32_t floor = static_cast<std::uint32_t>(balance) * isqrt(m);
  const std::uint32_t keys = per > floor ? per : floor;
  return (keys + tile - 1) / tile * tile;
}

}  // namespace kvlayer::cuda::detail
