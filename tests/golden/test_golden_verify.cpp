// Reference KvLayer vs the NumPy golden verify cases (SPEC §11): speculative steps replayed with
// reserve(T), a multi-row device-counter append, inc_seqlen(T), the device-counter verify decode
// (bit for bit the host-len one) and a rewind that keeps a prefix; every output row within the
// golden decode tolerance (kvlayer/golden/check.hpp: float64 vs float64, summation order only),
// refused verify decodes, the state after every op and the final planes byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "golden_data.hpp"
#include "golden_verify.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/golden/check.hpp"
#include "kvlayer/golden/golden.hpp"
#include "kvlayer/golden/npy.hpp"

namespace kvlayer::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> verify_names() {
  const VerifySet* set = verify_golden();
  return set != nullptr ? case_names(set->cases) : std::vector<std::string>{};
}

const VerifyCase& find_case(const std::string& name) {
  return find_named(verify_golden()->cases, name, "verify");
}

class GoldenVerify : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenVerify, ReplayMatches) {
  const VerifyCase& c = find_case(GetParam());
  const VerifyCheck r = check_verify(c);
  EXPECT_TRUE(r.pass()) << joined(r.failures);
  EXPECT_EQ(r.op_failures, 0);
  EXPECT_EQ(r.plane_byte_mismatches, 0);
  EXPECT_EQ(r.output_failures, 0);
  EXPECT_LE(r.max_error_ratio, 1.0);
  // Non-vacuous: every op ran, the case has verify steps, planes and outputs.
  EXPECT_EQ(r.ops, std::int64_t(c.ops.size()));
  EXPECT_GT(r.steps, 0);
  EXPECT_GT(r.plane_bytes, 0);
  EXPECT_EQ(r.outputs_compared, c.output_rows * c.n_q_heads * c.head_dim());
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenVerify, ::testing::ValuesIn(verify_names()),
                         [](const auto& info) { return info.param; });

TEST(GoldenVerifyData, LoadsAndCoversTheSpec) {
  const VerifySet* set = verify_golden();
  ASSERT_NE(set, nullptr) << verify_load_error();
  ASSERT_FALSE(set->cases.empty());
  std::set<std::int64_t> steps_t;
  int flat = 0, windowed_flat = 0, rings = 0, refused = 0, rejected = 0, rebased = 0;
  for (const VerifyCase& c : set->cases) {
    flat += !c.geometry.is_ring() && !c.geometry.window;
    windowed_flat += !c.geometry.is_ring() && c.geometry.window.has_value();
    rings += c.geometry.is_ring();
    std::int64_t base = 0;
    for (const VerifyOp& op : c.ops) {
      if (op.kind == VerifyOp::Kind::verify) {
        steps_t.insert(op.n);
        rejected += op.accept < op.n;
        rebased += op.base > base;  // this step's reserve rebased the ring
      }
      refused += op.kind == VerifyOp::Kind::decode_rows && !op.decode_ok;
      base = op.base;
    }
  }
  for (std::int64_t t : {1, 2, 7, 16}) EXPECT_TRUE(steps_t.count(t)) << "no step with T " << t;
  EXPECT_GE(flat, 1);
  EXPECT_GE(windowed_flat, 1);
  EXPECT_GE(rings, 1);
  EXPECT_GE(rebased, 2);
  EXPECT_GE(refused, 2);
  EXPECT_GE(rejected, 4);
  // k, v, queries, outputs, magnitudes, score magnitudes and the two planes of every case.
  EXPECT_EQ(set->files_verified, 8 * set->cases.size());
}

// The existing loader still accepts the manifest with the verify section (it ignores the key).
TEST(GoldenVerifyData, TheSpec2To8LoaderStillLoads) {
  const auto set = golden::load_golden(golden::default_golden_dir());
  EXPECT_FALSE(set.decode.empty());
  EXPECT_FALSE(set.quant.empty());
}

// ---- The checker and the loader must be able to fail ----------------------------------------

const VerifyCase& ring_case() {
  for (const VerifyCase& c : verify_golden()->cases)
    if (c.geometry.is_ring()) return c;
  throw std::runtime_error("no ring verify case");
}

TEST(GoldenVerifyChecker, DetectsAPlaneByte) {
  ASSERT_NE(verify_golden(), nullptr) << verify_load_error();
  VerifyCase c = ring_case();
  c.k_plane[c.k_plane.size() / 3] ^= 0x04;
  const VerifyCheck r = check_verify(c);
  EXPECT_EQ(r.plane_byte_mismatches, 1);
  EXPECT_EQ(r.op_failures, 0);
  EXPECT_FALSE(r.pass());
}

TEST(GoldenVerifyChecker, DetectsAnOutputJustOutsideTheBound) {
  ASSERT_NE(verify_golden(), nullptr) << verify_load_error();
  VerifyCase c = ring_case();
  // The last row of the first verify step: its own window, not the first row's.
  const VerifyOp* step = nullptr;
  for (const VerifyOp& op : c.ops)
    if (op.kind == VerifyOp::Kind::verify && op.n > 1) {
      step = &op;
      break;
    }
  ASSERT_NE(step, nullptr);
  const std::size_t row = std::size_t(step->out_row + step->n - 1);
  const std::size_t per_row = std::size_t(c.n_q_heads) * std::size_t(c.head_dim());
  const std::size_t e = row * per_row + 3;
  const double tol =
      golden::decode_tolerance(c.magnitudes[e], c.score_magnitudes[row * std::size_t(c.n_q_heads)],
                               c.head_dim(), *c.geometry.window);
  ASSERT_GT(tol, 0);
  c.outputs[e] += 2 * tol;
  const VerifyCheck r = check_verify(c);
  EXPECT_EQ(r.output_failures, 1);
  EXPECT_GT(r.max_error_ratio, 1.0);
}

TEST(GoldenVerifyChecker, DetectsStateAndRefusalMismatches) {
  ASSERT_NE(verify_golden(), nullptr) << verify_load_error();
  {
    VerifyCase c = ring_case();
    for (VerifyOp& op : c.ops)
      if (op.kind == VerifyOp::Kind::verify) {
        op.base += 32;  // a wrong base after the step's reserve
        break;
      }
    EXPECT_GE(check_verify(c).op_failures, 1);
  }
  {
    VerifyCase c = ring_case();
    for (VerifyOp& op : c.ops)
      if (op.kind == VerifyOp::Kind::verify) {
        ++op.accept;  // golden keeps one more draft than it says
        break;
      }
    EXPECT_GE(check_verify(c).op_failures, 1);
  }
  {
    VerifyCase c = ring_case();
    for (VerifyOp& op : c.ops)
      if (op.kind == VerifyOp::Kind::decode_rows && !op.decode_ok) {
        op.decode_ok = true;  // golden claims the non-resident view decodes
        op.out_row = 0;
        break;
      }
    EXPECT_GE(check_verify(c).op_failures, 1);
  }
}

/// A copy of golden/data in a temporary directory, to corrupt.
struct DataCopy {
  fs::path root;
  DataCopy() {
    root = fs::temp_directory_path() /
           ("kvlayer_verify_golden_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    fs::copy(golden::default_golden_dir(), root, fs::copy_options::recursive);
  }
  ~DataCopy() { fs::remove_all(root); }
  nlohmann::json manifest() const {
    std::ifstream in(root / "manifest.json");
    return nlohmann::json::parse(in);
  }
  void write_manifest(const nlohmann::json& m) const {
    std::ofstream(root / "manifest.json") << m.dump(1);
  }
};

std::string error_of(const fs::path& dir) {
  try {
    load_verify_golden(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GoldenVerifyLoader, ChecksEveryFileAgainstTheManifest) {
  ASSERT_NE(verify_golden(), nullptr) << verify_load_error();
  const std::string name = ring_case().name;
  {
    DataCopy d;
    const fs::path victim = d.root / "verify" / (name + ".out.npy");
    auto bytes = golden::read_file(victim);
    bytes.back() ^= 0x01;
    golden::write_file(victim, bytes);
    const std::string msg = error_of(d.root);
    EXPECT_NE(msg.find("golden verify: case " + name + ": golden verify: verify/" + name +
                       ".out.npy has sha256 "),
              std::string::npos)
        << msg;
  }
  {
    DataCopy d;  // a listed file no case uses
    nlohmann::json m = d.manifest();
    m["verify"]["files"]["verify/extra.bin"] =
        m["verify"]["files"]["verify/" + name + ".kplane.bin"];
    d.write_manifest(m);
    EXPECT_NE(error_of(d.root).find("verify files but the cases use"), std::string::npos);
  }
  {
    DataCopy d;  // a case that needs more output rows than the file holds
    nlohmann::json m = d.manifest();
    for (auto& c : m["verify"]["cases"])
      if (c["name"] == name) c["ops"].back()["out_row"] = c["ops"].back()["out_row"].get<int>() + 1;
    d.write_manifest(m);
    EXPECT_NE(error_of(d.root).find(".out.npy has dtype <f8 and shape"), std::string::npos)
        << error_of(d.root);
  }
}

}  // namespace
}  // namespace kvlayer::testing
