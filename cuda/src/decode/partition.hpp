// The split-K partition shared by the planner (host) and the kernels (device): one formula, so
// the plan's max_keys_per_split bounds what the kernels actually do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvlayer::cuda::detail {

/// Threads per split block: one (key, 32-value block) pair each in the score phase.
inline constexpr int kDecodeThreads = 128;
/// Upper bound on n_splits (the merge kernel keeps one weight per split in shared memory).
inline constexpr int kDecodeMaxSplits = 1024;
/// Split blocks the planner aims for per multiprocessor at max_view_keys.
inline constexpr int kDecodeBlocksPerSm = 4;

/// Tensor-core kernel (decode_mma.cu): 4 warps, each owning every 4th 16-key warp tile of the
/// split, so the partition granule (tile_keys of its plan) is 64 keys for every head dim.
inline constexpr int kDecodeMmaWarps = 4;
inline constexpr int kDecodeMmaWarpKeys = 16;
inline constexpr int kDecodeMmaTileKeys = kDecodeMmaWarps * kDecodeMmaWarpKeys;

/// Resident tensor-core split blocks per multiprocessor (shared memory and the register cap of
/// its __launch_bounds__): head dim 128 with gqa ≤ 8 is decode_mma_direct.cu's kernel (3: two
/// tiles of operands in registers, 168 registers per thread); for decode_mma.cu, head dim 256
/// needs 96 KB of stages and gqa > 8 doubles the accumulators.
__host__ __device__ constexpr int decode_mma_blocks_per_sm(int head_dim, int gqa) {
  (void)gqa;  // both head-dim-128 kernels (gqa ≤ 8 direct, gqa > 8 staged) hold 3 today
  return head_dim == 256 ? 2 : (head_dim == 128 ? 3 : 4);
}

/// Query rows of a verify decode (SPEC §11) one tensor-core split block holds: one mma tile.
inline constexpr int kVerifyRowsPerBlock = 16;

/// Rows per block of a verify grid of `z` row blocks (blockIdx.z) over `rows` query rows.
__host__ __device__ constexpr int verify_rows_per_block(int rows, int z) {
  return z <= 1 ? rows : (rows + z - 1) / z;
}

/// Keys per tile for a head dim: tile × (head_dim / 32) = kDecodeThreads.
__host__ __device__ constexpr int decode_tile_keys(int head_dim) {
  return kDecodeThreads / (head_dim / 32);
}

/// Keys per split for a view of n ≥ 1 keys: ceil(n / n_splits) rounded up to a whole tile.
/// NOTE: depends only on the view length and the geometry (SPEC §8 determinism).
__host__ __device__ constexpr std::int64_t decode_keys_per_split(std::int64_t n, int n_splits,
                                                                 int tile_keys) {
  const std::int64_t per = (n + n_splits - 1) / n_splits;
  return (per + tile_keys - 1) / tile_keys * tile_keys;
}

}  // namespace kvlayer::cuda::detail
