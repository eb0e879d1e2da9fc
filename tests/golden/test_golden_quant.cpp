// Reference quantizers vs the NumPy golden bytes (SPEC §2-3, §10.2): every block bit for bit,
// every bad block reported with the right block and value.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <span>

#include "golden_data.hpp"
#include "kvlayer/golden/check.hpp"
#include "kvlayer/reference/quantize.hpp"

namespace kvlayer::testing {
namespace {

using kvlayer::golden::QuantCase;
using kvlayer::golden::QuantFormat;
using kvlayer::ref::BlockType;

struct QuantParam {
  std::size_t case_index, format_index;
  std::string name;
};

std::vector<QuantParam> quant_params() {
  std::vector<QuantParam> out;
  if (const auto* set = golden_set())
    for (std::size_t c = 0; c < set->quant.size(); ++c)
      for (std::size_t f = 0; f < set->quant[c].formats.size(); ++f)
        out.push_back({c, f,
                       set->quant[c].name + "_" +
                           (set->quant[c].formats[f].type == BlockType::q8_0 ? "q8_0" : "q5_1")});
  return out;
}

class GoldenQuant : public ::testing::TestWithParam<QuantParam> {
 protected:
  const QuantCase& c() const { return golden_set()->quant[GetParam().case_index]; }
  const QuantFormat& f() const { return c().formats[GetParam().format_index]; }
};

/// The reference's bytes for block b of the case.
std::vector<std::uint8_t> quantize_block(const QuantCase& c, BlockType t, std::int64_t b,
                                         std::optional<float>& reported) {
  std::span<const float, kvlayer::kBlockValues> in(c.input.data() + b * kvlayer::kBlockValues,
                                                   kvlayer::kBlockValues);
  std::vector<std::uint8_t> out(std::size_t(kvlayer::ref::block_bytes(t)));
  if (t == BlockType::q8_0)
    reported = kvlayer::ref::quantize_q8_0_block(
        in,
        std::span<std::uint8_t, kvlayer::kQ8_0BlockBytes>(out.data(), kvlayer::kQ8_0BlockBytes));
  else
    reported = kvlayer::ref::quantize_q5_1_block(
        in,
        std::span<std::uint8_t, kvlayer::kQ5_1BlockBytes>(out.data(), kvlayer::kQ5_1BlockBytes));
  return out;
}

TEST_P(GoldenQuant, EveryBlockBitForBit) {
  const std::size_t bb = std::size_t(kvlayer::ref::block_bytes(f().type));
  ASSERT_GT(c().blocks, 0);
  ASSERT_EQ(f().expected.size(), std::size_t(c().blocks) * bb);
  for (std::int64_t b = 0; b < c().blocks; ++b) {
    std::optional<float> reported;
    const auto got = quantize_block(c(), f().type, b, reported);
    const std::vector<std::uint8_t> want(f().expected.begin() + std::ptrdiff_t(b * bb),
                                         f().expected.begin() + std::ptrdiff_t((b + 1) * bb));
    EXPECT_EQ(got, want) << c().name << " block " << b;
  }
}

TEST_P(GoldenQuant, BadBlocksReportedWithBlockAndValue) {
  std::size_t next = 0;
  for (std::int64_t b = 0; b < c().blocks; ++b) {
    std::optional<float> reported;
    quantize_block(c(), f().type, b, reported);
    const bool expect_bad = next < f().bad_blocks.size() && f().bad_blocks[next].block == b;
    ASSERT_EQ(reported.has_value(), expect_bad) << c().name << " block " << b;
    if (!expect_bad) continue;
    const float want = f().bad_blocks[next++].value();
    // NaN payloads are not part of the contract; every other value must match bit for bit.
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(*reported)) << "block " << b;
    else
      EXPECT_EQ(std::bit_cast<std::uint32_t>(*reported), std::bit_cast<std::uint32_t>(want))
          << "block " << b << ": reported " << *reported << ", golden " << want;
  }
  EXPECT_EQ(next, f().bad_blocks.size());
}

TEST_P(GoldenQuant, RowQuantizerMatchesAndReportsFirstBadBlock) {
  std::vector<std::uint8_t> row(f().expected.size(), 0xAB);  // poisoned: every byte must be written
  const auto first = kvlayer::ref::quantize_row(f().type, c().input, row);
  EXPECT_EQ(row, f().expected);
  ASSERT_EQ(first.has_value(), !f().bad_blocks.empty());
  if (first) {
    EXPECT_EQ(first->block, f().bad_blocks.front().block);
  }
}

TEST_P(GoldenQuant, CheckerAgrees) {
  const auto r = kvlayer::golden::check_quant(c(), f());
  EXPECT_TRUE(r.pass()) << (r.failures.empty() ? "" : r.failures.front());
  EXPECT_EQ(r.blocks, c().blocks);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenQuant, ::testing::ValuesIn(quant_params()),
                         [](const auto& info) { return info.param.name; });

TEST(GoldenQuantData, CoversTheSpecialCases) {
  const auto* set = golden_set();
  ASSERT_NE(set, nullptr) << load_error();
  std::int64_t bad8 = 0, bad5 = 0, degenerate = 0, nonzero_inputs = 0;
  for (const auto& c : set->quant) {
    for (float v : c.input) nonzero_inputs += v != 0;
    for (const auto& f : c.formats) {
      (f.type == BlockType::q8_0 ? bad8 : bad5) += std::int64_t(f.bad_blocks.size());
      degenerate += std::int64_t(f.degenerate_blocks.size());
    }
  }
  EXPECT_GE(set->quant.size(), 10u);
  EXPECT_GT(bad8, 5);
  EXPECT_GT(bad5, 5);
  EXPECT_GT(degenerate, 5);
  EXPECT_GT(nonzero_inputs, 5000);  // never a test over zeros only
}

// The checker must be able to fail: corrupt a copy of a case and see each defect reported.
TEST(GoldenQuantChecker, DetectsCorruptedBytesAndReports) {
  const auto* set = golden_set();
  ASSERT_NE(set, nullptr) << load_error();
  const QuantCase* bad_case = nullptr;
  for (const auto& c : set->quant)
    if (c.name == "bad") bad_case = &c;
  ASSERT_NE(bad_case, nullptr);
  for (const auto& f : bad_case->formats) {
    ASSERT_FALSE(f.bad_blocks.empty());
    {
      QuantFormat g = f;
      g.expected[std::size_t(g.expected.size() - 1)] ^= 0x01;  // last quant byte of the last block
      const auto r = kvlayer::golden::check_quant(*bad_case, g);
      EXPECT_FALSE(r.pass());
      EXPECT_EQ(r.mismatched_blocks, 2);  // that block, and the row quantizer's bytes
    }
    {
      QuantFormat g = f;
      for (auto& b : g.bad_blocks)
        if (!std::isnan(b.value())) {
          b.value_bits ^= 1;  // one ulp off
          break;
        }
      EXPECT_GE(kvlayer::golden::check_quant(*bad_case, g).bad_misreported, 1);
    }
    {
      QuantFormat g = f;
      g.bad_blocks.erase(g.bad_blocks.begin());  // the reference reports a block golden does not
      EXPECT_EQ(kvlayer::golden::check_quant(*bad_case, g).bad_misreported, 2);
    }
  }
}

}  // namespace
}  // namespace kvlayer::testing
