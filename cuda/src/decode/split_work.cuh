// What one split block works on, and the one place that maps a block to it: the launch
// parameters, the scratch layout of the partial results, begin_split (KV head, split, keys,
// query rows, partial) and the last step of a tensor-core block (its warps into the partial).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "batch_slots.hpp"
#include "decode/batch_schedule.hpp"
#include "decode/partition.hpp"
#include "decode/pdl.cuh"
#include "decode/softmax_state.cuh"
#include "decode/view.cuh"
#include "device_status.cuh"
#include "kvlayer/status.hpp"
#include "mutants.cuh"

namespace kvlayer::cuda::detail::decode_impl {

/// Partial results of one (KV head, split): o[rows][D], m[rows], l[rows] at fixed offsets,
/// rows = the query rows of a KV head (query_rows()).
struct Scratch {
  float* o;
  float* m;
  float* l;
};

__host__ __device__ inline Scratch scratch_layout(void* base, int n_kv, int n_splits, int rows,
                                                  int d) {
  float* f = static_cast<float*>(base);
  const long long parts = (long long)n_kv * n_splits * rows;
  return Scratch{f, f + parts * d, f + parts * d + parts};
}

/// Query rows per KV head: gqa for a decode, T·gqa for a verify decode; row r is query r / gqa
/// (position len − T + r / gqa), head r % gqa of the KV head.
__host__ __device__ inline int query_rows(long long queries, int gqa) {
  return queries > 1 ? int(queries) * gqa : gqa;
}

/// Index of row r of KV head kv in the [T, n_q_heads, ·] layout of q and out.
__host__ __device__ inline long long query_row_index(int r, int kv, int gqa, int n_kv) {
  return ((long long)(r / gqa) * n_kv + kv) * gqa + r % gqa;
}

/// What a batch launch adds to one layer's: the batch's slots and active list (batch_slots.hpp)
/// and each position's share of q, out and scratch. A scheduled launch (the batch's) takes its
/// blocks' positions and splits from `schedule`, blockIdx.z being the row block; a positional
/// one has block z = j·row_blocks + its row block for position j. list.slots null: one layer's
/// launch.
struct BatchParams {
  BatchList list;
  int row_blocks;                  ///< row blocks per position
  bool windowed;                   ///< views from len_d and base_d (_dcw); else len_d, base 0 (_dc)
  long long q_stride, out_stride;  ///< floats of q and out per position
  long long scratch_stride;        ///< bytes of scratch per position
  BatchSchedule schedule;          ///< n_items null: positional
};

struct SplitParams {
  ViewParams view;
  const std::uint8_t* k_plane;
  const std::uint8_t* v_plane;
  long long k_tok_bytes, v_tok_bytes;
  const float* q;
  float scale;
  int gqa, n_splits;
  int split_balance;  ///< decode_keys_per_split's balance (the plan's; 0 for verify)
  void* scratch;
  DeviceStatus* status;
  BatchParams batch;
};

/// The sequence a block works for, from the block's z: its view source, planes, queries,
/// scratch and status.
struct SequenceWork {
  ViewParams view;
  const std::uint8_t* k_plane;
  const std::uint8_t* v_plane;
  const float* q;
  void* scratch;
  DeviceStatus* status;
  bool present;  ///< false: a position past the active list (nothing to do)
};

/// The view source of position j of a batch launch: its sequence's len_d (and base_d on a
/// windowed batch), the layer constants of `view`. Shared by the split kernels and the merge.
__device__ __forceinline__ ViewParams batch_view(ViewParams view, const BatchParams& b, int j,
                                                 MutantSite site) {
  const int n_active = *b.list.n_active;
  int len_from = b.list.active[j], base_from = len_from;
  if (KVLAYER_DEVICE_MUTANT(batch_neighbour_len_d) && j + 1 < n_active) {
    len_from = b.list.active[j + 1];  // planted bug: the next entry's length
    KVLAYER_MUTANT_REACHED(site);
  }
  if (KVLAYER_DEVICE_MUTANT(batch_first_base_d) && b.windowed && j > 0) {
    base_from = b.list.active[0];  // planted bug: the first entry's ring base for every entry
    KVLAYER_MUTANT_REACHED(site);
  }
  view.len_d = b.list.slots[len_from].len_d;
  view.base_d = b.windowed ? b.list.slots[base_from].base_d : nullptr;
  return view;
}

/// Position j of a batch launch's active list: its sequence's slot, and the position's q and
/// scratch.
__device__ __forceinline__ SequenceWork sequence_work(const SplitParams& p, int j,
                                                      MutantSite site) {
  SequenceWork w{p.view, p.k_plane, p.v_plane, p.q, p.scratch, p.status, true};
  const BatchParams& b = p.batch;
  if (j >= *b.list.n_active) {
    w.present = false;
    return w;
  }
  const SequenceSlot s = b.list.slots[b.list.active[j]];
  w.view = batch_view(p.view, b, j, site);
  w.k_plane = s.k_plane;
  w.v_plane = s.v_plane;
  w.status = s.status;
  w.q = p.q + j * b.q_stride;
  w.scratch = static_cast<char*>(p.scratch) + j * b.scratch_stride;
  return w;
}

/// What one split block attends and where its partial goes: keys [lo, hi) at physical row
/// key − base; its query rows [row0, row0 + nrows) of the KV head (all of them, unless a
/// verify grid splits them over blockIdx.z), partial o[nrows][D], m[nrows], l[nrows].
struct SplitRange {
  int kv;  ///< the KV head (see begin_split)
  /// The sequence's bases for this block: the KV head's first K and V bytes in row 0 of its
  /// planes (a key at physical row r is r·tok_bytes further) and its queries (q[T][heads][D]).
  const std::uint8_t* k_head;
  const std::uint8_t* v_head;
  const float* q;
  long long lo, hi, base;
  long long len;  ///< the view's end: the last query sits at len − 1
  int row0, nrows;
  float* o;
  float* m;
  float* l;
  bool active;  ///< false: nothing left to do (view error recorded, empty view or empty split)
};

/// The prologue every split kernel shares (block-uniform, before any barrier): finds the
/// block's sequence (sequence_work), resolves and checks its view (recording a device error
/// once per sequence), picks the block's (KV head, split) and lets the merge grid launch early
/// (allow_merge_launch). A view of n keys needs active = ceil(n / keys_per_split) splits per KV
/// head, at most the grid's: the blocks of linear index blockIdx.x + gridDim.x·blockIdx.y below
/// active·n_kv take (KV head, split) = (index % n_kv, index / n_kv) and the rest have nothing
/// to do, so that the working blocks are the first ones the GPU places, spread evenly over the
/// SMs, and blocks placed together read the same keys of neighbouring KV heads, i.e.
/// neighbouring bytes of the same token rows (faster at long views than splits of one head
/// placed together; bench/NOTES.md). A scheduled batch block takes (KV head, item) the same way
/// and its item's position, split and keys per split from the launch's schedule
/// (batch_schedule.hpp), which also recorded the views in error (they have no items). An active
/// split with no keys (a planted mutant's) writes the empty partial (m = sentinel, l = 0,
/// o = 0). tile_keys is the kernel's partition granule (split_granule); site names the kernel
/// (mutant reach). The range hands the kernel every base it reads or writes: no kernel computes
/// a pointer from the launch's parameters.
template <bool kBatch = false>
__device__ inline SplitRange begin_split(const SplitParams& p, int head_dim, int tile_keys,
                                         MutantSite site) {
  allow_merge_launch();
  SplitRange r{};
  // The linear index of the block among the (KV head, split or item) blocks of its row block.
  const unsigned index = blockIdx.x + gridDim.x * blockIdx.y;
  // A scheduled batch block: its item (index / n_kv), the item's position and split, and the
  // position's keys per split (plan_batch_splits).
  const bool scheduled = kBatch && p.batch.schedule.n_items != nullptr;
  unsigned item_split = 0, item_kps = 0;
  // One layer's launch reads its own parameters (w stays unused).
  SequenceWork w{};
  if constexpr (kBatch) {
    int j = int(blockIdx.z) / p.batch.row_blocks;
    if (scheduled) {
      const BatchSchedule& sch = p.batch.schedule;
      const int item = static_cast<int>(index / gridDim.y);
      if (item >= *sch.n_items) return r;
      j = sch.item_position[item];
      item_split = static_cast<unsigned>(item - sch.first_item[j]);
      item_kps = static_cast<unsigned>(sch.keys_per_split[j]);
    }
    w = sequence_work(p, j, site);
    if (!w.present) return r;
  }
  const ViewParams& view_params = kBatch ? w.view : p.view;
  const int tid = threadIdx.x;
  const int rows = query_rows(view_params.queries, p.gqa);
  // The block's row block among the position's (blockIdx.z: one layer's launch).
  const int row_blocks = kBatch ? p.batch.row_blocks : int(gridDim.z);
  const int row_block = kBatch ? int(blockIdx.z) % p.batch.row_blocks : int(blockIdx.z);
  const int rows_per_block = verify_rows_per_block(rows, row_blocks);
  r.row0 = row_block * rows_per_block;
  r.nrows = rows - r.row0 < rows_per_block ? rows - r.row0 : rows_per_block;
  if (KVLAYER_DEVICE_MUTANT(verify_last_row_block_short) && view_params.queries > 16 &&
      row_block + 1 == row_blocks && r.nrows > 1) {
    --r.nrows;  // planted bug: the last row block of a verify of T > 16 drops its last row
    KVLAYER_MUTANT_REACHED(site);
  }
  const View view = resolve_view(view_params, site);
  if (view.error) {
    // A scheduled launch's views in error have no items (plan_batch_splits recorded them).
    if (!scheduled && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0)
      record_device_error(kBatch ? w.status : p.status, int(DeviceErrorKind::decode_view_too_long),
                          view.len, view.base, view.limit);
    return r;
  }
  const long long n = view.end - view.begin;
  if (n <= 0) return r;  // the merge writes the all-zero output
  // 32-bit: n ≤ 2^31 − 1 (the view checks), and 64-bit divisions sit on the critical path.
  unsigned kps = item_kps, split = item_split;
  if (!scheduled) {
    kps = static_cast<unsigned>(decode_keys_per_split(n, p.n_splits, tile_keys, p.split_balance));
    const unsigned active = (static_cast<unsigned>(n) + kps - 1) / kps;  // ≤ n_splits
    if (index >= active * gridDim.y) return r;                           // not needed by this view
    split = index / gridDim.y;
  }
  r.kv = static_cast<int>(index % gridDim.y);
  const Scratch scratch =
      scratch_layout(kBatch ? w.scratch : p.scratch, gridDim.y, p.n_splits, rows, head_dim);
  const long long part = (long long)r.kv * p.n_splits + split;  // partial index
  r.o = scratch.o + (part * rows + r.row0) * head_dim;
  r.m = scratch.m + part * rows + r.row0;
  r.l = scratch.l + part * rows + r.row0;
  r.lo = view.begin + (long long)split * kps;
  r.hi = split_end(r.lo, kps, view.end, site);
  r.base = view.base;
  r.len = view.end;
  if (r.lo >= r.hi || r.nrows <= 0) {
    for (int i = tid; i < r.nrows * head_dim; i += blockDim.x) r.o[i] = 0.0f;
    for (int h = tid; h < r.nrows; h += blockDim.x) {
      r.m[h] = kNegSentinel;
      r.l[h] = 0.0f;
    }
    return r;
  }
  r.k_head = (kBatch ? w.k_plane : p.k_plane) + (long long)r.kv * k_head_bytes(head_dim);
  r.v_head = (kBatch ? w.v_plane : p.v_plane) + (long long)r.kv * v_head_bytes(head_dim);
  r.q = kBatch ? w.q : p.q;
  r.active = true;
  return r;
}

/// The last step of a tensor-core split block (decode_mma_staged.cu, decode_mma_direct.cu): merges
/// its kWarps warps' online-softmax states into the split's partial, in f32, warps in order: m =
/// max_w m_w, weight_w = softmax_rescale(m_w, m), l = Σ l_w·weight_w, o = Σ o_w·weight_w, for the
/// block's r.nrows rows. m_s, l_s, w_s hold [warp][row] at row stride `heads`; o_s [warp][row] rows
/// of `o_stride` floats. Call after a __syncthreads that made m_s, l_s and o_s visible.
template <int kWarps, int kThreads>
__device__ __forceinline__ void merge_warps_into_partial(const SplitRange& r, int head_dim,
                                                         int heads, const float* m_s,
                                                         const float* l_s, float* w_s,
                                                         const float* o_s, int o_stride) {
  const int tid = threadIdx.x, gqa = r.nrows;
  if (tid < gqa) {
    float top = kNegSentinel;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, m_s[w * heads + tid]);
    float den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = m_s[w * heads + tid];
      const float wt = softmax_rescale(mw, top);
      w_s[w * heads + tid] = wt;
      den = fmaf(l_s[w * heads + tid], wt, den);
    }
    r.m[tid] = top;
    r.l[tid] = den;
  }
  __syncthreads();
  for (int i = tid; i < gqa * head_dim; i += kThreads) {
    const int h = i / head_dim, col = i % head_dim;
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      num = fmaf(o_s[(w * heads + h) * o_stride + col], w_s[w * heads + h], num);
    r.o[i] = num;
  }
}

}  // namespace kvlayer::cuda::detail::decode_impl
