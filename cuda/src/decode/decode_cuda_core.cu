// Split-K flash-decoding on the CUDA cores (SPEC §8): K q8_0, V q5_1, one query token; the
// kernel select_split_kernel names cuda_core (KVLAYER_DECODE_KERNEL=cuda_core), kept as a
// second implementation under test.
//
// ---- Rounding points (kvlayer/accuracy.hpp (1)–(4)), as this kernel implements them -------
//  (1) q̃ = fp16(q) (RNE, subnormals kept; NOTE: |q| < 65520); per 32-value block the dot is
//      sequential f32 FMAs (j = 0..31), × f32(d); blocks summed by a fixed xor butterfly;
//      × scale in f32.
//  (2) one max update per tile; α and p by IEEE exp2f; m starts at the finite sentinel
//      −FLT_MAX (no inf − inf); fmaxf ignores NaN scores, which reach the output through p.
//  (3) p rounded to fp16 (RNE); V at its exact f32 value (SPEC §4, bit-identical to the
//      reference); l from the unrounded p; PV by f32 FMAs, keys in order: ≤ max_keys_per_split
//      terms (plus one ×α per tile that raised the max).
//  (4) the merge (merge.cu).
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

using namespace decode_impl;  // NOLINT(google-build-using-namespace): the shared pieces

constexpr int kThreads = kDecodeThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 3;
/// Compile-time layout for one head dim.
template <int D>
struct Shape {
  static_assert(D == 64 || D == 128 || D == 256, "supported head dims: 64, 128, 256");
  static constexpr int kBlocks = D / 32;              ///< 32-value blocks per head
  static constexpr int kTile = decode_tile_keys(D);   ///< keys per tile
  static constexpr int kKBytes = k_head_bytes(D);     ///< K span of one head in a row
  static constexpr int kVBytes = v_head_bytes(D);     ///< V span of one head in a row
  static constexpr int kKChunks = kQ8_0BlockWords;    ///< the K span in 17 equal copies
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

__device__ __forceinline__ float round_to_f16(float x) {
  return __half2float(__float2half_rn(x));
}

// ---- The kernel's phases (each block-wide; the kernel below calls them in order) ----------

/// q of this KV head's query heads, rounded to fp16 once, laid out [g][block][kQStride].
template <int D>
__device__ __forceinline__ void load_q(float* q_s, const SplitRange& range, float scale, int G,
                                       int tid) {
  using S = Shape<D>;
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, e = i % D;
    q_s[(g * S::kBlocks + e / 32) * S::kQStride + e % 32] = round_to_f16(q_operand(
        range.q[((long long)range.kv * G + g) * D + e], scale, MutantSite::decode_cuda_core));
  }
}

/// Issues the copies of one tile into its stage (nothing past the split's last key), and always
/// commits a group so that wait_group counts tiles.
template <int D>
__device__ __forceinline__ void issue_tile(
    std::uint8_t (&k_tile)[kStages][Shape<D>::kTile * Shape<D>::kKBytes],
    std::uint8_t (&v_tile)[kStages][Shape<D>::kTile * Shape<D>::kVBytes], const SplitParams& p,
    const SplitRange& range, int tile, int n_tiles, int tid) {
  using S = Shape<D>;
  constexpr int T = S::kTile;
  if (tile < n_tiles) {
    const long long key0 = range.lo + (long long)tile * T;
    const int valid = static_cast<int>(range.hi - key0 < T ? range.hi - key0 : T);
    const long long row0 = key0 - range.base;  // physical row of the tile's first key
    std::uint8_t* kd = k_tile[tile % kStages];
    std::uint8_t* vd = v_tile[tile % kStages];
    for (int i = tid; i < valid * S::kKChunks; i += kThreads) {
      const int t = i / S::kKChunks, c = i % S::kKChunks;
      cp_async<S::kKChunk>(kd + t * S::kKBytes + c * S::kKChunk,
                           range.k_head + (row0 + t) * p.k_tok_bytes + c * S::kKChunk);
    }
    for (int i = tid; i < valid * S::kVChunks; i += kThreads) {
      const int t = i / S::kVChunks, c = i % S::kVChunks;
      cp_async<16>(vd + t * S::kVBytes + c * 16,
                   range.v_head + (row0 + t) * p.v_tok_bytes + c * 16);
    }
  }
  cp_async_commit();
}

/// A: the tile's scores. Thread (t, b) dots block b of key t with every query head; the NB
/// blocks of a key (consecutive lanes) are summed by a butterfly.
template <int D, int GMAX>
__device__ __forceinline__ void compute_scores(const std::uint8_t* k_stage, const float* q_s,
                                               float (&s_s)[GMAX][Shape<D>::kTile], int valid,
                                               int G, float scale, int tid) {
  using S = Shape<D>;
  constexpr int NB = S::kBlocks;
  const int t = tid / NB, b = tid % NB;
  float dot[GMAX];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) dot[g] = 0.0f;
  if (t < valid) {
    // The block starts at byte t·kKBytes + b·34 ≡ 2·(b & 1) (mod 4): read the 9 aligned
    // words covering it and shift by 2 bytes for even b. For odd b the window starts 2
    // bytes early; for the last block (odd: NB is even) it ends exactly at the key's end.
    const int start = t * S::kKBytes + b * kQ8_0BlockBytes;
    const unsigned* w = reinterpret_cast<const unsigned*>(k_stage + (start & ~3));
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
  // All lanes take part in the butterfly.
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g < G) {
#pragma unroll
      for (int off = NB / 2; off > 0; off /= 2) dot[g] += __shfl_xor_sync(kFullMask, dot[g], off);
    }
  }
  if (b == 0 && t < valid) {
#pragma unroll
    for (int g = 0; g < GMAX; ++g)
      if (g < G) s_s[g][t] = score_scaled(dot[g], scale);
  }
}

/// B: online softmax. Warp w owns query heads w, w + kWarps, …: the tile max, α (into alpha_s
/// for phase C), the fp16-rounded weights (into p_s) and the running sum.
template <int D, int GMAX, int GW>
__device__ __forceinline__ void update_softmax(SoftmaxState<GW>& state,
                                               const float (&s_s)[GMAX][Shape<D>::kTile],
                                               float (&p_s)[Shape<D>::kTile][GMAX], float* alpha_s,
                                               int valid, int G, int warp, int lane) {
  constexpr int T = Shape<D>::kTile;
#pragma unroll
  for (int k = 0; k < GW; ++k) {
    const int g = warp + kWarps * k;
    if (g < G) {
      float top = kNegSentinel;
      for (int t = lane; t < valid; t += 32) top = fmaxf(top, s_s[g][t]);
      top = warp_max(top);
      const float m_new = state.max_with(k, top);
      const float alpha = state.rescale_to(k, m_new);
      float sum = 0.0f;
      for (int t = lane; t < T; t += 32) {
        float pt = 0.0f;
        if (t < valid) {
          pt = softmax_weight(s_s[g][t], m_new);
          sum += pt;
        }
        p_s[t][g] = round_to_f16(pt);
      }
      sum = warp_sum(sum);
      state.advance(k, m_new, alpha, sum);
      if (lane == 0) alpha_s[g] = alpha;
    }
  }
}

/// Calls f(c, k, g) for each accumulator acc[c][k] of the thread whose query head g (hg +
/// kHeadGroups·k) is one of the G heads.
template <int D, int GPT, class F>
__device__ __forceinline__ void for_each_owned(int G, int hg, F&& f) {
#pragma unroll
  for (int c = 0; c < Shape<D>::kCols; ++c)
#pragma unroll
    for (int k = 0; k < GPT; ++k) {
      const int g = hg + Shape<D>::kHeadGroups * k;
      if (g < G) f(c, k, g);
    }
}

/// C: o = o·α + Σ_t p̃_t·V_t over the tile's valid keys (never a stale row). Thread owns
/// columns col0 + c·kColThreads and query heads hg + kHeadGroups·k.
template <int D, int GMAX, int GPT>
__device__ __forceinline__ void accumulate_pv(float (&acc)[Shape<D>::kCols][GPT],
                                              const std::uint8_t* vt,
                                              const float (&p_s)[Shape<D>::kTile][GMAX],
                                              const float* alpha_s, int valid, int G, int col0,
                                              int hg) {
  using S = Shape<D>;
  for_each_owned<D, GPT>(G, hg, [&](int c, int k, int g) {
    acc[c][k] = pv_accumulator(acc[c][k] * alpha_s[g], MutantSite::decode_cuda_core);
  });
#pragma unroll 1
  for (int t = 0; t < valid; ++t) {
#pragma unroll
    for (int c = 0; c < S::kCols; ++c) {
      const int col = col0 + c * S::kColThreads;
      const int j = col % 32;
      const std::uint8_t* blk = vt + t * S::kVBytes + (col / 32) * kQ5_1BlockBytes;
      const uint2 hdr = q5_1_header(blk);
      const unsigned q5 = q5_1_quant(blk[kQ5_1Nibbles + (j & 15)], hdr.y, j);
      // d·q is exact in f32, so the FMA rounds once, exactly like d·q + m (SPEC §4).
      const float v = fmaf(q5_1_d(hdr.x), static_cast<float>(q5), q5_1_m(hdr.x));
#pragma unroll
      for (int k = 0; k < GPT; ++k) {
        const int g = hg + S::kHeadGroups * k;
        if (g < G)
          acc[c][k] = pv_accumulator(fmaf(p_s[t][g], v, acc[c][k]), MutantSite::decode_cuda_core);
      }
    }
  }
}

/// The split's partial: o unnormalised, and each head's m and l (lane 0 of its owning warp).
template <int D, int GMAX, int GW, int GPT>
__device__ __forceinline__ void write_partial(const SplitRange& range,
                                              const float (&acc)[Shape<D>::kCols][GPT],
                                              const SoftmaxState<GW> state, int G, int col0, int hg,
                                              int warp, int lane) {
  for_each_owned<D, GPT>(G, hg, [&](int c, int k, int g) {
    range.o[g * D + col0 + c * Shape<D>::kColThreads] = acc[c][k];
  });
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < GW; ++k) {
      const int g = warp + kWarps * k;
      if (g < G) {
        range.m[g] = state.m[k];
        range.l[g] = state.l[k];
      }
    }
  }
}

/// One block per (split, KV head): online softmax over the split's keys for all gqa query
/// heads; writes the unnormalised partial (o, m, l).
template <int D, int GMAX, bool kBatch>
__global__ void __launch_bounds__(kThreads, split_blocks_per_sm(SplitKernel::cuda_core, D, GMAX))
    decode_split_kernel(const SplitParams p) {
  static_assert(split_instance_built(SplitKernel::cuda_core, D, GMAX));
  using S = Shape<D>;
  constexpr int T = S::kTile;
  constexpr int GW = (GMAX + kWarps - 1) / kWarps;                   // heads per warp, phase B
  constexpr int GPT = (GMAX + S::kHeadGroups - 1) / S::kHeadGroups;  // heads per thread, C

  // NOTE: k_tile precedes v_tile so that no K read can leave shared memory (it never does:
  // the 9-word window of a block ends at or before its key's K span end, see phase A).
  __shared__ __align__(16) std::uint8_t k_tile[kStages][T * S::kKBytes];
  __shared__ __align__(16) std::uint8_t v_tile[kStages][T * S::kVBytes];
  __shared__ __align__(16) float q_s[GMAX * S::kBlocks * S::kQStride];
  __shared__ float s_s[GMAX][T];   // scores of the tile
  __shared__ float p_s[T][GMAX];   // fp16-rounded probabilities of the tile
  __shared__ float alpha_s[GMAX];  // rescale of the running output, per head

  const int tid = threadIdx.x;
  const int G = p.gqa;

  const SplitRange range = begin_split<kBatch>(p, D, split_granule(SplitKernel::cuda_core, D),
                                               MutantSite::decode_cuda_core);
  if (!range.active) return;  // block-uniform: no barrier has been reached yet
  load_q<D>(q_s, range, p.scale, G, tid);
  const int n_tiles = static_cast<int>((range.hi - range.lo + T - 1) / T);

  // Running softmax state of the heads this warp owns in phase B (identical in all lanes).
  const int warp = tid / 32, lane = tid % 32;
  SoftmaxState<GW> state;
#pragma unroll
  for (int k = 0; k < GW; ++k) {
    state.reset(k);
  }
  // Phase C ownership: columns col0 + c·kColThreads, query heads hg + kHeadGroups·k.
  const int col0 = tid % S::kColThreads;
  const int hg = tid / S::kColThreads;
  float acc[S::kCols][GPT];
#pragma unroll
  for (int c = 0; c < S::kCols; ++c)
#pragma unroll
    for (int k = 0; k < GPT; ++k) acc[c][k] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_tile<D>(k_tile, v_tile, p, range, s, n_tiles, tid);

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();  // this thread's copies of `tile` have landed
    __syncthreads();               // everyone's have; everyone finished tile − 1 (and q_s)
    // Reuses the stage of tile − 1, free after the barrier.
    issue_tile<D>(k_tile, v_tile, p, range, tile + kStages - 1, n_tiles, tid);

    const int stage = tile % kStages;
    const long long key0 = range.lo + (long long)tile * T;
    const int valid = static_cast<int>(range.hi - key0 < T ? range.hi - key0 : T);
    compute_scores<D, GMAX>(k_tile[stage], q_s, s_s, valid, G, p.scale, tid);
    __syncthreads();
    update_softmax<D, GMAX, GW>(state, s_s, p_s, alpha_s, valid, G, warp, lane);
    __syncthreads();
    accumulate_pv<D, GMAX, GPT>(acc, v_tile[stage], p_s, alpha_s, valid, G, col0, hg);
  }
  cp_async_wait<0>();  // only empty groups can remain; keep the block's exit clean anyway
  write_partial<D, GMAX, GW, GPT>(range, acc, state, G, col0, hg, warp, lane);
}

template <int D, int GMAX>
void launch_split(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  if (sp.batch.list.slots != nullptr)
    decode_split_kernel<D, GMAX, true><<<grid, kThreads, 0, stream>>>(sp);
  else
    decode_split_kernel<D, GMAX, false><<<grid, kThreads, 0, stream>>>(sp);
}

/// `rows`: the kernel's query-head capacity (select_split_kernel: 1, 2, 4, 8 or 16 ≥ gqa).
template <int D>
void launch_split_for_dim(const SplitParams& sp, int rows, dim3 grid, cudaStream_t stream) {
  switch (rows) {
    case 1:
      return launch_split<D, 1>(sp, grid, stream);
    case 2:
      return launch_split<D, 2>(sp, grid, stream);
    case 4:
      return launch_split<D, 4>(sp, grid, stream);
    case 8:
      return launch_split<D, 8>(sp, grid, stream);
    default:
      return launch_split<D, 16>(sp, grid, stream);
  }
}

}  // namespace

namespace decode_impl {

cudaError_t launch_split_cuda_core(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                   cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      launch_split_for_dim<64>(sp, rows, grid, stream);
      break;
    case 128:
      launch_split_for_dim<128>(sp, rows, grid, stream);
      break;
    default:
      launch_split_for_dim<256>(sp, rows, grid, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace decode_impl

KVLAYER_DEFINE_MUTANT_UNIT(decode_cuda_core)

}  // namespace kvlayer::cuda::detail
