// Split-K flash-decoding on tensor cores with shared-memory stages (SPEC §8, §11): K q8_0, V
// q5_1. Two kernels of select_split_kernel: mma_staged (a decode: the head dims and gqa that
// decode_mma_direct.cu does not serve) and mma_verify_staged (T ≥ 2 queries, each row with its
// own causal window, at head dim 64, which decode_mma_verify.cu does not serve). Same grid,
// partition of the live view, partial format and device-mode checks as every split kernel
// (decode_common.cuh); merge.cu merges the partials.
//
// ---- Rounding points (kvlayer/accuracy.hpp (1)–(5)), as these kernels implement them -------
//  (1) q̃ = fp16(q) (RNE); K quants exact in fp16 (fp16(1024 + 128 + q) − 1152); per 32-value
//      block two chained mma into a fresh f32 accumulator ((5)), × f32(d) (__fmul_rn); blocks
//      summed in block order (__fadd_rn); × scale (__fmul_rn).
//  (2) one max update per 16-key warp tile; α, p by IEEE exp2f; finite sentinel −FLT_MAX;
//      fmaxf ignores NaN scores, which reach the output through p.
//  (3) p̃ = fp16(p) as PV's A operand; B = d·q + m by one HFMA2 (the exact value rounded once
//      to fp16), or the exact f32 value on the CUDA cores for a tile holding a block beyond
//      fp16's range (and, verify, a bad block at a row's view edge); l from the unrounded p
//      (per lane, then an xor butterfly); PV in f32 accumulators, chains of pv_mma_steps mma
//      ((5): max_keys_per_split/64 per warp).
//  (4) the block merges its warps in f32 (warps in order), then merge.cu merges the splits.
//      Rescales per accumulator: one per warp tile, + 1 (DecodePlan::max_rescales,
//      verify_accumulation_shape).
//
// ---- Design ---------------------------------------------------------------------------------
// Decode: block = 4 independent warps; warp w owns the 16-key warp tiles w, w + 4, w + 8, … of
// the split (so the partition granule is 64 keys) with its own online-softmax state and its own
// 3-stage cp.async pipeline in shared memory (no block barrier until the final merge).
// Verify: the same, for 16 of the T·gqa query rows per block (blockIdx.z takes the others).
// Per 16-key warp tile, M = 16 query-head rows (gqa ≤ 8 uses rows 0..7; the rest are zero q):
//  QK: S[16 heads × 8 keys] per n-tile; A = q̃ fragments held in registers for the whole split,
//      B = K quants of key n = groupID. Within a block the 32 dims are assigned to the mma's k
//      slots by a fixed permutation (the same for q and K, so the dot is unchanged) such that a
//      thread's 4 k slots of one k-step are one aligned 32-bit shared word (see k_slot_quant).
//  softmax: the C fragment (rows g, g+8; keys 2t, 2t+1 of each n-tile) is exactly the A
//      fragment of PV (FlashAttention-2 register reuse): no shared-memory round trip for p.
//  PV: O[16 heads × 8 cols] per n-tile j (columns 32b + 8jj + n, jj = j % 4); B = V values of
//      keys 2t, 2t+1, 2t+8, 2t+9 at column 32b + 8jj + groupID, dequantized from shared memory.
// Shared-memory rows are padded so that every fragment load of a warp is conflict-free: K rows
// of 20/36/76 words (D 64/128/256: 4·odd words, so 8 keys × 4 lanes hit 32 banks), V rows of
// 12/28/52 words (4·odd: the 4 keys a load touches land 8 banks apart).
// Partial warp tiles (the split's end) are zero-filled past the last key, so no stale or
// uninitialised byte ever reaches an mma (0 × NaN would poison a row).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/mma_fragments.cuh"
#include "decode/partition.hpp"
#include "device_status.cuh"

namespace kvlayer::cuda::detail::decode_impl {
namespace {

constexpr int kThreads = kDecodeThreads;  // 4 warps
constexpr int kWarps = kDecodeMmaWarps;
constexpr int kWK = kDecodeMmaWarpKeys;  // keys per warp tile
constexpr int kStages = 3;
static_assert(kThreads == 32 * kWarps && kWK == 16);

/// Compile-time layout of one head dim.
template <int D>
struct MmaShape {
  static_assert(D == 64 || D == 128 || D == 256, "supported head dims: 64, 128, 256");
  static constexpr int kBlocks = D / 32;                     ///< 32-value blocks per head
  static constexpr int kKBytes = k_head_bytes(D);            ///< K span of one head in a row
  static constexpr int kVBytes = v_head_bytes(D);            ///< V span of one head in a row
  static constexpr int kKChunk = kKBytes / kQ8_0BlockWords;  ///< 4, 8, 16: the K span's alignment
  static constexpr int kVChunks = kVBytes / 16;
  /// Shared row strides (bytes): 4·odd words (bank-conflict-free fragments, see the header),
  /// multiples of the copy sizes.
  static constexpr int kKStride = D == 64 ? 80 : D == 128 ? 144 : 304;
  static constexpr int kVStride = D == 64 ? 48 : D == 128 ? 112 : 208;
  static constexpr int kKRegion = kWK * kKStride;
  static constexpr int kStageBytes = kWK * (kKStride + kVStride);
  static constexpr int kSmemBytes = kWarps * kStages * kStageBytes;
  /// Final merge, reusing the stages (WarpMergeScratch): o [warp][16][kOStride].
  static constexpr int kOStride = D + 8;
  static constexpr int kMergeBytes = WarpMergeScratch<kWarps>::bytes(16, kOStride);
  static_assert(kKStride >= kKBytes && kKStride % kKChunk == 0 && (kKStride / 4) % 8 == 4);
  static_assert(kVStride >= kVBytes && kVStride % 16 == 0 && (kVStride / 4) % 8 == 4);
  static_assert(kKChunk * kQ8_0BlockWords == kKBytes && kVChunks * 16 == kVBytes);
  static_assert(kKRegion % 16 == 0 && kStageBytes % 16 == 0);
  static_assert(kMergeBytes <= kSmemBytes);
};

/// The quant index (0..31 within its block) that k slot (t, h, e) of k-step ks holds for a
/// block of parity `odd`: t = threadID_in_group, h = 0 for k slots 2t + e, 1 for 2t + 8 + e.
/// Both operands use it, so Σ_k A·B is the block's dot in a permuted order.
///  Odd blocks (quants 4-byte aligned in shared memory): word u = 4·ks + t holds quants
///    4u..4u+3; half h of it holds 4u + 2h + e.
///  Even blocks (quants at 2 mod 4): aligned word W_i (i ≥ 1) holds quants 4i−2..4i+1, W_0
///    holds d and quants 0, 1, W_8 quants 30, 31. Slot s = 4·ks + t < 7 is word W_{s+1}
///    (quants 4s+2+2h+e); slot 7 is (W_0's high half, W_8's low half): quants 0, 1 and 30, 31.
__host__ __device__ constexpr int k_slot_quant(bool odd, int ks, int t, int h, int e) {
  const int s = 4 * ks + t;
  if (odd) return 4 * s + 2 * h + e;
  if (s < 7) return 4 * s + 2 + 2 * h + e;
  return h == 0 ? e : 30 + e;
}

/// The same with rows g + 8 of A zero and their results discarded (gqa ≤ 8): only c0, c1
/// (row g) are kept, so no registers hold the padding rows' accumulators.
__device__ __forceinline__ void mma_16816_top(float (&c)[2], unsigned a0, unsigned a2, unsigned b0,
                                              unsigned b1) {
  [[maybe_unused]] float d2, d3;  // rows g + 8: padding, discarded
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(d2), "=f"(d3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(0.0f),
        "f"(0.0f));
}

/// PV of one 16-key warp tile on the CUDA cores, in f32, into the mma C-fragment accumulators:
/// o[4b + jj][2r + e] (row g + 8r, column 32b + 8jj + 2t + e) += Σ_k p[row][k]·V[k][column],
/// keys in order, p unrounded, V at its exact f32 value (SPEC §4; accuracy.hpp (3)), over the
/// keys k that attends(r, k) admits for row g + 8r (a verify row skips the keys outside its
/// view, whose V may be a bad block's NaN: 0·NaN would poison the row).
/// pr holds this lane's p in the C layout: pr[nt][2r + e] is key 8nt + 2t + e of row g + 8r.
template <int NB, int kC, int kVStride, typename Attends>
__device__ __forceinline__ void pv_tile_f32(float (&o)[4 * NB][kC], const float (&pr)[2][kC],
                                            const std::uint8_t* vs_base, int lane,
                                            const Attends& attends) {
  constexpr int R = kC / 2;
  const int t = lane & 3;
#pragma unroll 1
  for (int k = 0; k < 16; ++k) {
    // p of key k for this lane's rows: held by lane (g, (k % 8) / 2) of the quad.
    const int nt = k / 8, e_src = k & 1, src = (lane & ~3) | ((k & 7) >> 1);
    float pk[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float mine = nt == 0 ? (e_src ? pr[0][2 * r + 1] : pr[0][2 * r])
                                 : (e_src ? pr[1][2 * r + 1] : pr[1][2 * r]);
      pk[r] = __shfl_sync(kFullMask, mine, src);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const std::uint8_t* blk = vs_base + k * kVStride + kQ5_1BlockBytes * b;
      const uint2 hdr = q5_1_header(blk);
      const float d = q5_1_d(hdr.x), m = q5_1_m(hdr.x);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = 8 * jj + 2 * t + e;  // quant index = column within the block
          const unsigned q = q5_1_quant(blk[kQ5_1Nibbles + (j & 15)], hdr.y, j);
          const float v = __fadd_rn(__fmul_rn(d, float(q)), m);
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (attends(r, k))
              o[4 * b + jj][2 * r + e] = pv_accumulator(fmaf(pk[r], v, o[4 * b + jj][2 * r + e]),
                                                        MutantSite::decode_mma_staged);
        }
      // NOTE: keeps the next block's loads from being hoisted here: on this rare path,
      // registers matter more than latency (the hot loop around it must not spill).
      asm volatile("" ::: "memory");
    }
  }
}

/// A lane's position in a tile copy of `n` chunks per key (chunk c = lane + 32·r is key c / n,
/// chunk c % n): the key, and the byte offsets of the chunk in global memory and shared memory.
struct ChunkWalk {
  int key, chunk;
  int src, dst;            ///< offsets from the tile's first key (global / shared)
  int src_step, dst_step;  ///< offset change for 32 / n keys and 32 % n chunks
  int src_wrap, dst_wrap;  ///< extra change when the chunk wraps into the next key

  __device__ static ChunkWalk start(int lane, int n, int chunk_bytes, int tok_bytes,
                                    int smem_stride) {
    ChunkWalk w;
    w.key = lane / n;
    w.chunk = lane % n;
    w.src = w.key * tok_bytes + w.chunk * chunk_bytes;
    w.dst = w.key * smem_stride + w.chunk * chunk_bytes;
    w.src_step = (32 / n) * tok_bytes + (32 % n) * chunk_bytes;
    w.dst_step = (32 / n) * smem_stride + (32 % n) * chunk_bytes;
    w.src_wrap = tok_bytes - n * chunk_bytes;
    w.dst_wrap = smem_stride - n * chunk_bytes;
    return w;
  }
  __device__ void next(int n) {
    key += 32 / n;
    chunk += 32 % n;
    src += src_step;
    dst += dst_step;
    if (chunk >= n) {
      chunk -= n;
      key += 1;
      src += src_wrap;
      dst += dst_wrap;
    }
  }
};

/// One thread's share of a staged block (decode_split_mma_kernel<D, GM, kRows>): what every phase
/// reads (the split, shared memory, this lane's place in its warp, the warp's tiles and stages,
/// the lane's copy walks) and, by reference, the thread's registers (q̃ as A fragments, its rows'
/// views, the running softmax and the PV accumulators). The phases are its member functions, in
/// the kernel's order.
///
/// NOTE: the registers are the kernel's locals, one variable each, that the object refers to, as
/// VerifyBlock's are (decode_mma_verify.cu): as members, the arrays (indexed by loop counters
/// until the loops are unrolled) keep the whole object in memory through the early optimizations.
template <int D, int GM, bool kRows, bool kBatch>
struct StagedBlock {
  using S = MmaShape<D>;
  static constexpr int NB = S::kBlocks;
  static constexpr int NT = D / 8;  // PV n-tiles
  static constexpr bool kHi = GM == 16;
  static constexpr int kC = kHi ? 4 : 2;  // accumulator registers kept per n-tile
  // Per-warp state. Row r = 0: head g; r = 1: head g + 8 (GM 16 only).
  static constexpr int R = kHi ? 2 : 1;
  static constexpr MutantSite kSite = MutantSite::decode_mma_staged;
  using QFrags = unsigned[NB][2][kHi ? 4 : 2];
  using RowBounds = long long[R];
  using State = SoftmaxState<R>;
  using Acc = float[NT][kC];
  using Scores = float[2][kC];  // [nt][c]: keys 8nt + 2t + (c & 1), row c >> 1 (C layout)

  const SplitParams& p;
  std::uint8_t* const smem;
  const int tid, warp, lane;
  const int g, t;  // groupID, threadID_in_group
  const int G;
  SplitRange range;  // set by find_split (the constructor, before it, places the lane)
  // The tile walk's plan, set by plan_tiles (after q̃'s loads, not by the constructor).
  int ev_a, ev_b;
  unsigned ev_sel;
  int my_tiles;
  std::uint8_t* wsmem;
  ChunkWalk k_walk, v_walk;

  // q̃ as A fragments, for the whole split: qa[b][ks][r], r = a0..a3 of the PTX layout.
  // a0: row g, slots 2t+e; a1: row g+8, slots 2t+e; a2: row g, 2t+8+e; a3: row g+8, 2t+8+e.
  QFrags& qa;
  // kRows: the keys [row_lo, row_hi) each of this lane's rows attends (SPEC §11: query i at
  // position p_i = len − T + i sees [max(0, p_i + 1 − window), p_i + 1)); padding rows none.
  RowBounds& row_lo;
  RowBounds& row_hi;
  State& state;  // m identical in the 4 lanes of a row; l per lane (its keys)
  Acc& o;

  __device__ __forceinline__ StagedBlock(const SplitParams& params, std::uint8_t* shared,
                                         QFrags& q_frags, RowBounds& rows_lo, RowBounds& rows_hi,
                                         State& softmax, Acc& acc)
      : p(params),
        smem(shared),
        tid(threadIdx.x),
        warp(tid / 32),
        lane(tid % 32),
        g(lane >> 2),
        t(lane & 3),
        G(params.gqa),
        qa(q_frags),
        row_lo(rows_lo),
        row_hi(rows_hi),
        state(softmax),
        o(acc) {}

  /// The block's split (begin_split); false: nothing to do.
  __device__ __forceinline__ bool find_split() {
    range = begin_split<kBatch>(p, D, split_granule(SplitKernel::mma_staged, D), kSite);
    return range.active;
  }

  /// q̃'s A fragments (qa) for the whole split.
  __device__ __forceinline__ void load_q() {
    const float* q_kv = range.q + (long long)range.kv * G * D;
    const int n_kv = int(gridDim.y);
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int r = 0; r < (kHi ? 4 : 2); ++r) {
          // Register r (compact for GM 8: 0 → a0, 1 → a2).
          const int row = g + (kHi ? 8 * (r & 1) : 0);
          const int h = kHi ? r >> 1 : r;
          const float* q_row =
              kRows ? range.q + query_row_index(range.row0 + row, range.kv, G, n_kv) * D
                    : q_kv + row * D;
          float x[2] = {0.0f, 0.0f};
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int quant = k_slot_quant(b & 1, ks, t, h, e);
            if (row < range.nrows) x[e] = q_operand(q_row[32 * b + quant], p.scale, kSite);
          }
          qa[b][ks][r] = pack_f16x2(x[0], x[1]);
        }
  }

  /// The tile walk's plan: the K words of even blocks' k-step 1, this warp's tiles and stages,
  /// and this lane's copy walks.
  __device__ __forceinline__ void plan_tiles() {
    // Even blocks, k-step 1: thread t < 3 takes word W_{5+t}; t = 3 joins W_0 and W_8.
    ev_a = t < 3 ? 5 + t : 0;
    ev_b = t < 3 ? 5 + t : 8;
    ev_sel = t < 3 ? 0x3210u : 0x5432u;

    const long long n_keys = range.hi - range.lo;
    const int n_wt = static_cast<int>((n_keys + kWK - 1) / kWK);       // warp tiles
    my_tiles = n_wt > warp ? (n_wt - warp + kWarps - 1) / kWarps : 0;  // this warp's
    wsmem = smem + warp * kStages * S::kStageBytes;

    // This lane's copy walks: chunk c = lane + 32·r of a tile is (key c / n, chunk c % n) for
    // n chunks per key; stepping c by 32 moves the key by 32 / n and the chunk by 32 % n (one
    // more key on wrap), so no division is left in the loop.
    k_walk = ChunkWalk::start(lane, kQ8_0BlockWords, S::kKChunk, p.k_tok_bytes, S::kKStride);
    v_walk = ChunkWalk::start(lane, S::kVChunks, 16, p.v_tok_bytes, S::kVStride);
  }

  /// kRows: the rows' views (row_lo, row_hi); nothing otherwise.
  __device__ __forceinline__ void bound_rows() {
    if constexpr (kRows) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = g + 8 * r;
        row_lo[r] = 0;
        row_hi[r] = 0;
        if (row < range.nrows) {
          const long long pos = range.len - p.view.queries + (range.row0 + row) / G;
          row_hi[r] = verify_row_end(pos, range.len, kSite);
          row_lo[r] =
              p.view.window > 0 ? verify_row_begin(pos, range.len - 1, p.view.window, kSite) : 0;
        }
      }
    }
  }

  /// The running softmax and the PV accumulators, empty.
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      state.reset(r);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < kC; ++e) o[j][e] = 0.0f;
  }

  /// This warp's tile i (global warp tile warp + 4i): its first key, its keys in the split, and
  /// the stage that holds it (K rows, then V rows from kKRegion on).
  __device__ __forceinline__ long long key0_of(int i) const {
    return range.lo + (long long)(warp + kWarps * i) * kWK;
  }
  __device__ __forceinline__ int valid_of(long long key0) const {
    return static_cast<int>(range.hi - key0 < kWK ? range.hi - key0 : kWK);
  }
  __device__ __forceinline__ std::uint8_t* stage(int i) const {
    return wsmem + (i % kStages) * S::kStageBytes;
  }

  /// The copies of the first kStages − 1 tiles.
  __device__ __forceinline__ void start_copies() {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
  }

  /// Issues the copies of this warp's i-th tile into its stage and zero-fills the rows past the
  /// split's last key; always commits a group (wait counts tiles).
  __device__ __forceinline__ void issue(int i) {
    if (i < my_tiles) {
      const long long key0 = key0_of(i);
      const int valid = valid_of(key0);
      const long long row0 = key0 - range.base;  // physical row of the tile's first key
      std::uint8_t* kd = stage(i);
      std::uint8_t* vd = kd + S::kKRegion;
      const std::uint8_t* ks = range.k_head + row0 * p.k_tok_bytes;
      const std::uint8_t* vs = range.v_head + row0 * p.v_tok_bytes;
      for (ChunkWalk w = k_walk; w.key < valid; w.next(kQ8_0BlockWords))
        cp_async<S::kKChunk>(kd + w.dst, ks + w.src);
      for (ChunkWalk w = v_walk; w.key < valid; w.next(S::kVChunks))
        cp_async<16>(vd + w.dst, vs + w.src);
      if (valid < kWK) {
        // Plain stores; ordered before the reads by the __syncwarp of the consuming iteration.
        for (int c = valid * S::kKStride / 4 + lane; c < kWK * S::kKStride / 4; c += 32)
          reinterpret_cast<unsigned*>(kd)[c] = 0u;
        for (int c = valid * S::kVStride / 4 + lane; c < kWK * S::kVStride / 4; c += 32)
          reinterpret_cast<unsigned*>(vd)[c] = 0u;
      }
    }
    cp_async_commit();
  }

  /// QK: s[nt][c] for keys 8nt + 2t + (c & 1), row c >> 1 (c = C fragment index), from the K
  /// rows of a stage (ks_base).
  __device__ __forceinline__ void compute_scores(const std::uint8_t* ks_base, Scores& s) const {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const std::uint8_t* krow = ks_base + (8 * nt + g) * S::kKStride;       // B: key n = g
      const std::uint8_t* drow0 = ks_base + (8 * nt + 2 * t) * S::kKStride;  // C: keys 2t, 2t+1
      const std::uint8_t* drow1 = drow0 + S::kKStride;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        unsigned z[2];
        if (b & 1) {
          const unsigned* u =
              reinterpret_cast<const unsigned*>(krow + kQ8_0BlockBytes * b + kQ8_0Quants);
          z[0] = u[t];
          z[1] = u[4 + t];
        } else {
          const unsigned* w = reinterpret_cast<const unsigned*>(krow + kQ8_0BlockBytes * b);
          z[0] = w[1 + t];
          z[1] = __byte_perm(w[ev_a], w[ev_b], ev_sel);
        }
        float c[kC] = {};
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          unsigned b0, b1;
          int8x4_to_f16x2x2(z[ks], b0, b1);
          if constexpr (kHi)
            mma_16816(c, qa[b][ks][0], qa[b][ks][1], qa[b][ks][2], qa[b][ks][3], b0, b1);
          else
            mma_16816_top(c, qa[b][ks][0], qa[b][ks][1], b0, b1);
        }
        const float d0 =
            f16_bits(*reinterpret_cast<const unsigned short*>(drow0 + kQ8_0BlockBytes * b));
        const float d1 =
            f16_bits(*reinterpret_cast<const unsigned short*>(drow1 + kQ8_0BlockBytes * b));
#pragma unroll
        for (int e = 0; e < kC; ++e) {
          const float x = __fmul_rn(c[e], (e & 1) ? d1 : d0);
          s[nt][e] = b == 0 ? x : __fadd_rn(s[nt][e], x);
        }
      }
#pragma unroll
      for (int e = 0; e < kC; ++e) s[nt][e] = score_scaled(s[nt][e], p.scale);
    }
  }

  /// Online softmax of the tile (its first key key0, `valid` keys in the split), per row: pr[nt][c]
  /// (the C layout, zero on entry) becomes the weights p of the keys the row attends; the
  /// accumulators are rescaled when a max moved (first: nothing accumulated yet).
  __device__ __forceinline__ void update_softmax(const Scores& s, Scores& pr, long long key0,
                                                 int valid, bool first) {
    float alpha[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Whether key 8nt + 2t + e of the tile is in this row's view.
      const auto attends = [&](int nt, int e) {
        const int k = 8 * nt + 2 * t + e;
        if constexpr (kRows) return k < valid && key0 + k >= row_lo[r] && key0 + k < row_hi[r];
        return k < valid;
      };
      float top = kNegSentinel;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (attends(nt, e)) top = fmaxf(top, s[nt][2 * r + e]);
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, 1));
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, 2));
      const float m_new = state.max_with(r, top);
      alpha[r] = state.rescale_to(r, m_new);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (attends(nt, e)) {
            pr[nt][2 * r + e] = softmax_weight(s[nt][2 * r + e], m_new);
            sum += pr[nt][2 * r + e];
          }
      state.advance(r, m_new, alpha[r], sum);
    }
    bool rescale = alpha[0] != 1.0f;
    if constexpr (kHi) rescale = rescale || alpha[R - 1] != 1.0f;
    if (rescale_accumulators(__any_sync(kFullMask, rescale), first, kSite)) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < kC; ++e) o[j][e] = pv_accumulator(o[j][e] * alpha[e >> 1], kSite);
    }
  }

  /// PV of the tile: p (pr, the C layout) by the V rows of its stage (vs_base). A V value beyond
  /// fp16's range cannot be a tensor-core operand: a tile with such a block (|d|·31 + |m| > 65504
  /// for any of its keys) takes the f32 path (rare; warp-uniform). A verify tile whose keys some
  /// row does not attend and which holds a bad V block takes the f32 path too, skipping each
  /// row's masked keys (rare: bad blocks at a view's edge).
  __device__ __forceinline__ void accumulate_pv(const Scores& pr, const std::uint8_t* vs_base,
                                                long long key0, int valid) {
    // p̃ as the A fragment of PV (rows g, g+8; keys 2t+e and 8+2t+e).
    const unsigned pa0 = pack_f16x2(pr[0][0], pr[0][1]);
    const unsigned pa2 = pack_f16x2(pr[1][0], pr[1][1]);
    unsigned pa1 = 0u, pa3 = 0u;
    if constexpr (kHi) {
      pa1 = pack_f16x2(pr[0][kC - 2], pr[0][kC - 1]);
      pa3 = pack_f16x2(pr[1][kC - 2], pr[1][kC - 1]);
    }

    // The tile's 16·NB block headers, NB / 2 per lane (header i = lane + 32r: key i % 16,
    // block i / 16), then one vote.
    bool wide = false, bad = false;
#pragma unroll
    for (int r = 0; r < NB / 2; ++r) {
      const int i = lane + 32 * r;
      const unsigned dm = *reinterpret_cast<const unsigned*>(vs_base + (i % 16) * S::kVStride +
                                                             kQ5_1BlockBytes * (i / 16));
      wide = wide || v_block_exceeds_f16(dm);
      if constexpr (kRows) bad = bad || v_block_not_finite(dm);
    }
    bool masked_bad = false;
    if constexpr (kRows) {
      bool partial = false;  // some valid key of the tile outside one of this lane's rows' views
#pragma unroll
      for (int r = 0; r < R; ++r)
        partial =
            partial || (row_hi[r] > row_lo[r] && (row_lo[r] > key0 || row_hi[r] < key0 + valid));
      masked_bad = __any_sync(kFullMask, bad) && __any_sync(kFullMask, partial);
    }
    if (masked_bad) {
      pv_tile_f32<NB, kC, S::kVStride>(o, pr, vs_base, lane, [&](int r, int k) {
        return key0 + k >= row_lo[r] && key0 + k < row_hi[r];
      });
    } else if (wide_tile_on_cuda_cores(__any_sync(kFullMask, wide), kSite)) {
      pv_tile_f32<NB, kC, S::kVStride>(o, pr, vs_base, lane, [](int, int) { return true; });
    } else {
      accumulate_pv_mma(pa0, pa1, pa2, pa3, vs_base);
    }
  }

  /// PV on the tensor cores: B = V[keys 2t, 2t+1 | 2t+8, 2t+9][column 32b + 8jj + g] in fp16.
  __device__ __forceinline__ void accumulate_pv_mma(unsigned pa0, unsigned pa1, unsigned pa2,
                                                    unsigned pa3, const std::uint8_t* vs_base) {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      unsigned vb[4][2];  // [jj][pair]: pair 0 = keys (2t, 2t+1), pair 1 = keys (2t+8, 2t+9)
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const std::uint8_t* blk0 = vs_base + (2 * t + 8 * pair) * S::kVStride + kQ5_1BlockBytes * b;
        const std::uint8_t* blk1 = blk0 + S::kVStride;
        const uint2 h0 = q5_1_header(blk0), h1 = q5_1_header(blk1);
        const unsigned d2 = __byte_perm(h0.x, h1.x, 0x5410);  // fp16x2 (d of key 0, of key 1)
        const unsigned m2 = __byte_perm(h0.x, h1.x, 0x7632);  // fp16x2 (m of key 0, of key 1)
        const unsigned q5_0 = v_quants5(blk0, h0.y, g), q5_1 = v_quants5(blk1, h1.y, g);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          // fp16 bits 0x64qq = 1024 + q for both keys, minus 1024: q exactly; then d·q + m
          // with one rounding (HFMA2).
          const unsigned both = __byte_perm(q5_0, q5_1, jj | ((4 + jj) << 4));
          const unsigned biased = __byte_perm(both, 0x64646464u, 0x5140);
          const __half2 q = __hsub2(as_h2(biased), as_h2(0x64006400u));
          vb[jj][pair] = h2_bits(__hfma2(as_h2(d2), q, as_h2(m2)));
        }
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        if constexpr (kHi)
          mma_16816(o[4 * b + jj], pa0, pa1, pa2, pa3, vb[jj][0], vb[jj][1]);
        else
          mma_16816_top(o[4 * b + jj], pa0, pa2, vb[jj][0], vb[jj][1]);
        pv_accumulators(o[4 * b + jj], kSite);
      }
    }
  }

  // ---- Merge the 4 warps into the split's partial (shared memory reuses the stages: o rows of
  // kOStride). ----
  __device__ __forceinline__ WarpMergeScratch<kWarps> merge_s() const {
    return {reinterpret_cast<float*>(smem)};
  }

  /// Each row's l summed over the 4 lanes that hold its keys.
  __device__ __forceinline__ void sum_lane_groups() {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      state.l[r] += __shfl_xor_sync(kFullMask, state.l[r], 1);
      state.l[r] += __shfl_xor_sync(kFullMask, state.l[r], 2);
    }
  }

  /// This warp's m, l and o into shared memory.
  __device__ __forceinline__ void stage_warp_results() const {
    const WarpMergeScratch<kWarps> s = merge_s();
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s.m()[warp * 16 + g + 8 * r] = state.m[r];
        s.l()[warp * 16 + g + 8 * r] = state.l[r];
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int col = 32 * (j / 4) + 8 * (j % 4) + 2 * t;
        *reinterpret_cast<float2*>(s.o() + (warp * 16 + g + 8 * r) * S::kOStride + col) =
            make_float2(o[j][2 * r], o[j][2 * r + 1]);
      }
  }

  /// The split's partial from the 4 warps' m, l and o (warps in order).
  __device__ __forceinline__ void merge() const {
    const WarpMergeScratch<kWarps> s = merge_s();
    merge_warps_into_partial<kWarps, kThreads>(range, D, 16, s.m(), s.l(), s.w(), s.o(),
                                               S::kOStride);
  }
};

/// One block per (split, KV head) — and, for a verify decode of more than 16 query rows, per
/// 16 of them (blockIdx.z). GM: mma rows in use (8 when the block's rows are ≤ 8: rows g + 8
/// are padding and skipped; else 16). kRows: a verify decode (SPEC §11): the block's row r is
/// query r / gqa, which attends only the keys of its own causal window.
template <int D, int GM, bool kRows, bool kBatch>
__global__ void __launch_bounds__(
    kThreads, split_blocks_per_sm(kRows ? SplitKernel::mma_verify_staged : SplitKernel::mma_staged,
                                  D, GM)) decode_split_mma_kernel(const SplitParams p) {
  static_assert(split_instance_built(
      kRows ? SplitKernel::mma_verify_staged : SplitKernel::mma_staged, D, GM));
  using Block = StagedBlock<D, GM, kRows, kBatch>;
  extern __shared__ __align__(16) std::uint8_t smem[];

  // The thread's registers (StagedBlock says what each holds, and why they are locals here).
  typename Block::QFrags qa;
  typename Block::RowBounds row_lo, row_hi;
  typename Block::State state;
  typename Block::Acc o;
  Block b(p, smem, qa, row_lo, row_hi, state, o);
  if (!b.find_split()) return;  // block-uniform: no barrier has been reached yet
  b.load_q();
  b.plan_tiles();
  b.bound_rows();
  b.reset();
  b.start_copies();

  // Each warp walks its own tiles through its own stages: no block barrier until the merge.
  for (int i = 0; i < b.my_tiles; ++i) {
    cp_async_wait<kStages - 2>();  // this lane's copies of tile i have landed
    __syncwarp();                  // every lane's have; every lane finished tile i − 1
    b.issue(i + kStages - 1);      // reuses the stage of tile i − 1

    const std::uint8_t* ks_base = b.stage(i);
    const std::uint8_t* vs_base = ks_base + Block::S::kKRegion;
    const long long key0 = b.key0_of(i);
    const int valid = b.valid_of(key0);
    typename Block::Scores s;
    b.compute_scores(ks_base, s);
    typename Block::Scores pr = {};
    b.update_softmax(s, pr, key0, valid, i == 0);
    b.accumulate_pv(pr, vs_base, key0, valid);
  }
  cp_async_wait<0>();  // only empty groups can remain; keep the block's exit clean anyway

  // ---- Merge the 4 warps into the split's partial (shared memory reuses the stages). ----
  b.sum_lane_groups();
  __syncthreads();  // every warp is done with its stages
  b.stage_warp_results();
  __syncthreads();
  b.merge();
}

/// The function attributes a launch of decode_split_mma_kernel<D, GM, kRows> needs: the
/// dynamic shared-memory opt-in where its stages exceed 48 KB, nothing otherwise. NOTE: the launch
/// and the occupancy query (mma_split_resident_blocks) both apply exactly this, so a query never
/// enables more than a launch would: the opt-in is per process, and a query that set it would let a
/// launch succeed in that process that fails in a fresh one.
template <int D, int GM, bool kRows = false, bool kBatch = false>
cudaError_t apply_launch_attributes() {
  constexpr int smem = MmaShape<D>::kSmemBytes;
  if constexpr (smem > 48 * 1024) {
    // Not a stream operation (legal while capturing); set per launch so every device the
    // process uses gets it.
    return cudaFuncSetAttribute(decode_split_mma_kernel<D, GM, kRows, kBatch>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  return cudaSuccess;
}

template <int D, int GM, bool kRows, bool kBatch>
cudaError_t launch_instance(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  if (const cudaError_t err = apply_launch_attributes<D, GM, kRows, kBatch>(); err != cudaSuccess)
    return err;
  decode_split_mma_kernel<D, GM, kRows, kBatch>
      <<<grid, kThreads, MmaShape<D>::kSmemBytes, stream>>>(sp);
  return cudaGetLastError();
}

template <int D, int GM, bool kRows = false>
cudaError_t launch(const SplitParams& sp, dim3 grid, cudaStream_t stream) {
  return sp.batch.list.slots != nullptr ? launch_instance<D, GM, kRows, true>(sp, grid, stream)
                                        : launch_instance<D, GM, kRows, false>(sp, grid, stream);
}

/// Resident blocks per SM of decode_split_mma_kernel<D, GM> as launch() configures it.
template <int D, int GM>
cudaError_t resident_blocks(int* blocks) {
  if (const cudaError_t err = apply_launch_attributes<D, GM>(); err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, decode_split_mma_kernel<D, GM, false, false>, kThreads, MmaShape<D>::kSmemBytes);
}

}  // namespace

// NOTE: head dim 128, and 256 with ≤ 8 rows, are decode_mma_direct.cu's (select_split_kernel),
// so no <128, ·> or <256, 8> instance is built.
cudaError_t launch_split_mma_staged(const SplitParams& sp, int head_dim, int rows, dim3 grid,
                                    cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return rows <= 8 ? launch<64, 8>(sp, grid, stream) : launch<64, 16>(sp, grid, stream);
    case 256:
      return rows == 16 ? launch<256, 16>(sp, grid, stream) : cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

// NOTE: head dims 128 and 256 are decode_mma_verify.cu's (select_split_kernel).
cudaError_t launch_split_mma_verify_staged(const SplitParams& sp, int head_dim, dim3 grid,
                                           cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch<64, 16, true>(sp, grid, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t split_mma_staged_resident_blocks(int head_dim, int rows, int* blocks) {
  switch (head_dim) {
    case 64:
      return rows <= 8 ? resident_blocks<64, 8>(blocks) : resident_blocks<64, 16>(blocks);
    case 256:
      return rows == 16 ? resident_blocks<256, 16>(blocks) : cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvlayer::cuda::detail::decode_impl

namespace kvlayer::cuda::detail {

KVLAYER_DEFINE_MUTANT_UNIT(decode_mma_staged)
}  // namespace kvlayer::cuda::detail
