// Reference KvLayer vs the NumPy golden decode cases (SPEC §5-8): the state after every
// append/rewind (including refusals), the final K/V planes byte for byte (so ring rebases are
// checked byte for byte), the sticky data error, and every decode output within the bound
// derived in kvlayer/golden/check.hpp (float64 vs float64: summation order only).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "golden_data.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/golden/check.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::testing {
namespace {

using kvlayer::golden::DecodeCase;
using kvlayer::golden::GoldenOp;

std::vector<std::string> decode_names() {
  const auto* set = golden_set();
  return set != nullptr ? case_names(set->decode) : std::vector<std::string>{};
}

const DecodeCase& find_case(const std::string& name) {
  return find_named(golden_set()->decode, name, "decode");
}

class GoldenDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenDecode, ReplayMatches) {
  const DecodeCase& c = find_case(GetParam());
  const auto r = kvlayer::golden::check_decode(c);
  EXPECT_TRUE(r.pass()) << joined(r.failures);
  EXPECT_EQ(r.op_failures, 0);
  EXPECT_EQ(r.plane_byte_mismatches, 0);
  EXPECT_EQ(r.output_failures, 0);
  EXPECT_LE(r.max_error_ratio, 1.0);
  // Non-vacuous: the case exercised ops, planes and outputs.
  EXPECT_EQ(r.ops, std::int64_t(c.ops.size()));
  EXPECT_GT(r.plane_bytes, 0);
  EXPECT_GT(r.outputs_compared, 0);
}

// Independent of the checker: replay directly and compare the final planes and counters.
TEST_P(GoldenDecode, FinalPlanesByteForByte) {
  const DecodeCase& c = find_case(GetParam());
  kvlayer::ref::KvLayer layer(c.geometry);
  for (const GoldenOp& op : c.ops) {
    try {
      if (op.kind == GoldenOp::Kind::append)
        layer.append({c.k_row(op.src_row), c.v_row(op.src_row), op.n, c.input_dtype});
      else
        layer.rewind(op.to);
      EXPECT_TRUE(op.expect_ok) << op.describe() << " was accepted";
    } catch (const kvlayer::Error& e) {
      EXPECT_FALSE(op.expect_ok) << op.describe() << ": " << e.what();
      EXPECT_EQ(e.kind(), kvlayer::ErrorKind::refused);
    }
    ASSERT_EQ(layer.len(), op.len) << op.describe();
    ASSERT_EQ(layer.base(), op.base) << op.describe();
  }
  EXPECT_EQ(layer.len(), c.final_len);
  EXPECT_EQ(layer.base(), c.final_base);
  EXPECT_EQ(layer.rows(), std::int64_t(c.k_plane.size()) / c.geometry.k_tok_bytes());
  EXPECT_TRUE(layer.k_plane() == c.k_plane) << "K plane differs";
  EXPECT_TRUE(layer.v_plane() == c.v_plane) << "V plane differs";
  // Never compare mostly-zero planes: the rows ever written hold random data, so most of
  // their bytes are non-zero.
  std::int64_t high_water = 0, nonzero = 0;
  for (const GoldenOp& op : c.ops) high_water = std::max(high_water, op.len - op.base);
  for (auto b : c.k_plane) nonzero += b != 0;
  EXPECT_GT(nonzero, high_water * c.geometry.k_tok_bytes() / 2);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenDecode, ::testing::ValuesIn(decode_names()),
                         [](const auto& info) { return info.param; });

TEST(GoldenDecodeData, CoversTheGeometries) {
  const auto* set = golden_set();
  ASSERT_NE(set, nullptr) << load_error();
  std::set<int> head_dims, gqas;
  int rings = 0, windowed_flat = 0, rebased = 0, refused = 0, refused_decodes = 0, bad = 0;
  for (const auto& c : set->decode) {
    head_dims.insert(c.head_dim());
    gqas.insert(c.gqa);
    rings += c.geometry.is_ring();
    windowed_flat += !c.geometry.is_ring() && c.geometry.window.has_value();
    rebased += c.final_base > 0;
    bad += c.data_error.has_value();
    for (const auto& op : c.ops) {
      refused += !op.expect_ok;
      refused_decodes += !op.decode_ok;
    }
  }
  EXPECT_EQ(head_dims, (std::set<int>{64, 128, 256}));
  EXPECT_EQ(gqas, (std::set<int>{1, 4, 8}));
  EXPECT_GE(rings, 4);
  EXPECT_GE(windowed_flat, 2);
  EXPECT_GE(rebased, 4);
  EXPECT_GE(refused, 5);
  EXPECT_GE(refused_decodes, 2);
  EXPECT_GE(bad, 2);
}

// ---- The checker must be able to fail -------------------------------------------------------

const DecodeCase& ring_case() {
  return find_case("ring_hd64_gqa1");
}

TEST(GoldenDecodeChecker, DetectsAPlaneByte) {
  DecodeCase c = ring_case();
  c.k_plane[c.k_plane.size() / 2] ^= 0x10;
  const auto r = kvlayer::golden::check_decode(c);
  EXPECT_FALSE(r.pass());
  EXPECT_EQ(r.plane_byte_mismatches, 1);
  EXPECT_EQ(r.op_failures, 0);
}

TEST(GoldenDecodeChecker, DetectsAnOutputJustOutsideTheBound) {
  DecodeCase c = ring_case();
  const std::size_t op = 3, per_op = std::size_t(c.n_q_heads) * std::size_t(c.head_dim());
  ASSERT_TRUE(c.ops[op].decode_ok);
  const std::size_t e = op * per_op + 5;
  const double tol = kvlayer::golden::decode_tolerance(
      c.magnitudes[e], c.score_magnitudes[op * std::size_t(c.n_q_heads)], c.head_dim(),
      c.view_length(op));
  ASSERT_GT(tol, 0);
  // The real error is far below the bound, so moving golden by 2x the bound must fail.
  c.outputs[e] += 2 * tol;
  const auto r = kvlayer::golden::check_decode(c);
  EXPECT_EQ(r.output_failures, 1);
  EXPECT_GT(r.max_error_ratio, 1.0);
}

TEST(GoldenDecodeChecker, DetectsStateRefusalAndDataErrorMismatches) {
  {
    DecodeCase c = ring_case();
    c.ops[6].base += 32;  // wrong base after a rebase
    EXPECT_GE(kvlayer::golden::check_decode(c).op_failures, 1);
  }
  {
    DecodeCase c = ring_case();
    for (auto& op : c.ops)
      if (!op.expect_ok) {
        op.expect_ok = true;  // golden now claims a refused rewind succeeds
        break;
      }
    EXPECT_GE(kvlayer::golden::check_decode(c).op_failures, 1);
  }
  {
    DecodeCase c = ring_case();
    for (auto& op : c.ops)
      if (!op.decode_ok) {
        op.decode_ok = true;  // golden now claims a non-resident view decodes
        break;
      }
    EXPECT_GE(kvlayer::golden::check_decode(c).op_failures, 1);
  }
  {
    DecodeCase c = find_case("bad_flat");
    ASSERT_TRUE(c.data_error.has_value());
    c.data_error->block += 1;
    EXPECT_GE(kvlayer::golden::check_decode(c).op_failures, 1);
    c.data_error.reset();
    EXPECT_GE(kvlayer::golden::check_decode(c).op_failures, 1);
  }
}

TEST(GoldenDecodeChecker, NaNMustMatchNaN) {
  DecodeCase c = find_case("bad_flat");
  std::size_t nan_at = c.outputs.size();
  for (std::size_t i = 0; i < c.outputs.size(); ++i)
    if (std::isnan(c.outputs[i])) {
      nan_at = i;
      break;
    }
  ASSERT_LT(nan_at, c.outputs.size()) << "bad_flat must attend a canonical bad block";
  c.outputs[nan_at] = 0.5;
  EXPECT_EQ(kvlayer::golden::check_decode(c).output_failures, 1);
}

TEST(DecodeTolerance, ScalesWithMagnitudeKeysAndScores) {
  using kvlayer::golden::decode_tolerance;
  const double u = std::ldexp(1.0, -53);
  EXPECT_EQ(decode_tolerance(0.0, 10.0, 128, 100), 0.0);  // all-zero V: exact on both sides
  // n = 1, S = 0: 2·(2·16u + 8u) = 80u per unit magnitude.
  EXPECT_DOUBLE_EQ(decode_tolerance(1.0, 0.0, 64, 1), 80 * u);
  EXPECT_GT(decode_tolerance(1.0, 0.0, 64, 200), decode_tolerance(1.0, 0.0, 64, 100));
  EXPECT_GT(decode_tolerance(1.0, 50.0, 64, 100), decode_tolerance(1.0, 5.0, 64, 100));
  EXPECT_DOUBLE_EQ(decode_tolerance(3.0, 5.0, 64, 100), 3 * decode_tolerance(1.0, 5.0, 64, 100));
  // It stays far below one f32 rounding of the output, so f32 arithmetic anywhere would fail.
  EXPECT_LT(decode_tolerance(1.0, 100.0, 256, 1000), std::ldexp(1.0, -30));
}

}  // namespace
}  // namespace kvlayer::testing
