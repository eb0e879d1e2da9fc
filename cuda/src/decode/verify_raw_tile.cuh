// A verify block's raw tile (decode_mma_verify.cu, decode_wgmma_verify.cu): its shape in shared
// memory, its cp.async copy, and its K and V blocks decoded to fp16 words (K exact or with d
// folded in, accuracy.hpp (1); V by one HFMA2, (3)), each kernel storing the words in its own
// operand layout.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cp_async.cuh"
#include "decode/codec_q5_1.cuh"
#include "decode/codec_q8_0.cuh"
#include "decode/mma_fragments.cuh"
#include "decode/partition.hpp"
#include "decode/softmax_state.cuh"
#include "kvlayer/block_format.hpp"

namespace kvlayer::cuda::detail::decode_impl {

/// Raw stages: tile i + 1 is copied while tile i is converted and computed (the conversion,
/// not the copy, is the long pole, so a third stage buys nothing).
inline constexpr int kVerifyStages = 2;

/// Compile-time layout of one head dim. Shared memory (bytes): raw stages [kVerifyStages] (K
/// rows, then V rows), then one fp16 stage: K̃ (or exact K quants), V values, K scales (an fp16
/// per block and key, for exact quants only). The final merge reuses all of it.
template <int D>
struct VerifyShape {
  static_assert(D == 128 || D == 256, "decode_mma_verify.cu serves head dims 128 and 256");
  static constexpr int kBlocks = D / 32;
  static constexpr int kKBytes = k_head_bytes(D);    ///< raw K span of a head in a row
  static constexpr int kVBytes = v_head_bytes(D);    ///< raw V span of a head in a row
  static constexpr int kTile = verify_tile_keys(D);  ///< keys per block tile
  static constexpr int kMTiles = kTile / 16;         ///< 16-key m-tiles per tile
  static constexpr int kGroupRows = verify_group_rows(D);
  static constexpr int kNTiles = kGroupRows / 8;  ///< 8-row n-tiles per warp
  static constexpr int kDimTiles = D / 16;        ///< 16-dim m-tiles of PV, k-steps of QK
  static constexpr int kF16Stride = 2 * D + 16;   ///< fp16 row (bytes): 4·odd words
  /// Raw V row stride (bytes): a multiple of 16 whose word count is 4·odd, so that the 8-byte
  /// header loads of 8 consecutive keys hit 8 bank pairs (96 B would put keys 4 apart on the
  /// same banks).
  static constexpr int kVStride = D == 128 ? 112 : 208;
  static constexpr int kRawK = kTile * kKBytes;
  static constexpr int kRawStage = kRawK + kTile * kVStride;
  static constexpr int kKf = kVerifyStages * kRawStage;
  static constexpr int kVf = kKf + kTile * kF16Stride;
  static constexpr int kKd = kVf + kTile * kF16Stride;
  static constexpr int kBytes = kKd + kTile * kBlocks * 2;
  static constexpr int kOStride = D + 4;  ///< merge staging row (floats)
  static constexpr int kMergeBytes = WarpMergeScratch<kDecodeMmaWarps>::bytes(kGroupRows, kOStride);
  static_assert((kF16Stride / 4) % 8 == 4 && kF16Stride % 16 == 0);
  static_assert(kVStride % 16 == 0 && kVStride >= kVBytes && (kVStride / 4) % 8 == 4);
  static_assert(kRawStage % 16 == 0 && kMergeBytes <= kBytes);
};

/// Copies the raw K and V rows of `valid` keys from row0 (physical) into a raw stage: K in
/// 8-byte pieces (a head's span is 8-byte aligned), V in 16-byte pieces, by kThreads threads.
template <int D, int kThreads = kDecodeThreads>
__device__ __forceinline__ void copy_raw_tile(std::uint8_t* stage, const std::uint8_t* k_head,
                                              const std::uint8_t* v_head, long long row0,
                                              long long k_tok, long long v_tok, int valid) {
  const std::uint8_t* ks = k_head + row0 * k_tok;
  const std::uint8_t* vs = v_head + row0 * v_tok;
  using S = VerifyShape<D>;
  constexpr int kKPieces = S::kKBytes / 8, kVPieces = S::kVBytes / 16;
  for (int c = threadIdx.x; c < valid * kKPieces; c += kThreads) {
    const int key = c / kKPieces, piece = c % kKPieces;
    cp_async<8>(stage + key * S::kKBytes + 8 * piece, ks + key * k_tok + 8 * piece);
  }
  for (int c = threadIdx.x; c < valid * kVPieces; c += kThreads) {
    const int key = c / kVPieces, piece = c % kVPieces;
    cp_async<16>(stage + S::kRawK + key * S::kVStride + 16 * piece, vs + key * v_tok + 16 * piece);
  }
}

/// Flags of a tile's conversion, or-ed over the block by the barrier that ends it.
inline constexpr int kWideV = 1;  ///< a V block may leave fp16's range or is not finite
inline constexpr int kWideK = 2;  ///< a K block's d is beyond the fold (k_header_maybe_wide)

/// K block b of a key in a raw stage (kb: its first byte, d at byte 0, the 32 quants after it)
/// as 8 words of int8 quants; returns d's fp16 bits. kEven: an even block, 4-byte aligned (the
/// quants at 2 mod 4, funnelled from 9 words); odd blocks have their quants aligned.
template <bool kEven>
__device__ __forceinline__ unsigned load_k_block(const std::uint8_t* kb, unsigned (&qw)[8]) {
  if constexpr (kEven) {
    const unsigned* w = reinterpret_cast<const unsigned*>(kb);
    unsigned x[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) x[i] = w[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) qw[i] = __byte_perm(x[i], x[i + 1], 0x5432);
    return x[0] & 0xffffu;
  } else {
    const unsigned* w = reinterpret_cast<const unsigned*>(kb + 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) qw[i] = w[i];
    return *reinterpret_cast<const unsigned short*>(kb);
  }
}

/// One thread's share of a tile's conversion by kThreads threads: key threadIdx.x % kTile and
/// the 32-value blocks block(j) = threadIdx.x / kTile + kBStep·j, j < kPerThread (a warp's
/// blocks share their parity, and with it the K alignment).
template <int D, int kThreads = kDecodeThreads>
struct ConvertShare {
  using S = VerifyShape<D>;
  static constexpr int kBStep = kThreads / S::kTile;
  static constexpr int kPerThread = S::kBlocks / kBStep;
  static_assert(kPerThread * kBStep == S::kBlocks && kBStep % 2 == 0);
  const int key = threadIdx.x % S::kTile, b0 = threadIdx.x / S::kTile;
  __device__ __forceinline__ int block(int j) const { return b0 + kBStep * j; }
  /// K block block(j) of the key in a raw stage: its quants as words (qw), its d (returned).
  __device__ __forceinline__ unsigned load_k(const std::uint8_t* raw, int j,
                                             unsigned (&qw)[8]) const {
    const std::uint8_t* kb = raw + key * S::kKBytes + kQ8_0BlockBytes * block(j);
    return (b0 & 1) == 0 ? load_k_block<true>(kb, qw) : load_k_block<false>(kb, qw);
  }
};

/// K block b's 32 quants as 16 fp16x2 words, dims in order (words 4c … 4c + 3: the 16-byte
/// chunk c of dims 8c … 8c + 7): exact (kFold false), or K̃ = fp16(d·q) with d's bits d_bits
/// (accuracy.hpp (1)).
template <bool kFold>
__device__ __forceinline__ void k_block_words(const unsigned (&qw)[8], unsigned d_bits,
                                              unsigned (&w)[16]) {
  const auto f16 = [&](unsigned u, int h) {
    const unsigned q2 = int8_pair_to_f16x2(u, h);
    return kFold ? k_fold_f16x2(q2, d_bits) : q2;
  };
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const unsigned u0 = qw[2 * c] ^ 0x80808080u, u1 = qw[2 * c + 1] ^ 0x80808080u;
    w[4 * c] = f16(u0, 0);
    w[4 * c + 1] = f16(u0, 1);
    w[4 * c + 2] = f16(u1, 0);
    w[4 * c + 3] = f16(u1, 1);
  }
}

/// K block b's 32 quants into its 64-byte slot of a key's fp16 row (k_block_words).
template <bool kFold>
__device__ __forceinline__ void store_k_block(std::uint8_t* slot, const unsigned (&qw)[8],
                                              unsigned d_bits) {
  unsigned w[16];
  k_block_words<kFold>(qw, d_bits, w);
#pragma unroll
  for (int c = 0; c < 4; ++c)
    *reinterpret_cast<uint4*>(slot + 16 * c) =
        make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
}

/// V block b of a key in a raw stage as 16 fp16x2 words, dims in order (as k_block_words);
/// returns whether its header may leave fp16's range or is not finite (v_header_maybe_wide).
template <int D>
__device__ __forceinline__ bool v_block_words(const std::uint8_t* raw, int key, int b,
                                              unsigned (&v)[16]) {
  // ---- V block b (d | m << 16, qh, 16 qs bytes): quant j < 16 is the low nibble of qs[j],
  // j ≥ 16 the high nibble of qs[j − 16], bit j of qh its fifth bit. The pair (j, j + 1) as
  // fp16x2: 1024 + q (nibble in bits 0..3, fifth bit in bit 4) or 64 + q (nibble in bits
  // 4..7, fifth bit in bit 8), minus the bias exactly, then d·q + m rounded once (HFMA2).
  using S = VerifyShape<D>;
  const std::uint8_t* vb = raw + S::kRawK + key * S::kVStride + kQ5_1BlockBytes * b;
  const uint2 hdr = q5_1_header(vb);
  const uint2 qa = *reinterpret_cast<const uint2*>(vb + kQ5_1Nibbles);
  const uint2 qb2 = *reinterpret_cast<const uint2*>(vb + kQ5_1Nibbles + 8);
  const __half2 d2 = as_h2(__byte_perm(hdr.x, hdr.x, 0x1010));
  const __half2 m2 = as_h2(__byte_perm(hdr.x, hdr.x, 0x3232));
  // Fifth bits j and j + 1 (j even) at bits j and j + 16 of y (low quants), of y_hi (high).
  const unsigned lo16 = hdr.y & 0xffffu, hi16 = hdr.y >> 16;
  const unsigned y_lo = lo16 | (lo16 << 15), y_hi = hi16 | (hi16 << 15);
  const unsigned qs[4] = {qa.x, qa.y, qb2.x, qb2.y};
  const auto pair = [&](auto i_c) {
    constexpr int i = decltype(i_c)::value;  // quants 2i, 2i + 1 and 16 + 2i, 17 + 2i
    const unsigned bytes = __byte_perm(qs[i / 2], 0u, (i & 1) ? 0x4342u : 0x4140u);
    v[i] = h2_bits(__hfma2(d2, v_quant_f16x2<0, 2 * i>(bytes, y_lo, 0x64006400u), m2));
    v[8 + i] = h2_bits(__hfma2(d2, v_quant_f16x2<4, 2 * i>(bytes, y_hi, 0x54005400u), m2));
  };
  pair(std::integral_constant<int, 0>{});
  pair(std::integral_constant<int, 1>{});
  pair(std::integral_constant<int, 2>{});
  pair(std::integral_constant<int, 3>{});
  pair(std::integral_constant<int, 4>{});
  pair(std::integral_constant<int, 5>{});
  pair(std::integral_constant<int, 6>{});
  pair(std::integral_constant<int, 7>{});
  return v_header_maybe_wide(hdr.x);
}

/// V block b of a key in a raw stage into its 64-byte slot of the key's fp16 row (v_block_words);
/// returns whether its header may leave fp16's range or is not finite.
template <int D>
__device__ __forceinline__ bool convert_v_block(std::uint8_t* slot, const std::uint8_t* raw,
                                                int key, int b) {
  unsigned v[16];
  const bool wide = v_block_words<D>(raw, key, b, v);
#pragma unroll
  for (int c = 0; c < 4; ++c)
    *reinterpret_cast<uint4*>(slot + 16 * c) =
        make_uint4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
  return wide;
}

/// The exact f32 value of V (key, dim) from a raw stage (SPEC §4: d·q + m in f32).
template <int D>
__device__ __forceinline__ float v_exact(const std::uint8_t* raw, int key, int dim) {
  using S = VerifyShape<D>;
  const std::uint8_t* blk = raw + S::kRawK + key * S::kVStride + kQ5_1BlockBytes * (dim / 32);
  const int j = dim % 32;
  const unsigned dm = *reinterpret_cast<const unsigned*>(blk);
  const unsigned qh = *reinterpret_cast<const unsigned*>(blk + 4);
  const unsigned byte = blk[kQ5_1Nibbles + (j & 15)];
  const unsigned q = ((j < 16 ? byte : byte >> 4) & 0xfu) | (((qh >> j) & 1u) << 4);
  return __fadd_rn(__fmul_rn(f16_bits(dm & 0xffffu), float(q)), f16_bits(dm >> 16));
}

}  // namespace kvlayer::cuda::detail::decode_impl
