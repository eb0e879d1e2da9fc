// plan_batch_splits: a batch launch's split schedule (batch_schedule.hpp), made on the device at
// every launch from the active list and the sequences' counters of that moment.
#include <cuda_runtime.h>

#include <cstdint>

#include "decode/decode_common.cuh"
#include "kvlayer/cuda/kv_batch.hpp"

namespace kvlayer::cuda::detail {
namespace {

using namespace decode_impl;  // NOLINT(google-build-using-namespace): the shared pieces

/// One thread per position of the active list.
constexpr int kScheduleThreads = 1024;
static_assert(kScheduleThreads >= kMaxBatch, "one thread per position");
constexpr int kScheduleWarps = kScheduleThreads / 32;

/// Inclusive sum over the block (every thread gets the sum up to and including its own value)
/// and the block's total. Call from every thread.
template <typename T>
__device__ T block_inclusive_sum(T x, T* warp_totals, T& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T y = __shfl_up_sync(kFullMask, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_totals[warp] = x;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kScheduleWarps; ++w) {
    if (w < warp) before += warp_totals[w];
    all += warp_totals[w];
  }
  __syncthreads();  // warp_totals may be reused
  total = all;
  return before + x;
}

/// One block of kScheduleThreads. Position j's view of n_j keys (0 when empty; a view in error
/// records its device error here, once, and gets no split); one chunk for the launch
/// (batch_chunk), each position its splits (batch_splits), the items the positions' splits in
/// list order.
/// NOTE: one length for every block of the launch: a long sequence gets many splits and a short
/// one few, and Σ s_j ≤ items + positions (batch_max_items).
__global__ void __launch_bounds__(kScheduleThreads)
    plan_batch_splits_kernel(const ViewParams view, const BatchParams batch, int items,
                             int max_splits, int granule, int balance) {
  __shared__ long long key_totals[kScheduleWarps];
  __shared__ int split_totals[kScheduleWarps];
  const int j = threadIdx.x;
  const int n_active = *batch.list.n_active;
  long long keys = 0;
  if (j < n_active) {
    const View v = resolve_view(batch_view(view, batch, j, MutantSite::batch_schedule),
                                MutantSite::batch_schedule);
    if (v.error)
      record_device_error(batch.list.slots[batch.list.active[j]].status,
                          int(DeviceErrorKind::decode_view_too_long), v.len, v.base, v.limit);
    else if (v.end > v.begin)
      keys = v.end - v.begin;
  }
  long long total = 0;
  block_inclusive_sum(keys, key_totals, total);
  const long long chunk = batch_chunk(total, items, balance, granule);
  const BatchSplits mine = batch_splits(keys, chunk, max_splits, granule);
  const int splits = mine.splits;
  int kps = mine.keys_per_split;
  if (KVLAYER_DEVICE_MUTANT(batch_schedule_short_split) && splits > 1) {
    kps -= granule;  // planted bug: the splits no longer reach the view's end
    KVLAYER_MUTANT_REACHED(MutantSite::batch_schedule);
  }
  int n_items = 0;
  const int first = block_inclusive_sum(splits, split_totals, n_items) - splits;
  if (j < n_active) {
    batch.schedule.splits[j] = splits;
    batch.schedule.keys_per_split[j] = kps;
    batch.schedule.first_item[j] = first;
    for (int s = 0; s < splits; ++s) batch.schedule.item_position[first + s] = j;
  }
  if (j == 0) *batch.schedule.n_items = n_items;
}

}  // namespace

namespace decode_impl {

cudaError_t launch_batch_schedule(const SplitParams& sp, int items, int granule,
                                  cudaStream_t stream) {
  plan_batch_splits_kernel<<<1, kScheduleThreads, 0, stream>>>(
      sp.view, sp.batch, items, sp.n_splits, granule, sp.split_balance);
  return cudaGetLastError();
}

}  // namespace decode_impl

KVLAYER_DEFINE_MUTANT_UNIT(batch_schedule)

}  // namespace kvlayer::cuda::detail
