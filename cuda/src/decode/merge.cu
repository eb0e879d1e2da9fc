// The merge of the split partials (SPEC §8), shared by every split kernel: per output element
// accuracy.hpp (4): M = max m_i, w_i = exp2f((m_i − M)·log2e) (exactly 1 for the max),
// o = (Σ_i o_i·w_i) / (Σ_i l_i·w_i) by fmaf in split order, IEEE division.
#include <cuda_runtime.h>

#include <cstdint>

#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/partition.hpp"

namespace kvlayer::cuda::detail {
namespace {

using namespace decode_impl;  // NOLINT(google-build-using-namespace): the shared pieces

/// Merge geometry: a block merges kMergeCols output columns of one query head; its threads
/// first copy the partials' slices into shared memory (kMergeChunk splits at a time, every load
/// in flight at once), then one warp sums them, one column per lane, in split order.
/// NOTE: every load of a block is in flight at once because the merge is latency-bound: a
/// thread per column walking the splits waits for ceil(splits / 64) dependent rounds of L2
/// loads, which at 128K keys costs more than the split grid itself (bench/NOTES.md).
constexpr int kMergeCols = 32;
constexpr int kMergeThreads = 256;
constexpr int kMergeChunk = 256;  ///< splits staged at once: 32 KB of o slices
static_assert(kMergeCols == 32, "one lane per column in the sum");

/// Grid (n_kv × query rows per KV head (query_rows), head_dim / kMergeCols), kMergeThreads
/// threads: merges the active splits' partials of one query row. Per output element the arithmetic
/// is fixed: M = max of the m_i, w_i = exp2f((m_i − M)·log2e) (exactly 1 for the max), num and den
/// summed by fmaf in split order, out = num / den. Writes nothing when the view is in error.
/// kBatch: blockIdx.z is the position in the batch's active list (BatchParams).
template <bool kBatch>
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const MergeParams p) {
  __shared__ __align__(16) float o_s[kMergeChunk][kMergeCols];
  __shared__ float l_s[kMergeChunk];
  __shared__ float w_s[kDecodeMaxSplits];
  __shared__ float red_s[kMergeThreads / 32];
  // The view first: the split grid does not write len_d or base_d (the work before it on the
  // stream, which does, has completed), so their round trip overlaps the split grid's tail.
  ViewParams view_params = p.view;
  float* out = p.out;
  void* scratch = p.scratch;
  if constexpr (kBatch) {
    const int j = int(blockIdx.z);
    if (j >= *p.batch.list.n_active) return;
    view_params = batch_view(p.view, p.batch, j, MutantSite::decode_merge);
    out += j * p.batch.out_stride;
    scratch = static_cast<char*>(scratch) + j * p.batch.scratch_stride;
  }
  const View view = resolve_view(view_params, MutantSite::decode_merge);
  wait_for_split_grid();   // launched as a programmatic dependent of the split grid
  if (view.error) return;  // the split kernel recorded it
  const int D = p.head_dim;
  const int rows = query_rows(p.view.queries, p.gqa);
  const int h = blockIdx.x, kv = h / rows, g = h % rows;
  const long long out_row = query_row_index(g, kv, p.gqa, p.n_kv);
  const int col0 = blockIdx.y * kMergeCols;
  const int tid = threadIdx.x;
  const long long n = view.end - view.begin;
  if (n <= 0) {
    if (tid < kMergeCols) out[out_row * D + col0 + tid] = 0.0f;  // SPEC §8: zeros
    return;
  }
  int active = 0;
  if (kBatch && p.batch.schedule.n_items != nullptr) {
    active = p.batch.schedule.splits[blockIdx.z];  // the split grid's schedule
    if (active == 0) {
      if (tid < kMergeCols) out[out_row * D + col0 + tid] = 0.0f;
      return;
    }
  } else {
    const auto kps =
        static_cast<unsigned>(decode_keys_per_split(n, p.n_splits, p.tile_keys, p.split_balance));
    active = static_cast<int>((static_cast<unsigned>(n) + kps - 1) / kps);  // 32-bit
  }
  const Scratch s = scratch_layout(scratch, p.n_kv, p.n_splits, rows, D);
  const long long part0 = (long long)kv * p.n_splits;  // partial (kv, split 0)

  // Copies splits [i0, i0 + chunk) of this block's columns (16-byte pieces) and their l.
  const auto stage_chunk = [&](int i0) {
    const int chunk = min(kMergeChunk, active - i0);
    constexpr int kPieces = kMergeCols / 4;
    for (int q = tid; q < chunk * kPieces; q += kMergeThreads) {
      const int j = q / kPieces, piece = q % kPieces;
      const long long part = (part0 + i0 + j) * rows + g;
      cp_async<16>(&o_s[j][4 * piece], s.o + part * D + col0 + 4 * piece);
    }
    for (int j = tid; j < chunk; j += kMergeThreads)
      cp_async<4>(&l_s[j], s.l + (part0 + i0 + j) * rows + g);
    cp_async_commit();
  };
  stage_chunk(0);  // independent of the max below: its loads overlap the max pass

  // M = max_i m_i (fmaxf is exact and order-free); then the weights.
  float top = kNegSentinel;
  for (int i = tid; i < active; i += kMergeThreads) top = fmaxf(top, s.m[(part0 + i) * rows + g]);
  top = warp_max(top);
  if (tid % 32 == 0) red_s[tid / 32] = top;
  __syncthreads();
  top = kNegSentinel;
  for (int i = 0; i < kMergeThreads / 32; ++i) top = fmaxf(top, red_s[i]);
  for (int i = tid; i < active; i += kMergeThreads) {
    const float mi = s.m[(part0 + i) * rows + g];
    w_s[i] = softmax_rescale(mi, top);
  }

  float num = 0.0f, den = 0.0f;
  for (int i0 = 0; i0 < active; i0 += kMergeChunk) {
    if (i0 > 0) {
      __syncthreads();  // the summing warp is done with the previous chunk
      stage_chunk(i0);
    }
    cp_async_wait<0>();
    __syncthreads();  // every thread's copies (and, the first time, w_s) are visible
    if (tid < kMergeCols) {
      const int chunk = min(kMergeChunk, active - i0);
      // NOTE: unrolled so that the shared-memory loads of 8 splits are in flight at once; the two
      // fmaf chains stay in split order. Rolled, every step waits for its loads.
#pragma unroll 8
      for (int j = 0; j < chunk; ++j) {
        num = fmaf(o_s[j][tid], w_s[i0 + j], num);
        if (KVLAYER_DEVICE_MUTANT(merge_drops_split_weight) && i0 + j == 0 && active > 1) {
          if (l_s[j] * w_s[i0 + j] != 0.0f) KVLAYER_MUTANT_REACHED(MutantSite::decode_merge);
          continue;  // planted bug: split 0's weight is missing from the denominator
        }
        den = fmaf(l_s[j], w_s[i0 + j], den);
      }
    }
  }
  if (tid < kMergeCols) out[out_row * D + col0 + tid] = num / den;
}

}  // namespace

namespace decode_impl {

cudaError_t launch_merge(const MergeParams& mp, int positions, cudaStream_t stream) {
  // Programmatic dependent launch: the merge grid may be scheduled while the split grid drains;
  // it waits for the split grid's completion (wait_for_split_grid) before reading scratch.
  // NOTE: saves the launch gap between the two kernels (bench/NOTES.md); graph-capturable.
  cudaLaunchConfig_t config{};
  config.gridDim =
      dim3(static_cast<unsigned>(mp.n_kv * query_rows(mp.view.queries, mp.gqa)),
           static_cast<unsigned>(mp.head_dim / kMergeCols), static_cast<unsigned>(positions));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return mp.batch.list.slots != nullptr
             ? cudaLaunchKernelEx(&config, decode_merge_kernel<true>, mp)
             : cudaLaunchKernelEx(&config, decode_merge_kernel<false>, mp);
}

}  // namespace decode_impl

KVLAYER_DEFINE_MUTANT_UNIT(decode_merge)

}  // namespace kvlayer::cuda::detail
