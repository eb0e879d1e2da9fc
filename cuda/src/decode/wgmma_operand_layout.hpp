// The shared-memory layout of decode_wgmma_verify.cu's fp16 operands and the wgmma descriptors
// that read it, for host and device: the kernel stores and reads with these, and a host test
// (tests/decode/test_wgmma_operand_layout.cpp) checks them against the canonical layouts of the
// PTX ISA (9.7.15.5.1), element by element, without a GPU.
#pragma once

#include <cuda_runtime_api.h>  // __host__/__device__ for host compilers too

#include <cstdint>

#include "decode/partition.hpp"

namespace kvlayer::cuda::detail::decode_impl {

/// One tile's K̃ or Ṽ (kWgmmaVerifyTileKeys keys × 128 dims, fp16): [dim atom 0, 1][key][128
/// bytes], each key's 64 dims of an atom as 8 16-byte chunks, chunk c stored at c ^ (key % 8)
/// (the 128-byte swizzle; the operand's base is 1024-aligned). Read as B of S = Q̃·K̃ᵀ it is
/// K-major (k = dims); as B of O += P̃·Ṽ it is MN-major (n = dims), with no second copy.
struct WgmmaOperand {
  static constexpr int kKeys = kWgmmaVerifyTileKeys;
  static constexpr int kDims = 128;
  static constexpr int kAtomBytes = kKeys * 128;  ///< 64 dims of every key
  static constexpr int kBytes = 2 * kAtomBytes;

  /// Byte offset of the 16-byte chunk of dims 8c … 8c + 7 of `key`.
  __host__ __device__ static constexpr int chunk(int key, int c) {
    return (c >> 3) * kAtomBytes + key * 128 + (((c & 7) ^ (key & 7)) << 4);
  }

  /// B of QK at k16 step ks (dims 16ks … 16ks + 15): the start's offset; K-major, 8-key groups
  /// kSbo bytes apart (with swizzling the leading offset is not used; 16 is its conventional 1).
  __host__ __device__ static constexpr int k_start(int ks) {
    return (ks >> 2) * kAtomBytes + (ks & 3) * 32;
  }
  static constexpr int kKLbo = 16, kKSbo = 1024;

  /// B of PV at k16 step ks (keys 16ks … 16ks + 15): the start's offset; MN-major, the two
  /// 64-dim atoms kVLbo bytes apart (leading offset), 8-key groups kVSbo apart (stride offset).
  __host__ __device__ static constexpr int v_start(int ks) { return ks * 2048; }
  static constexpr int kVLbo = kAtomBytes, kVSbo = 1024;
};

/// A wgmma shared-memory descriptor with the 128-byte swizzle (PTX ISA 9.7.15.5.1.2): shared
/// address >> 4 in bits 0–13, leading byte offset >> 4 in 16–29, stride byte offset >> 4 in
/// 32–45, base offset 0 in 49–51 (the swizzle atoms are 1024-aligned), mode 1 in 62–63.
__host__ __device__ constexpr std::uint64_t wgmma_desc_sw128_bits(std::uint32_t smem_address,
                                                                  int lbo, int sbo) {
  return ((smem_address & 0x3FFFF) >> 4) | (std::uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3FFF) << 32) | (std::uint64_t(1) << 62);
}

}  // namespace kvlayer::cuda::detail::decode_impl
