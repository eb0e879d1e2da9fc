// Every compiled split-kernel instance, in one table: the kernel files build exactly these
// (each checks its instances against it), the planner reads their occupancy from it, and
// select_split_kernel chooses among them (tests check that its every choice is listed).
#pragma once

#include <cuda_runtime_api.h>

#include "partition.hpp"

namespace kvlayer::cuda::detail {

/// Every split kernel of the decode (all write the same partials; one merge, merge.cu).
enum class SplitKernel {
  cuda_core,   ///< decode_cuda_core.cu: decodes of a cuda_core plan
  mma_direct,  ///< decode_mma_direct.cu: register-direct loads; head dim 128 (8 or 16 rows)
  /// decode_mma_direct.cu's bulk instance: head dim 256 by 8 rows, the same arithmetic, its
  /// tiles brought by the copy engine (tensor-map boxes) into a per-warp shared-memory ring
  mma_bulk,
  mma_staged,  ///< decode_mma_staged.cu: cp.async stages per warp; head dim 64, 256 by 16 rows
  mma_verify,  ///< decode_mma_verify.cu: verify decodes of T ≥ 2 (SPEC §11), head dims 128, 256
  /// decode_mma_direct.cu's verify instances: verify decodes of T·gqa ≤ 16 at head dim 128, the
  /// decode's arithmetic with each row's causal view
  mma_direct_verify,
  mma_verify_staged,  ///< decode_mma_staged.cu: verify decodes of T ≥ 2, head dim 64
  /// decode_wgmma_verify.cu: verify decodes of T·gqa > 16 at head dim 128 on warpgroup MMA
  /// (opt-in, DecodeOptions::Verify::wgmma; sm_90a builds on compute capability 9.0 devices)
  wgmma_verify,
};

/// One compiled instance: its kernel, head dim, query rows per block, and the blocks one
/// multiprocessor holds at once (its shared memory and the register cap of its
/// __launch_bounds__, which takes this value).
struct SplitInstance {
  SplitKernel kernel;
  int head_dim;
  int rows;
  int blocks_per_sm;
};

// Why each occupancy: decode_mma_direct.cu, head dim 128 by 8 rows: 3 (two tiles of operands in
// registers at 168 registers per thread); by 16 rows: 2 (a second n-tile doubles q̃ and the
// accumulators; the verify instances alike); head dim 256 by 8 rows: 2 (two slices of operands;
// 58 KB of bulk-load ring).
// decode_mma_staged.cu: head dim 256 by 16 rows: 2 (96 KB of stages); head dim 64: 4.
// decode_mma_verify.cu: 2 (its register cap: 255 at 2, at 3 the 170-register cap spills, and
// 64 KB of shared memory). decode_wgmma_verify.cu: one warpgroup (64 rows) 2, two (128 rows) 1
// (~250 registers a thread; 99 KB of shared memory: two fp16 stages and two raw stages).
// decode_cuda_core.cu: kDecodeBlocksPerSm.
inline constexpr SplitInstance kSplitInstances[] = {
    {SplitKernel::mma_direct, 128, 8, 3},
    {SplitKernel::mma_direct, 128, 16, 2},
    {SplitKernel::mma_direct_verify, 128, 8, 3},
    {SplitKernel::mma_direct_verify, 128, 16, 2},
    {SplitKernel::mma_bulk, 256, 8, 2},
    {SplitKernel::mma_staged, 64, 8, 4},
    {SplitKernel::mma_staged, 64, 16, 4},
    {SplitKernel::mma_staged, 256, 16, 2},
    {SplitKernel::mma_verify, 128, 32, 2},
    {SplitKernel::mma_verify, 128, 64, 2},
    {SplitKernel::mma_verify, 256, 16, 2},
    {SplitKernel::mma_verify, 256, 32, 2},
    {SplitKernel::mma_verify_staged, 64, 16, 4},
    {SplitKernel::wgmma_verify, 128, 64, 2},
    {SplitKernel::wgmma_verify, 128, 128, 1},
    {SplitKernel::cuda_core, 64, 1, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 64, 2, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 64, 4, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 64, 8, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 64, 16, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 128, 1, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 128, 2, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 128, 4, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 128, 8, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 128, 16, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 256, 1, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 256, 2, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 256, 4, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 256, 8, kDecodeBlocksPerSm},
    {SplitKernel::cuda_core, 256, 16, kDecodeBlocksPerSm},
};

/// Whether (kernel, head_dim, rows) is compiled.
__host__ __device__ constexpr bool split_instance_built(SplitKernel kernel, int head_dim,
                                                        int rows) {
  for (const SplitInstance& i : kSplitInstances)
    if (i.kernel == kernel && i.head_dim == head_dim && i.rows == rows) return true;
  return false;
}

/// Resident blocks per multiprocessor of a compiled instance (0: not compiled).
__host__ __device__ constexpr int split_blocks_per_sm(SplitKernel kernel, int head_dim, int rows) {
  for (const SplitInstance& i : kSplitInstances)
    if (i.kernel == kernel && i.head_dim == head_dim && i.rows == rows) return i.blocks_per_sm;
  return 0;
}

/// Resident blocks per multiprocessor of the tensor-core decode instance (direct, bulk or
/// staged: one per (head dim, rows)) of `rows` mma rows per block.
__host__ __device__ constexpr int decode_mma_blocks_per_sm(int head_dim, int rows) {
  for (const SplitKernel k :
       {SplitKernel::mma_direct, SplitKernel::mma_bulk, SplitKernel::mma_staged})
    if (const int b = split_blocks_per_sm(k, head_dim, rows); b > 0) return b;
  return 0;
}

}  // namespace kvlayer::cuda::detail
