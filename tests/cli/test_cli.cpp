// The `kvlayer` CLI, run as a process: quantize/dequantize round trips whose bytes equal the
// reference quantizer's, every error case with its exact message and exit status, and selfcheck
// passing on the committed golden data and failing on a corrupted copy.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvlayer/crc32.hpp"
#include "kvlayer/cuda/limits.hpp"  // supported_head_dims()
#include "kvlayer/golden/golden.hpp"
#include "kvlayer/golden/npy.hpp"
#include "kvlayer/golden/sha256.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "kvlayer/testing/head_dims.hpp"

namespace {

namespace fs = std::filesystem;
using kvlayer::ref::BlockType;

struct Result {
  int status = -1;
  std::string out, err;
};

struct ErrorCase {
  std::vector<std::string> args;
  int status;
  std::string message;  // the whole of stderr
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kvlayer_cli_" + std::to_string(::getpid()) + "_" +
                                        info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }

  /// Runs kvlayer with `args` (each single-quoted), capturing stdout, stderr and the exit status.
  Result run(const std::vector<std::string>& args) const {
    std::string cmd = std::string("'") + KVLAYER_CLI + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " >'" + path("stdout").string() + "' 2>'" + path("stderr").string() + "'";
    const int raw = std::system(cmd.c_str());
    Result r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = slurp(path("stdout"));
    r.err = slurp(path("stderr"));
    return r;
  }

  /// Runs each error case: exact stderr and exit status, nothing on stdout and, when given,
  /// no file at `untouched` (nothing may be written on an error).
  void expect_errors(const std::vector<ErrorCase>& cases,
                     const std::optional<fs::path>& untouched = std::nullopt) const {
    for (const auto& c : cases) {
      const Result r = run(c.args);
      EXPECT_EQ(r.status, c.status) << c.message;
      EXPECT_EQ(r.err, c.message);
      EXPECT_EQ(r.out, "") << c.message;
      if (untouched) {
        EXPECT_FALSE(fs::exists(*untouched)) << "written on an error: " << c.message;
      }
    }
  }

  void write_raw(const std::string& name, const std::vector<float>& v) const {
    kvlayer::golden::write_file(
        path(name), std::span(reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * 4));
  }
  std::vector<std::uint8_t> read(const std::string& name) const {
    return kvlayer::golden::read_file(path(name));
  }

  fs::path dir_;
};

/// Seeded values with a spread of magnitudes and signs (never all zero).
std::vector<float> values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-6, 6);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::ldexp(normal(rng), i % 32 == 0 ? exp(rng) : 0);
  return v;
}

std::vector<std::uint8_t> ref_quantize(BlockType t, const std::vector<float>& x) {
  std::vector<std::uint8_t> out(x.size() / 32 * std::size_t(kvlayer::ref::block_bytes(t)));
  kvlayer::ref::quantize_row(t, x, out);
  return out;
}

/// A version-1 .npy with the given header dict and payload.
std::vector<std::uint8_t> npy(const std::string& dict, const std::vector<std::uint8_t>& payload) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  // Built with reserve + push_back: GCC 12 reports a false -Warray-bounds for range inserts here.
  std::vector<std::uint8_t> out;
  out.reserve(10 + header.size() + payload.size());
  for (int b : {0x93, int('N'), int('U'), int('M'), int('P'), int('Y'), 1, 0})
    out.push_back(std::uint8_t(b));
  out.push_back(std::uint8_t(header.size()));
  out.push_back(0);
  for (char c : header) out.push_back(std::uint8_t(c));
  for (std::uint8_t b : payload) out.push_back(b);
  return out;
}

std::vector<std::uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

constexpr const char* kQuantizeUsage =
    "(usage: kvlayer quantize --type q8_0|q5_1 --input IN --output OUT)";

// ---- help and dispatch ------------------------------------------------------------------------

TEST_F(Cli, TopLevelHelpListsEveryCommand) {
  const Result r = run({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  for (const char* c : {"quantize", "dequantize", "selfcheck"})
    EXPECT_NE(r.out.find(std::string("\n  ") + c + " "), std::string::npos) << c;
  EXPECT_NE(r.out.find("usage: kvlayer <command> [options]"), std::string::npos);
}

TEST_F(Cli, NoArgumentsPrintsUsageToStderrAndExits2) {
  const Result r = run({});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("usage: kvlayer <command> [options]"), std::string::npos);
}

TEST_F(Cli, UnknownCommand) {
  const Result r = run({"frobnicate"});
  EXPECT_EQ(r.status, 2);
#ifdef KVLAYER_CLI_HAS_BENCH
  const std::string commands =
      "quantize, dequantize, selfcheck, fuzz, replay, inspect, snapshot-demo, sensitivity, bench, "
      "soak, probe, mma-probe, snapshot-bench";
#else
  const std::string commands =
      "quantize, dequantize, selfcheck, fuzz, replay, inspect, snapshot-demo, sensitivity";
#endif
  EXPECT_EQ(r.err, "kvlayer: unknown command 'frobnicate' (commands: " + commands +
                       "; see kvlayer --help)\n");
}

#ifdef KVLAYER_CLI_HAS_BENCH
// snapshot-bench checks its sizes before it touches a GPU (so this runs anywhere).
TEST_F(Cli, SnapshotBenchRefusesBadSizesBeforeTouchingTheGpu) {
  Result r = run({"snapshot-bench", "--head-dim", "48"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "kvlayer snapshot-bench: --head-dim 48 must be a multiple of 32\n");
  r = run({"snapshot-bench", "--len", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "kvlayer snapshot-bench: --len '0' must be an integer in [1, 16777216]\n");
}
#endif

// The sweep's rows at 1K keys (every supported head dim, both data kinds): its own attention of
// fp16(q) is the reference's õ (self-check), fp16(q) alone stays inside the bound, and a dropped
// last key leaves the bound on peaked data (its dominant key) while the planted 2^-k errors are
// reported.
void check_sensitivity_rows(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    if (line.find("of the bound") == std::string::npos) continue;
    ++rows;
    std::istringstream f(line);
    std::string d, keys, data;
    f >> d >> keys >> data;
    std::vector<std::string> cells;
    for (std::string c; f >> c;) cells.push_back(c);
    // 4 plants, drop first, drop last, no plant, self-check, "of", "the", "bound"
    ASSERT_EQ(cells.size(), 11u) << line;
    EXPECT_EQ(keys, "1024") << line;
    EXPECT_LT(std::stod(cells[7]), 1e-9) << "self-check: " << line;
    EXPECT_LT(std::stod(cells[6]), 1.0) << "fp16(q) alone left the bound: " << line;
    if (data == "peaked") {
      EXPECT_GT(std::stod(cells[5]), 1.0) << "drop last missed: " << line;
    }
  }
  EXPECT_EQ(rows, 6) << out;  // 3 head dims x 2 data kinds
}

TEST_F(Cli, SensitivitySweepAtOneThousandKeys) {
  const Result r = run({"sensitivity", "--longest", "1024"});
  ASSERT_EQ(r.status, 0) << r.err;
  check_sensitivity_rows(r.out);
}

// The same for a verify of the view's last 4 positions (each row its own view and bound).
TEST_F(Cli, SensitivitySweepOfVerifyRowsAtOneThousandKeys) {
  const Result r = run({"sensitivity", "--longest", "1024", "--rows", "4"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("verify of T = 4 rows"), std::string::npos) << r.out;
  check_sensitivity_rows(r.out);
}

// An H100's own decodes of the sweep's first configurations (head dim 64, 1K keys, a decode and
// a verify of T = 8; saved by `kvlayer sensitivity --gpu --save`, session 25), replayed: the
// declared statistical check catches every plant on peaked data at 2^-12 or finer with the
// GPU's real rounding in, and no clean launch alarms.
TEST_F(Cli, SensitivityReplayOfAGpuRunMeetsTheResolutionTargets) {
  for (const char* rows : {"1", "8"}) {
    const Result r = run({"sensitivity", "--load", KVLAYER_SENSITIVITY_DATA, "--head-dim", "64",
                          "--longest", "1024", "--rows", rows, "--require-resolution"});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("resolution: PASS"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(replayed from "), std::string::npos) << r.out;
  }
  // The usage: --save needs --gpu; --require-resolution needs a GPU's output; a missing file
  // is named.
  EXPECT_EQ(run({"sensitivity", "--save", "x"}).status, 2);
  EXPECT_EQ(run({"sensitivity", "--require-resolution"}).status, 2);
  const Result missing =
      run({"sensitivity", "--load", "/nonexistent", "--head-dim", "64", "--longest", "1024"});
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("/nonexistent/d64_k1024_normal_t1.f32"), std::string::npos)
      << missing.err;
}

TEST_F(Cli, PerCommandHelp) {
  for (const char* c : {"quantize", "dequantize", "selfcheck", "inspect", "snapshot-demo"}) {
    const Result r = run({c, "--help"});
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_EQ(r.out.rfind(std::string("usage: kvlayer ") + c, 0), 0u) << r.out;
    EXPECT_NE(r.out.find("Exit status"), std::string::npos) << c;
  }
}

// ---- quantize / dequantize round trips ---------------------------------------------------------

TEST_F(Cli, RawRoundTripMatchesTheReferenceBytes) {
  const std::vector<float> x = values(32 * 40, 7);
  write_raw("in.f32", x);
  for (BlockType t : {BlockType::q8_0, BlockType::q5_1}) {
    const std::string name = t == BlockType::q8_0 ? "q8_0" : "q5_1";
    Result r = run({"quantize", "--type", name, "--input", path("in.f32").string(), "--output",
                    path("out." + name).string()});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.out, "");
    const auto bytes = read("out." + name);
    EXPECT_EQ(bytes, ref_quantize(t, x)) << name;

    r = run({"dequantize", "--type=" + name, "--input=" + path("out." + name).string(),
             "--output=" + path("back." + name).string()});
    ASSERT_EQ(r.status, 0) << r.err;
    const auto back = read("back." + name);
    ASSERT_EQ(back.size(), x.size() * 4);
    std::vector<float> want(x.size()), got(x.size());
    kvlayer::ref::dequantize_row(t, bytes, want);
    std::memcpy(got.data(), back.data(), back.size());
    EXPECT_EQ(got, want) << name;
    // And it is a round trip: every value within one quantization step of its input (plus the
    // fp16 rounding of the scale).
    for (std::size_t b = 0; b < x.size() / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      const float step = t == BlockType::q8_0 ? amax / 127 : (hi - lo) / 31;
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(got[b * 32 + j] - x[b * 32 + j]),
                  step * 0.52f + 2e-3f * std::fabs(x[b * 32 + j]))
            << name << " block " << b << " lane " << j;
    }
  }
}

TEST_F(Cli, NpyInputsF32AnyShapeAndF16) {
  const std::vector<float> x = values(32 * 6, 11);
  kvlayer::golden::write_file(
      path("a.npy"),
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 32), }", f32_bytes(x)));
  Result r = run({"quantize", "--type", "q5_1", "--input", path("a.npy").string(), "--output",
                  path("a.q").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read("a.q"), ref_quantize(BlockType::q5_1, x));

  std::vector<std::uint8_t> half;
  std::vector<float> widened;
  for (float v : x) {
    const std::uint16_t h = kvlayer::f32_to_f16_bits(v);
    half.push_back(std::uint8_t(h & 0xFF));
    half.push_back(std::uint8_t(h >> 8));
    widened.push_back(kvlayer::f16_bits_to_f32(h));
  }
  kvlayer::golden::write_file(
      path("h.npy"), npy("{'descr': '<f2', 'fortran_order': False, 'shape': (192,), }", half));
  r = run({"quantize", "--type", "q8_0", "--input", path("h.npy").string(), "--output",
           path("h.q").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read("h.q"), ref_quantize(BlockType::q8_0, widened));
  EXPECT_NE(read("h.q"), ref_quantize(BlockType::q8_0, x));  // f16 rounding is visible: not vacuous
}

TEST_F(Cli, QuantizesTheGoldenInputsToTheGoldenBytes) {
  const auto dir = kvlayer::golden::default_golden_dir();
  for (const char* name : {"ties_q8_0", "ties_q5_1", "subnormal", "signed_zero"})
    for (const char* t : {"q8_0", "q5_1"}) {
      const Result r = run({"quantize", "--type", t, "--input",
                            (dir / "quant" / (std::string(name) + ".input.npy")).string(),
                            "--output", path("g.bin").string()});
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(read("g.bin"),
                kvlayer::golden::read_file(dir / "quant" / (std::string(name) + "." + t + ".bin")))
          << name << " " << t;
    }
}

TEST_F(Cli, BadBlocksWarnButTheOutputIsWritten) {
  std::vector<float> x = values(32 * 4, 3);
  x[32 + 5] = NAN;
  x[96 + 31] = -INFINITY;
  write_raw("in.f32", x);
  const Result r = run({"quantize", "--type", "q8_0", "--input", path("in.f32").string(),
                        "--output", path("out").string()});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err,
            "kvlayer quantize: warning: block 1 (values 32..63): value nan cannot be represented; "
            "wrote the canonical bad block\n"
            "kvlayer quantize: warning: block 3 (values 96..127): value -inf cannot be "
            "represented; wrote the canonical bad block\n");
  const auto out = read("out");
  EXPECT_EQ(out, ref_quantize(BlockType::q8_0, x));
  ASSERT_EQ(out.size(), 4u * 34);
  EXPECT_EQ(out[34], 0x00);  // canonical bad block: d = 0x7E00, quants 0
  EXPECT_EQ(out[35], 0x7E);
}

// ---- errors: exact message, exit status ---------------------------------------------------------

TEST_F(Cli, CampaignAndGpuCommandsRefuseBadOptionsWithOneLine) {
  std::vector<ErrorCase> cases = {
      {{"fuzz", "--cases", "0"},
       2,
       "kvlayer fuzz: --cases '0' must be an integer in [1, 1000000000]\n"},
      {{"fuzz", "--minutes", "-1"},
       2,
       "kvlayer fuzz: --minutes '-1' must be a number in (0, 100000]\n"},
      {{"fuzz", "--seed", "abc"},
       2,
       "kvlayer fuzz: --seed 'abc' must be an integer in [0, 9223372036854775807]\n"},
      {{"fuzz", "--max-size", "0"},
       2,
       "kvlayer fuzz: --max-size '0' must be an integer in [1, 10000]\n"},
      {{"fuzz", "--bogus"},
       2,
       "kvlayer fuzz: unknown option '--bogus' (options: --cases, --minutes, --seed, --max-size, "
       "--replay-dir, --head-dim, --min-gqa, --max-gqa, --rows, --kernel, --verify-kernel, "
       "--longest, --hang-seconds, --reference-only, --require-coverage, --help)\n"},
      {{"fuzz", "--hang-seconds", "-1"},
       2,
       "kvlayer fuzz: --hang-seconds '-1' must be an integer in [0, 86400]\n"},
      {{"replay", "a.json", "--hang-seconds", "1.5"},
       2,
       "kvlayer replay: --hang-seconds '1.5' must be an integer in [0, 86400]\n"},
      {{"fuzz", "--head-dim", std::to_string(kvlayer::testing::unsupported_head_dim())},
       2,
       "kvlayer fuzz: --head-dim '" + std::to_string(kvlayer::testing::unsupported_head_dim()) +
           "' must be one of " + kvlayer::cuda::supported_head_dims() + "\n"},
      {{"fuzz", "--rows", "halves"},
       2,
       "kvlayer fuzz: --rows 'halves' must be auto, split or whole\n"},
      {{"fuzz", "--longest", "0"},
       2,
       "kvlayer fuzz: --longest '0' must be an integer in [1, 131072]\n"},
      {{"fuzz", "--kernel", "tensor"},
       2,
       "kvlayer fuzz: --kernel 'tensor' must be mma or cuda_core\n"},
      {{"fuzz", "--verify-kernel", "auto"},
       2,
       "kvlayer fuzz: --verify-kernel 'auto' must be mma or wgmma\n"},
      {{"fuzz", "--min-gqa", "9", "--max-gqa", "4"},
       2,
       "kvlayer fuzz: --max-gqa '4' must be an integer in [9, 16]\n"},
      {{"replay"},
       2,
       "kvlayer replay: missing FILE (usage: kvlayer replay FILE [--reference-only] ...)\n"},
      {{"replay", "a.json", "b.json"},
       2,
       "kvlayer replay: unexpected argument 'b.json' (options take the form --name value)\n"},
      {{"replay", path("missing.json").string()},
       1,
       "kvlayer replay: replay file " + path("missing.json").string() + ": cannot be read\n"},
  };
  // The GPU commands exist where CUDA was built; their options are checked before any GPU.
  if (run({"--help"}).out.find("soak") != std::string::npos) {
    cases.push_back({{"bench", "--reps", "2"},
                     2,
                     "kvlayer bench: --reps '2' must be an integer in [5, 100000]\n"});
    cases.push_back({{"bench", "--decode-only", "63"},
                     2,
                     "kvlayer bench: --decode-only '63' must be an integer in [64, 16777216]\n"});
    cases.push_back(
        {{"bench", "--decode-only", "1024", "--shape", "8x100x8"},
         2,
         "kvlayer bench: --shape '8x100x8' must be KVxDxG with KV in [1, 64], D one of " +
             kvlayer::cuda::supported_head_dims() + ", G in [1, 16]\n"});
    cases.push_back({{"bench", "--accuracy-only", "--no-accuracy"},
                     2,
                     "kvlayer bench: --accuracy-only excludes --batch-only, --no-accuracy and "
                     "--decode-only\n"});
    cases.push_back({{"bench", "--shape", "1x128x16"},
                     2,
                     "kvlayer bench: --shape applies to --decode-only only\n"});
    cases.push_back({{"bench", "--queries", "4"},
                     2,
                     "kvlayer bench: --queries applies to --decode-only only\n"});
    cases.push_back({{"bench", "--decode-only", "4096", "--queries", "65"},
                     2,
                     "kvlayer bench: --queries '65' must be an integer in [1, 64]\n"});
    cases.push_back({{"bench", "--capacity", "131072"},
                     2,
                     "kvlayer bench: --capacity applies to --decode-only only\n"});
    cases.push_back({{"bench", "--decode-only", "4096", "--capacity", "1024"},
                     2,
                     "kvlayer bench: --capacity 1024 must be at least --decode-only's keys (4096), "
                     "without --queries\n"});
    cases.push_back({{"soak", "--cycles", "-1"},
                     2,
                     "kvlayer soak: --cycles '-1' must be an integer in [0, 100000000]\n"});
    cases.push_back({{"soak", "--chain", "0"},
                     2,
                     "kvlayer soak: --chain '0' must be an integer in [1, 4096]\n"});
    cases.push_back({{"probe", "--keys", "1000"},
                     2,
                     "kvlayer probe: --keys '1000' must be an integer in [1024, 4194304]\n"});
    cases.push_back(
        {{"probe", "--keys", "1030"}, 2, "kvlayer probe: --keys 1030 must be a multiple of 16\n"});
    cases.push_back({{"mma-probe", "--tiles", "6"},
                     2,
                     "kvlayer mma-probe: --tiles 6 must be a multiple of 4\n"});
    cases.push_back({{"mma-probe", "--tiles", "2"},
                     2,
                     "kvlayer mma-probe: --tiles '2' must be an integer in [4, 65536]\n"});
  }
  expect_errors(cases);
}

TEST_F(Cli, FuzzRefusesAnUnusableReplayDirBeforeTheCampaign) {
  std::ofstream(path("plain")).put('x');
  // --minutes bounds the run should the check come after the campaign (stdout then fills).
  expect_errors({
      {{"fuzz", "--replay-dir", path("missing").string(), "--minutes", "0.02", "--reference-only"},
       1,
       "kvlayer fuzz: replay dir " + path("missing").string() + ": does not exist\n"},
      {{"fuzz", "--replay-dir", path("plain").string(), "--minutes", "0.02", "--reference-only"},
       1,
       "kvlayer fuzz: replay dir " + path("plain").string() + ": is not a directory\n"},
  });
}

TEST_F(Cli, FuzzAnnouncesAPlantedMutantOnlyWhereOneIsBuiltIn) {
  ::setenv("KVLAYER_MUTANT", "qh_bit_order", 1);
  const Result r = run({"fuzz", "--cases", "2", "--max-size", "8", "--reference-only",
                        "--replay-dir", dir_.string()});
  ::unsetenv("KVLAYER_MUTANT");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("planted mutant armed"), std::string::npos) << r.out;
#ifdef KVLAYER_CLI_HAS_MUTANTS
  const std::string note =
      "planted mutant qh_bit_order is not exercised: the CUDA side does not run";
#else
  const std::string note =
      "KVLAYER_MUTANT=qh_bit_order is ignored: this build has no planted mutants";
#endif
  EXPECT_NE(r.out.find(note), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  cases                        2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  failures                     0\n"), std::string::npos) << r.out;
}

TEST_F(Cli, HelpTextsPrintPercentSignsOnce) {
  std::vector<std::string> commands = {"quantize", "dequantize", "selfcheck",    "fuzz",
                                       "replay",   "inspect",    "snapshot-demo"};
#ifdef KVLAYER_CLI_HAS_BENCH
  commands.insert(commands.end(), {"bench", "soak", "probe", "mma-probe"});
#endif
  for (const auto& c : commands) {
    const Result r = run({c, "--help"});
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_EQ(r.out.find("%%"), std::string::npos) << c << ":\n" << r.out;
  }
#ifdef KVLAYER_CLI_HAS_BENCH
  EXPECT_NE(run({"bench", "--help"}).out.find("and % of the measured ceiling"), std::string::npos);
#endif
}

TEST_F(Cli, UsageErrorsExit2WithOneLine) {
  write_raw("in.f32", values(64, 1));
  const std::string in = path("in.f32").string(), out = path("out").string();
  const std::vector<ErrorCase> cases = {
      {{"quantize", "--input", in, "--output", out},
       2,
       std::string("kvlayer quantize: missing --type ") + kQuantizeUsage + "\n"},
      {{"quantize", "--type", "q8_0", "--output", out},
       2,
       std::string("kvlayer quantize: missing --input ") + kQuantizeUsage + "\n"},
      {{"quantize", "--type", "q8_0", "--input", in},
       2,
       std::string("kvlayer quantize: missing --output ") + kQuantizeUsage + "\n"},
      {{"quantize", "--type", "q4_0", "--input", in, "--output", out},
       2,
       "kvlayer quantize: unknown --type 'q4_0' (supported: q8_0, q5_1)\n"},
      {{"dequantize", "--type", "Q8_0", "--input", in, "--output", out},
       2,
       "kvlayer dequantize: unknown --type 'Q8_0' (supported: q8_0, q5_1)\n"},
      {{"quantize", "--type", "q8_0", "--input", in, "--output", out, "--bogus", "1"},
       2,
       "kvlayer quantize: unknown option '--bogus' (options: --type, --input, --output, --help)\n"},
      {{"quantize", "--type", "q8_0", "--input", in, "--output"},
       2,
       "kvlayer quantize: option --output needs a value\n"},
      {{"quantize", "--type", "q8_0", "--type", "q5_1", "--input", in, "--output", out},
       2,
       "kvlayer quantize: option --type given twice\n"},
      {{"quantize", in},
       2,
       "kvlayer quantize: unexpected argument '" + in + "' (options take the form --name value)\n"},
      {{"selfcheck", "--golden"}, 2, "kvlayer selfcheck: option --golden needs a value\n"},
      {{"selfcheck", "--fast"},
       2,
       "kvlayer selfcheck: unknown option '--fast' (options: --golden, --verbose, --help)\n"},
  };
  expect_errors(cases, out);
}

TEST_F(Cli, DataAndIoErrorsExit1NamingValueAndLimit) {
  const std::string out = path("out").string();
  write_raw("33.f32", values(33, 2));
  kvlayer::golden::write_file(path("130.f32"), std::vector<std::uint8_t>(130, 1));
  kvlayer::golden::write_file(path("empty.f32"), {});
  const std::vector<float> x = values(64, 5);
  kvlayer::golden::write_file(
      path("fortran.npy"),
      npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 32), }", f32_bytes(x)));
  kvlayer::golden::write_file(path("f64.npy"),
                              npy("{'descr': '<f8', 'fortran_order': False, 'shape': (32,), }",
                                  std::vector<std::uint8_t>(256, 0)));
  auto truncated = f32_bytes(x);
  truncated.resize(100);
  kvlayer::golden::write_file(
      path("trunc.npy"),
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (64,), }", truncated));
  kvlayer::golden::write_file(path("notnpy.npy"), std::vector<std::uint8_t>(64, 'x'));
  kvlayer::golden::write_file(path("35.q8"), std::vector<std::uint8_t>(35, 0));
  kvlayer::golden::write_file(path("25.q5"), std::vector<std::uint8_t>(25, 0));
  kvlayer::golden::write_file(path("empty.q5"), {});
  write_raw("ok.f32", x);

  auto p = [&](const char* n) { return path(n).string(); };
  const std::vector<ErrorCase> cases = {
      {{"quantize", "--type", "q8_0", "--input", p("33.f32"), "--output", out},
       1,
       "kvlayer quantize: " + p("33.f32") +
           ": holds 33 values, not a multiple of the block size 32\n"},
      {{"quantize", "--type", "q5_1", "--input", p("130.f32"), "--output", out},
       1,
       "kvlayer quantize: " + p("130.f32") +
           ": 130 bytes is not a whole number of float32 values (4 bytes each)\n"},
      {{"quantize", "--type", "q5_1", "--input", p("empty.f32"), "--output", out},
       1,
       "kvlayer quantize: " + p("empty.f32") +
           ": holds no values (need at least one block of 32)\n"},
      {{"quantize", "--type", "q8_0", "--input", p("missing.f32"), "--output", out},
       1,
       "kvlayer quantize: " + p("missing.f32") + ": cannot read (No such file or directory)\n"},
      {{"quantize", "--type", "q8_0", "--input", dir_.string(), "--output", out},
       1,
       "kvlayer quantize: " + dir_.string() + ": cannot read (is a directory)\n"},
      {{"quantize", "--type", "q8_0", "--input", p("fortran.npy"), "--output", out},
       1,
       "kvlayer quantize: " + p("fortran.npy") +
           ": fortran_order arrays are not supported (save a C-ordered array)\n"},
      {{"quantize", "--type", "q8_0", "--input", p("f64.npy"), "--output", out},
       1,
       "kvlayer quantize: " + p("f64.npy") +
           ": npy dtype '<f8' is not supported (supported: '<f4', '<f2')\n"},
      {{"quantize", "--type", "q8_0", "--input", p("trunc.npy"), "--output", out},
       1,
       "kvlayer quantize: " + p("trunc.npy") +
           ": truncated: the header promises 64 values of 4 bytes but the file holds 100 data "
           "bytes\n"},
      {{"quantize", "--type", "q8_0", "--input", p("notnpy.npy"), "--output", out},
       1,
       "kvlayer quantize: " + p("notnpy.npy") +
           ": not an npy file (missing the \\x93NUMPY magic)\n"},
      {{"quantize", "--type", "q8_0", "--input", p("ok.f32"), "--output", p("no/such/dir/out")},
       1,
       "kvlayer quantize: " + p("no/such/dir/out") +
           ": cannot write (No such file or directory)\n"},
      {{"dequantize", "--type", "q8_0", "--input", p("35.q8"), "--output", out},
       1,
       "kvlayer dequantize: " + p("35.q8") +
           ": holds 35 bytes, not a multiple of the q8_0 block size 34\n"},
      {{"dequantize", "--type", "q5_1", "--input", p("25.q5"), "--output", out},
       1,
       "kvlayer dequantize: " + p("25.q5") +
           ": holds 25 bytes, not a multiple of the q5_1 block size 24\n"},
      {{"dequantize", "--type", "q5_1", "--input", p("empty.q5"), "--output", out},
       1,
       "kvlayer dequantize: " + p("empty.q5") + ": holds no blocks\n"},
      {{"dequantize", "--type", "q5_1", "--input", p("missing.q5"), "--output", out},
       1,
       "kvlayer dequantize: " + p("missing.q5") + ": cannot read (No such file or directory)\n"},
  };
  expect_errors(cases, out);
}

// ---- selfcheck ----------------------------------------------------------------------------------

TEST_F(Cli, SelfcheckPassesOnTheCommittedGoldenData) {
  const Result r = run({"selfcheck"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("result: PASS"), std::string::npos) << r.out;
  for (const char* row :
       {"quant   q8_0", "quant   q5_1", "decode  state", "decode  planes", "decode  outputs"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST_F(Cli, SelfcheckFailsOnAMismatchAndOnUnreadableData) {
  // A consistent but wrong data set: one expected byte flipped, its sha256 updated in the
  // manifest, so the data loads and the comparison itself must fail.
  const fs::path data = path("data");
  fs::copy(kvlayer::golden::default_golden_dir(), data, fs::copy_options::recursive);
  const fs::path victim = data / "decode" / "ring_hd64_gqa1.vplane.bin";
  auto bytes = kvlayer::golden::read_file(victim);
  const std::string old_hash = kvlayer::golden::sha256_hex(bytes);
  bytes[100] ^= 0x04;
  kvlayer::golden::write_file(victim, bytes);
  std::string manifest = slurp(data / "manifest.json");
  const auto at = manifest.find(old_hash);
  ASSERT_NE(at, std::string::npos);
  manifest.replace(at, old_hash.size(), kvlayer::golden::sha256_hex(bytes));
  std::ofstream(data / "manifest.json", std::ios::trunc) << manifest;

  Result r = run({"selfcheck", "--golden", data.string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("result: FAIL"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("ring_hd64_gqa1: V plane: 1 bytes differ, first at byte 100 (physical row 1)"),
      std::string::npos)
      << r.out;

  r = run({"selfcheck", "--golden", path("nowhere").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "kvlayer selfcheck: " + (path("nowhere") / "manifest.json").string() +
                       ": cannot read (No such file or directory)\n");
}

// ---- inspect and snapshot-demo (SPEC §13) -------------------------------------------------------

constexpr const char* kDemoUsage =
    "(usage: kvlayer snapshot-demo --output FILE | --compare FILE [--storage flat|ring] [--len N] "
    "[--seed S])";

TEST_F(Cli, SnapshotDemoWritesAFileThatInspectDescribes) {
  const std::string f = path("demo.gguf").string();
  Result r = run({"snapshot-demo", "--output", f, "--len", "300"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, f + ": ring 2x64/64 max_ctx 4096 window 100 max_append 16 rewind_slack 8 rows "
                       "155, len 300, rows [192, 300)\n");
  const kvlayer::Snapshot s = kvlayer::load_snapshot(f);
  r = run({"inspect", f});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  char crc[128];
  std::snprintf(crc, sizeof crc,
                "crc32       kv.k 0x%08x, kv.v 0x%08x: match the stored kvlayer.k_crc32, "
                "kvlayer.v_crc32\n",
                kvlayer::crc32(s.k), kvlayer::crc32(s.v));
  const std::string head =
      "file        " + f + " (" + std::to_string(fs::file_size(f)) +
      " bytes, GGUF v3, kvlayer format 1)\n"
      "geometry    ring 2x64/64 max_ctx 4096 window 100 max_append 16 rewind_slack 8 rows 155\n"
      "len         300\n"
      "window      100\n"
      "first row   192 (108 rows held, [192, 300); base " +
      std::to_string(s.base) + " when saved)\n" + crc;
  EXPECT_EQ(r.out.substr(0, head.size()), head);
  EXPECT_NE(r.out.find("\nkv.k        q8_0, 108 rows x 128: 432 blocks, 0 bad; |value| max "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\nkv.v        q5_1, 108 rows x 128: 432 blocks, 0 bad; |value| max "),
            std::string::npos)
      << r.out;

  r = run({"snapshot-demo", "--compare", f, "--len", "300"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, f + ": identical to the demo snapshot (geometry, len 300, first 192, base " +
                       std::to_string(s.base) + ", 14688 K and 10368 V bytes)\n");
  r = run({"snapshot-demo", "--compare", f, "--len", "300", "--seed", "2"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("kvlayer snapshot-demo: " + f +
                            ": differs from the demo snapshot: kv.k byte 0 (row 192, byte 0 of "
                            "the row): 0x",
                        0),
            0u)
      << r.err;
  r = run({"snapshot-demo", "--compare", f, "--storage", "flat", "--len", "300"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("kvlayer snapshot-demo: " + f +
                            ": differs from the demo snapshot: geometry 'ring 2x64/64",
                        0),
            0u)
      << r.err;
}

TEST_F(Cli, InspectCountsBadBlocksApart) {
  kvlayer::Geometry g;
  g.n_kv_heads = 1;
  g.head_dim_k = g.head_dim_v = 64;
  g.max_ctx = 8;
  kvlayer::ref::KvLayer layer(g);
  std::vector<float> k = values(3 * 64, 4), v = values(3 * 64, 5);
  k[70] = NAN;  // row 1, block 0 of K
  layer.append({k.data(), v.data(), 3, kvlayer::DType::f32});
  kvlayer::save_snapshot(path("bad.gguf").string(), layer.snapshot());
  const Result r = run({"inspect", path("bad.gguf").string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\nkv.k        q8_0, 3 rows x 64: 6 blocks, 1 bad; "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\nkv.v        q5_1, 3 rows x 64: 6 blocks, 0 bad; "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\nwindow      none\n"), std::string::npos) << r.out;
}

TEST_F(Cli, InspectAndSnapshotDemoMistakesAndBadFiles) {
  const std::string f = path("demo.gguf").string(), out = path("out.gguf").string();
  ASSERT_EQ(run({"snapshot-demo", "--output", f, "--len", "40", "--storage", "flat"}).status, 0);
  auto bytes = kvlayer::golden::read_file(f);
  bytes[bytes.size() - 1] ^= 0x01;  // the last V byte (40 x 96 is a multiple of 32)
  kvlayer::golden::write_file(path("corrupt.gguf"), bytes);
  bytes.resize(100);
  kvlayer::golden::write_file(path("short.gguf"), bytes);
  const kvlayer::Snapshot s = kvlayer::load_snapshot(f);
  auto v = s.v;
  v.back() ^= 0x01;
  char crc[160];
  std::snprintf(crc, sizeof crc,
                "kvlayer.v_crc32: 0x%08x, but tensor kv.v's bytes have CRC-32 0x%08x (corrupted)",
                kvlayer::crc32(s.v), kvlayer::crc32(v));
  const std::string missing = path("missing.gguf").string();
  const std::vector<ErrorCase> cases = {
      {{"inspect"}, 2, "kvlayer inspect: missing FILE (usage: kvlayer inspect FILE)\n"},
      {{"inspect", f, f},
       2,
       "kvlayer inspect: unexpected argument '" + f + "' (usage: kvlayer inspect FILE)\n"},
      {{"inspect", "--verbose", f},
       2,
       "kvlayer inspect: unknown option '--verbose' (usage: kvlayer inspect FILE)\n"},
      {{"inspect", missing},
       1,
       "kvlayer inspect: " + missing + ": cannot open: No such file or directory\n"},
      {{"inspect", path("corrupt.gguf").string()},
       1,
       "kvlayer inspect: " + path("corrupt.gguf").string() + ": " + crc + "\n"},
      {{"inspect", path("short.gguf").string()},
       1,
       "kvlayer inspect: " + path("short.gguf").string() +
           ": truncated: the value of general.alignment at byte 100 needs 4 bytes, the file has "
           "100\n"},
      {{"snapshot-demo"},
       2,
       std::string("kvlayer snapshot-demo: give one of --output FILE and --compare FILE ") +
           kDemoUsage + "\n"},
      {{"snapshot-demo", "--output", out, "--compare", f},
       2,
       std::string("kvlayer snapshot-demo: give one of --output FILE and --compare FILE ") +
           kDemoUsage + "\n"},
      {{"snapshot-demo", "--output", out, "--storage", "paged"},
       2,
       "kvlayer snapshot-demo: unknown --storage 'paged' (supported: flat, ring)\n"},
      {{"snapshot-demo", "--output", out, "--len", "5000"},
       2,
       "kvlayer snapshot-demo: --len '5000' must be an integer in [0, 4096]\n"},
      {{"snapshot-demo", "--output", path("no/dir/x.gguf").string()},
       1,
       "kvlayer snapshot-demo: save_snapshot: " + path("no/dir/x.gguf").string() +
           ": cannot create a temporary file in " + path("no/dir").string() +
           ": No such file or directory\n"},
  };
  expect_errors(cases, out);
}

}  // namespace
