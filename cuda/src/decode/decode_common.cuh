// Device pieces shared by the split kernels (decode_cuda_core.cu, decode_mma.cu,
// decode_mma_direct.cu), the merge (merge.cu) and the launch (launch.cu): the view resolution
// and its device-mode checks, the scratch layout of the partial results, the launch parameters
// and the launchers, so that every kernel obeys one definition.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cp_async.cuh"
#include "decode/decode.hpp"
#include "decode/partition.hpp"
#include "device_status.cuh"
#include "kvlayer/block_format.hpp"
#include "kvlayer/status.hpp"
#include "mutants.cuh"
#include "view_begin.hpp"

namespace kvlayer::cuda::detail::decode_impl {

inline constexpr float kNegSentinel = -FLT_MAX;  ///< finite "minus infinity" for m
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr unsigned kFullMask = 0xffffffffu;

/// The view a launch attends, resolved on the device (device-counter mode) or from the host
/// values. Passed by value so a captured graph holds only pointers and layer constants.
struct ViewParams {
  const std::int32_t* len_d;  ///< null: host mode
  const std::int32_t* base_d;
  long long host_len, host_base;
  long long window, rows, max_ctx, max_view;
  /// 0: a decode (one query at len). T ≥ 1: a verify decode (SPEC §11): T queries at
  /// len − T … len − 1, each with its own causal window; the launch attends their union.
  long long queries;
};

struct View {
  long long begin, end, base;  ///< logical [begin, end) at physical row = logical − base
  long long len, limit;        ///< for the error record
  bool error;
};

/// Resolves and (device mode) checks the view, in the reference's order: len_d past max_ctx
/// (limit max_ctx), then outside the resident rows (limit rows), then longer than the grid
/// (limit max_view_keys). Host-mode views were checked on the host before the launch.
/// NOTE: a negative len_d or base_d (impossible through the layer API) is treated as outside.
/// `site` names the calling kernel for the planted mutants' reach report.
__device__ inline View resolve_view(const ViewParams& p, MutantSite site) {
  View v{};
  long long base = p.host_base;
  v.len = p.host_len;
  if (p.len_d != nullptr) {
    v.len = *p.len_d;
    base = p.base_d != nullptr ? *p.base_d : 0;
  }
  v.base = base;
  v.end = v.len;
  v.begin = view_begin(v.len, p.queries, p.window);
  if (KVLAYER_DEVICE_MUTANT(decode_window_off_by_one) && p.window > 0 && v.begin < v.len) {
    ++v.begin;  // planted bug: one key too few
    KVLAYER_MUTANT_REACHED(site);
  }
  if (p.len_d != nullptr) {
    if (v.len < 0 || v.len > p.max_ctx) {
      v.error = true;
      v.limit = p.max_ctx;
    } else if (p.queries > 0 && v.len < p.queries) {
      v.error = true;  // fewer keys than verified queries: no causal view for query 0
      v.limit = p.queries;
    } else if (base < 0 || v.begin < base || v.len - base > p.rows) {
      v.error = true;
      v.limit = p.rows;
    } else if (v.end - v.begin > p.max_view) {
      v.error = true;
      v.limit = p.max_view;
    }
  }
  if (KVLAYER_DEVICE_MUTANT(decode_reads_past_view) && !v.error && v.end - base < p.rows) {
    ++v.end;  // planted bug: one (stale) row past the view, never past the plane
    KVLAYER_MUTANT_REACHED(site);
  }
  return v;
}

/// End of the keys [lo, ·) a split attends: lo + kps, clipped to the view.
__device__ inline long long split_end(long long lo, long long kps, long long view_end,
                                      MutantSite site) {
  const long long hi = lo + kps < view_end ? lo + kps : view_end;
  if (KVLAYER_DEVICE_MUTANT(split_drops_last_key) && hi > lo) {
    KVLAYER_MUTANT_REACHED(site);
    return hi - 1;  // planted bug
  }
  return hi;
}

/// End of the keys a verified query at logical position `pos` attends: itself and the rows
/// before it (SPEC §11, causal among the new rows). `site` names the kernel (mutant reach).
__device__ __forceinline__ long long verify_row_end(long long pos, long long len, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(verify_causal_off_by_one) && pos + 1 < len) {
    KVLAYER_MUTANT_REACHED(site);
    return pos + 2;  // planted bug: sees the next draft
  }
  return pos + 1;
}

/// Start of the keys a verified query at `pos` attends on a windowed layer (SPEC §11: its own
/// window); `last` is the launch's last query position.
__device__ __forceinline__ long long verify_row_begin(long long pos, long long last,
                                                      long long window, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(verify_one_window) && pos != last) {
    KVLAYER_MUTANT_REACHED(site);
    pos = last;  // planted bug: one window for every row
  }
  return pos + 1 - window > 0 ? pos + 1 - window : 0;
}

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
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

/// Butterfly sum: every lane ends with the same, order-fixed result (f32 + is commutative).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

// ---- Online softmax: the rounding points every kernel shares (accuracy.hpp (2), (4)) ---------

/// The weight of a state whose max is m once the max is m_new ≥ m (a rescale α, or a merge
/// weight): exactly 1 when m_new == m, else IEEE exp2f((m − m_new)·log2e).
__device__ __forceinline__ float softmax_rescale(float m, float m_new) {
  return m_new == m ? 1.0f : exp2f((m - m_new) * kLog2e);
}

/// p of a score s under the running max m: IEEE exp2f((s − m)·log2e), in f32.
__device__ __forceinline__ float softmax_weight(float s, float m) {
  return exp2f((s - m) * kLog2e);
}

// ---- Programmatic dependent launch (sm_90) -----------------------------------------------

/// Split kernels: lets the merge grid, launched with programmatic stream serialization, be
/// scheduled before this grid ends (its blocks then take SM slots as split blocks retire).
/// NOTE: no ordering is given up: the merge waits in wait_for_split_grid for this whole grid.
__device__ __forceinline__ void allow_merge_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/// Merge kernel: waits until the split grid has completed and its writes are visible.
__device__ __forceinline__ void wait_for_split_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

/// What one split block attends and where its partial goes: keys [lo, hi) at physical row
/// key − base; its query rows [row0, row0 + nrows) of the KV head (all of them, unless a
/// verify grid splits them over blockIdx.z), partial o[nrows][D], m[nrows], l[nrows].
struct SplitRange {
  int kv;  ///< the KV head (see begin_split)
  long long lo, hi, base;
  long long len;  ///< the view's end: the last query sits at len − 1
  int row0, nrows;
  float* o;
  float* m;
  float* l;
  bool active;  ///< false: nothing left to do (view error recorded, empty view or empty split)
};

/// The prologue every split kernel shares (block-uniform, before any barrier): resolves and
/// checks the view (recording a device error once), picks the block's (KV head, split) and
/// lets the merge grid launch early (allow_merge_launch). A view of n keys needs active =
/// ceil(n / keys_per_split) splits per KV head, at most the grid's: the blocks of linear index
/// blockIdx.x + gridDim.x·blockIdx.y below active·n_kv take (KV head, split) = (index % n_kv,
/// index / n_kv) and the rest have nothing to do, so that the working blocks are the first
/// ones the GPU places, spread evenly over the SMs, and blocks placed together read the same
/// keys of neighbouring KV heads, i.e. neighbouring bytes of the same token rows: −3 to −6% at
/// 64K–128K keys against splits of one head placed together (bench/NOTES.md, session 14; not
/// L2 reuse: ncu's hit rate is unchanged, so likely DRAM page locality). An active split with
/// no keys (a planted mutant's) writes the empty partial (m = sentinel, l = 0, o = 0).
/// tile_keys is the kernel's partition granule (decode_keys_per_split); site names the kernel
/// (mutant reach).
__device__ inline SplitRange begin_split(const SplitParams& p, int head_dim, int tile_keys,
                                         MutantSite site) {
  allow_merge_launch();
  SplitRange r{};
  const int tid = threadIdx.x;
  const int rows = query_rows(p.view.queries, p.gqa);
  const int rows_per_block = verify_rows_per_block(rows, int(gridDim.z));
  r.row0 = blockIdx.z * rows_per_block;
  r.nrows = rows - r.row0 < rows_per_block ? rows - r.row0 : rows_per_block;
  if (KVLAYER_DEVICE_MUTANT(verify_last_row_block_short) && p.view.queries > 16 &&
      blockIdx.z + 1 == gridDim.z && r.nrows > 1) {
    --r.nrows;  // planted bug: the last row block of a verify of T > 16 drops its last row
    KVLAYER_MUTANT_REACHED(site);
  }
  const View view = resolve_view(p.view, site);
  if (view.error) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0)
      record_device_error(p.status, int(DeviceErrorKind::decode_view_too_long), view.len, view.base,
                          view.limit);
    return r;
  }
  const long long n = view.end - view.begin;
  if (n <= 0) return r;  // the merge writes the all-zero output
  // 32-bit: n ≤ 2^31 − 1 (the view checks), and 64-bit divisions sit on the critical path.
  const auto kps =
      static_cast<unsigned>(decode_keys_per_split(n, p.n_splits, tile_keys, p.split_balance));
  const unsigned active = (static_cast<unsigned>(n) + kps - 1) / kps;  // ≤ n_splits
  const unsigned index = blockIdx.x + gridDim.x * blockIdx.y;
  if (index >= active * gridDim.y) return r;  // not needed by this view
  r.kv = static_cast<int>(index % gridDim.y);
  const unsigned split = index / gridDim.y;
  const Scratch scratch = scratch_layout(p.scratch, gridDim.y, p.n_splits, rows, head_dim);
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
  r.active = true;
  return r;
}

/// The last step of a tensor-core split block (decode_mma.cu, decode_mma_direct.cu): merges its
/// kWarps warps' online-softmax states into the split's partial, in f32, warps in order:
/// m = max_w m_w, weight_w = softmax_rescale(m_w, m), l = Σ l_w·weight_w, o = Σ o_w·weight_w,
/// for the block's r.nrows rows. m_s, l_s, w_s hold [warp][row] at row stride `heads`; o_s
/// [warp][row] rows of `o_stride` floats. Call after a __syncthreads that made m_s, l_s and o_s
/// visible.
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

// ---- Planted mutants of the split kernels (identities in normal builds) ------------------------

/// A P·V accumulator after an update or rescale: itself; under pv_accumulated_in_f16 it is kept
/// in fp16 (rounded, so wide values overflow to inf).
__device__ __forceinline__ float pv_accumulator(float x, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(pv_accumulated_in_f16)) {
    const float r = __half2float(__float2half_rn(x));  // planted bug
    if (r != x) KVLAYER_MUTANT_REACHED(site);
    return r;
  }
  return x;
}

/// Whether a warp rescales its P·V accumulators after a max update: when any of its rows' max
/// moved; under rescale_skipped_after_first_tile never after the warp's first key-loop trip
/// (whose accumulators are no longer empty).
__device__ __forceinline__ bool rescale_accumulators(bool any_moved, bool first_trip,
                                                     MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(rescale_skipped_after_first_tile) && any_moved && !first_trip) {
    KVLAYER_MUTANT_REACHED(site);
    return false;  // planted bug
  }
  return any_moved;
}

/// pv_accumulator for the registers one mma just updated.
template <int N>
__device__ __forceinline__ void pv_accumulators(float (&c)[N], MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(pv_accumulated_in_f16)) {
#pragma unroll
    for (int e = 0; e < N; ++e) c[e] = pv_accumulator(c[e], site);
  }
}

/// The f32 q value a kernel rounds to its fp16 operand: q; under scale_folded_into_f16_q,
/// q·fp16(scale), and the dot is then left unscaled (score_scaled).
__device__ __forceinline__ float q_operand(float q, float scale, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(scale_folded_into_f16_q)) {
    const float folded = __fmul_rn(q, __half2float(__float2half_rn(scale)));  // planted bug
    const float normal = __fmul_rn(__half2float(__float2half_rn(q)), scale);
    if (__half2float(__float2half_rn(folded)) != normal) KVLAYER_MUTANT_REACHED(site);
    return folded;
  }
  return q;
}

/// score = dot × scale in f32 (__fmul_rn), or the dot alone under scale_folded_into_f16_q.
__device__ __forceinline__ float score_scaled(float dot, float scale) {
  if (KVLAYER_DEVICE_MUTANT(scale_folded_into_f16_q)) return dot;  // planted bug
  return __fmul_rn(dot, scale);
}

/// Whether a tensor-core tile whose vote found a V block beyond fp16 takes the f32 path: yes;
/// under wide_values_on_tensor_cores, no.
__device__ __forceinline__ bool wide_tile_on_cuda_cores(bool any_wide, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(wide_values_on_tensor_cores) && any_wide) {
    KVLAYER_MUTANT_REACHED(site);
    return false;  // planted bug
  }
  return any_wide;
}

/// True when some value of the q5_1 block with header word dm (d | m << 16) might leave fp16's
/// range in d·q + m: |d| > 1024 or |m| > 32768 (or a NaN / inf header). Otherwise |d·q + m| ≤
/// 31·1024 + 32768 < 65504. Each 15-bit magnitude plus its complement carries into bit 15.
__device__ __forceinline__ bool v_header_maybe_wide(unsigned dm) {
  return (((dm & 0x7fff7fffu) + 0x07ff1bffu) & 0x80008000u) != 0u;
}

__device__ __forceinline__ float f16_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// ---- The launchers: one per split kernel, plus the merge (launch.cu calls them) -------------
// Each runs the kernel that select_split_kernel (plan.cpp) names, with its choice's parameters.

/// decode_cuda_core.cu: the CUDA-core split kernel for `rows` (1, 2, 4, 8, 16) query heads.
cudaError_t launch_split_cuda_core(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                   cudaStream_t stream);
/// decode_mma.cu: the staged tensor-core split kernel with `rows` (8 or 16) mma rows.
cudaError_t launch_split_mma_staged(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream);
/// decode_mma.cu: the staged verify split kernel (SPEC §11), head dim 64, 16 query rows per block.
cudaError_t launch_split_mma_verify_staged(const SplitParams& sp, dim3 grid, cudaStream_t stream);
/// decode_mma_verify.cu: the verify split kernel for head dim 128 or 256, `rows` query rows per
/// block (select_split_kernel's).
cudaError_t launch_split_mma_verify(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream);
/// decode_mma_direct.cu: the tensor-core split kernel for head dim 128 and `rows` 8 or 16 query
/// heads (register-direct loads), or head dim 256 and 8 (bulk loads: SplitKernel::mma_bulk).
cudaError_t launch_split_mma_direct(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream);

/// Resident blocks per multiprocessor (occupancy API, with the launch's attributes applied).
cudaError_t split_mma_staged_resident_blocks(int head_dim, int rows, int* blocks);
cudaError_t split_mma_direct_resident_blocks(int head_dim, int rows, int* blocks);
cudaError_t split_mma_verify_resident_blocks(int head_dim, int rows, int* blocks);

/// What the merge reads and writes (merge.cu).
struct MergeParams {
  ViewParams view;
  float* out;
  int gqa, n_splits, tile_keys, split_balance, n_kv, head_dim;
  void* scratch;
};

/// merge.cu: enqueues the merge of every query row's partials as a programmatic dependent of
/// the split grid just enqueued on `stream`.
cudaError_t launch_merge(const MergeParams& mp, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail::decode_impl
