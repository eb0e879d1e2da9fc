// Verify decode (SPEC §11) on tensor cores, head dims 128 and 256: T queries × gqa heads of a
// KV head against one split of the cache, each query row with its own causal (and window) view.
// Same grid, partition of the views' union in 64-key granules, partial format, device-mode
// checks and merge kernel as every split kernel (decode_common.cuh). Rounding points
// (kvlayer/accuracy.hpp (1)–(5)), as decode_mma_direct.cu implements them:
//  (1) q̃ = fp16(q). Head dim 128 (verify_folds_k): K̃ = fp16(d·q) by one HMUL2 of the exact
//      quants (convert_tile), the dot one chain of D/16 m16n8k16 mma from zero, × scale
//      (__fmul_rn); a tile holding a K block whose d is beyond the fold (|d| > 511.75 or not
//      finite) is converted again with exact quants (convert_k_exact). Exact quants (head dim
//      256, and those tiles): per 32-value block two mma into a fresh f32 accumulator, × f32(d),
//      block 0 by __fmul_rn, each later block by fmaf(c, d, s); × scale.
//  (2) online softmax in f32, one max update per step of one or two 16-key m-tiles
//      (verify_softmax_steps), IEEE exp2f, finite sentinel.
//  (3) p rounded to fp16 for PV; V = d·q + m by one HFMA2 (the exact value rounded once to
//      fp16), or the exact f32 value on the CUDA cores, keys in order and only the keys a row
//      attends, for a tile holding a V block that may leave fp16's range or is not finite (a
//      masked key's NaN must not meet p = 0 in an mma); row sums from the unrounded p; f32
//      accumulation, pv_mma_steps = (keys per split / tile) · verify_warp_mtiles.
//  (4) the block merges the warps that share a row (key groups, in order) in f32.
//
// ---- Why this kernel ----------------------------------------------------------------------
// A decode is bound by turning q8_0 / q5_1 bytes into fp16 operands, not by its mma. The
// verify kernel of decode_mma_staged.cu repeats that work for every 16 query rows. Here the block
// converts each tile once, into fp16 in shared memory, and every warp reads its operands from there
// with ldmatrix: conversion is paid once per key for all T·gqa rows, and only ldmatrix, mma and the
// softmax grow with T.
//  - Keys are the mma's M, query rows its N: S^T[16 keys × 8 rows] = K·q̃^T (A = K quants by
//    ldmatrix, B = q̃ held in registers for the split), O^T[dims × rows] = V^T·P^T (A = V by
//    ldmatrix.trans, B = the transpose (movmatrix) of p's C fragment), as decode_mma_direct.cu.
//  - Tiles (verify_tile_keys) of 64 keys at head dim 128, 32 at 256, so that the fp16 stage is
//    the same 34 KB and two blocks fit a multiprocessor.
//  - Warps form a WR × WK grid: WR row groups of verify_group_rows (16 at head dim 128, 8 at
//    256: the accumulators of 128 dims × 16 rows or 256 × 8 fill the registers), WK = 4 / WR
//    key groups, warp (r, k) taking m-tiles k, k + WK, … of every tile, two at a time where it
//    has two or more (independent chains). select_split_kernel picks WR from T·gqa
//    (verify_row_groups; at head dim 128 T·gqa ≤ 16 runs on decode_mma_direct.cu's verify
//    instances instead); blockIdx.z takes the rows beyond 4 row groups.
//  - The conversion: thread c takes key c % tile and blocks c / tile, c / tile + 128 / tile
//    (ConvertShare), so that a warp's K blocks share one alignment, every shift is a compile-time
//    constant and the two V halves of a block share one byte permute.
//  - Per tile: cp.async copies of the raw rows (two stages: tile i + 1 lands while i is
//    converted and computed), a block-wide conversion into one fp16 stage (K̃, V values), then
//    the mma phase. Two barriers per tile; the second is a __syncthreads_or that also tells
//    every warp whether the tile holds a wide or bad block (then two more votes say which).
//  - At head dim 128, K carries its block scale (K̃ = fp16(d·q)), so the dot is one mma chain
//    with no per-block f32 fix-up of each score.
//  - fp16 rows are 2·D + 16 bytes: the 8 row addresses of an ldmatrix hit all 32 banks.
//  - The softmax skips the masks for m-tiles whose keys every real row of the warp attends.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cp_async.cuh"
#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/mma_fragments.cuh"
#include "decode/partition.hpp"
#include "decode/verify_raw_tile.cuh"
#include "device_status.cuh"

namespace kvlayer::cuda::detail::decode_impl {
namespace {

constexpr int kWarps = kDecodeMmaWarps;
constexpr int kThreads = 32 * kWarps;
static_assert(kThreads == kDecodeThreads);

/// The block-wide conversion of a raw stage into the fp16 stage: each thread its share
/// (ConvertShare) of K and of V. K gets its block scale folded in (K̃ = fp16(d·q),
/// accuracy.hpp (1)). Keys past `valid` get zeros (K and V: their p is 0, and 0 · 0 keeps every
/// row finite). Returns this thread's flags: kWideV where one of its V blocks may leave fp16's
/// range or is not finite (v_header_maybe_wide), kWideK where one of its K blocks' d is beyond
/// the fold (then convert_k_exact redoes the tile's K).
template <int D>
__device__ __forceinline__ int convert_tile(std::uint8_t* smem, const std::uint8_t* raw,
                                            int valid) {
  using S = VerifyShape<D>;
  static_assert(verify_folds_k(D));
  using Share = ConvertShare<D>;
  const Share my;
  const int key = my.key;
  std::uint8_t* kf = smem + S::kKf + key * S::kF16Stride;
  std::uint8_t* vf = smem + S::kVf + key * S::kF16Stride;
  if (key >= valid) {
#pragma unroll
    for (int j = 0; j < Share::kPerThread; ++j) {
      const int b = my.block(j);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        *reinterpret_cast<uint4*>(kf + 64 * b + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(vf + 64 * b + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    return 0;
  }
  bool wide = false, wide_k = false;
  unsigned first_d = 0;
#pragma unroll
  for (int j = 0; j < Share::kPerThread; ++j) {
    const int b = my.block(j);
    unsigned qw[8];
    const unsigned d = my.load_k(raw, j, qw);
    if (j == 0) first_d = d;
    wide_k = wide_k || k_header_maybe_wide(d);
    store_k_block<true>(kf + 64 * b, qw,
                        k_fold_scale(d, first_d, j, MutantSite::decode_mma_verify));

    wide = convert_v_block<D>(vf + 64 * b, raw, key, b) || wide;
  }
  return (wide ? kWideV : 0) | (wide_k ? kWideK : 0);
}

/// convert_tile for a head dim that keeps exact quants (verify_folds_k false): the fp16 stage gets
/// K quants and their d apart, each thread its share as in convert_tile. Keys past `valid` get
/// zeros (K, d and V: their p is 0, and 0 · 0 keeps every row finite). Returns whether one of this
/// thread's V blocks may leave fp16's range or is not finite (v_header_maybe_wide). NOTE: its K
/// loads are written out, not load_k_block's: through the helper, ptxas schedules this kernel
/// differently (its SASS is the one gated at head dim 256).
template <int D>
__device__ __forceinline__ bool convert_tile_unfolded(std::uint8_t* smem, const std::uint8_t* raw,
                                                      int valid) {
  using S = VerifyShape<D>;
  using Share = ConvertShare<D>;
  const Share my;
  const int key = my.key, b0 = my.b0;
  std::uint8_t* kf = smem + S::kKf + key * S::kF16Stride;
  std::uint8_t* vf = smem + S::kVf + key * S::kF16Stride;
  auto* kd = reinterpret_cast<unsigned short*>(smem + S::kKd) + key * S::kBlocks;
  if (key >= valid) {
#pragma unroll
    for (int j = 0; j < Share::kPerThread; ++j) {
      const int b = my.block(j);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        *reinterpret_cast<uint4*>(kf + 64 * b + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(vf + 64 * b + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
      }
      kd[b] = 0;
    }
    return false;
  }
  bool wide = false;
#pragma unroll
  for (int j = 0; j < Share::kPerThread; ++j) {
    const int b = my.block(j);
    // ---- K block b: d at byte 34b of the key's span, its 32 quants after it. Even b: the block
    // is 4-byte aligned (quants at 2 mod 4, funnelled from 9 words); odd b: its quants are.
    const std::uint8_t* kb = raw + key * S::kKBytes + kQ8_0BlockBytes * b;
    unsigned qw[8];
    if ((b0 & 1) == 0) {
      const unsigned* w = reinterpret_cast<const unsigned*>(kb);
      unsigned x[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) x[i] = w[i];
#pragma unroll
      for (int i = 0; i < 8; ++i) qw[i] = __byte_perm(x[i], x[i + 1], 0x5432);
      kd[b] = static_cast<unsigned short>(x[0] & 0xffffu);
    } else {
      const unsigned* w = reinterpret_cast<const unsigned*>(kb + 2);
#pragma unroll
      for (int i = 0; i < 8; ++i) qw[i] = w[i];
      kd[b] = *reinterpret_cast<const unsigned short*>(kb);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const unsigned u0 = qw[2 * c] ^ 0x80808080u, u1 = qw[2 * c + 1] ^ 0x80808080u;
      *reinterpret_cast<uint4*>(kf + 64 * b + 16 * c) =
          make_uint4(int8_pair_to_f16x2(u0, 0), int8_pair_to_f16x2(u0, 1),
                     int8_pair_to_f16x2(u1, 0), int8_pair_to_f16x2(u1, 1));
    }

    wide = convert_v_block<D>(vf + 64 * b, raw, key, b) || wide;
  }
  return wide;
}

/// The tile's K again, exact quants and their d apart (the path of accuracy.hpp (1) for a tile
/// that holds a K block whose d is beyond the fold; compute_scores<false> reads it). Same
/// threads, keys and blocks as convert_tile.
template <int D>
__device__ __forceinline__ void convert_k_exact(std::uint8_t* smem, const std::uint8_t* raw,
                                                int valid) {
  using S = VerifyShape<D>;
  using Share = ConvertShare<D>;
  const Share my;
  const int key = my.key;
  std::uint8_t* kf = smem + S::kKf + key * S::kF16Stride;
  auto* kd = reinterpret_cast<unsigned short*>(smem + S::kKd) + key * S::kBlocks;
#pragma unroll
  for (int j = 0; j < Share::kPerThread; ++j) {
    const int b = my.block(j);
    if (key >= valid) {
      kd[b] = 0;  // the quants are convert_tile's zeros
      continue;
    }
    unsigned qw[8];
    const unsigned d = my.load_k(raw, j, qw);
    kd[b] = static_cast<unsigned short>(d);
    store_k_block<false>(kf + 64 * b, qw, 0u);
  }
}


/// One thread's share of a verify block (one block per (split, KV head, rows chunk of
/// kGroupRows·WR); warp (wr, wk) = (warp / WK, warp % WK)): what every phase reads (the split,
/// shared memory, this lane's place in the warp grid) and, by reference, the thread's registers
/// (q̃ as fragments, its rows' views, the running softmax and P·V accumulators). The phases are
/// its member functions, in the kernel's order.
///
/// NOTE: the registers are the kernel's locals, one variable each, that the object refers to. As
/// its members, the arrays (indexed by loop counters until the loops are unrolled) kept the whole
/// object in memory through the early optimizations (more integer instructions, spills); as one
/// struct of the kernel's, they still changed the code ptxas is given.
template <int D, int WR>
struct VerifyBlock {
  using S = VerifyShape<D>;
  static constexpr int kKf = S::kKf, kVf = S::kVf, kKd = S::kKd, kF16Stride = S::kF16Stride;
  static constexpr int kTile = S::kTile, kBlocks = S::kBlocks, kNTiles = S::kNTiles;
  static constexpr int kDimTiles = S::kDimTiles, kGR = S::kGroupRows, kOStride = S::kOStride;
  static constexpr int WK = kWarps / WR;
  static_assert(S::kMTiles % WK == 0);
  static constexpr int kMy = S::kMTiles / WK;                         // m-tiles per warp and tile
  static constexpr int kNJ = kMy >= kVerifyPairs ? kVerifyPairs : 1;  // m-tiles per softmax step
  // The plan's accumulation shape (verify_accumulation_shape) counts these.
  static_assert(WR == verify_row_groups(D, kGR * WR) && kMy == verify_warp_mtiles(D, kGR * WR) &&
                kMy / kNJ == verify_softmax_steps(D, kGR * WR));
  static constexpr MutantSite kSite = MutantSite::decode_mma_verify;
  using QFrags = unsigned[kNTiles][kDimTiles][2];
  using RowBounds = int[kNTiles][2];
  using State = SoftmaxState<2 * kNTiles>;
  using Acc = float[kNTiles][kDimTiles][4];
  using Scores = float[kNJ][kNTiles][4];

  const SplitParams& p;
  const SplitRange& range;
  std::uint8_t* const smem;
  const int tid, warp, lane, wr, wk, g, t;
  const int G;     ///< query heads per KV head
  const int n_kv;  ///< KV heads
  const long long lo;
  // Set by the phase that first needs them, not by the constructor (computed there, ahead of
  // q̃'s loads, they changed the code ptxas is given): the split's key count, hi − lo
  // (bound_rows), its tiles and the ldmatrix row addresses of this lane within an m-tile
  // (start_copies): K (keys l % 8 + 8·(l / 8 % 2), dims + 8·(l / 16)), V transposed (keys l % 8 +
  // 8·(l / 16), dims + 8·(l / 8 % 2)).
  int n_keys, n_tiles;
  int k_lrow, k_lcol, v_lrow, v_lcol;

  // q̃ as the QK B fragments for the split: qb[nt][ks][j], row kGR·wr + 8nt + g of the block,
  // dims 16ks + 2t + 8j + {0, 1} (zero for padding rows).
  QFrags& qb;
  // The keys each of this lane's softmax rows (kGR·wr + 8nt + 2t + h) attends, as offsets from lo
  // (see bound_rows).
  RowBounds& row_lo;
  RowBounds& row_hi;
  // The keys every real row of this warp attends: [warp_lo, warp_hi) (empty: no fast path).
  int& warp_lo;
  int& warp_hi;
  // Row 2nt + h: row 16wr + 8nt + 2t + h (m identical across the lane groups; l per lane).
  State& state;
  Acc& o;  // (dim 16dm + g + 8(e / 2), row 16wr + 8nt + 2t + e % 2)

  __device__ __forceinline__ VerifyBlock(const SplitParams& params, const SplitRange& split,
                                         std::uint8_t* shared, QFrags& q_frags, RowBounds& rows_lo,
                                         RowBounds& rows_hi, int& common_lo, int& common_hi,
                                         State& softmax, Acc& acc)
      : p(params),
        range(split),
        smem(shared),
        tid(threadIdx.x),
        warp(tid / 32),
        lane(tid % 32),
        wr(warp / WK),
        wk(warp % WK),
        g(lane >> 2),
        t(lane & 3),
        G(params.gqa),
        n_kv(int(gridDim.y)),
        lo(split.lo),
        qb(q_frags),
        row_lo(rows_lo),
        row_hi(rows_hi),
        warp_lo(common_lo),
        warp_hi(common_hi),
        state(softmax),
        o(acc) {}

  /// q̃'s fragments (qb) for the split.
  __device__ __forceinline__ void load_q() {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int row = kGR * wr + 8 * nt + g;
      const bool real = row < range.nrows;
      const float* q_row =
          range.q + query_row_index(range.row0 + (real ? row : 0), range.kv, G, n_kv) * D;
#pragma unroll
      for (int ks = 0; ks < kDimTiles; ++ks)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int dim = 16 * ks + 2 * t + 8 * j;
          const float x0 = real ? q_operand(q_row[dim], p.scale, kSite) : 0.0f;
          const float x1 = real ? q_operand(q_row[dim + 1], p.scale, kSite) : 0.0f;
          qb[nt][ks][j] = pack_f16x2(x0, x1);
        }
    }
  }

  /// The rows' views (row_lo, row_hi) clipped to [0, hi − lo] (SPEC §11: query i at p_i = len −
  /// T + i sees [max(0, p_i + 1 − window), p_i + 1)); padding rows none. Then their intersection
  /// over the warp's real rows (warp_lo, warp_hi).
  __device__ __forceinline__ void bound_rows() {
    n_keys = static_cast<int>(range.hi - lo);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = kGR * wr + 8 * nt + 2 * t + h;
        row_lo[nt][h] = 0;
        row_hi[nt][h] = 0;
        if (row < range.nrows) {
          const long long pos = range.len - p.view.queries + (range.row0 + row) / G;
          const long long end = verify_row_end(pos, range.len, kSite);
          const long long begin =
              p.view.window > 0 ? verify_row_begin(pos, range.len - 1, p.view.window, kSite) : 0;
          row_hi[nt][h] = static_cast<int>(min(max(end - lo, 0ll), (long long)n_keys));
          row_lo[nt][h] = static_cast<int>(min(max(begin - lo, 0ll), (long long)n_keys));
        }
      }

    warp_lo = 0;
    warp_hi = n_keys;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (kGR * wr + 8 * nt + 2 * t + h < range.nrows) {
          warp_lo = max(warp_lo, row_lo[nt][h]);
          warp_hi = min(warp_hi, row_hi[nt][h]);
        }
    warp_lo = max(warp_lo, __shfl_xor_sync(kFullMask, warp_lo, 1));
    warp_lo = max(warp_lo, __shfl_xor_sync(kFullMask, warp_lo, 2));
    warp_hi = min(warp_hi, __shfl_xor_sync(kFullMask, warp_hi, 1));
    warp_hi = min(warp_hi, __shfl_xor_sync(kFullMask, warp_hi, 2));
  }

  /// The running softmax and the P·V accumulators, empty.
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        state.reset(2 * nt + h);
      }
#pragma unroll
      for (int dm = 0; dm < kDimTiles; ++dm)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][dm][e] = 0.0f;
    }
  }

  /// The keys of tile i (the last may be partial), and the raw stage that holds it.
  __device__ __forceinline__ int valid_of(int i) const {
    return min(kTile, n_keys - kTile * i);
  }
  __device__ __forceinline__ const std::uint8_t* raw_stage(int i) const {
    return smem + (i % kVerifyStages) * S::kRawStage;
  }

  /// The tile walk's start: its length, this lane's ldmatrix rows, and the copies of the first
  /// kVerifyStages − 1 tiles.
  __device__ __forceinline__ void start_copies() {
    n_tiles = (n_keys + kTile - 1) / kTile;
    k_lrow = (lane & 7) + 8 * ((lane >> 3) & 1);
    k_lcol = 8 * (lane >> 4);
    v_lrow = (lane & 7) + 8 * (lane >> 4);
    v_lcol = 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int i = 0; i < kVerifyStages - 1; ++i) copy(i);
  }

  /// Copies of tile i go to raw stage i % kVerifyStages, kVerifyStages − 1 tiles ahead; one
  /// commit group per tile (empty past the last), so that a fixed wait count finds tile i landed.
  __device__ __forceinline__ void copy(int i) {
    if (i < n_tiles)
      copy_raw_tile<D>(smem + (i % kVerifyStages) * S::kRawStage, range.k_head, range.v_head,
                       lo + kTile * i - range.base, p.k_tok_bytes, p.v_tok_bytes, valid_of(i));
    cp_async_commit();
  }

  /// Scores: s[jj][nt][e] for key 16mt + g + 8(e / 2) of m-tile mt = wk + WK·(j0 + jj), row
  /// (nt, e % 2), from the converted tile in shared memory (accuracy.hpp (1)). kFolded: K̃ carries
  /// d, the dot is one chain of D/16 mma. Otherwise (convert_k_exact's tile) per 32-value block
  /// two mma into a fresh accumulator, × f32(d): block 0 by __fmul_rn, later ones by fmaf.
  template <bool kFolded>
  __device__ __forceinline__ void compute_scores(int j0, Scores& s) const {
#pragma unroll
    for (int jj = 0; jj < kNJ; ++jj) {
      const int mt = wk + WK * (j0 + jj);
      const std::uint8_t* krow = smem + kKf + (16 * mt + k_lrow) * kF16Stride + 2 * k_lcol;
      if constexpr (kFolded) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[jj][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kDimTiles; ++ks) {
          unsigned a[4];
          ldmatrix_x4<false>(a, krow + 32 * ks);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            mma_16816(s[jj][nt], a[0], a[1], a[2], a[3], qb[nt][ks][0], qb[nt][ks][1]);
        }
        continue;
      }
      // d of blocks (2i, 2i + 1) of keys g, g + 8 of the m-tile.
      unsigned dk0[kBlocks / 2], dk1[kBlocks / 2];
      {
        const auto* w0 = reinterpret_cast<const uint2*>(smem + kKd + (16 * mt + g) * kBlocks * 2);
        const auto* w1 =
            reinterpret_cast<const uint2*>(smem + kKd + (16 * mt + g + 8) * kBlocks * 2);
#pragma unroll
        for (int i = 0; i < kBlocks / 4; ++i) {
          const uint2 x0 = w0[i], x1 = w1[i];
          dk0[2 * i] = x0.x;
          dk0[2 * i + 1] = x0.y;
          dk1[2 * i] = x1.x;
          dk1[2 * i + 1] = x1.y;
        }
      }
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        float c[kNTiles][4] = {};
#pragma unroll
        for (int ks = 2 * b; ks < 2 * b + 2; ++ks) {
          unsigned a[4];
          ldmatrix_x4<false>(a, krow + 32 * ks);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            mma_16816(c[nt], a[0], a[1], a[2], a[3], qb[nt][ks][0], qb[nt][ks][1]);
        }
        const unsigned w0 = dk0[b / 2], w1 = dk1[b / 2];
        const float d0 = f16_bits((b & 1) ? w0 >> 16 : w0 & 0xffffu);
        const float d1 = f16_bits((b & 1) ? w1 >> 16 : w1 & 0xffffu);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float d = e < 2 ? d0 : d1;
            s[jj][nt][e] = b == 0 ? __fmul_rn(c[nt][e], d) : fmaf(c[nt][e], d, s[jj][nt][e]);
          }
      }
    }
  }

  /// The online softmax of one step, row by row, over the keys each row attends (p = 0
  /// elsewhere): s becomes the weights p, alpha[nt][h] row (nt, h)'s rescale, and rescale whether
  /// one moved. kFull: every key of the step's m-tiles is in every real row's view (no mask is
  /// evaluated).
  template <bool kFull>
  __device__ __forceinline__ void update_local_state(Scores& s, int j0, int key_off, int valid,
                                                     float (&alpha)[kNTiles][2], bool& rescale) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        bool att[kNJ][2];
        float top = kNegSentinel;
#pragma unroll
        for (int jj = 0; jj < kNJ; ++jj)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int k = 16 * (wk + WK * (j0 + jj)) + g + 8 * r;  // key of the tile
            att[jj][r] =
                kFull || (k < valid && key_off + k >= row_lo[nt][h] && key_off + k < row_hi[nt][h]);
            s[jj][nt][2 * r + h] = score_scaled(s[jj][nt][2 * r + h], p.scale);
            if (att[jj][r]) top = fmaxf(top, s[jj][nt][2 * r + h]);
          }
        top = max_over_lane_groups(top);
        const float m_new = state.max_with(2 * nt + h, top);
        alpha[nt][h] = state.rescale_to(2 * nt + h, m_new);
        rescale = rescale || alpha[nt][h] != 1.0f;
        float sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < kNJ; ++jj)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            s[jj][nt][2 * r + h] = att[jj][r] ? softmax_weight(s[jj][nt][2 * r + h], m_new) : 0.0f;
            sum += s[jj][nt][2 * r + h];
          }
        state.advance(2 * nt + h, m_new, alpha[nt][h], sum);
      }
  }

  /// Online softmax per row over the keys it attends (p = 0 elsewhere): s becomes the weights
  /// p; the accumulators are rescaled when a max moved (first: nothing accumulated yet). When
  /// every key of these m-tiles is in every real row's view (the common case), no mask is
  /// evaluated.
  __device__ __forceinline__ void update_softmax(Scores& s, int j0, int key_off, int valid,
                                                 bool first) {
    bool rescale = false;
    float alpha[kNTiles][2];
    const int mt_first = wk + WK * j0, mt_last = wk + WK * (j0 + kNJ - 1);
    const bool full = 16 * mt_last + 16 <= valid && key_off + 16 * mt_first >= warp_lo &&
                      key_off + 16 * mt_last + 16 <= warp_hi;
    if (full)
      update_local_state<true>(s, j0, key_off, valid, alpha, rescale);
    else
      update_local_state<false>(s, j0, key_off, valid, alpha, rescale);
    if (rescale_accumulators(__any_sync(kFullMask, rescale), first, kSite))
      rescale_pv_accumulators(o, alpha, kSite);
  }

  /// P·V on the CUDA cores, f32, keys in order, only the keys each row attends: V exact, p
  /// unrounded (a tile holding a V block that may leave fp16's range). w: m-tile mt's weights p.
  __device__ __forceinline__ void accumulate_pv_f32(const float (&w)[kNTiles][4], int mt,
                                                    int key_off, int valid,
                                                    const std::uint8_t* raw) {
#pragma unroll 1
    for (int k = 0; k < 16; ++k) {
      const int key = 16 * mt + k;
      if (key >= valid) break;  // warp-uniform
      const int src = ((k & 7) << 2) | t;
      float pk[kNTiles][2];
      bool att[kNTiles][2];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          pk[nt][h] = __shfl_sync(kFullMask, k < 8 ? w[nt][h] : w[nt][2 + h], src);
          att[nt][h] = key_off + key >= row_lo[nt][h] && key_off + key < row_hi[nt][h];
        }
#pragma unroll
      for (int dm = 0; dm < kDimTiles; ++dm)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float v = v_exact<D>(raw, key, 16 * dm + g + 8 * r);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (att[nt][h])
                o[nt][dm][2 * r + h] =
                    pv_accumulator(fmaf(pk[nt][h], v, o[nt][dm][2 * r + h]), kSite);
          // NOTE: keeps the next value's loads from being hoisted here: on this rare
          // path, registers matter more than latency.
          asm volatile("" ::: "memory");
        }
    }
  }

  /// P·V on the tensor cores: p̃^T (keys 2t, 2t + 1 (+ 8), row g of n-tile nt) as the B
  /// fragments, V^T from the converted tile by ldmatrix. w: m-tile mt's weights p.
  __device__ __forceinline__ void accumulate_pv_mma(const float (&w)[kNTiles][4], int mt) {
    unsigned pb[kNTiles][2];  // p̃^T: keys 2t, 2t + 1 (+ 8), row g of n-tile nt
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      pb[nt][0] = transpose_8x8_f16(pack_f16x2(w[nt][0], w[nt][1]));
      pb[nt][1] = transpose_8x8_f16(pack_f16x2(w[nt][2], w[nt][3]));
    }
    const std::uint8_t* vrow = smem + kVf + (16 * mt + v_lrow) * kF16Stride + 2 * v_lcol;
#pragma unroll
    for (int dm = 0; dm < kDimTiles; ++dm) {
      unsigned a[4];
      ldmatrix_x4<true>(a, vrow + 32 * dm);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        mma_16816(o[nt][dm], a[0], a[1], a[2], a[3], pb[nt][0], pb[nt][1]);
        pv_accumulators(o[nt][dm], kSite);
      }
    }
  }

  /// P·V of one step's m-tiles: on the CUDA cores where the tile holds a wide or bad V block
  /// (f32_pv), else on the tensor cores.
  __device__ __forceinline__ void accumulate_pv(const Scores& s, int j0, int key_off, int valid,
                                                const std::uint8_t* raw, bool f32_pv) {
#pragma unroll
    for (int jj = 0; jj < kNJ; ++jj) {
      const int mt = wk + WK * (j0 + jj);
      if (f32_pv) {
        accumulate_pv_f32(s[jj], mt, key_off, valid, raw);
        continue;
      }
      accumulate_pv_mma(s[jj], mt);
    }
  }

  // ---- Merge the WK warps of each row group into the split's partial (shared memory reused:
  // o [warp][kGR][kOStride]). ----
  __device__ __forceinline__ WarpMergeScratch<kWarps> merge_s() const {
    return {reinterpret_cast<float*>(smem)};
  }

  /// Each row's l summed over the lanes that hold its keys.
  __device__ __forceinline__ void sum_lane_groups() {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        state.l[2 * nt + h] = sum_over_lane_groups(state.l[2 * nt + h]);
      }
  }

  /// This warp's m, l and o into shared memory.
  __device__ __forceinline__ void stage_warp_results() const {
    const WarpMergeScratch<kWarps> s = merge_s();
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s.m()[warp * 16 + 8 * nt + 2 * t + h] = state.m[2 * nt + h];
          s.l()[warp * 16 + 8 * nt + 2 * t + h] = state.l[2 * nt + h];
        }
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int dm = 0; dm < kDimTiles; ++dm)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s.o()[(warp * kGR + 8 * nt + 2 * t + (e & 1)) * kOStride + 16 * dm + g + 8 * (e >> 1)] =
              o[nt][dm][e];
  }

  /// Thread r < rows: row r's max and sum over its WK warps (the partial's m, l), and each
  /// warp's weight (w).
  __device__ __forceinline__ void merge_softmax() const {
    const float* m = merge_s().m();
    const float* l = merge_s().l();
    float* ws = merge_s().w();
    if (tid < range.nrows) {
      const int w0 = (tid / kGR) * WK, lr = tid % kGR;
      float top = kNegSentinel;
#pragma unroll
      for (int k = 0; k < WK; ++k) top = fmaxf(top, m[(w0 + k) * 16 + lr]);
      float den = 0.0f;
#pragma unroll
      for (int k = 0; k < WK; ++k) {
        const float wt = softmax_rescale(m[(w0 + k) * 16 + lr], top);
        ws[(w0 + k) * 16 + lr] = wt;
        den = fmaf(l[(w0 + k) * 16 + lr], wt, den);
      }
      range.m[tid] = top;
      range.l[tid] = den;
    }
  }

  /// The partial's o: each row's warps' o by their weights, in key-group order.
  __device__ __forceinline__ void merge_output() const {
    const float* ws = merge_s().w();
    const float* os = merge_s().o();
    const int rows = range.nrows;
    for (int i = tid; i < rows * D; i += kThreads) {
      const int r = i / D, col = i % D;
      const int w0 = (r / kGR) * WK, lr = r % kGR;
      float num = 0.0f;
#pragma unroll
      for (int k = 0; k < WK; ++k)
        num = fmaf(os[((w0 + k) * kGR + lr) * kOStride + col], ws[(w0 + k) * 16 + lr], num);
      range.o[i] = num;
    }
  }
};

/// One block per (split, KV head, rows chunk of kGroupRows·WR). Warp (wr, wk) = (warp / WK,
/// warp % WK).
template <int D, int WR, bool kBatch>
__global__ void __launch_bounds__(kThreads, split_blocks_per_sm(SplitKernel::mma_verify, D,
                                                                verify_group_rows(D) * WR))
    decode_split_mma_verify_kernel(const SplitParams p) {
  static_assert(split_instance_built(SplitKernel::mma_verify, D, verify_group_rows(D) * WR));
  using Block = VerifyBlock<D, WR>;
  extern __shared__ __align__(16) std::uint8_t smem[];

  const SplitRange range =
      begin_split<kBatch>(p, D, split_granule(SplitKernel::mma_verify, D), Block::kSite);
  if (!range.active) return;  // block-uniform: no barrier has been reached yet

  // The thread's registers (VerifyBlock says what each holds, and why they are locals here).
  typename Block::QFrags qb;
  typename Block::RowBounds row_lo, row_hi;
  int warp_lo, warp_hi;
  typename Block::State state;
  typename Block::Acc o;
  Block b(p, range, smem, qb, row_lo, row_hi, warp_lo, warp_hi, state, o);
  b.load_q();
  b.bound_rows();
  b.reset();
  b.start_copies();
  for (int i = 0; i < b.n_tiles; ++i) {
    const std::uint8_t* raw = b.raw_stage(i);
    const int valid = b.valid_of(i);
    cp_async_wait<kVerifyStages - 2>();  // this thread's copies of tile i have landed
    __syncthreads();  // every thread's have; every warp is done with tile i − 1 (and its stage)
    b.copy(i + kVerifyStages - 1);
    const int key_off = Block::kTile * i;  // the tile's first key, as an offset from lo
    bool f32_pv = false, k_exact = !verify_folds_k(D);
    if constexpr (verify_folds_k(D)) {
      const int flags = convert_tile<D>(smem, raw, valid);
      if (__syncthreads_or(flags)) {  // block-uniform; rare: a tile with a wide or bad block
        f32_pv = wide_tile_on_cuda_cores(__syncthreads_or(flags & kWideV), Block::kSite);
        k_exact = k_tile_unfolded(__syncthreads_or(flags & kWideK), Block::kSite);
        if (k_exact) {
          convert_k_exact<D>(smem, raw, valid);
          __syncthreads();
        }
      }
    } else {
      const bool special = __syncthreads_or(convert_tile_unfolded<D>(smem, raw, valid));
      f32_pv = wide_tile_on_cuda_cores(special, Block::kSite);
    }

    // kNJ m-tiles at a time (NOTE: not the whole tile: its scores and operands at once need more
    // than 255 registers), with one max update for them.
#pragma unroll 1
    for (int j0 = 0; j0 < Block::kMy; j0 += Block::kNJ) {
      typename Block::Scores s;
      if (k_exact)
        b.template compute_scores<false>(j0, s);
      else
        b.template compute_scores<true>(j0, s);
      b.update_softmax(s, j0, key_off, valid, i == 0 && j0 == 0);
      b.accumulate_pv(s, j0, key_off, valid, raw, f32_pv);
    }
  }

  // ---- Merge the WK warps of each row group into the split's partial. ----
  b.sum_lane_groups();
  __syncthreads();  // every warp is done with the stages (no copy is in flight)
  b.stage_warp_results();
  __syncthreads();
  b.merge_softmax();
  __syncthreads();
  b.merge_output();
}

template <int D, int WR, bool kBatch>
cudaError_t launch_instance(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  // Not a stream operation (legal while capturing); set per launch so every device the process
  // uses gets it.
  constexpr int kBytes = VerifyShape<D>::kBytes;
  if (const cudaError_t err =
          cudaFuncSetAttribute(decode_split_mma_verify_kernel<D, WR, kBatch>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
      err != cudaSuccess)
    return err;
  decode_split_mma_verify_kernel<D, WR, kBatch><<<grid, kThreads, kBytes, stream>>>(sp);
  return cudaGetLastError();
}

template <int D, int WR>
cudaError_t launch(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  return sp.batch.list.slots != nullptr ? launch_instance<D, WR, true>(sp, grid, stream)
                                        : launch_instance<D, WR, false>(sp, grid, stream);
}

template <int D, int WR>
cudaError_t resident_blocks(int* blocks) {
  constexpr int kBytes = VerifyShape<D>::kBytes;
  const auto kernel = decode_split_mma_verify_kernel<D, WR, false>;
  if (const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
      err != cudaSuccess)
    return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, kBytes);
}

}  // namespace

// The instances select_split_kernel names: rows = verify_group_rows(D) · verify_row_groups (at
// head dim 128 more than 16: fewer rows are decode_mma_direct.cu's).
cudaError_t launch_split_mma_verify(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream) {
  if (head_dim == 128)
    return rows <= 32 ? launch<128, 2>(sp, grid, stream) : launch<128, 4>(sp, grid, stream);
  return rows <= 16 ? launch<256, 2>(sp, grid, stream) : launch<256, 4>(sp, grid, stream);
}

cudaError_t split_mma_verify_resident_blocks(int head_dim, int rows, int* blocks) {
  if (head_dim == 128)
    return rows <= 32 ? resident_blocks<128, 2>(blocks) : resident_blocks<128, 4>(blocks);
  return rows <= 16 ? resident_blocks<256, 2>(blocks) : resident_blocks<256, 4>(blocks);
}

}  // namespace kvlayer::cuda::detail::decode_impl

namespace kvlayer::cuda::detail {
KVLAYER_DEFINE_MUTANT_UNIT(decode_mma_verify)
}  // namespace kvlayer::cuda::detail
