// The merge folded into the split grid (SPEC §8; decode_folds): every block of a (KV head, row
// block) writes its partial and arrives at that pair's counter; the block that arrives last
// merges the pair's partials with merge.cu's arithmetic, element for element (accuracy.hpp (4)),
// so a folded decode equals the unfolded one bit for bit and runs as one launch.
//
// The counter needs no reset: the last arrival's atomicInc wraps it back to 0, so every launch
// (a replayed graph's included) finds it at 0. Blocks that do not arrive (beyond the view's
// splits, or of a view in error) leave it alone.
// NOTE: every load of the merge goes through L2 (ld.global.cg): the partials were written by
// other blocks of the same grid, and L1 is not coherent with them.
#pragma once

#include <cuda_runtime.h>

#include "decode/softmax_state.cuh"
#include "decode/split_work.cuh"
#include "kvlayer/cuda/decode_options.hpp"
#include "mutants.cuh"

namespace kvlayer::cuda::detail::decode_impl {

/// The shared memory (floats) a folded block's merge needs at the most: the weights and sums of
/// every (split, row) pair of the largest fold a plan makes (DecodeOptions::kMaxFoldKib of o
/// partials), and each row's max.
__host__ __device__ constexpr int fold_merge_floats(int head_dim, int max_rows) {
  return 2 * (DecodeOptions::kMaxFoldKib * 1024 / (4 * head_dim)) + max_rows;
}

/// The arrival of a block whose partial stores every thread has issued (block-uniform; its
/// barriers take every thread): true in the block that arrives last of r.arrivals at its (KV
/// head, row block)'s counter.
__device__ inline bool fold_arrive(const SplitParams& p, const SplitRange& r, MutantSite site) {
  __shared__ int last_s;
  // The block's partial stores, ordered by the barrier before thread 0's release (cumulative);
  // a fence in every thread (fence.sc) cost more than the merge kernel's launch.
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned modulus = unsigned(r.arrivals) - 1;
    if (KVLAYER_DEVICE_MUTANT(fold_modulus_n_splits) && r.arrivals < p.n_splits) {
      modulus = unsigned(p.n_splits) - 1;  // planted bug: counts the grid's splits, not the view's
      KVLAYER_MUTANT_REACHED(site);
    }
    const bool first_split = blockIdx.x + gridDim.x * blockIdx.y < gridDim.y;
    unsigned ticket = 0;
    if (KVLAYER_DEVICE_MUTANT(fold_skips_arrival) && first_split && r.arrivals > 1) {
      ticket = 0;  // planted bug: split 0 does not count its arrival
      KVLAYER_MUTANT_REACHED(site);
    } else {
      // acq_rel: releases this block's partial; acquires those of the blocks before it.
      asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;"
                   : "=r"(ticket)
                   : "l"(p.fold_counters + r.kv * gridDim.z + blockIdx.z), "r"(modulus)
                   : "memory");
    }
    last_s = ticket == modulus;
  }
  __syncthreads();
  return last_s != 0;
}

/// The last block's merge of its (KV head, row block)'s partials, written to p.out: per output
/// element M = max of the splits' m (exact, order-free), w_i = softmax_rescale(m_i, M), num =
/// Σ o_i·w_i and den = Σ l_i·w_i by fmaf in split order, out = num / den, as merge.cu. smem:
/// fold_merge_floats(kD, kMaxRows) floats the block no longer uses. Every load of a chunk of
/// splits is in flight at once (the merge is latency-bound), the first chunk's before the
/// weights are known.
template <int kD, int kMaxRows, int kThreads>
__device__ inline void fold_merge(const SplitParams& p, const SplitRange& r, float* smem,
                                  MutantSite site) {
  // Per thread: kGroups runs of 4 columns of the block's nrows × kD outputs; kChunk splits'
  // loads (64 floats) in flight.
  constexpr int kGroups = kMaxRows * kD / (4 * kThreads);
  constexpr int kChunk = 16 / kGroups;
  static_assert(kGroups >= 1 && kChunk >= 1 && kMaxRows * kD == 4 * kThreads * kGroups);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int nrows = r.nrows, active = r.arrivals;
  const int rows = query_rows(p.view.queries, p.gqa);
  const Scratch s = scratch_layout(p.scratch, int(gridDim.y), p.n_splits, rows, kD);
  const long long part0 = (long long)r.kv * p.n_splits;  // partial (kv, split 0)
  const float* o0 = s.o + (part0 * rows + r.row0) * kD;
  const float* m0 = s.m + part0 * rows + r.row0;
  const float* l0 = s.l + part0 * rows + r.row0;
  const long long o_split = (long long)rows * kD;  // floats between two splits' o
  float* w_s = smem;                               // [active][nrows]: m, then the weights
  float* l_s = smem + active * nrows;              // [active][nrows]
  float* top_s = l_s + active * nrows;             // [nrows]

  int e0[kGroups];  // each run's first output (row e0 / kD, column e0 % kD)
#pragma unroll
  for (int g = 0; g < kGroups; ++g) e0[g] = 4 * (tid + g * kThreads);
  float4 buf[kChunk][kGroups];
  const auto issue = [&](int i0) {
#pragma unroll
    for (int c = 0; c < kChunk; ++c)
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
        if (i0 + c < active && e0[g] < nrows * kD)
          buf[c][g] = __ldcg(reinterpret_cast<const float4*>(o0 + (i0 + c) * o_split + e0[g]));
  };
  issue(0);  // independent of the weights: its loads overlap the max pass

  for (int e = tid; e < active * nrows; e += kThreads) {
    const int i = e / nrows, h = e % nrows;
    w_s[e] = __ldcg(m0 + (long long)i * rows + h);
    l_s[e] = __ldcg(l0 + (long long)i * rows + h);
  }
  __syncthreads();
  for (int h = warp; h < nrows; h += kThreads / 32) {
    float top = kNegSentinel;
    for (int i = lane; i < active; i += 32) top = fmaxf(top, w_s[i * nrows + h]);
    top = warp_max(top);
    if (lane == 0) top_s[h] = top;
  }
  __syncthreads();
  for (int e = tid; e < active * nrows; e += kThreads)
    w_s[e] = softmax_rescale(w_s[e], top_s[e % nrows]);
  __syncthreads();

  float num[kGroups][4], den[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    den[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) num[g][k] = 0.0f;
  }
  for (int i0 = 0; i0 < active; i0 += kChunk) {
    if (i0 > 0) issue(i0);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int i = i0 + c;
      if (i >= active) break;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        if (e0[g] >= nrows * kD) continue;
        const int h = e0[g] / kD;
        const float w = w_s[i * nrows + h];
        num[g][0] = fmaf(buf[c][g].x, w, num[g][0]);
        num[g][1] = fmaf(buf[c][g].y, w, num[g][1]);
        num[g][2] = fmaf(buf[c][g].z, w, num[g][2]);
        num[g][3] = fmaf(buf[c][g].w, w, num[g][3]);
        if (KVLAYER_DEVICE_MUTANT(merge_drops_split_weight) && i == 0 && active > 1) {
          if (l_s[h] * w != 0.0f) KVLAYER_MUTANT_REACHED(site);
          continue;  // planted bug: split 0's weight is missing from the denominator
        }
        den[g] = fmaf(l_s[i * nrows + h], w, den[g]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (e0[g] >= nrows * kD) continue;
    const int h = e0[g] / kD, col = e0[g] % kD;
    float* out = p.out + query_row_index(r.row0 + h, r.kv, p.gqa, int(gridDim.y)) * kD + col;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = num[g][k] / den[g];
  }
}

/// A folded block's last step, after its partial's stores (empty or not): it arrives, and the
/// last to arrive merges. A block of an empty view has no partial: the first n_kv blocks write
/// their KV head's zeros instead (SPEC §8), as merge.cu would.
template <int kD, int kMaxRows, int kThreads>
__device__ inline void fold_tail(const SplitParams& p, const SplitRange& r, float* smem,
                                 MutantSite site) {
  if (r.empty_view) {
    const unsigned index = blockIdx.x + gridDim.x * blockIdx.y;
    if (index >= gridDim.y) return;
    for (int e = threadIdx.x; e < r.nrows * kD; e += kThreads)
      p.out[query_row_index(r.row0 + e / kD, int(index), p.gqa, int(gridDim.y)) * kD + e % kD] =
          0.0f;
    return;
  }
  if (r.arrivals == 0) return;  // not one of the view's splits (or its view is in error)
  if (fold_arrive(p, r, site)) fold_merge<kD, kMaxRows, kThreads>(p, r, smem, site);
}

}  // namespace kvlayer::cuda::detail::decode_impl
