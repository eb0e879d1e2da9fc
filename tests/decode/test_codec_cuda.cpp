// The q8_0 fold on the device (kvlayer/accuracy.hpp (1), fused form): every fp16 d times every
// int8 quant, as the verify kernel's conversion computes it, against the reference's one RNE
// rounding of the exact product; and the predicate that keeps a d out of the fold, against the
// reference's.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "codec_probe.hpp"
#include "cuda_testbed.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/quantize.hpp"

namespace kvlayer::testing {
namespace {

TEST(CodecQ8_0, FoldIsOneRoundingOfDTimesQForEveryScaleAndQuant) {
  KVLAYER_REQUIRE_GPU();
  constexpr std::size_t kPairs = std::size_t(1) << 24;
  DeviceBuffer out(kPairs * 2), wide(1 << 16), differ(sizeof(int));
  // Poisoned: an unwritten element cannot match (0xFFFF is a NaN, compared by bits).
  KVLAYER_CUDA_CHECK(cudaMemset(out.get(), 0xFF, kPairs * 2));
  KVLAYER_CUDA_CHECK(cudaMemset(wide.get(), 0xFF, 1 << 16));
  KVLAYER_CUDA_CHECK(cudaMemset(differ.get(), 0, sizeof(int)));
  KVLAYER_CUDA_CHECK(
      probe_k_fold(out.as<std::uint16_t>(), wide.as<std::uint8_t>(), differ.as<int>()));
  std::vector<std::uint16_t> got(kPairs);
  std::vector<std::uint8_t> got_wide(1 << 16);
  int halves_differ = -1;
  KVLAYER_CUDA_CHECK(cudaMemcpy(got.data(), out.get(), kPairs * 2, cudaMemcpyDeviceToHost));
  KVLAYER_CUDA_CHECK(cudaMemcpy(got_wide.data(), wide.get(), 1 << 16, cudaMemcpyDeviceToHost));
  KVLAYER_CUDA_CHECK(cudaMemcpy(&halves_differ, differ.get(), sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(halves_differ, 0);

  std::int64_t mismatches = 0, folded = 0, subnormal = 0;
  std::array<std::uint8_t, kQ8_0BlockBytes> block{};
  for (std::uint32_t d = 0; d < (1u << 16); ++d) {
    block[0] = std::uint8_t(d & 0xff);
    block[1] = std::uint8_t(d >> 8);
    const bool want_wide = ref::q8_0_header_may_be_wide(block);
    ASSERT_EQ(got_wide[d], want_wide ? 1 : 0) << "d bits 0x" << std::hex << d;
    const float df = f16_bits_to_f32(std::uint16_t(d));
    for (int q = -128; q < 128; ++q) {
      const std::uint16_t g = got[std::size_t(d) * 256 + std::size_t(q + 128)];
      // d·q is exact in f32 (11 × 8 significant bits): f32_to_f16_bits rounds it once.
      const std::uint16_t want = f32_to_f16_bits(df * float(q));
      const bool both_nan = std::isnan(f16_bits_to_f32(g)) && std::isnan(df * float(q));
      if (g != want && !both_nan && mismatches++ < 5)
        ADD_FAILURE() << "d bits 0x" << std::hex << d << std::dec << " q " << q << ": got 0x"
                      << std::hex << g << ", want 0x" << want;
      if (!want_wide) {
        ++folded;
        const double x = std::fabs(f16_bits_to_f32(want));
        subnormal += x > 0 && x < std::ldexp(1.0, -14);
        // The fold's premise: no product of a d kept in the fold leaves fp16's range.
        ASSERT_TRUE(std::isfinite(f16_bits_to_f32(want))) << d << " " << q;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  // What the sweep reached: every d in the fold, subnormal results included.
  std::printf("  %lld folded products (d within the fold), %lld of them fp16 subnormals\n",
              static_cast<long long>(folded), static_cast<long long>(subnormal));
  EXPECT_GT(subnormal, 0);
  // 0x5fff = 511.75 is the last magnitude in the fold, 0x6000 = 512 the first out of it.
  EXPECT_EQ(got_wide[0x5fff], 0);
  EXPECT_EQ(got_wide[0xdfff], 0);
  EXPECT_EQ(got_wide[0x6000], 1);
  EXPECT_EQ(got_wide[0x7c00], 1);  // inf
  EXPECT_EQ(got_wide[0x7e00], 1);  // NaN
}

}  // namespace
}  // namespace kvlayer::testing
