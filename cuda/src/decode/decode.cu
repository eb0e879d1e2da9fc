// Split-K flash-decoding over the quantized cache (SPEC §8): K q8_0, V q5_1, one query token.
//
// ---- Declared internal precision (the accuracy contract; see kvlayer/accuracy.hpp) ----
// The tolerance against the float64 reference is derived from exactly these rounding points; a
// later tensor-core version (mma.sync m16n8k16, f16 operands, f32 accumulators) keeps them.
//  (1) q is rounded once to fp16 (round-to-nearest-even, subnormals kept). K quants are exact
//      int8. Per 32-value block the dot Σ_j q̃_j·qs_j is accumulated in f32 (sequential FMAs,
//      j = 0..31), multiplied by the block's f32(d), and the head_dim/32 block results are
//      summed in f32 (xor-butterfly across lanes, a fixed order); score = dot × scale in f32.
//      NOTE: |q| must stay below 65520 (fp16 overflow); real activations do.
//  (2) Online softmax in f32 per split, one max update per tile: m' = max(m, tile max),
//      α = exp2f((m − m')·log2e) (exactly 1 when m' == m), p_t = exp2f((s_t − m')·log2e).
//      IEEE exp2f (no fast-math, ≤ 2 ulp). m starts at the finite sentinel −FLT_MAX, never
//      −inf, so no inf − inf can arise; fmaxf ignores NaN scores, so m stays finite and a NaN
//      score (canonical bad block) reaches the output through p.
//  (3) p is rounded to fp16 (RNE) before it multiplies V. V is dequantized per SPEC §4 in
//      exact f32 (d·q is exact, + m rounds once: bit-identical to the reference). The row sum
//      l = l·α + Σ_tile p uses the unrounded f32 p. PV is accumulated in f32 with FMAs, one
//      accumulator per (query head, column), keys in order: at most max_keys_per_split terms
//      (plus one ×α per tile that raised the max).
//  (4) Merge across splits in f32: M = max m_i, w_i = exp2f((m_i − M)·log2e),
//      o = (Σ_i o_i·w_i) / (Σ_i l_i·w_i), splits in index order, IEEE division.
//
// ---- Design ---------------------------------------------------------------------------------
// Grid (n_splits, n_kv_heads) × 128 threads, fixed at plan time. A block serves all gqa query
// heads of its KV head, so every K/V byte of a decode is read from memory once. The live view
// length picks the partition (keys_per_split = ceil(n / n_splits) rounded up to a tile).
// Keys are processed in tiles of T = 4096/head_dim keys (T × head_dim/32 = 128 blocks), staged
// in shared memory by cp.async with kStages buffers (two tiles in flight while one computes):
//  A. scores: thread (t, b) dots its K block with the gqa query heads, butterfly over b;
//  B. softmax: warp w owns query heads w, w+4, …: tile max, α, p (fp16) and l;
//  C. PV: thread owns output columns (and, for head_dim 64, half the query heads).
// Alignment: a head's K span is (head_dim/32)·34 = 17·c bytes with c = 4, 8, 16 for head dims
// 64, 128, 256, and k_tok_bytes is a multiple of it, so every K span is c-byte aligned (the
// planes are 16-byte aligned); V spans are multiples of 16 bytes. Each tile load is therefore
// 17 c-byte copies per key for K and head_dim·24/32/16 16-byte copies per key for V.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/partition.hpp"
#include "device_status.cuh"

namespace kvlayer::cuda::detail {
namespace {

using namespace decode_impl;  // NOLINT(google-build-using-namespace): shared with decode_mma.cu

constexpr int kThreads = kDecodeThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 3;
/// Compile-time layout for one head dim.
template <int D>
struct Shape {
  static_assert(D == 64 || D == 128 || D == 256, "supported head dims: 64, 128, 256");
  static constexpr int kBlocks = D / 32;             ///< 32-value blocks per head
  static constexpr int kTile = decode_tile_keys(D);  ///< keys per tile
  static constexpr int kKBytes = k_head_bytes(D);   ///< K span of one head in a row
  static constexpr int kVBytes = v_head_bytes(D);   ///< V span of one head in a row
  static constexpr int kKChunks = kQ8_0BlockWords;  ///< the K span in 17 equal copies
  static constexpr int kKChunk = kKBytes / kKChunks;  ///< 4, 8, 16: the K span's alignment
  static constexpr int kVChunks = kVBytes / 16;
  static constexpr int kQStride = 36;  ///< floats per (head, block) of q: 32 + 4 bank padding
  /// Phase C: columns per thread and query-head groups (head_dim 64 splits the heads in two).
  static constexpr int kColThreads = D < kThreads ? D : kThreads;
  static constexpr int kCols = D / kColThreads;
  static constexpr int kHeadGroups = kThreads / kColThreads;
  static_assert(kKChunk * kKChunks == kKBytes && kVChunks * 16 == kVBytes);
  static_assert(kTile * kBlocks == kThreads);
};

struct MergeParams {
  ViewParams view;
  float* out;
  int gqa, n_splits, tile_keys, n_kv, head_dim;
  void* scratch;
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

__device__ __forceinline__ float round_to_f16(float x) {
  return __half2float(__float2half_rn(x));
}

/// One block per (split, KV head): online softmax over the split's keys for all gqa query
/// heads; writes the unnormalised partial (o, m, l).
template <int D, int GMAX>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm)
    decode_split_kernel(const SplitParams p) {
  using S = Shape<D>;
  constexpr int NB = S::kBlocks;
  constexpr int T = S::kTile;
  constexpr int GW = (GMAX + kWarps - 1) / kWarps;                   // heads per warp, phase B
  constexpr int GPT = (GMAX + S::kHeadGroups - 1) / S::kHeadGroups;  // heads per thread, C

  // NOTE: k_tile precedes v_tile so that no K read can leave shared memory (it never does:
  // the 9-word window of a block ends at or before its key's K span end, see phase A).
  __shared__ __align__(16) std::uint8_t k_tile[kStages][T * S::kKBytes];
  __shared__ __align__(16) std::uint8_t v_tile[kStages][T * S::kVBytes];
  __shared__ __align__(16) float q_s[GMAX * NB * S::kQStride];
  __shared__ float s_s[GMAX][T];   // scores of the tile
  __shared__ float p_s[T][GMAX];   // fp16-rounded probabilities of the tile
  __shared__ float alpha_s[GMAX];  // rescale of the running output, per head

  const int kv = blockIdx.y;
  const int tid = threadIdx.x;
  const int G = p.gqa;

  const SplitRange range = begin_split(p, D, T, MutantSite::decode_cuda_core);
  if (!range.active) return;  // block-uniform: no barrier has been reached yet
  const long long lo = range.lo, hi = range.hi;

  // q of this KV head's query heads, rounded to fp16 once, laid out [g][block][36].
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, e = i % D;
    q_s[(g * NB + e / 32) * S::kQStride + e % 32] = round_to_f16(
        q_operand(p.q[((long long)kv * G + g) * D + e], p.scale, MutantSite::decode_cuda_core));
  }

  const std::uint8_t* k_head = p.k_plane + (long long)kv * S::kKBytes;
  const std::uint8_t* v_head = p.v_plane + (long long)kv * S::kVBytes;
  const long long n_keys = hi - lo;
  const int n_tiles = static_cast<int>((n_keys + T - 1) / T);

  // Issues the copies of one tile into its stage (nothing past the split's last key), and
  // always commits a group so that wait_group counts tiles.
  auto issue = [&](int tile) {
    if (tile < n_tiles) {
      const long long key0 = lo + (long long)tile * T;
      const int valid = static_cast<int>(hi - key0 < T ? hi - key0 : T);
      const long long row0 = key0 - range.base;  // physical row of the tile's first key
      std::uint8_t* kd = k_tile[tile % kStages];
      std::uint8_t* vd = v_tile[tile % kStages];
      for (int i = tid; i < valid * S::kKChunks; i += kThreads) {
        const int t = i / S::kKChunks, c = i % S::kKChunks;
        cp_async<S::kKChunk>(kd + t * S::kKBytes + c * S::kKChunk,
                             k_head + (row0 + t) * p.k_tok_bytes + c * S::kKChunk);
      }
      for (int i = tid; i < valid * S::kVChunks; i += kThreads) {
        const int t = i / S::kVChunks, c = i % S::kVChunks;
        cp_async<16>(vd + t * S::kVBytes + c * 16, v_head + (row0 + t) * p.v_tok_bytes + c * 16);
      }
    }
    cp_async_commit();
  };

  // Running softmax state of the heads this warp owns in phase B (identical in all lanes).
  const int warp = tid / 32, lane = tid % 32;
  float m_run[GW], l_run[GW];
#pragma unroll
  for (int k = 0; k < GW; ++k) {
    m_run[k] = kNegSentinel;
    l_run[k] = 0.0f;
  }
  // Phase C ownership: columns col0 + c·128, query heads hg + kHeadGroups·k.
  const int col0 = tid % S::kColThreads;
  const int hg = tid / S::kColThreads;
  float acc[S::kCols][GPT];
#pragma unroll
  for (int c = 0; c < S::kCols; ++c)
#pragma unroll
    for (int k = 0; k < GPT; ++k) acc[c][k] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();  // this thread's copies of `tile` have landed
    __syncthreads();               // everyone's have; everyone finished tile − 1 (and q_s)
    issue(tile + kStages - 1);     // reuses the stage of tile − 1, free after the barrier

    const int stage = tile % kStages;
    const long long key0 = lo + (long long)tile * T;
    const int valid = static_cast<int>(hi - key0 < T ? hi - key0 : T);

    // ---- A: scores. Thread (t, b): block b of key t against every query head. ----
    {
      const int t = tid / NB, b = tid % NB;
      float dot[GMAX];
#pragma unroll
      for (int g = 0; g < GMAX; ++g) dot[g] = 0.0f;
      if (t < valid) {
        // The block starts at byte t·kKBytes + b·34 ≡ 2·(b & 1) (mod 4): read the 9 aligned
        // words covering it and shift by 2 bytes for even b. For odd b the window starts 2
        // bytes early; for the last block (odd: NB is even) it ends exactly at the key's end.
        const int start = t * S::kKBytes + b * kQ8_0BlockBytes;
        const unsigned* w = reinterpret_cast<const unsigned*>(k_tile[stage] + (start & ~3));
        const bool odd = (start & 2) != 0;
        unsigned wr[9];
#pragma unroll
        for (int i = 0; i < 9; ++i) wr[i] = w[i];
        const float d = f16_bits(odd ? wr[0] >> 16 : wr[0] & 0xffffu);
        const unsigned sel = odd ? 0x7654u : 0x5432u;
        float kq[32];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned qw = __byte_perm(wr[i], wr[i + 1], sel);
#pragma unroll
          for (int j = 0; j < 4; ++j)
            kq[4 * i + j] = static_cast<float>(static_cast<std::int8_t>(qw >> (8 * j)));
        }
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          if (g < G) {
            const float4* qv = reinterpret_cast<const float4*>(q_s + (g * NB + b) * S::kQStride);
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float4 x = qv[i];
              a = fmaf(x.x, kq[4 * i + 0], a);
              a = fmaf(x.y, kq[4 * i + 1], a);
              a = fmaf(x.z, kq[4 * i + 2], a);
              a = fmaf(x.w, kq[4 * i + 3], a);
            }
            dot[g] = __fmul_rn(a, d);  // _rn: never contracted into the butterfly add
          }
        }
      }
      // Sum the NB blocks of key t (consecutive lanes); all lanes take part.
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        if (g < G) {
#pragma unroll
          for (int off = NB / 2; off > 0; off /= 2)
            dot[g] += __shfl_xor_sync(kFullMask, dot[g], off);
        }
      }
      if (b == 0 && t < valid) {
#pragma unroll
        for (int g = 0; g < GMAX; ++g)
          if (g < G) s_s[g][t] = score_scaled(dot[g], p.scale);
      }
    }
    __syncthreads();

    // ---- B: online softmax. Warp w owns query heads w, w + 4, … ----
#pragma unroll
    for (int k = 0; k < GW; ++k) {
      const int g = warp + kWarps * k;
      if (g < G) {
        float top = kNegSentinel;
        for (int t = lane; t < valid; t += 32) top = fmaxf(top, s_s[g][t]);
        top = warp_max(top);
        const float m_new = fmaxf(m_run[k], top);
        const float alpha = m_new == m_run[k] ? 1.0f : exp2f((m_run[k] - m_new) * kLog2e);
        float sum = 0.0f;
        for (int t = lane; t < T; t += 32) {
          float pt = 0.0f;
          if (t < valid) {
            pt = exp2f((s_s[g][t] - m_new) * kLog2e);
            sum += pt;
          }
          p_s[t][g] = round_to_f16(pt);
        }
        sum = warp_sum(sum);
        l_run[k] = l_run[k] * alpha + sum;
        m_run[k] = m_new;
        if (lane == 0) alpha_s[g] = alpha;
      }
    }
    __syncthreads();

    // ---- C: o = o·α + Σ_t p̃_t·V_t over the tile's valid keys (never a stale row). ----
    {
#pragma unroll
      for (int c = 0; c < S::kCols; ++c)
#pragma unroll
        for (int k = 0; k < GPT; ++k) {
          const int g = hg + S::kHeadGroups * k;
          if (g < G)
            acc[c][k] = pv_accumulator(acc[c][k] * alpha_s[g], MutantSite::decode_cuda_core);
        }
      const std::uint8_t* vt = v_tile[stage];
#pragma unroll 1
      for (int t = 0; t < valid; ++t) {
#pragma unroll
        for (int c = 0; c < S::kCols; ++c) {
          const int col = col0 + c * S::kColThreads;
          const int j = col % 32;
          const std::uint8_t* blk = vt + t * S::kVBytes + (col / 32) * kQ5_1BlockBytes;
          const uint2 hdr = *reinterpret_cast<const uint2*>(blk);  // d | m << 16, qh
          const unsigned byte = blk[8 + (j & 15)];
          const unsigned nib = j < 16 ? (byte & 15u) : (byte >> 4);
          const unsigned q5 = nib | (((hdr.y >> j) & 1u) << 4);
          // d·q is exact in f32, so the FMA rounds once, exactly like d·q + m (SPEC §4).
          const float v =
              fmaf(f16_bits(hdr.x & 0xffffu), static_cast<float>(q5), f16_bits(hdr.x >> 16));
#pragma unroll
          for (int k = 0; k < GPT; ++k) {
            const int g = hg + S::kHeadGroups * k;
            if (g < G)
              acc[c][k] =
                  pv_accumulator(fmaf(p_s[t][g], v, acc[c][k]), MutantSite::decode_cuda_core);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; keep the block's exit clean anyway

#pragma unroll
  for (int c = 0; c < S::kCols; ++c)
#pragma unroll
    for (int k = 0; k < GPT; ++k) {
      const int g = hg + S::kHeadGroups * k;
      if (g < G) range.o[g * D + col0 + c * S::kColThreads] = acc[c][k];
    }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < GW; ++k) {
      const int g = warp + kWarps * k;
      if (g < G) {
        range.m[g] = m_run[k];
        range.l[g] = l_run[k];
      }
    }
  }
}

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
/// threads: merges the active splits' partials of one query row. Per output element the arithmetic is fixed: M = max of the m_i,
/// w_i = exp2f((m_i − M)·log2e) (exactly 1 for the max), num and den summed by fmaf in split
/// order, out = num / den. Writes nothing when the view is in error.
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const MergeParams p) {
  __shared__ __align__(16) float o_s[kMergeChunk][kMergeCols];
  __shared__ float l_s[kMergeChunk];
  __shared__ float w_s[kDecodeMaxSplits];
  __shared__ float red_s[kMergeThreads / 32];
  wait_for_split_grid();  // launched as a programmatic dependent of the split grid
  const View view = resolve_view(p.view, MutantSite::decode_merge);
  if (view.error) return;  // the split kernel recorded it
  const int D = p.head_dim;
  const int rows = query_rows(p.view.queries, p.gqa);
  const int h = blockIdx.x, kv = h / rows, g = h % rows;
  const long long out_row = query_row_index(g, kv, p.gqa, p.n_kv);
  const int col0 = blockIdx.y * kMergeCols;
  const int tid = threadIdx.x;
  const long long n = view.end - view.begin;
  if (n <= 0) {
    if (tid < kMergeCols) p.out[out_row * D + col0 + tid] = 0.0f;  // SPEC §8: zeros
    return;
  }
  const long long kps = decode_keys_per_split(n, p.n_splits, p.tile_keys);
  const int active = static_cast<int>((n + kps - 1) / kps);
  const Scratch s = scratch_layout(p.scratch, p.n_kv, p.n_splits, rows, D);
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
    w_s[i] = mi == top ? 1.0f : exp2f((mi - top) * kLog2e);
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
  if (tid < kMergeCols) p.out[out_row * D + col0 + tid] = num / den;
}

template <int D, int GMAX>
void launch_split(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  decode_split_kernel<D, GMAX><<<grid, kThreads, 0, stream>>>(sp);
}

template <int D>
void launch_split_for_dim(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  if (sp.gqa <= 1) return launch_split<D, 1>(sp, grid, stream);
  if (sp.gqa <= 2) return launch_split<D, 2>(sp, grid, stream);
  if (sp.gqa <= 4) return launch_split<D, 4>(sp, grid, stream);
  if (sp.gqa <= 8) return launch_split<D, 8>(sp, grid, stream);
  return launch_split<D, 16>(sp, grid, stream);
}

}  // namespace

cudaError_t launch_decode(const DecodeArgs& a, const DecodePlan& plan, cudaStream_t stream) {
  // Plan and arguments: refuse anything the kernels were not built for (no device work).
  const bool plan_ok = (plan.head_dim == 64 || plan.head_dim == 128 || plan.head_dim == 256) &&
                       plan.gqa >= 1 && plan.gqa <= 16 && plan.n_kv_heads >= 1 &&
                       plan.n_kv_heads <= 65535 && plan.n_splits >= 1 &&
                       plan.n_splits <= kDecodeMaxSplits && plan.max_view_keys >= 1 &&
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
  if (a.k_plane == nullptr || a.v_plane == nullptr || a.q == nullptr || a.out == nullptr ||
      a.scratch == nullptr || misaligned(a.k_plane) || misaligned(a.v_plane) || a.rows < 0 ||
      a.max_ctx < 0 || a.window < 0)
    return cudaErrorInvalidValue;
  if (a.len_d != nullptr && a.status == nullptr) return cudaErrorInvalidValue;
  if (a.len_d == nullptr) {
    // Host mode: the same checks the device makes, made here so a bad view launches nothing.
    const long long len = a.host_len, base = a.host_base;
    const long long first_end = T > 1 ? len - T + 1 : len;
    const long long begin = a.window > 0 ? (first_end > a.window ? first_end - a.window : 0) : 0;
    if (len < 0 || len > a.max_ctx || (verify && len < T) || base < 0 || begin < base ||
        len - base > a.rows || len - begin > max_view)
      return cudaErrorInvalidValue;
  }

  const long long blocks_per_head = plan.head_dim / 32;
  const ViewParams vp{a.len_d,  a.base_d, a.host_len, a.host_base, a.window,
                      a.rows,   a.max_ctx, max_view,  T};
  const int n_splits = verify ? verify_splits(plan, T) : plan.n_splits;
  const SplitParams sp{vp,
                       a.k_plane,
                       a.v_plane,
                       plan.n_kv_heads * blocks_per_head * kQ8_0BlockBytes,
                       plan.n_kv_heads * blocks_per_head * kQ5_1BlockBytes,
                       a.q,
                       a.scale,
                       plan.gqa,
                       n_splits,
                       a.scratch,
                       a.status};
  const dim3 grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(plan.n_kv_heads),
                  static_cast<unsigned>(verify ? verify_row_chunks(plan, T) : 1));
  if (plan.kernel == DecodeKernel::mma || verify) {
    if (const cudaError_t err = launch_split_mma(sp, plan, grid, stream); err != cudaSuccess)
      return err;
  } else {
    switch (plan.head_dim) {
      case 64:
        launch_split_for_dim<64>(sp, grid, stream);
        break;
      case 128:
        launch_split_for_dim<128>(sp, grid, stream);
        break;
      default:
        launch_split_for_dim<256>(sp, grid, stream);
        break;
    }
  }
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

  const int tile_keys = verify ? kDecodeMmaTileKeys : plan.tile_keys;
  const MergeParams mp{vp,       a.out,           plan.gqa,       n_splits,
                       tile_keys, plan.n_kv_heads, plan.head_dim, a.scratch};
  // Programmatic dependent launch: the merge grid may be scheduled while the split grid drains;
  // it waits for the split grid's completion (wait_for_split_grid) before reading scratch.
  // NOTE: saves the launch gap between the two kernels (bench/NOTES.md); graph-capturable.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(plan.n_kv_heads * query_rows(T, plan.gqa)),
                        static_cast<unsigned>(plan.head_dim / kMergeCols));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, decode_merge_kernel, mp);
}

KVLAYER_DEFINE_MUTANT_UNIT(decode)

}  // namespace kvlayer::cuda::detail
