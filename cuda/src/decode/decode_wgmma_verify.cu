// OPT-IN (DecodeOptions::Verify::wgmma): compiled and host-tested, not yet run on a device; the
// default verify is decode_mma_verify.cu until this kernel passes the gate (bench/NOTES.md says
// what that call runs).
//
// Verify decode (SPEC §11) at head dim 128 on warpgroup MMA (wgmma, sm_90a): 64 or 128 query rows
// (T·gqa rows of a KV head; more are split over blockIdx.z) against one split of the cache, each
// row with its own causal (and window) view. Same grid, partition of the views' union in 64-key
// granules, partial format, device-mode checks and merge kernel as every split kernel
// (decode_common.cuh). Rounding points (kvlayer/accuracy.hpp (1)–(5)):
//  (1) q̃ = fp16(q); K̃ = fp16(d·q) by one HMUL2 of the exact quants, the dot one chain of 8
//      k16 steps from zero (wgmma, f32 accumulation: (5)), × scale (__fmul_rn). A tile holding
//      a K block whose d is beyond the fold (|d| > 511.75 or not finite) is converted again with
//      exact quants: per 32-value block two mma.sync k16 steps into a fresh accumulator,
//      × f32(d), block 0 by __fmul_rn, each later block by fmaf(c, d, s); × scale.
//  (2) online softmax in f32, one max update per 64-key tile, IEEE exp2f, finite sentinel.
//  (3) p rounded to fp16 for PV; V = d·q + m by one HFMA2 (the exact value rounded once to
//      fp16), or the exact f32 value on the CUDA cores, keys in order and only the keys a row
//      attends, for a tile holding a V block that may leave fp16's range or is not finite (its
//      wgmma then adds p̃ = 0 times finite Ṽ: exact zeros); row sums from the unrounded p; f32
//      accumulation, 4 k16 steps per tile.
//  (4) no merge inside the block: a row lives in one warp's quad of lanes from start to end.
//
// ---- Why this kernel ----------------------------------------------------------------------
// decode_mma_verify.cu converts each tile once into shared memory but then issues 16×8 mma.sync
// tiles with keys on M: at 64 rows per block the ldmatrix/mma/transpose instructions dominate,
// and at 255 registers two blocks of 4 warps leave the SM latency-bound (bench/NOTES.md). Here
// each warpgroup of the block takes 64 query rows on wgmma's M: S = Q̃·K̃ᵀ is 8 wgmma
// m64n64k16 and O += P̃·Ṽ 4 wgmma m64n128k16 per 64-key tile, with q̃ and P̃ as register A
// operands (FA3's register-resident P: S's accumulator is P's A fragment) and K̃, Ṽ read by
// the tensor cores from shared memory.
//  - Per tile: cp.async copies of the raw rows (two stages), a block-wide conversion into one of
//    two fp16 stages, then QK (waited), the softmax, and PV issued without a wait: the next
//    tile's conversion, into the other stage, runs while PV's wgmma does.
//  - K̃ and Ṽ share one layout, [dim atom 0, 1][key 0 … 63][128 bytes], each key's 64 dims of an
//    atom as 8 16-byte chunks stored at chunk ^ (key % 8) (the 128-byte swizzle). Read as B of
//    QK it is K-major (k = dims); as B of PV, N-major (n = dims, the transposed form).
//  - Padding rows (row ≥ the block's rows) have q̃ = 0 and attend nothing; their outputs are
//    never written.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cp_async.cuh"
#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/mma_fragments.cuh"
#include "decode/partition.hpp"
#include "decode/verify_raw_tile.cuh"
#include "decode/wgmma.cuh"
#include "decode/wgmma_operand_layout.hpp"
#include "device_status.cuh"

namespace kvlayer::cuda::detail::decode_impl {
namespace {

constexpr int kD = 128;
using Raw = VerifyShape<kD>;  ///< the raw stages' layout (64-key tiles)
constexpr int kTile = Raw::kTile;
static_assert(kTile == kWgmmaVerifyTileKeys);

/// A block of kWG warpgroups: 64·kWG query rows (each warpgroup's 64 on its wgmma's M), every
/// tile converted once for all of them.
template <int kWG>
struct Shape {
  static constexpr int kRows = 64 * kWG;
  static constexpr int kThreads = 128 * kWG;
};

/// One fp16 operand (K̃ or Ṽ) of a tile (wgmma_operand_layout.hpp); 1024-aligned.
using Operand = WgmmaOperand;
static_assert(Operand::kKeys == kTile && Operand::kDims == kD);
constexpr int kOperandBytes = Operand::kBytes;
/// Shared memory: fp16 stages [2] (K̃ then Ṽ), raw stages [kVerifyStages], the exact path's
/// K scales [key][block] (fp16).
constexpr int kF16Stage = 2 * kOperandBytes;
constexpr int kRawOff = 2 * kF16Stage;
constexpr int kKdOff = kRawOff + kVerifyStages * Raw::kRawStage;
constexpr int kBytes = kKdOff + kTile * Raw::kBlocks * 2;
/// The dynamic allocation: kBytes after its base is rounded up to 1024 (the swizzle atoms').
constexpr int kDynamicBytes = kBytes + 1024;
static_assert(Raw::kRawStage % 16 == 0 && kF16Stage % 1024 == 0);
/// The f32 P·V path stages p [row][key] in the other fp16 stage (free by then).
static_assert(Shape<2>::kRows * kTile * 4 <= kF16Stage);

constexpr MutantSite kSite = MutantSite::decode_wgmma_verify;

/// Stores 32-value block b of a key (16 fp16x2 words, dims in order) into an fp16 operand.
__device__ __forceinline__ void store_block(std::uint8_t* operand, int key, int b,
                                            const unsigned (&w)[16]) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
    *reinterpret_cast<uint4*>(operand + Operand::chunk(key, 4 * b + c)) =
        make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
}

/// The block-wide conversion of a raw stage into an fp16 stage (kt: K̃, vt: V). Each thread
/// converts its share (ConvertShare) of K (d folded in: K̃ = fp16(d·q),
/// accuracy.hpp (1)) and of V; keys past `valid` get zeros (their p is 0, and 0 · 0 keeps every
/// row finite). Returns this thread's flags: kWideV where one of its V blocks may leave fp16's
/// range or is not finite, kWideK where one of its K blocks' d is beyond the fold.
template <int kWG>
__device__ __forceinline__ int convert_tile(std::uint8_t* kt, std::uint8_t* vt,
                                            const std::uint8_t* raw, int valid) {
  using Share = ConvertShare<kD, Shape<kWG>::kThreads>;
  const Share my;
  const int key = my.key;
  if (key >= valid) {
    const unsigned zero[16] = {};
#pragma unroll
    for (int j = 0; j < Share::kPerThread; ++j) {
      store_block(kt, key, my.block(j), zero);
      store_block(vt, key, my.block(j), zero);
    }
    return 0;
  }
  bool wide = false, wide_k = false;
  unsigned first_d = 0;
#pragma unroll
  for (int j = 0; j < Share::kPerThread; ++j) {
    const int b = my.block(j);
    unsigned qw[8], w[16];
    const unsigned d = my.load_k(raw, j, qw);
    if (j == 0) first_d = d;
    wide_k = wide_k || k_header_maybe_wide(d);
    k_block_words<true>(qw, k_fold_scale(d, first_d, j, kSite), w);
    store_block(kt, key, b, w);
    // A V block that may leave fp16's range stores zeros: its tile's P·V runs on the CUDA cores
    // and the tensor cores then add 0·Ṽ, which must stay 0 (0·inf would be NaN).
    const bool wide_b = v_block_words<kD>(raw, key, b, w);
    wide = wide || wide_b;
    if (wide_b) {
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i] = 0u;
    }
    store_block(vt, key, b, w);
  }
  return (wide ? kWideV : 0) | (wide_k ? kWideK : 0);
}

/// The tile's K again as exact quants (kt) and their d apart (kd[key][block], fp16 bits): the
/// path of accuracy.hpp (1) for a tile that holds a K block whose d is beyond the fold. Each
/// thread its share, as in convert_tile.
template <int kWG>
__device__ __forceinline__ void convert_k_exact(std::uint8_t* kt, unsigned short* kd,
                                                const std::uint8_t* raw, int valid) {
  using Share = ConvertShare<kD, Shape<kWG>::kThreads>;
  const Share my;
  const int key = my.key;
#pragma unroll
  for (int j = 0; j < Share::kPerThread; ++j) {
    const int b = my.block(j);
    if (key >= valid) {
      kd[key * Raw::kBlocks + b] = 0;  // the quants are convert_tile's zeros
      continue;
    }
    unsigned qw[8], w[16];
    const unsigned d = my.load_k(raw, j, qw);
    kd[key * Raw::kBlocks + b] = static_cast<unsigned short>(d);
    k_block_words<false>(qw, 0u, w);
    store_block(kt, key, b, w);
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// B of QK at k16 step ks, and of PV at k16 step ks (WgmmaOperand).
__device__ __forceinline__ std::uint64_t k_desc(const std::uint8_t* kt, int ks) {
  return wgmma_desc_sw128(kt + Operand::k_start(ks), Operand::kKLbo, Operand::kKSbo);
}
__device__ __forceinline__ std::uint64_t v_desc(const std::uint8_t* vt, int ks) {
  return wgmma_desc_sw128(vt + Operand::v_start(ks), Operand::kVLbo, Operand::kVSbo);
}

/// One thread's share of the block: its two rows (16·warp + g and + 8, g = lane / 4) and their
/// keys' columns (8j + 2t + {0, 1}, t = lane % 4) in every accumulator. The phases are member
/// functions, in the kernel's order; the registers are the kernel's locals, referred to here.
template <int kWG>
struct WgmmaVerifyBlock {
  using W = Shape<kWG>;
  using QFrags = unsigned[8][4];
  using Scores = float[32];  ///< s[4j + e]: key 8j + 2t + (e & 1), row g + 8·(e >> 1)
  using Acc = float[64];     ///< o[4j + e]: dim 8j + 2t + (e & 1), row g + 8·(e >> 1)
  using State = SoftmaxState<2>;

  const SplitParams& p;
  const SplitRange& range;
  std::uint8_t* const smem;
  const int warp, lane, g, t;
  int n_keys = 0, n_tiles = 0;
  QFrags& qa;
  int row_lo[2] = {0, 0}, row_hi[2] = {0, 0};
  State& state;
  Acc& o;

  __device__ __forceinline__ WgmmaVerifyBlock(const SplitParams& params, const SplitRange& split,
                                              std::uint8_t* shared, QFrags& q_frags, State& softmax,
                                              Acc& acc)
      : p(params),
        range(split),
        smem(shared),
        warp(int(threadIdx.x) / 32),  // 4·warpgroup + its warp
        lane(int(threadIdx.x) % 32),
        g(lane >> 2),
        t(lane & 3),
        qa(q_frags),
        state(softmax),
        o(acc) {}

  __device__ __forceinline__ int row(int h) const { return 16 * warp + g + 8 * h; }

  /// q̃ as the A fragments of QK's 8 k16 steps: qa[ks][h + 2·c] row(h), dims 16ks + 8c + 2t,
  /// + 1 (zero for padding rows).
  __device__ __forceinline__ void load_q() {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) q_fragment(ks, qa[ks]);
  }

  /// q̃'s A fragment of k16 step ks, from q (the exact path reads it again: qa indexed by a
  /// runtime step would live in memory).
  __device__ __forceinline__ void q_fragment(int ks, unsigned (&a)[4]) const {
    const int G = p.gqa, n_kv = int(gridDim.y);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool real = row(h) < range.nrows;
      const float* q_row =
          range.q + query_row_index(range.row0 + (real ? row(h) : 0), range.kv, G, n_kv) * kD;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int dim = 16 * ks + 8 * c + 2 * t;
        const float x0 = real ? q_operand(q_row[dim], p.scale, kSite) : 0.0f;
        const float x1 = real ? q_operand(q_row[dim + 1], p.scale, kSite) : 0.0f;
        a[h + 2 * c] = pack_f16x2(x0, x1);
      }
    }
  }

  /// Row r's view as offsets from lo, clipped to [0, hi − lo] (SPEC §11: query i at
  /// p_i = len − T + i sees [max(0, p_i + 1 − window), p_i + 1)).
  __device__ __forceinline__ void view_of(int r, int& lo_off, int& hi_off) const {
    const long long pos = range.len - p.view.queries + (range.row0 + r) / p.gqa;
    const long long end = verify_row_end(pos, range.len, kSite);
    const long long begin =
        p.view.window > 0 ? verify_row_begin(pos, range.len - 1, p.view.window, kSite) : 0;
    hi_off = static_cast<int>(min(max(end - range.lo, 0ll), (long long)n_keys));
    lo_off = static_cast<int>(min(max(begin - range.lo, 0ll), (long long)n_keys));
  }

  /// This thread's rows' views (padding rows none) and the split's tiles.
  __device__ __forceinline__ void bound_rows() {
    n_keys = static_cast<int>(range.hi - range.lo);
    // Block-uniform; from lane 0 so that ptxas sees the tile loop as uniform (else, in the batch
    // instance, it serializes every wgmma: C7520).
    n_tiles = __shfl_sync(kFullMask, (n_keys + kTile - 1) / kTile, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row(h) < range.nrows) view_of(row(h), row_lo[h], row_hi[h]);
  }

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int h = 0; h < 2; ++h) state.reset(h);
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  }

  __device__ __forceinline__ int valid_of(int i) const {
    return min(kTile, n_keys - kTile * i);
  }
  __device__ __forceinline__ std::uint8_t* raw_stage(int i) const {
    return smem + kRawOff + (i % kVerifyStages) * Raw::kRawStage;
  }
  __device__ __forceinline__ std::uint8_t* k_stage(int i) const {
    return smem + (i & 1) * kF16Stage;
  }
  __device__ __forceinline__ unsigned short* k_scales() const {
    return reinterpret_cast<unsigned short*>(smem + kKdOff);
  }

  /// Copies tile i's raw rows (if there is a tile i) and commits the group.
  __device__ __forceinline__ void copy(int i) {
    if (i < n_tiles)
      copy_raw_tile<kD, W::kThreads>(raw_stage(i), range.k_head, range.v_head,
                                     range.lo + kTile * i - range.base, p.k_tok_bytes,
                                     p.v_tok_bytes, valid_of(i));
    cp_async_commit();
  }

  /// S = q̃·K̃ᵀ of the tile in kt (accuracy.hpp (1), fused form): 8 k16 steps from zero,
  /// waited (with the previous tile's PV, which completes first).
  __device__ __forceinline__ void compute_scores_folded(Scores& s, const std::uint8_t* kt) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) wgmma_m64n64k16(s, qa[ks], k_desc(kt, ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    wgmma_fence_operands(o);
  }

  /// S from exact quants (convert_k_exact's tile), replacing compute_scores_folded's: per
  /// 32-value block b and 8 keys two mma.sync m16n8k16 into a fresh accumulator (A: q̃'s
  /// fragments, which are mma.sync's; B: the quants), × f32(d) of each key's block b, block 0 by
  /// __fmul_rn, each later block by fmaf(c, d, s). mma.sync, not wgmma: this rare path sits on a
  /// divergent branch.
  __device__ __forceinline__ void compute_scores_exact(Scores& s, const std::uint8_t* kt) {
    const unsigned short* kd = k_scales();
#pragma unroll 1
    for (int b = 0; b < Raw::kBlocks; ++b) {
      unsigned a[2][4];
      q_fragment(2 * b, a[0]);
      q_fragment(2 * b + 1, a[1]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int key = 8 * j + g;
#pragma unroll
        for (int ks = 2 * b; ks < 2 * b + 2; ++ks) {
          const int dim = 16 * ks + 2 * t;
          const unsigned b0 = *reinterpret_cast<const unsigned*>(
              kt + Operand::chunk(key, dim >> 3) + 2 * (dim & 7));
          const unsigned b1 = *reinterpret_cast<const unsigned*>(
              kt + Operand::chunk(key, (dim + 8) >> 3) + 2 * (dim & 7));
          const unsigned(&q)[4] = a[ks - 2 * b];
          mma_16816(c, q[0], q[1], q[2], q[3], b0, b1);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 8 * j + 2 * t + (e & 1);
          const float d = f16_bits(kd[k * Raw::kBlocks + b]);
          s[4 * j + e] = b == 0 ? __fmul_rn(c[e], d) : fmaf(c[e], d, s[4 * j + e]);
        }
      }
    }
  }

  /// The online softmax of one tile, row by row, over the keys each row attends (p = 0
  /// elsewhere): s becomes the weights p; the accumulators are rescaled by α (by 1 where no max
  /// moved). One branch-free path: a wgmma accumulator written on a divergent path serializes
  /// every wgmma of the kernel (ptxas C7520).
  __device__ __forceinline__ void update_softmax(Scores& s, int key_off, int valid, bool first) {
    float alpha[2];
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // The keys of this tile row h attends: [first_k, end_k) (tile offsets).
      const int first_k = row_lo[h] - key_off, end_k = min(row_hi[h] - key_off, valid);
      float top = kNegSentinel;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * j + 2 * h + e, k = 8 * j + 2 * t + e;
          s[i] = score_scaled(s[i], p.scale);
          if (k >= first_k && k < end_k) top = fmaxf(top, s[i]);
        }
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, 1));
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, 2));
      const float m_new = state.max_with(h, top);
      alpha[h] = state.rescale_to(h, m_new);
      moved = moved || alpha[h] != 1.0f;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * j + 2 * h + e, k = 8 * j + 2 * t + e;
          s[i] = k >= first_k && k < end_k ? softmax_weight(s[i], m_new) : 0.0f;
          sum += s[i];
        }
      state.advance(h, m_new, alpha[h], sum);
    }
    const bool rescale = rescale_accumulators(__any_sync(kFullMask, moved), first, kSite);
#pragma unroll
    for (int i = 0; i < 64; ++i)
      o[i] = pv_accumulator(o[i] * (rescale ? alpha[(i >> 1) & 1] : 1.0f), kSite);
  }

  /// P·V on the tensor cores: p̃ (S's accumulator as A fragments) times Ṽ, 4 k16 steps, issued
  /// and committed, not waited (the next tile's QK waits for it). zero_p (a tile whose P·V ran on
  /// the CUDA cores): p̃ = 0, so that the wgmma adds exact zeros (issued all the same: see
  /// update_softmax on divergent paths).
  __device__ __forceinline__ void accumulate_pv_mma(const Scores& s, const std::uint8_t* vt,
                                                    bool zero_p) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const unsigned a[4] = {zero_p ? 0u : pack_f16x2(s[8 * ks], s[8 * ks + 1]),
                             zero_p ? 0u : pack_f16x2(s[8 * ks + 2], s[8 * ks + 3]),
                             zero_p ? 0u : pack_f16x2(s[8 * ks + 4], s[8 * ks + 5]),
                             zero_p ? 0u : pack_f16x2(s[8 * ks + 6], s[8 * ks + 7])};
      wgmma_m64n128k16_bt(o, a, v_desc(vt, ks), 1);
    }
    wgmma_commit();
    if (KVLAYER_DEVICE_MUTANT(pv_accumulated_in_f16)) {
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      pv_accumulators(o, kSite);
    }
  }

  /// P·V on the CUDA cores, f32, keys in order, only the keys each row attends: V exact, p
  /// unrounded (a tile holding a V block that may leave fp16's range), before the tile's
  /// accumulate_pv_mma (zero_p). p goes through shared memory, pw[row][key], in the other fp16
  /// stage (`spare`: its tile's P·V was waited for by this tile's QK, and the next tile's
  /// conversion starts after a barrier).
  __device__ __forceinline__ void accumulate_pv_f32(const Scores& s, std::uint8_t* spare,
                                                    int key_off, int valid,
                                                    const std::uint8_t* raw) {
    float* pw = reinterpret_cast<float*>(spare);
    __syncthreads();  // every warp has waited for the previous tile's P·V
#pragma unroll
    for (int i = 0; i < 32; ++i)
      pw[row((i >> 1) & 1) * kTile + 8 * (i / 4) + 2 * t + (i & 1)] = s[i];
    __syncthreads();
#pragma unroll 1
    for (int k = 0; k < valid; ++k) {
      float pk[2];
      bool att[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        pk[h] = pw[row(h) * kTile + k];
        att[h] = key_off + k >= row_lo[h] && key_off + k < row_hi[h];
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = v_exact<kD>(raw, k, 8 * j + 2 * t + e);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (att[h])
              o[4 * j + 2 * h + e] = pv_accumulator(fmaf(pk[h], v, o[4 * j + 2 * h + e]), kSite);
          // NOTE: keeps the next value's loads from being hoisted here: on this rare
          // path, registers matter more than latency.
          asm volatile("" ::: "memory");
        }
    }
  }

  /// The split's partial: each row's m, its l summed over the quad, o as accumulated.
  __device__ __forceinline__ void write_partial() {
    wgmma_wait<0>();
    wgmma_fence_operands(o);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = state.l[h];
      l += __shfl_xor_sync(kFullMask, l, 1);
      l += __shfl_xor_sync(kFullMask, l, 2);
      const int r = row(h);
      if (r >= range.nrows) continue;
      if (t == 0) {
        range.m[r] = state.m[h];
        range.l[r] = l;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(range.o + r * kD + 8 * j + 2 * t) =
            make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
    }
  }
};

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

/// One block (kWG warpgroups) per (split, KV head, rows chunk of ≤ 64·kWG).
template <int kWG, bool kBatch>
__global__ void __launch_bounds__(Shape<kWG>::kThreads,
                                  split_blocks_per_sm(SplitKernel::wgmma_verify, kD,
                                                      Shape<kWG>::kRows))
    decode_split_wgmma_verify_kernel(const SplitParams p) {
  static_assert(split_instance_built(SplitKernel::wgmma_verify, kD, Shape<kWG>::kRows));
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Block = WgmmaVerifyBlock<kWG>;
  extern __shared__ __align__(16) std::uint8_t smem_dynamic[];
  // The swizzle atoms must be 1024-aligned in the shared window.
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem_dynamic));
  std::uint8_t* smem = smem_dynamic + ((1024u - (base & 1023u)) & 1023u);

  const SplitRange range =
      begin_split<kBatch>(p, kD, split_granule(SplitKernel::wgmma_verify, kD), kSite);
  if (!range.active) return;  // block-uniform: no barrier has been reached yet

  typename Block::QFrags qa;
  typename Block::State state;
  typename Block::Acc o;
  Block b(p, range, smem, qa, state, o);
  b.load_q();
  b.bound_rows();
  b.reset();
  b.copy(0);
  for (int i = 0; i < b.n_tiles; ++i) {
    const std::uint8_t* raw = b.raw_stage(i);
    const int valid = b.valid_of(i);
    std::uint8_t* kt = b.k_stage(i);
    std::uint8_t* vt = kt + kOperandBytes;
    cp_async_wait<0>();  // this thread's copies of tile i have landed
    // Every thread's have; every warp has waited for tile i − 1's wgmma (so tile i − 2's fp16
    // stage, which this tile's conversion overwrites, is free) and is done with raw stage i − 1.
    __syncthreads();
    b.copy(i + 1);
    const int key_off = kTile * i;  // the tile's first key, as an offset from lo
    const int flags = convert_tile<kWG>(kt, vt, raw, valid);
    fence_proxy_async_shared();
    bool f32_pv = false, k_exact = false;
    if (__syncthreads_or(flags)) {  // block-uniform; rare: a tile with a wide or bad block
      f32_pv = wide_tile_on_cuda_cores(__syncthreads_or(flags & kWideV), kSite);
      k_exact = k_tile_unfolded(__syncthreads_or(flags & kWideK), kSite);
      if (k_exact) {
        convert_k_exact<kWG>(kt, b.k_scales(), raw, valid);
        fence_proxy_async_shared();
        __syncthreads();
      }
    }
    typename Block::Scores s;
    b.compute_scores_folded(s, kt);
    if (k_exact) b.compute_scores_exact(s, kt);
    b.update_softmax(s, key_off, valid, i == 0);
    if (f32_pv) b.accumulate_pv_f32(s, b.k_stage(i + 1), key_off, valid, raw);
    b.accumulate_pv_mma(s, vt, f32_pv);
  }
  b.write_partial();
#else
  (void)p;
  __trap();  // never launched: wgmma_verify_supported() is false without an sm_90a build
#endif
}

template <int kWG, bool kBatch>
cudaError_t launch_instance(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  // Not a stream operation (legal while capturing); set per launch so every device the process
  // uses gets it.
  if (const cudaError_t err =
          cudaFuncSetAttribute(decode_split_wgmma_verify_kernel<kWG, kBatch>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicBytes);
      err != cudaSuccess)
    return err;
  decode_split_wgmma_verify_kernel<kWG, kBatch>
      <<<grid, Shape<kWG>::kThreads, kDynamicBytes, stream>>>(sp);
  return cudaGetLastError();
}

template <int kWG>
cudaError_t launch(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  return sp.batch.list.slots != nullptr ? launch_instance<kWG, true>(sp, grid, stream)
                                        : launch_instance<kWG, false>(sp, grid, stream);
}

template <int kWG>
cudaError_t resident_blocks(int* blocks) {
  const auto kernel = decode_split_wgmma_verify_kernel<kWG, false>;
  if (const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicBytes);
      err != cudaSuccess)
    return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, Shape<kWG>::kThreads,
                                                       kDynamicBytes);
}

}  // namespace

// The instances select_split_kernel names: 64 rows (one warpgroup) or 128 (two).
cudaError_t launch_split_wgmma_verify(const SplitParams& sp, int rows, dim3 grid,
                                      cudaStream_t stream) {
  return rows <= Shape<1>::kRows ? launch<1>(sp, grid, stream) : launch<2>(sp, grid, stream);
}

cudaError_t split_wgmma_verify_resident_blocks(int rows, int* blocks) {
  return rows <= Shape<1>::kRows ? resident_blocks<1>(blocks) : resident_blocks<2>(blocks);
}

}  // namespace kvlayer::cuda::detail::decode_impl

namespace kvlayer::cuda::detail {

bool wgmma_verify_supported(int major, int minor) {
#if defined(KVLAYER_WGMMA_SM90A)
  return major == 9 && minor == 0;
#else
  (void)major;
  (void)minor;
  return false;
#endif
}

KVLAYER_DEFINE_MUTANT_UNIT(decode_wgmma_verify)
}  // namespace kvlayer::cuda::detail
