// launch_decode: checks a launch's plan and arguments, resolves its parameters and enqueues the
// split kernel select_split_kernel names, then the merge (merge.cu). Host code only: the kernels
// are behind their launchers (launchers.hpp).
#include <cuda_runtime.h>

#include <cstdint>

#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/partition.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "mutants.hpp"

namespace kvlayer::cuda::detail {

using namespace decode_impl;  // NOLINT(google-build-using-namespace): the launchers

namespace {

/// A batch launch's BatchParams (SplitParams::batch); all zero for one layer's.
BatchParams batch_params(const DecodeArgs& a, const DecodePlan& plan, int row_blocks) {
  if (a.batch.slots == nullptr) return BatchParams{};
  const long long floats = (long long)(a.queries > 1 ? a.queries : 1) * plan.n_kv_heads * plan.gqa *
                           plan.head_dim;  // q and out per position
  return BatchParams{.list = a.batch,
                     .row_blocks = row_blocks,
                     .windowed = a.windowed,
                     .q_stride = floats,
                     .out_stride = floats,
                     .scratch_stride = static_cast<long long>(batch_scratch_stride(plan)),
                     .schedule = a.schedule};
}

}  // namespace

cudaError_t launch_decode(const DecodeArgs& a, const DecodePlan& plan, cudaStream_t stream) {
  // Plan and arguments: refuse anything the kernels were not built for (no device work).
  const bool plan_ok = head_dim_supported(plan.head_dim) && plan.gqa >= 1 && plan.gqa <= kMaxGqa &&
                       plan.n_kv_heads >= 1 && plan.n_kv_heads <= kMaxKvHeads &&
                       plan.n_splits >= 1 && plan.n_splits <= kDecodeMaxSplits &&
                       plan.max_view_keys >= 1 && plan.split_balance >= 0 &&
                       ((plan.kernel == DecodeKernel::cuda_core &&
                         plan.tile_keys == decode_tile_keys(plan.head_dim)) ||
                        (plan.kernel == DecodeKernel::mma && plan.tile_keys == kDecodeMmaTileKeys));
  const int T = a.queries;
  const bool verify = T > 0;
  if (!plan_ok || T < 0 || (verify && T > plan.max_verify)) return cudaErrorInvalidValue;
  const long long max_view = verify ? plan.verify_max_view_keys : plan.max_view_keys;
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % kDecodePlaneAlignment != 0;
  };
  const bool batch = a.batch.slots != nullptr;
  if (a.q == nullptr || a.out == nullptr || a.scratch == nullptr || a.rows < 0 || a.max_ctx < 0 ||
      a.window < 0)
    return cudaErrorInvalidValue;
  if (batch) {
    // The slots' planes were checked when the batch wrote them (kv_batch.cpp).
    const BatchSchedule& sc = a.schedule;
    const bool schedule_ok =
        sc.n_items == nullptr || (sc.splits != nullptr && sc.keys_per_split != nullptr &&
                                  sc.first_item != nullptr && sc.item_position != nullptr);
    if (!plan.batch || a.batch.active == nullptr || a.batch.n_active == nullptr ||
        a.max_batch < 1 || !schedule_ok)
      return cudaErrorInvalidValue;
  } else if (a.k_plane == nullptr || a.v_plane == nullptr || misaligned(a.k_plane) ||
             misaligned(a.v_plane) || (a.len_d != nullptr && a.status == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.len_d == nullptr && !batch) {
    // Host mode: the same checks the device makes, made here so a bad view launches nothing.
    const long long len = a.host_len, base = a.host_base;
    const long long begin = view_begin(len, T, a.window);
    if (len < 0 || len > a.max_ctx || (verify && len < T) || base < 0 || begin < base ||
        len - base > a.rows || len - begin > max_view)
      return cudaErrorInvalidValue;
  }

  const ViewParams vp{a.len_d,   a.base_d, a.host_len, a.host_base, a.window, a.rows,
                      a.max_ctx, max_view, T};
  const SplitChoice choice = select_split_kernel(plan, T);
  const SplitGrid sg = split_grid(plan, T);
  const int n_splits = sg.n_splits;
  const int tile_keys = sg.granule;
  const int split_balance = sg.balance;
  const SplitParams sp{vp,
                       a.k_plane,
                       a.v_plane,
                       plan.n_kv_heads * k_head_bytes(plan.head_dim),
                       plan.n_kv_heads * v_head_bytes(plan.head_dim),
                       a.q,
                       a.scale,
                       plan.gqa,
                       n_splits,
                       split_balance,
                       a.scratch,
                       a.status,
                       batch_params(a, plan, row_chunks(plan, T))};
  const int positions = batch ? a.max_batch : 1;
  const bool scheduled = sp.batch.schedule.n_items != nullptr;
  // A scheduled batch: as many blocks per KV head as the schedule can give out; otherwise the
  // plan's splits for each position.
  const long long x_blocks = scheduled ? batch_max_items(plan, a.max_batch) : n_splits;
  const dim3 grid(static_cast<unsigned>(x_blocks), static_cast<unsigned>(plan.n_kv_heads),
                  static_cast<unsigned>(row_chunks(plan, T) * (scheduled ? 1 : positions)));
  cudaError_t err = cudaSuccess;
  if (scheduled) {
    err = launch_batch_schedule(sp, static_cast<int>(batch_items(plan, T)), tile_keys, stream);
    if (err != cudaSuccess) return err;
  }
  switch (choice.kernel) {
    case SplitKernel::cuda_core:
      err = launch_split_cuda_core(sp, plan.head_dim, choice.rows, grid, stream);
      break;
    case SplitKernel::mma_direct:
    case SplitKernel::mma_bulk:
      err = launch_split_mma_direct(sp, plan.head_dim, choice.rows, false, grid, stream);
      break;
    case SplitKernel::mma_direct_verify:
      err = launch_split_mma_direct(sp, plan.head_dim, choice.rows, true, grid, stream);
      break;
    case SplitKernel::mma_staged:
      err = launch_split_mma_staged(sp, plan.head_dim, choice.rows, grid, stream);
      break;
    case SplitKernel::mma_verify:
      err = launch_split_mma_verify(sp, plan.head_dim, choice.rows, grid, stream);
      break;
    case SplitKernel::mma_verify_staged:
      err = launch_split_mma_verify_staged(sp, plan.head_dim, grid, stream);
      break;
    case SplitKernel::wgmma_verify:
      err = launch_split_wgmma_verify(sp, choice.rows, grid, stream);
      break;
  }
  if (err != cudaSuccess) return err;
  if (err = cudaGetLastError(); err != cudaSuccess) return err;

  // (planted bug: a verify's merge cuts the view with twice the split kernel's granule)
  const int merge_granule =
      verify && KVLAYER_HOST_MUTANT(verify_merge_granule) ? 2 * tile_keys : tile_keys;
  const MergeParams mp{vp,
                       a.out,
                       plan.gqa,
                       n_splits,
                       merge_granule,
                       split_balance,
                       plan.n_kv_heads,
                       plan.head_dim,
                       a.scratch,
                       sp.batch};
  return launch_merge(mp, positions, stream);
}

cudaError_t mma_split_resident_blocks(const DecodePlan& plan, int* blocks) {
  const SplitChoice choice = select_split_kernel(plan, 0);
  if (choice.kernel == SplitKernel::mma_direct || choice.kernel == SplitKernel::mma_bulk)
    return split_mma_direct_resident_blocks(plan.head_dim, choice.rows, false, blocks);
  if (choice.kernel == SplitKernel::mma_staged)
    return split_mma_staged_resident_blocks(plan.head_dim, choice.rows, blocks);
  return cudaErrorInvalidValue;  // not a tensor-core decode plan
}

cudaError_t mma_verify_resident_blocks(SplitKernel kernel, int head_dim, int rows, int* blocks) {
  if (kernel == SplitKernel::mma_direct_verify)
    return split_mma_direct_resident_blocks(head_dim, rows, true, blocks);
  if (kernel == SplitKernel::mma_verify)
    return split_mma_verify_resident_blocks(head_dim, rows, blocks);
  if (kernel == SplitKernel::wgmma_verify && head_dim == 128)
    return split_wgmma_verify_resident_blocks(rows, blocks);
  return cudaErrorInvalidValue;
}

}  // namespace kvlayer::cuda::detail
