// Split-K flash-decoding on tensor cores (SPEC §8): the default kernel for head dim 128, with
// register-direct loads (8 query rows on one mma n-tile; 16 on two, kNT = 2, that share each K
// and V operand), and for head dim 256 by 8 rows with bulk loads (two 128-dim slices, each read
// and converted as head dim 128's; SplitKernel::mma_bulk). A block takes rows [row0, row0 +
// nrows) of its KV head: all of them, or one of the row blocks a plan splits gqa > 8 into
// (plan.cpp, row_chunks). Same contract as decode_mma_staged.cu (grid, partition of the live view
// in 64-key granules, partial format, device-mode checks, merge kernel) and the same rounding
// points, point for point (kvlayer/accuracy.hpp (1)–(5)):
//  (1) q̃ = fp16(q); K quants exact in fp16; per 32-value block two m16n8k16 mma into a fresh f32
//      accumulator, × f32(d), blocks summed in block order: block 0 by __fmul_rn, each later
//      block by fmaf(c, d, s) (one rounding where decode_mma_staged.cu has two), × scale
//      (__fmul_rn).
//  (2) online softmax in f32, one max update per 16-key warp tile, IEEE exp2f, finite sentinel.
//  (3) p rounded to fp16 for PV; V = d·q + m by one HFMA2 (exact value rounded once to fp16), or
//      the exact f32 value on the CUDA cores for a tile holding a block beyond fp16's range; row
//      sums from the unrounded p; f32 accumulation.
//  (4) the block merges its 4 warps in f32, warps in order.
//
// ---- Why a second tensor-core kernel --------------------------------------------------------
// decode_mma_staged.cu stages tiles through shared memory with per-lane cp.async and runs ~62 warp
// instructions per (key, KV head) against a budget of ~54 at the bandwidth floor
// (bench/NOTES.md). This kernel removes the staging and cuts the dequantization work:
//  - Keys are the mma's M rows: S^T[16 keys × 8 heads] = K·q̃^T, so gqa 8 fills the mma with no
//    padding rows, and each lane's K operand is two whole key rows (g, g + 8) of the tile.
//  - Each lane loads its operands straight from global memory into registers (8-byte loads),
//    one tile ahead of the one it computes (double-buffered registers; no shared memory, no
//    barrier in the loop).
//  - K: lane t of a quad loads 8-byte words t, t+4, t+8, t+12 (and 16 for t = 0) of a key's
//    136-byte span. Because a block is 34 bytes, every lane then holds exactly 4 quant pairs of
//    every block; lane 0's pairs straddle words and are gathered by one PRMT per register
//    (k_pair_byte gives each pair's place; q̃ is laid out to match, so the dot is unchanged).
//  - PV is O^T[dims × heads] = V^T·P^T. P^T's B fragment is the transpose (movmatrix) of the
//    softmax's C fragment. The 128 output dims are permuted so that lane group g owns the 16
//    quants of half g % 2 of block g / 2 (v_dim): per key a lane needs one 8-byte header and 8
//    qs bytes, and two keys' headers pack into the fp16x2 (d, m) of one HFMA2.
//  - q5 → fp16 without a per-value byte gather: nibble and high bit are merged into an fp16
//    with a biased exponent (0x6400: 1024 + q for a nibble in bits 0..3, 0x5400: 64 + q for
//    one in bits 4..7, mantissa bits 0..3 zero), minus the bias (exact), then HFMA2.
//
// ---- Bulk loads (head dim 256) -----------------------------------------------------------------
// Head dim 256's operands are two tiles' worth of registers too many to double-buffer at 2
// blocks per SM. Its warps instead keep a ring of BulkRing::kStages tiles in shared memory: lane 0
// copies a whole tile as one tensor-map box per plane (the copy engine; rows of 272 and 192
// bytes, 16-byte aligned) and the warp reads the tile back in load_tile's register layout once
// its mbarrier has counted the bytes. At head dim 128 one tile of operands in registers is
// cheaper than the ring's shared-memory round trip, so those instances load directly
// (bench/NOTES.md has the measurements of both).
//
// ---- Verify (SplitKernel::mma_direct_verify: T·gqa ≤ 16 at head dim 128)
// -------------------------- A verify decode's T·gqa rows (SPEC §11) take the mma's n-tiles as a
// decode's heads do, so each K and V tile is read and converted once for all of them, in registers,
// with the decode's arithmetic and rounding points. Each row keeps its own causal (and window)
// view: a warp tile inside the keys every real row attends runs the decode's softmax; a tile at an
// edge masks each row's keys (update_softmax<true>), and on the f32 P·V path skips them (a masked
// key's V may be non-finite, and 0 · inf is NaN). decode_mma_verify.cu converts each tile once into
// shared memory for many rows; at 16 rows its copies and barriers cost more than they share.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "bulk_copy.cuh"
#include "decode/decode.hpp"
#include "decode/decode_common.cuh"
#include "decode/mma_fragments.cuh"
#include "decode/partition.hpp"
#include "device_status.cuh"

namespace kvlayer::cuda::detail::decode_impl {
namespace {

/// A slice: 128 dims of a head (4 blocks), whose K bytes (136) and V bytes (96) start 8-byte
/// aligned in every row; head dim 256 is two slices, each read and converted as head dim 128's.
constexpr int kSliceDims = 128;
constexpr int kSliceBlocks = kSliceDims / 32;
constexpr int kKSliceBytes = k_head_bytes(kSliceDims);
constexpr int kVSliceBytes = v_head_bytes(kSliceDims);
constexpr int kWarps = kDecodeMmaWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kWK = kDecodeMmaWarpKeys;  ///< keys per warp tile (the mma's M)
static_assert(kWK == 16 && kThreads == kDecodeThreads);
static_assert(kKSliceBytes % 8 == 0 && kVSliceBytes % 8 == 0);

/// Byte offset, within a key's K slice, of the first quant of pair (reg, h) of block b as lane t
/// of a quad holds it after gather_k_block (pairs are 2-byte aligned: never split by a word).
///  t ≥ 1: block b is the lane's word t + 4b, registers (lo, hi) as loaded.
///  t = 0: the lane holds words 0, 4, 8, 12, 16 as registers S0..S9 (4 bytes each); its pairs
///    of block b are at: b0 (2, 4 | 6, 32), b1 (36, 38 | 64, 66), b2 (96, 98 | 70, 100),
///    b3 (128, 130 | 132, 134), gathered as in gather_k_block.
__host__ __device__ constexpr int k_pair_byte(int b, int reg, int h, int t) {
  if (t != 0) return 8 * (t + 4 * b) + 4 * reg + 2 * h;
  constexpr int lane0[kSliceBlocks][2][2] = {
      {{2, 4}, {6, 32}}, {{36, 38}, {64, 66}}, {{96, 98}, {70, 100}}, {{128, 130}, {132, 134}}};
  return lane0[b][reg][h];
}

/// Quant index (0..31 in its block) of pair (b, reg, h)'s first quant for lane t.
__host__ __device__ constexpr int k_pair_quant(int b, int reg, int h, int t) {
  return k_pair_byte(b, reg, h, t) - kQ8_0BlockBytes * b - kQ8_0Quants;
}

/// Output dim of accumulator row r (0: row g, 1: row g + 8) of PV m-tile i for lane group g:
/// group g owns block g / 2, half g % 2 — low-nibble quant 8·(g % 2) + i (r = 0) and high-nibble
/// quant 16 + 8·(g % 2) + i (r = 1).
__host__ __device__ constexpr int v_dim(int i, int g, int r) {
  return 32 * (g >> 1) + 16 * r + 8 * (g & 1) + i;
}

// Every pair of every block is held by exactly one lane of a quad (a 32-quant block = 4 lanes ×
// 4 pairs), checked at compile time.
__host__ __device__ constexpr bool k_pairs_cover_blocks() {
  for (int b = 0; b < kSliceBlocks; ++b) {
    int seen = 0;
    for (int t = 0; t < 4; ++t)
      for (int reg = 0; reg < 2; ++reg)
        for (int h = 0; h < 2; ++h) {
          const int q = k_pair_quant(b, reg, h, t);
          if (q < 0 || q > 30 || q % 2 != 0 || (seen >> q & 1)) return false;
          seen |= 1 << q;
        }
    if (seen != 0x55555555) return false;
  }
  return true;
}
static_assert(k_pairs_cover_blocks());

/// The bulk instance's shared memory (head dim 256): a ring of kStages stages per warp, each one
/// 16-key warp tile, its 16 K rows then its 16 V rows packed (as a tensor-map box lands them),
/// released by one mbarrier per stage. The ring holds a warp's next tile in flight on the copy
/// engine, where the register-direct instances hold it in registers.
struct BulkRing {
  static constexpr int kKBytes = k_head_bytes(256), kVBytes = v_head_bytes(256);
  static constexpr int kStageBytes = kDecodeMmaWarpKeys * (kKBytes + kVBytes);
  /// 2: more stages only add latency hiding the copy engine does not need (bench/NOTES.md).
  static constexpr int kStages = 2;
  static constexpr int kBytes = kWarps * kStages * kStageBytes;
  static constexpr unsigned kTx = kDecodeMmaWarpKeys * (kKBytes + kVBytes);
  /// Tensor-map element bytes: a box row holds at most 256 elements (a K row is 136 of 2 B).
  static constexpr int kElem = 2;
  // 16-byte rows and heads (copy sizes and addresses), 128-byte stages (box destinations).
  static_assert(kKBytes % 16 == 0 && kVBytes % 16 == 0);
  static_assert(kStageBytes % 128 == 0 && (kDecodeMmaWarpKeys * kKBytes) % 128 == 0);
};

/// The K and V planes as 2-D tensor maps (rows × row elements) for the bulk instance's whole
/// tiles, built at launch (plane_maps); valid = 0: every tile by per-row copies.
struct PlaneMaps {
  CUtensorMap k, v;
  int valid;
};

/// One lane's operands of a 16-key warp tile of kSlices slices, loaded straight from global
/// memory.
template <int kSlices>
struct TileRegs {
  /// keys g, g + 8, slice c: words t, t+4, t+8, t+12 (+16 for t = 0) of the slice, 4-byte regs
  unsigned k[2][kSlices][10];
  /// slice c: V header (d | m << 16, qh) of keys 2t, 2t+1, 2t+8, 2t+9, block g / 2 of the slice
  uint2 vh[kSlices][4];
  uint2 vq[kSlices][4];  ///< the same keys' qs bytes 8h..8h+7 of that block (h = g % 2)
};

/// The two registers of block b of one key in pair order (see k_pair_byte). sel_a / sel_b
/// are 0x3210 (take the first source) for t ≥ 1, 0x5432 / 0x7654 for t = 0.
__device__ __forceinline__ void gather_k_block(const unsigned (&s)[10], int b, unsigned sel_a,
                                               unsigned sel_b, unsigned& r0, unsigned& r1) {
  switch (b) {
    case 0:
      r0 = __byte_perm(s[0], s[1], sel_a);
      r1 = __byte_perm(s[1], s[2], sel_a);
      break;
    case 1:
      r0 = __byte_perm(s[2], s[3], sel_b);
      r1 = __byte_perm(s[3], s[4], sel_b);
      break;
    case 2:
      r0 = __byte_perm(s[4], s[6], sel_b);
      r1 = __byte_perm(s[5], s[7], sel_a);
      break;
    default:
      r0 = __byte_perm(s[6], s[8], sel_b);
      r1 = __byte_perm(s[7], s[9], sel_b);
      break;
  }
}

__device__ __forceinline__ uint2 load_u2(const std::uint8_t* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}

/// A verify block's row views, as key offsets from the split's first key, clipped to the split:
/// row r attends [lo[r], hi[r]); every real row attends [common_lo, common_hi) (empty when
/// common_lo ≥ common_hi). In shared memory: read at a tile's edge only, they would otherwise
/// hold registers through the key loop.
template <int kRows>
struct RowViews {
  int common_lo, common_hi;
  int lo[kRows], hi[kRows];
};

/// One thread's share of a block (one per (split, KV head); 4 independent warps, warp w owning
/// warp tiles w, w + 4, …): what every phase reads (the split, the tensor maps, shared memory,
/// this lane's place in its warp) and, by reference, the thread's registers (q̃ as fragments, its
/// rows within a tile and their offsets, the running softmax and the P·V accumulators). The
/// phases are its member functions, in the kernel's order. Head dim kD (128 or 256: kD / 128
/// slices); kNT mma n-tiles of 8 query heads each (head 8·n + g of n-tile n). kBulk (head dim
/// 256): the tiles come through the warp's BulkRing on the copy engine instead of straight into
/// registers. kBatch: the blocks of a batch launch (begin_split); the tensor maps are then unused
/// (a batch's planes are many). kVerify: a verify decode's rows (query_row_index), each
/// attending its own view (RowViews).
///
/// NOTE: the registers are the kernel's locals, one variable each, that the object refers to (as
/// decode_mma_verify.cu's VerifyBlock does: as its members, arrays kept the object in memory and
/// changed the code ptxas is given).
template <int kD, int kNT, bool kBulk, bool kBatch, bool kVerify>
struct DirectBlock {
  static constexpr int kSlices = kD / kSliceDims;
  static constexpr int kBlocks = kD / 32;
  // Query heads of the block (≥ gqa; the rest are zero rows).
  static constexpr int kHeads = 8 * kNT;
  static constexpr int kMTiles = 8 * kSlices;  // PV m-tiles of 16 dims (8 per slice)
  static constexpr int kOStride = kD + 4;      // merge staging row (floats)
  static constexpr MutantSite kSite = MutantSite::decode_mma_direct;
  static constexpr unsigned kBiasLow = 0x64006400u, kBiasHigh = 0x54005400u;  // see v_quant_f16x2
  static_assert(!kBulk || kD == 256);
  static_assert(!kVerify || (kD == 128 && !kBulk));
  using Ring = BulkRing;
  using Views = RowViews<kHeads>;
  using Tile = TileRegs<kSlices>;
  using Stats = float[kWarps][kHeads];
  // NOTE: indexed as this 3-D array: a flat float* moves ptxas's schedule of the direct
  // instances and slows them (bench/NOTES.md).
  using OStage = float[kWarps][kHeads][kOStride];
  using QFrags = unsigned[kNT][kBlocks][2][2];
  using State = SoftmaxState<2 * kNT>;
  using Acc = float[kNT][kMTiles][4];
  using Scores = float[kNT][4];

  const SplitParams& p;
  const PlaneMaps& maps;
  const SplitRange& range;
  Stats& m_s;
  Stats& l_s;
  Stats& w_s;
  OStage& o_s;
  std::uint8_t* const ring;             ///< bulk: kStages stages per warp
  std::uint64_t* const bars;            ///< bulk: one mbarrier per stage
  const std::uint8_t** const planes_s;  ///< batch: the planes, for the key loop (planes)
  Views& views;                         ///< verify: the rows' views (bound_rows)
  const int kv, tid, warp, lane, g, t;  // g, t: groupID, threadID_in_group
  const int hv;                         // the V half this lane group owns
  const int G;
  // Set by the phase that first needs them (select_bytes, share_planes, tile_offsets), not by the
  // constructor, so that they are computed where the kernel's order puts them, after q̃'s loads
  // (in VerifyBlock, values computed in the constructor moved ahead of q̃'s loads and changed the
  // code ptxas is given).
  unsigned sel_a, sel_b, qh_sel;
  const std::uint8_t *k_head, *v_head;
  long long lo, hi;
  int my_tiles;
  int k_tok, v_tok;

  // q̃ as the QK B fragments for the whole split (load_q).
  QFrags& qb;
  // This lane's rows within a tile, K keys g, g + 8 and V keys 2t, 2t+1, 2t+8, 2t+9, and their
  // offsets in bytes (tile_offsets).
  int (&k_key)[2];
  int (&v_key)[4];
  unsigned (&k_off)[2];
  unsigned (&v_off)[4];
  // Per-warp softmax, row 2n + hh: head 8n + 2t + hh of n-tile n (m identical across the lane
  // groups; l per lane).
  State& state;
  // PV m-tile mt = 8c + i: (dim 128c + v_dim(i, g, 0), heads 2t, 2t+1), (128c + v_dim(i, g, 1), …)
  Acc& o;

  __device__ __forceinline__ DirectBlock(const SplitParams& params, const PlaneMaps& tensor_maps,
                                         const SplitRange& split, Stats& m_stage, Stats& l_stage,
                                         Stats& w_stage, OStage& o_stage, std::uint8_t* ring_s,
                                         std::uint64_t* bars_s, const std::uint8_t** planes,
                                         Views& row_views, QFrags& q_frags, int (&k_keys)[2],
                                         int (&v_keys)[4], unsigned (&k_offs)[2],
                                         unsigned (&v_offs)[4], State& softmax, Acc& acc)
      : p(params),
        maps(tensor_maps),
        range(split),
        m_s(m_stage),
        l_s(l_stage),
        w_s(w_stage),
        o_s(o_stage),
        ring(ring_s),
        bars(bars_s),
        planes_s(planes),
        views(row_views),
        kv(split.kv),
        tid(threadIdx.x),
        warp(tid / 32),
        lane(tid % 32),
        g(lane >> 2),
        t(lane & 3),
        hv(g & 1),
        G(params.gqa),
        qb(q_frags),
        k_key(k_keys),
        v_key(v_keys),
        k_off(k_offs),
        v_off(v_offs),
        state(softmax),
        o(acc) {}

  __device__ __forceinline__ std::uint8_t* stage_of(int s) const {
    return ring + (warp * Ring::kStages + s) * Ring::kStageBytes;
  }

  /// Bulk: issues the copies of this warp's i-th tile into stage s: a whole tile as one box per
  /// plane (lane 0); a split's partial last tile (or no tensor maps) row by row, lane r < 16 K
  /// row r, lane 16 + r V row r, rows past the split's end copying its last key (their p is 0).
  /// The register-direct instances keep their own (later) definitions of the tile range
  /// (tile_offsets), so that the bulk path leaves their SASS unchanged.
  __device__ __forceinline__ void issue_tile(int s, int i) {
    const long long lo_b = range.lo, hi_b = range.hi;
    const long long key0 = lo_b + (long long)(warp + kWarps * i) * kWK;
    std::uint8_t* stage = stage_of(s);
    std::uint64_t* bar = &bars[warp * Ring::kStages + s];
    if (maps.valid && hi_b - key0 >= kWK) {
      if (lane == 0) {
        mbarrier_arrive_expect_tx(bar, Ring::kTx);
        const int y = static_cast<int>(key0 - range.base);
        tensor_copy_2d_to_shared(stage, &maps.k, kv * Ring::kKBytes / Ring::kElem, y, bar);
        tensor_copy_2d_to_shared(stage + kWK * Ring::kKBytes, &maps.v,
                                 kv * Ring::kVBytes / Ring::kElem, y, bar);
      }
      return;
    }
    const int row = lane & 15;
    const int key = hi_b - key0 < kWK ? min(row, static_cast<int>(hi_b - key0) - 1) : row;
    const long long phys = key0 - range.base + key;
    if (lane == 0) mbarrier_arrive_expect_tx(bar, Ring::kTx);
    __syncwarp();
    if (lane < 16)
      bulk_copy_to_shared(stage + row * Ring::kKBytes, range.k_head + phys * p.k_tok_bytes,
                          Ring::kKBytes, bar);
    else
      bulk_copy_to_shared(stage + kWK * Ring::kKBytes + row * Ring::kVBytes,
                          range.v_head + phys * p.v_tok_bytes, Ring::kVBytes, bar);
  }

  /// Bulk: the ring's mbarriers, and the copies of this warp's first kStages tiles, which go out
  /// before q̃ is built (they hold no registers).
  __device__ __forceinline__ void start_ring() {
    const int n_wt_b = static_cast<int>((range.hi - range.lo + kWK - 1) / kWK);
    const int my_tiles_b = n_wt_b > warp ? (n_wt_b - warp + kWarps - 1) / kWarps : 0;
    if (lane == 0)
      for (int s = 0; s < Ring::kStages; ++s) mbarrier_init(&bars[warp * Ring::kStages + s], 1);
    __syncwarp();
    for (int s = 0; s < Ring::kStages && s < my_tiles_b; ++s) issue_tile(s, s);
  }

  /// q̃ as the QK B fragments for the whole split: qb[n][b][ks][j] = pair (b % 4, reg ks, h j) of
  /// block b (slice b / 4) of the block's query row 8·n + g: head row0 + 8·n + g of the KV head,
  /// or (verify) the KV head's row row0 + 8·n + g (query_row_index); zero for rows ≥ nrows.
  __device__ __forceinline__ void load_q() {
    const int rows = range.nrows;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const int head = 8 * n + g;
      const float* q_head = range.q + ((long long)kv * G + range.row0 + head) * kD;
      if constexpr (kVerify)
        q_head = range.q +
                 query_row_index(range.row0 + (head < rows ? head : 0), kv, G, int(gridDim.y)) * kD;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int quant = 32 * b + k_pair_quant(b % kSliceBlocks, ks, j, t);
            const float x0 = head < rows ? q_operand(q_head[quant], p.scale, kSite) : 0.0f;
            const float x1 = head < rows ? q_operand(q_head[quant + 1], p.scale, kSite) : 0.0f;
            qb[n][b][ks][j] = pack_f16x2(x0, x1);
          }
    }
  }

  /// The QK B fragment (k-step ks) of block b, n-tile n.
  __device__ __forceinline__ void q_fragment(int n, int b, int ks, unsigned& b0,
                                             unsigned& b1) const {
    b0 = qb[n][b][ks][0];
    b1 = qb[n][b][ks][1];
  }

  /// This lane's byte selectors: K pairs (gather_k_block), V high bits.
  __device__ __forceinline__ void select_bytes() {
    sel_a = t == 0 ? 0x5432u : 0x3210u;
    sel_b = t == 0 ? 0x7654u : 0x3210u;
    qh_sel = hv ? 0x7531u : 0x6420u;  // qh bytes hv, hv + 2 of two keys
  }

  /// The KV head's planes (this lane's V block). A batch block's planes come from memory, not
  /// from the kernel's parameters, so they would hold four registers through the key loop, where
  /// the 8-row instance sits at its register cap and spills: its loop re-reads them from shared
  /// memory instead (planes()).
  __device__ __forceinline__ void share_planes() {
    k_head = range.k_head;
    v_head = range.v_head + kQ5_1BlockBytes * (g >> 1);
    if constexpr (kBatch) {
      if (tid == 0) {
        planes_s[0] = k_head;
        planes_s[1] = range.v_head;
      }
      __syncthreads();
    }
  }
  __device__ __forceinline__ void planes(const std::uint8_t*& k, const std::uint8_t*& v) const {
    k = k_head;
    v = v_head;
    if constexpr (kBatch) {
      k = *static_cast<const std::uint8_t* const volatile*>(&planes_s[0]);
      v = *static_cast<const std::uint8_t* const volatile*>(&planes_s[1]) +
          kQ5_1BlockBytes * (g >> 1);
    }
  }

  /// This warp's tiles of the split, and the offsets of this lane's rows within a tile.
  __device__ __forceinline__ void tile_offsets() {
    lo = range.lo;
    hi = range.hi;
    const long long n_keys = hi - lo;
    const int n_wt = static_cast<int>((n_keys + kWK - 1) / kWK);
    my_tiles = n_wt > warp ? (n_wt - warp + kWarps - 1) / kWarps : 0;
    // Row strides fit in int (≤ 65535 KV heads × 272 B); a tile spans 16 rows.
    k_tok = static_cast<int>(p.k_tok_bytes);
    v_tok = static_cast<int>(p.v_tok_bytes);
    // The offsets are recomputed with clamping only for a split's partial last tile (load_tile).
    k_key[0] = g;
    k_key[1] = g + 8;
    v_key[0] = 2 * t;
    v_key[1] = 2 * t + 1;
    v_key[2] = 2 * t + 8;
    v_key[3] = 2 * t + 9;
#pragma unroll
    for (int j = 0; j < 2; ++j) k_off[j] = unsigned(k_key[j] * k_tok);
#pragma unroll
    for (int j = 0; j < 4; ++j) v_off[j] = unsigned(v_key[j] * v_tok);
  }

  /// Verify: the rows' views (SPEC §11: query i at p_i = len − T + i sees [max(0, p_i + 1 −
  /// window), p_i + 1)) into `views`, clipped to the split; padding rows every key, as a
  /// decode's. The keys every real row attends are the last row's begin to the first row's end:
  /// a row's view never starts or ends before the previous row's.
  __device__ __forceinline__ void bound_rows() {
    if constexpr (kVerify) {
      const long long n_keys = range.hi - range.lo;
      const auto view_of = [&](int row, int& begin, int& end) {
        const long long pos = range.len - p.view.queries + (range.row0 + row) / G;
        const long long e = verify_row_end(pos, range.len, kSite);
        const long long b =
            p.view.window > 0 ? verify_row_begin(pos, range.len - 1, p.view.window, kSite) : 0;
        end = static_cast<int>(min(max(e - range.lo, 0ll), n_keys));
        begin = static_cast<int>(min(max(b - range.lo, 0ll), n_keys));
      };
      if (tid < kHeads) {
        int begin = 0, end = static_cast<int>(n_keys);
        if (tid < range.nrows) view_of(tid, begin, end);
        views.lo[tid] = begin;
        views.hi[tid] = end;
      }
      if (tid == kHeads) {
        int first_begin, first_end, last_begin, last_end;
        view_of(0, first_begin, first_end);
        view_of(range.nrows - 1, last_begin, last_end);
        views.common_lo = last_begin;
        views.common_hi = first_end;
      }
      __syncthreads();
    }
  }

  /// Whether every real row attends the `valid` keys of the tile at key offset key_off (verify).
  __device__ __forceinline__ bool tile_in_common_view(int key_off, int valid) const {
    return key_off >= views.common_lo && key_off + valid <= views.common_hi;
  }

  /// Whether the row of softmax slot (n, hh) (head 8n + 2t + hh) attends key key_off + k of a
  /// tile (verify).
  __device__ __forceinline__ bool attends(int n, int hh, int key) const {
    const int row = 8 * n + 2 * t + hh;
    return key >= views.lo[row] && key < views.hi[row];
  }

  /// Loads this warp's i-th tile. Keys past the split's end read the split's last key instead
  /// (real, finite-or-attended bytes; their p is 0).
  __device__ __forceinline__ void load_tile(Tile& r, int i) const {
    const long long key0 = lo + (long long)(warp + kWarps * i) * kWK;
    const long long row0 = key0 - range.base;
    // NOTE: the empty asm keeps the tile bases opaque, so that each row address is one 64-bit
    // add of a 32-bit offset (ptxas otherwise re-forms row0·tok + offset per row).
    const std::uint8_t *k_plane, *v_plane;
    planes(k_plane, v_plane);
    std::uintptr_t k_tile = reinterpret_cast<std::uintptr_t>(k_plane + row0 * p.k_tok_bytes);
    std::uintptr_t v_tile = reinterpret_cast<std::uintptr_t>(v_plane + row0 * p.v_tok_bytes);
    asm("" : "+l"(k_tile), "+l"(v_tile));
    unsigned ko[2] = {k_off[0], k_off[1]};
    unsigned vo[4] = {v_off[0], v_off[1], v_off[2], v_off[3]};
    if (hi - key0 < kWK) {  // warp-uniform: the split's partial last tile
      const int last = static_cast<int>(hi - key0) - 1;
#pragma unroll
      for (int j = 0; j < 2; ++j) ko[j] = unsigned(min(k_key[j], last) * k_tok);
#pragma unroll
      for (int j = 0; j < 4; ++j) vo[j] = unsigned(min(v_key[j], last) * v_tok);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < kSlices; ++c) {
        const std::uint8_t* src =
            reinterpret_cast<const std::uint8_t*>(k_tile + ko[j]) + kKSliceBytes * c + 8 * t;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint2 x = load_u2(src + 32 * w);
          r.k[j][c][2 * w] = x.x;
          r.k[j][c][2 * w + 1] = x.y;
        }
        uint2 x = make_uint2(0u, 0u);
        if (t == 0) x = load_u2(src + 128);  // word 16: lane t = 0's only
        r.k[j][c][8] = x.x;
        r.k[j][c][9] = x.y;
      }
#pragma unroll
    for (int c = 0; c < kSlices; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint8_t* src =
            reinterpret_cast<const std::uint8_t*>(v_tile + vo[j]) + kVSliceBytes * c;
        r.vh[c][j] = load_u2(src);
        r.vq[c][j] = load_u2(src + 8 + 8 * hv);
      }
  }

  /// Bulk: reads this warp's tile from stage s, once its copies have landed, into the register
  /// layout load_tile gives (rows past the split's end hold its last key, as load_tile's).
  __device__ __forceinline__ void read_tile(Tile& r, int s, unsigned parity) const {
    mbarrier_wait(&bars[warp * Ring::kStages + s], parity);
    const std::uint8_t* stage = stage_of(s);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < kSlices; ++c) {
        const std::uint8_t* src = stage + k_key[j] * Ring::kKBytes + kKSliceBytes * c + 8 * t;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint2 x = *reinterpret_cast<const uint2*>(src + 32 * w);
          r.k[j][c][2 * w] = x.x;
          r.k[j][c][2 * w + 1] = x.y;
        }
        uint2 x = make_uint2(0u, 0u);
        if (t == 0) x = *reinterpret_cast<const uint2*>(src + 128);
        r.k[j][c][8] = x.x;
        r.k[j][c][9] = x.y;
      }
    const std::uint8_t* v_stage = stage + kWK * Ring::kKBytes + kQ5_1BlockBytes * (g >> 1);
#pragma unroll
    for (int c = 0; c < kSlices; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint8_t* src = v_stage + v_key[j] * Ring::kVBytes + kVSliceBytes * c;
        r.vh[c][j] = *reinterpret_cast<const uint2*>(src);
        r.vq[c][j] = *reinterpret_cast<const uint2*>(src + 8 + 8 * hv);
      }
  }

  /// The running softmax and the P·V accumulators, empty.
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) state.reset(2 * n + hh);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][i][e] = 0.0f;
    }
  }

  /// Scores: s[n][e] for key g + 8·(e / 2), head 8n + 2t + e % 2, blocks in order.
  __device__ __forceinline__ void compute_scores(const Tile& r, Scores& s) const {
#pragma unroll
    for (int c = 0; c < kSlices; ++c) {
      unsigned dpk[2][2];  // d of blocks (0, 1), (2, 3) of the slice, keys g, g + 8, from t = 0
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        dpk[j][0] =
            __shfl_sync(kFullMask, __byte_perm(r.k[j][c][0], r.k[j][c][2], 0x7610), lane & ~3);
        dpk[j][1] =
            __shfl_sync(kFullMask, __byte_perm(r.k[j][c][5], r.k[j][c][7], 0x7610), lane & ~3);
      }
#pragma unroll
      for (int bs = 0; bs < kSliceBlocks; ++bs) {
        const int b = kSliceBlocks * c + bs;
        unsigned u[2][2];  // [key j][reg], sign bits flipped
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          gather_k_block(r.k[j][c], bs, sel_a, sel_b, u[j][0], u[j][1]);
          u[j][0] ^= 0x80808080u;
          u[j][1] ^= 0x80808080u;
        }
        unsigned a[2][4];  // the K A fragment of k-step ks, shared by the n-tiles
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          a[ks][0] = int8_pair_to_f16x2(u[0][ks], 0);
          a[ks][1] = int8_pair_to_f16x2(u[1][ks], 0);
          a[ks][2] = int8_pair_to_f16x2(u[0][ks], 1);
          a[ks][3] = int8_pair_to_f16x2(u[1][ks], 1);
        }
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            unsigned b0, b1;
            q_fragment(n, b, ks, b0, b1);
            mma_16816(acc, a[ks][0], a[ks][1], a[ks][2], a[ks][3], b0, b1);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const unsigned dw = dpk[e >> 1][bs >> 1];
            const float d = f16_bits((bs & 1) ? dw >> 16 : dw & 0xffffu);
            s[n][e] = b == 0 ? __fmul_rn(acc[e], d) : fmaf(acc[e], d, s[n][e]);
          }
        }
      }
    }
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = score_scaled(s[n][e], p.scale);
  }

  /// Online softmax per head over the tile's valid keys: the weights pr in s's layout, the
  /// accumulators rescaled when a max moved. kMasked (verify, a tile at a row view's edge): each
  /// row over the keys it attends only (key_off: the tile's first key as an offset from lo).
  template <bool kMasked>
  __device__ __forceinline__ void update_softmax(const Scores& s, int valid, int i, Scores& pr,
                                                 int key_off) {
    const bool valid0 = g < valid, valid1 = g + 8 < valid;
    float alpha[kNT][2];
    bool rescale = false;
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        bool att0 = valid0, att1 = valid1;
        if constexpr (kMasked) {
          att0 = att0 && attends(n, hh, key_off + g);
          att1 = att1 && attends(n, hh, key_off + g + 8);
        }
        float top = kNegSentinel;
        if (att0) top = fmaxf(top, s[n][hh]);
        if (att1) top = fmaxf(top, s[n][2 + hh]);
        top = max_over_lane_groups(top);
        const float m_new = state.max_with(2 * n + hh, top);
        alpha[n][hh] = state.rescale_to(2 * n + hh, m_new);
        pr[n][hh] = att0 ? softmax_weight(s[n][hh], m_new) : 0.0f;
        pr[n][2 + hh] = att1 ? softmax_weight(s[n][2 + hh], m_new) : 0.0f;
        state.advance(2 * n + hh, m_new, alpha[n][hh], pr[n][hh] + pr[n][2 + hh]);
        rescale = rescale || alpha[n][hh] != 1.0f;
      }
    if (rescale_accumulators(__any_sync(kFullMask, rescale), i == 0, kSite))
      rescale_pv_accumulators(o, alpha, kSite);
  }

  /// P·V on the CUDA cores, f32, keys in order: V at its exact f32 value, p unrounded (the rare
  /// path of a tile holding a V block that may leave fp16's range). Verify: each row skips the
  /// keys it does not attend (their V may be non-finite).
  __device__ __forceinline__ void accumulate_pv_f32(const Scores& pr, long long key0, int valid) {
#pragma unroll 1
    for (int k = 0; k < kWK; ++k) {
      const int src = ((k & 7) << 2) | t;
      float p0[kNT], p1[kNT];
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        p0[n] = __shfl_sync(kFullMask, k < 8 ? pr[n][0] : pr[n][2], src);
        p1[n] = __shfl_sync(kFullMask, k < 8 ? pr[n][1] : pr[n][3], src);
      }
      const int key = k < valid - 1 ? k : valid - 1;
      bool use0[kNT], use1[kNT];  // verify: the rows of p0, p1 attend key k
      if constexpr (kVerify) {
        const int key_off = static_cast<int>(key0 - lo) + k;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          use0[n] = k < valid && attends(n, 0, key_off);
          use1[n] = k < valid && attends(n, 1, key_off);
        }
      }
      const std::uint8_t *k_plane, *v_plane;
      planes(k_plane, v_plane);
      const std::uint8_t* row = v_plane + (key0 + key - range.base) * p.v_tok_bytes;
#pragma unroll
      for (int c = 0; c < kSlices; ++c) {
        const std::uint8_t* blk = row + kVSliceBytes * c;
        const uint2 hdr = load_u2(blk);
        const uint2 qs = load_u2(blk + 8 + 8 * hv);
        const float d = q5_1_d(hdr.x), mv = q5_1_m(hdr.x);
        const unsigned qh = hdr.y >> (8 * hv);
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          const unsigned byte = ((m < 4 ? qs.x : qs.y) >> (8 * (m & 3))) & 0xffu;
          const unsigned q_lo = (byte & 0xfu) | (((qh >> m) & 1u) << 4);
          const unsigned q_hi = (byte >> 4) | (((qh >> (16 + m)) & 1u) << 4);
          const float v_lo = __fadd_rn(__fmul_rn(d, float(q_lo)), mv);
          const float v_hi = __fadd_rn(__fmul_rn(d, float(q_hi)), mv);
#pragma unroll
          for (int n = 0; n < kNT; ++n) {
            float(&acc)[4] = o[n][8 * c + m];
            if constexpr (kVerify) {
              if (use0[n]) acc[0] = pv_accumulator(fmaf(p0[n], v_lo, acc[0]), kSite);
              if (use1[n]) acc[1] = pv_accumulator(fmaf(p1[n], v_lo, acc[1]), kSite);
              if (use0[n]) acc[2] = pv_accumulator(fmaf(p0[n], v_hi, acc[2]), kSite);
              if (use1[n]) acc[3] = pv_accumulator(fmaf(p1[n], v_hi, acc[3]), kSite);
            } else {
              acc[0] = pv_accumulator(fmaf(p0[n], v_lo, acc[0]), kSite);
              acc[1] = pv_accumulator(fmaf(p1[n], v_lo, acc[1]), kSite);
              acc[2] = pv_accumulator(fmaf(p0[n], v_hi, acc[2]), kSite);
              acc[3] = pv_accumulator(fmaf(p1[n], v_hi, acc[3]), kSite);
            }
          }
        }
      }
    }
  }

  /// P·V on the tensor cores: p̃^T as the B fragments, the transpose of the (keys × heads) C
  /// layout; V as fp16 A fragments by one HFMA2 per key pair.
  __device__ __forceinline__ void accumulate_pv(const Tile& r, const Scores& pr) {
    unsigned pb0[kNT], pb1[kNT];
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      pb0[n] = transpose_8x8_f16(pack_f16x2(pr[n][0], pr[n][1]));  // keys 2t, 2t+1
      pb1[n] = transpose_8x8_f16(pack_f16x2(pr[n][2], pr[n][3]));  // keys 2t+8, 2t+9
    }
#pragma unroll
    for (int c = 0; c < kSlices; ++c) {
      unsigned d2[2], m2[2], qh2[2], qs2[2][4];  // per key pair (2t, 2t+1), (2t+8, 2t+9)
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const uint2 h0 = r.vh[c][2 * pair], h1 = r.vh[c][2 * pair + 1];
        const uint2 w0 = r.vq[c][2 * pair], w1 = r.vq[c][2 * pair + 1];
        d2[pair] = __byte_perm(h0.x, h1.x, 0x5410);
        m2[pair] = __byte_perm(h0.x, h1.x, 0x7632);
        qh2[pair] = __byte_perm(h0.y, h1.y, qh_sel);  // per lane: bits 0..7 low, 8..15 high quants
        qs2[pair][0] = __byte_perm(w0.x, w1.x, 0x5410);  // qs bytes 0, 1 of each key
        qs2[pair][1] = __byte_perm(w0.x, w1.x, 0x7632);  // bytes 2, 3
        qs2[pair][2] = __byte_perm(w0.y, w1.y, 0x5410);  // bytes 4, 5
        qs2[pair][3] = __byte_perm(w0.y, w1.y, 0x7632);  // bytes 6, 7
      }
      auto v_operand = [&](int pair, auto m_tile, auto high) -> unsigned {
        constexpr int m = decltype(m_tile)::value;
        constexpr bool kHigh = decltype(high)::value;
        const unsigned qs = (m & 1) ? qs2[pair][m >> 1] >> 8 : qs2[pair][m >> 1];
        const __half2 q = kHigh ? v_quant_f16x2<4, 8 + m>(qs, qh2[pair], kBiasHigh)
                                : v_quant_f16x2<0, m>(qs, qh2[pair], kBiasLow);
        return h2_bits(__hfma2(as_h2(d2[pair]), q, as_h2(m2[pair])));
      };
      auto pv_m_tile = [&](auto m_tile) {
        constexpr int m = decltype(m_tile)::value;
        using Lo = std::false_type;
        using Hi = std::true_type;
        const unsigned a0 = v_operand(0, m_tile, Lo{}), a1 = v_operand(0, m_tile, Hi{});
        const unsigned a2 = v_operand(1, m_tile, Lo{}), a3 = v_operand(1, m_tile, Hi{});
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          mma_16816(o[n][8 * c + m], a0, a1, a2, a3, pb0[n], pb1[n]);
          pv_accumulators(o[n][8 * c + m], kSite);
        }
      };
      pv_m_tile(std::integral_constant<int, 0>{});
      pv_m_tile(std::integral_constant<int, 1>{});
      pv_m_tile(std::integral_constant<int, 2>{});
      pv_m_tile(std::integral_constant<int, 3>{});
      pv_m_tile(std::integral_constant<int, 4>{});
      pv_m_tile(std::integral_constant<int, 5>{});
      pv_m_tile(std::integral_constant<int, 6>{});
      pv_m_tile(std::integral_constant<int, 7>{});
    }
  }

  /// This warp's i-th tile, held in r: scores, softmax, P·V (on the CUDA cores where a V block of
  /// the tile may leave fp16's range).
  __device__ __forceinline__ void compute_tile(const Tile& r, int i) {
    const long long key0 = lo + (long long)(warp + kWarps * i) * kWK;
    const int valid = static_cast<int>(hi - key0 < kWK ? hi - key0 : kWK);
    float s[kNT][4];
    compute_scores(r, s);
    float pr[kNT][4];
    if constexpr (kVerify) {
      const int key_off = static_cast<int>(key0 - lo);
      if (tile_in_common_view(key_off, valid))
        update_softmax<false>(s, valid, i, pr, key_off);
      else
        update_softmax<true>(s, valid, i, pr, key_off);
    } else {
      update_softmax<false>(s, valid, i, pr, 0);
    }
    bool wide = false;
#pragma unroll
    for (int c = 0; c < kSlices; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) wide = wide || v_header_maybe_wide(r.vh[c][j].x);
    if (wide_tile_on_cuda_cores(__any_sync(kFullMask, wide), kSite))
      accumulate_pv_f32(pr, key0, valid);
    else
      accumulate_pv(r, pr);
  }

  /// This warp's m, l (summed over the lane groups) and o into shared memory, for the merge of
  /// the 4 warps into the split's partial.
  __device__ __forceinline__ void stage_warp_results() {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float& l = state.l[2 * n + hh];
        l = sum_over_lane_groups(l);
        if (g == 0) {
          m_s[warp][8 * n + 2 * t + hh] = state.m[2 * n + hh];
          l_s[warp][8 * n + 2 * t + hh] = l;
        }
      }
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o_s[warp][8 * n + 2 * t + (e & 1)][kSliceDims * (m / 8) + v_dim(m % 8, g, e >> 1)] =
              o[n][m][e];
  }

  /// The split's partial from the staged results of the 4 warps.
  __device__ __forceinline__ void merge_warps() const {
    merge_warps_into_partial<kWarps, kThreads>(range, kD, kHeads, &m_s[0][0], &l_s[0][0],
                                               &w_s[0][0], &o_s[0][0][0], kOStride);
  }
};

/// The SplitKernel an instance of decode_split_mma_direct_kernel is.
__host__ __device__ constexpr SplitKernel direct_split_kernel(bool bulk, bool verify) {
  return bulk     ? SplitKernel::mma_bulk
         : verify ? SplitKernel::mma_direct_verify
                  : SplitKernel::mma_direct;
}

/// One block per (split, KV head); DirectBlock says what the template parameters select.
template <int kD, int kNT, bool kBulk, bool kBatch, bool kVerify>
__global__ void __launch_bounds__(kThreads, split_blocks_per_sm(direct_split_kernel(kBulk, kVerify),
                                                                kD, 8 * kNT))
    decode_split_mma_direct_kernel(const SplitParams p, const __grid_constant__ PlaneMaps maps) {
  static_assert(split_instance_built(direct_split_kernel(kBulk, kVerify), kD, 8 * kNT));
  using Block = DirectBlock<kD, kNT, kBulk, kBatch, kVerify>;
  using Ring = typename Block::Ring;
  constexpr int kHeads = Block::kHeads, kOStride = Block::kOStride;
  // NOTE: q̃ stays in registers at head dim 256 too (238 at its 255 cap): the bulk ring holds the
  // next tile, so only one tile of operands is live, and q̃ in shared memory would add a load to
  // every score mma.
  __shared__ float m_s[kWarps][kHeads], l_s[kWarps][kHeads], w_s[kWarps][kHeads];
  __shared__ __align__(16) float o_static[kBulk ? 1 : kWarps][kHeads][kOStride];
  extern __shared__ __align__(128) std::uint8_t ring[];
  __shared__ std::uint64_t bars[kBulk ? kWarps * Ring::kStages : 1];
  // Bulk: the merge staging reuses the ring once every warp is done with it.
  using OStage = typename Block::OStage;
  static_assert(!kBulk || sizeof(OStage) <= Ring::kBytes);
  OStage& o_s = *reinterpret_cast<OStage*>(kBulk ? static_cast<void*>(ring) : o_static);
  __shared__ const std::uint8_t* planes_s[2];  // batch: see share_planes
  __shared__ typename Block::Views views_s;    // verify: see bound_rows

  const SplitRange range =
      begin_split<kBatch>(p, kD, split_granule(SplitKernel::mma_direct, kD), Block::kSite);
  if (!range.active) return;  // block-uniform: no barrier has been reached yet

  // The thread's registers (DirectBlock says what each holds, and why they are locals here).
  typename Block::QFrags qb;
  int k_key[2], v_key[4];
  unsigned k_off[2], v_off[4];
  typename Block::State state;
  typename Block::Acc o;
  Block b(p, maps, range, m_s, l_s, w_s, o_s, ring, bars, planes_s, views_s, qb, k_key, v_key,
          k_off, v_off, state, o);
  if constexpr (kBulk) b.start_ring();
  b.load_q();
  b.select_bytes();
  b.share_planes();
  b.tile_offsets();
  b.bound_rows();
  b.reset();

  // Double-buffered registers: tile i + 1's loads are in flight while tile i computes.
  // Registers rather than a shared-memory pipeline or an L2 prefetch: both were slower at long
  // views (bench/NOTES.md).
  if constexpr (kBulk) {
    typename Block::Tile r;
    int s = 0;
    unsigned parity = 0;
    for (int i = 0; i < b.my_tiles; ++i) {
      b.read_tile(r, s, parity);
      b.compute_tile(r, i);
      // The stage is free: compute_tile's warp-wide mma consumed every lane's reads of it.
      if (i + Ring::kStages < b.my_tiles) {
        __syncwarp();
        b.issue_tile(s, i + Ring::kStages);
      }
      if (++s == Ring::kStages) {
        s = 0;
        if (KVLAYER_DEVICE_MUTANT(ring_parity_not_flipped))
          KVLAYER_MUTANT_REACHED(Block::kSite);  // planted bug (deadlocks)
        else
          parity ^= 1u;
      }
    }
    __syncthreads();  // every warp is done with the ring before o_s reuses it
  } else {
    typename Block::Tile buf0, buf1;
    if (b.my_tiles > 0) b.load_tile(buf0, 0);
    for (int i = 0; i < b.my_tiles; i += 2) {
      if (i + 1 < b.my_tiles) b.load_tile(buf1, i + 1);
      b.compute_tile(buf0, i);
      if (i + 1 < b.my_tiles) {
        if (i + 2 < b.my_tiles) b.load_tile(buf0, i + 2);
        b.compute_tile(buf1, i + 1);
      }
    }
  }

  // ---- Merge the 4 warps into the split's partial. ----
  b.stage_warp_results();
  __syncthreads();
  b.merge_warps();
}

/// The kernel instance for (head_dim, rows): 128 × 8 and 128 × 16 register-direct (decode or
/// verify), 256 × 8 bulk (a decode of one layer's launches only: select_split_kernel gives a
/// batch head dim 256 to the staged kernel), with its dynamic shared memory; null otherwise.
struct DirectInstance {
  void (*kernel)(SplitParams, PlaneMaps) = nullptr;
  int smem = 0;
};
template <bool kVerify>
DirectInstance direct_kernel(int head_dim, int rows, bool batch) {
  if (head_dim == 128 && rows == 8)
    return {batch ? decode_split_mma_direct_kernel<128, 1, false, true, kVerify>
                  : decode_split_mma_direct_kernel<128, 1, false, false, kVerify>,
            0};
  if (head_dim == 128 && rows == 16)
    return {batch ? decode_split_mma_direct_kernel<128, 2, false, true, kVerify>
                  : decode_split_mma_direct_kernel<128, 2, false, false, kVerify>,
            0};
  if (head_dim == 256 && rows == 8 && !batch && !kVerify)
    return {decode_split_mma_direct_kernel<256, 1, true, false, false>, BulkRing::kBytes};
  return {};
}
DirectInstance direct_kernel(int head_dim, int rows, bool batch, bool verify) {
  return verify ? direct_kernel<true>(head_dim, rows, batch)
                : direct_kernel<false>(head_dim, rows, batch);
}

/// Sets a bulk instance's shared-memory attributes, once per instance and device (they hold for
/// the process; setting them at every launch cost host time on each eager decode).
cudaError_t prepare(const DirectInstance& k) {
  if (k.kernel == nullptr) return cudaErrorInvalidValue;
  if (k.smem == 0) return cudaSuccess;
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::vector<std::pair<const void*, int>> prepared;  // (kernel, device)
  const std::lock_guard<std::mutex> lock(mutex);
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(k.kernel), device};
  if (std::find(prepared.begin(), prepared.end(), key) != prepared.end()) return cudaSuccess;
  if (const cudaError_t err =
          cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem);
      err != cudaSuccess)
    return err;
  // NOTE: the default carveout left room for 2 of the 3 blocks per SM the plan counts on (a
  // second wave: +58% at 128K keys) when the bulk ring was tried at head dim 128.
  if (const cudaError_t err = cudaFuncSetAttribute(
          k.kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
      err != cudaSuccess)
    return err;
  prepared.push_back(key);
  return cudaSuccess;
}

/// The planes of a head dim 256 launch as 2-D tensor maps (rows × row bytes in 2-byte elements)
/// whose box is one warp tile of one head; valid = 0 (every tile by per-row copies) where the
/// driver has no encoder or refuses. The last planes' maps are kept per host thread: they depend
/// only on the planes' addresses and shapes, and encoding them took host time at every launch.
PlaneMaps plane_maps(const SplitParams& sp) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  struct Last {
    const std::uint8_t *k = nullptr, *v = nullptr;
    long long rows = -1, k_tok = 0, v_tok = 0;
    PlaneMaps maps{};
  };
  thread_local Last last;
  if (last.k == sp.k_plane && last.v == sp.v_plane && last.rows == sp.view.rows &&
      last.k_tok == sp.k_tok_bytes && last.v_tok == sp.v_tok_bytes)
    return last.maps;
  PlaneMaps m{};
  if (encode == nullptr) return m;
  auto make = [&](CUtensorMap* map, const std::uint8_t* plane, long long tok, int row_bytes) {
    const cuuint64_t dims[2] = {cuuint64_t(tok / BulkRing::kElem), cuuint64_t(sp.view.rows)};
    const cuuint64_t strides[1] = {cuuint64_t(tok)};
    const cuuint32_t box[2] = {cuuint32_t(row_bytes / BulkRing::kElem), cuuint32_t(kWK)};
    const cuuint32_t unit[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<std::uint8_t*>(plane), dims,
                  strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  m.valid = sp.view.rows >= 1 && make(&m.k, sp.k_plane, sp.k_tok_bytes, BulkRing::kKBytes) &&
            make(&m.v, sp.v_plane, sp.v_tok_bytes, BulkRing::kVBytes);
  last = Last{sp.k_plane, sp.v_plane, sp.view.rows, sp.k_tok_bytes, sp.v_tok_bytes, m};
  return m;
}

}  // namespace

cudaError_t launch_split_mma_direct(const SplitParams& sp, int head_dim, int rows, bool verify,
                                    dim3 grid, cudaStream_t stream) {
  const DirectInstance k = direct_kernel(head_dim, rows, sp.batch.list.slots != nullptr, verify);
  if (const cudaError_t err = prepare(k); err != cudaSuccess) return err;
  const PlaneMaps maps = k.smem > 0 ? plane_maps(sp) : PlaneMaps{};
  k.kernel<<<grid, kThreads, k.smem, stream>>>(sp, maps);
  return cudaGetLastError();
}

cudaError_t split_mma_direct_resident_blocks(int head_dim, int rows, bool verify, int* blocks) {
  const DirectInstance k = direct_kernel(head_dim, rows, false, verify);
  if (const cudaError_t err = prepare(k); err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, k.kernel, kThreads, k.smem);
}

}  // namespace kvlayer::cuda::detail::decode_impl

namespace kvlayer::cuda::detail {
KVLAYER_DEFINE_MUTANT_UNIT(decode_mma_direct)
}  // namespace kvlayer::cuda::detail
