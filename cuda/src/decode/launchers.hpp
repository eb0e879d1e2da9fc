// The launchers: one per split kernel, plus the merge (launch.cu calls them); each runs the
// kernel that select_split_kernel (plan.cpp) names, with its choice's parameters.
#pragma once

#include <cuda_runtime.h>

#include "decode/split_work.cuh"

namespace kvlayer::cuda::detail::decode_impl {

/// decode_cuda_core.cu: the CUDA-core split kernel for `rows` (1, 2, 4, 8, 16) query heads.
cudaError_t launch_split_cuda_core(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                   cudaStream_t stream);
/// decode_mma_staged.cu: the staged tensor-core split kernel with `rows` (8 or 16) mma rows.
cudaError_t launch_split_mma_staged(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream);
/// decode_mma_staged.cu: the staged verify split kernel (SPEC §11), 16 query rows per block (head
/// dim 64).
cudaError_t launch_split_mma_verify_staged(const SplitParams& sp, int head_dim, dim3 grid,
                                           cudaStream_t stream);
/// decode_mma_verify.cu: the verify split kernel for head dim 128 or 256, `rows` query rows per
/// block (select_split_kernel's).
cudaError_t launch_split_mma_verify(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream);
/// decode_wgmma_verify.cu: the warpgroup-MMA verify split kernel (head dim 128), `rows` 64 or 128
/// query rows per block.
cudaError_t launch_split_wgmma_verify(const SplitParams& sp, int rows, dim3 grid,
                                      cudaStream_t stream);
/// decode_mma_direct.cu: the tensor-core split kernel for head dim 128 and `rows` 8 or 16 query
/// rows (register-direct loads; verify: SplitKernel::mma_direct_verify's rows of a verify
/// decode), or head dim 256 and 8 (bulk loads: SplitKernel::mma_bulk).
cudaError_t launch_split_mma_direct(const SplitParams& sp, int head_dim, int rows, bool verify,
                                    dim3 grid, cudaStream_t stream);

/// batch_schedule.cu: enqueues plan_batch_splits for a scheduled batch launch (sp.batch's
/// schedule), aiming at `items` blocks per KV head of `granule`-key multiples.
cudaError_t launch_batch_schedule(const SplitParams& sp, int items, int granule,
                                  cudaStream_t stream);

/// Resident blocks per multiprocessor (occupancy API, with the launch's attributes applied).
cudaError_t split_mma_staged_resident_blocks(int head_dim, int rows, int* blocks);
cudaError_t split_mma_direct_resident_blocks(int head_dim, int rows, bool verify, int* blocks);
cudaError_t split_mma_verify_resident_blocks(int head_dim, int rows, int* blocks);
cudaError_t split_wgmma_verify_resident_blocks(int rows, int* blocks);

/// What the merge reads and writes (merge.cu).
struct MergeParams {
  ViewParams view;
  float* out;
  int gqa, n_splits, tile_keys, split_balance, n_kv, head_dim;
  void* scratch;
  BatchParams batch;  ///< the split grid's (slots null: one layer)
};

/// merge.cu: enqueues the merge of every query row's partials as a programmatic dependent of
/// the split grid just enqueued on `stream`; `positions`: max_batch for a batch, else 1.
cudaError_t launch_merge(const MergeParams& mp, int positions, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail::decode_impl
