// The wgmma verify's fp16 operands (cuda/src/decode/wgmma_operand_layout.hpp) against the
// canonical shared-memory layouts of the PTX ISA (9.7.15.5.1, 128-byte swizzle), on the host:
// every element a wgmma reads as B through the kernel's descriptors must be the element the
// conversion stored there. Written from the layouts' definition, not from the kernel's formulas.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "decode/wgmma_operand_layout.hpp"

namespace kvlayer::testing {
namespace {

using Operand = cuda::detail::decode_impl::WgmmaOperand;
using cuda::detail::decode_impl::wgmma_desc_sw128_bits;

/// A 1024-aligned operand base that is not 0, so that absolute addresses are exercised.
constexpr std::uint32_t kBase = 9 * 1024;

/// The fields of a descriptor, in bytes.
struct Descriptor {
  std::uint32_t start;
  int lbo, sbo, base_offset, swizzle;
};

Descriptor fields(std::uint64_t d) {
  return {std::uint32_t(d & 0x3FFF) << 4, int((d >> 16) & 0x3FFF) << 4,
          int((d >> 32) & 0x3FFF) << 4, int((d >> 49) & 7), int(d >> 62)};
}

/// The 128-byte swizzle: an address's 16-byte chunk bits [4, 7) XOR its 128-byte row bits
/// [7, 10).
std::uint32_t swizzle128(std::uint32_t a) {
  return a ^ (((a >> 7) & 7) << 4);
}

/// B's element (n, k) of one k16 step, 16-bit values, K-major with the 128-byte swizzle: each n
/// a 128-byte row holding its k contiguously, rows in groups of 8 (a 1024-byte atom), groups the
/// stride offset apart.
std::uint32_t k_major(const Descriptor& d, int n, int k) {
  return swizzle128(d.start + (n / 8) * d.sbo + (n % 8) * 128 + 2 * k);
}

/// MN-major with the 128-byte swizzle: n contiguous in runs of 64 (128 bytes), runs the leading
/// offset apart; each k a 128-byte row, rows in groups of 8, groups the stride offset apart.
std::uint32_t mn_major(const Descriptor& d, int n, int k) {
  return swizzle128(d.start + (n / 64) * d.lbo + 2 * (n % 64) + (k / 8) * d.sbo + (k % 8) * 128);
}

/// Where the conversion stores dim `dim` of `key`.
std::uint32_t stored(int key, int dim) {
  return kBase + Operand::chunk(key, dim / 8) + 2 * (dim % 8);
}

TEST(WgmmaOperandLayout, EveryValueHasItsOwnSlotInsideTheOperand) {
  std::set<std::uint32_t> slots;
  for (int key = 0; key < Operand::kKeys; ++key)
    for (int dim = 0; dim < Operand::kDims; ++dim) {
      const std::uint32_t a = stored(key, dim);
      ASSERT_GE(a, kBase);
      ASSERT_LT(a, kBase + Operand::kBytes);
      slots.insert(a);
    }
  EXPECT_EQ(slots.size(), std::size_t(Operand::kKeys) * Operand::kDims);  // 2 bytes each
  EXPECT_EQ(Operand::kBytes, Operand::kKeys * Operand::kDims * 2);
}

TEST(WgmmaOperandLayout, DescriptorFieldsAreEncoded) {
  const Descriptor k = fields(wgmma_desc_sw128_bits(kBase + Operand::k_start(7), 16, 1024));
  EXPECT_EQ(k.start, kBase + Operand::k_start(7));
  EXPECT_EQ(k.lbo, 16);
  EXPECT_EQ(k.sbo, 1024);
  EXPECT_EQ(k.base_offset, 0);
  EXPECT_EQ(k.swizzle, 1);  // 128-byte swizzle
  const Descriptor v =
      fields(wgmma_desc_sw128_bits(kBase + Operand::v_start(3), Operand::kVLbo, Operand::kVSbo));
  EXPECT_EQ(v.start, kBase + Operand::v_start(3));
  EXPECT_EQ(v.lbo, Operand::kVLbo);  // 14 bits of 16-byte units hold it
  EXPECT_EQ(v.sbo, Operand::kVSbo);
  // The highest shared address a block of 227 KiB has still fits the start field.
  EXPECT_EQ(fields(wgmma_desc_sw128_bits(227 * 1024 - 16, 16, 16)).start, 227u * 1024 - 16);
}

// S = Q̃·K̃ᵀ: k16 step ks reads B (k16 × n64) = dims 16ks … 16ks + 15 of keys 0 … 63, K-major.
TEST(WgmmaOperandLayout, QkStepsReadTheKeysDims) {
  int checked = 0;
  for (int ks = 0; ks < Operand::kDims / 16; ++ks) {
    const Descriptor d =
        fields(wgmma_desc_sw128_bits(kBase + Operand::k_start(ks), Operand::kKLbo, Operand::kKSbo));
    for (int n = 0; n < Operand::kKeys; ++n)
      for (int k = 0; k < 16; ++k, ++checked)
        ASSERT_EQ(k_major(d, n, k), stored(n, 16 * ks + k))
            << "ks " << ks << " n " << n << " k " << k;
  }
  EXPECT_EQ(checked, Operand::kKeys * Operand::kDims);
}

// O += P̃·Ṽ: k16 step ks reads B (k16 × n128) = dims 0 … 127 of keys 16ks … 16ks + 15, MN-major.
TEST(WgmmaOperandLayout, PvStepsReadTheKeysValues) {
  int checked = 0;
  for (int ks = 0; ks < Operand::kKeys / 16; ++ks) {
    const Descriptor d =
        fields(wgmma_desc_sw128_bits(kBase + Operand::v_start(ks), Operand::kVLbo, Operand::kVSbo));
    for (int n = 0; n < Operand::kDims; ++n)
      for (int k = 0; k < 16; ++k, ++checked)
        ASSERT_EQ(mn_major(d, n, k), stored(16 * ks + k, n))
            << "ks " << ks << " n " << n << " k " << k;
  }
  EXPECT_EQ(checked, Operand::kKeys * Operand::kDims);
}

// The check tells the two offsets apart: PV's descriptor with them swapped reads other values.
TEST(WgmmaOperandLayout, SwappedPvOffsetsAreCaught) {
  const Descriptor d =
      fields(wgmma_desc_sw128_bits(kBase + Operand::v_start(1), Operand::kVSbo, Operand::kVLbo));
  int wrong = 0;
  for (int n = 0; n < Operand::kDims; ++n)
    for (int k = 0; k < 16; ++k) wrong += mn_major(d, n, k) != stored(16 + k, n);
  // Dims past 64 of keys 8 … 15 of the step land where the swap reads them; so do the first 64
  // dims of its first 8 keys; the other half do not.
  EXPECT_EQ(wrong, Operand::kDims * 16 / 2);
}

}  // namespace
}  // namespace kvlayer::testing
