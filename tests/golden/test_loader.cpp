// The golden loader's parts: .npy reader, the manifest's checked JSON accessors, SHA-256, and
// load_golden's integrity checks on a corrupted copy of the data.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "golden_data.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/golden/manifest.hpp"
#include "kvlayer/golden/npy.hpp"
#include "kvlayer/golden/sha256.hpp"

namespace kvlayer::testing {
namespace {

namespace fs = std::filesystem;
using kvlayer::golden::as_array;
using kvlayer::golden::as_bool;
using kvlayer::golden::as_int;
using kvlayer::golden::as_number;
using kvlayer::golden::as_string;
using kvlayer::golden::has_member;
using kvlayer::golden::Json;
using kvlayer::golden::member;
using kvlayer::golden::parse_json;

/// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("kvlayer_golden_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

/// A version-1 .npy file with the given header dict (padded like numpy) and payload.
std::vector<std::uint8_t> npy_v1(const std::string& dict,
                                 const std::vector<std::uint8_t>& payload) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  // Magic, version 1.0, little-endian header length (built by push_back: GCC 12 warns falsely
  // on a braced initializer followed by insert at -O3).
  std::vector<std::uint8_t> out;
  for (std::uint8_t b : {std::uint8_t(0x93), std::uint8_t('N'), std::uint8_t('U'),
                         std::uint8_t('M'), std::uint8_t('P'), std::uint8_t('Y'), std::uint8_t(1),
                         std::uint8_t(0), std::uint8_t(header.size() & 0xFF),
                         std::uint8_t(header.size() >> 8)})
    out.push_back(b);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kvlayer::Error& e) {
    EXPECT_EQ(e.kind(), kvlayer::ErrorKind::io);
    return e.what();
  }
  return "<no error>";
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(kvlayer::golden::sha256_hex({}),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(kvlayer::golden::sha256_hex(bytes_of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding spills into a second block.
  EXPECT_EQ(kvlayer::golden::sha256_hex(
                bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Json, ParsesTheManifestSubset) {
  const Json j = parse_json(
      R"({"a": [1, -2.5e3, true, false, null], "s": "x\"y\\z\u0041", "o": {"k": 7}, "e": []})");
  const auto& a = as_array(member(j, "a"));
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(as_int(a[0]), 1);
  EXPECT_EQ(as_number(a[1]), -2500.0);
  EXPECT_TRUE(as_bool(a[2]));
  EXPECT_FALSE(as_bool(a[3]));
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(as_string(member(j, "s")), "x\"y\\zA");
  EXPECT_EQ(as_int(member(member(j, "o"), "k")), 7);
  EXPECT_TRUE(as_array(member(j, "e")).empty());
  EXPECT_TRUE(has_member(j, "o"));
  EXPECT_FALSE(has_member(j, "zz"));
}

TEST(Json, RejectsMalformedInputWithTheOffset) {
  EXPECT_EQ(error_of([] { parse_json(R"({"a": 1,})"); }),
            "json: syntax error while parsing object key - unexpected '}'; expected string literal "
            "at byte 8");
  EXPECT_EQ(error_of([] { parse_json(R"([1, 2)"); }),
            "json: syntax error while parsing array - unexpected end of input; expected ']' at "
            "byte 5");
  EXPECT_EQ(error_of([] { parse_json(R"({} x)"); }),
            "json: syntax error while parsing value - invalid literal; last read: '{} x'; expected "
            "end of input at byte 3");
  EXPECT_EQ(error_of([] { member(parse_json(R"({"a": 1})"), "b"); }), "json: missing key \"b\"");
  EXPECT_EQ(error_of([] { as_int(member(parse_json(R"({"a": 1.5})"), "a")); }),
            "json: 1.500000 is not an integer");
  EXPECT_EQ(error_of([] { as_int(parse_json("18446744073709551615")); }),
            "json: 18446744073709551616.000000 is not an integer");
  EXPECT_EQ(error_of([] { as_array(member(parse_json(R"({"a": "s"})"), "a")); }),
            "json: expected a array, found a string");
}

TEST(Npy, ReadsVersion1And2HeadersAndAnyShape) {
  TempDir t;
  const std::vector<std::uint8_t> payload = {0, 0, 128, 63, 0, 0, 0, 192};  // 1.0f, -2.0f
  kvlayer::golden::write_file(
      t.path / "a.npy",
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", payload));
  auto a = kvlayer::golden::read_npy(t.path / "a.npy");
  EXPECT_EQ(a.header.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(kvlayer::golden::npy_to_f32(a, "a"), (std::vector<float>{1.0f, -2.0f}));

  // Version 2: 4-byte header length; keys in another order; a 3-d shape of 1x2x1.
  std::string dict = "{'shape': (1, 2, 1), 'fortran_order': False, 'descr': '<f4'}";
  while ((12 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::vector<std::uint8_t> v2 = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, std::uint8_t(dict.size()),
                                  0,    0,   0};
  v2.insert(v2.end(), dict.begin(), dict.end());
  v2.insert(v2.end(), payload.begin(), payload.end());
  kvlayer::golden::write_file(t.path / "b.npy", v2);
  auto b = kvlayer::golden::read_npy(t.path / "b.npy");
  EXPECT_EQ(b.header.major_version, 2);
  EXPECT_EQ(b.header.count(), 2);
  EXPECT_EQ(kvlayer::golden::npy_to_f32(b, "b"), (std::vector<float>{1.0f, -2.0f}));

  // f16 converts exactly: 0x3C00 = 1.0, 0xC000 = -2.0, 0x0001 = 2^-24.
  kvlayer::golden::write_file(t.path / "h.npy",
                              npy_v1("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                                     {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00}));
  EXPECT_EQ(kvlayer::golden::npy_to_f32(kvlayer::golden::read_npy_float(t.path / "h.npy"), "h"),
            (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24)}));
}

TEST(Npy, RejectsWithClearMessages) {
  TempDir t;
  const auto p = t.path / "x.npy";
  const std::string ps = p.string();
  auto write = [&](const std::vector<std::uint8_t>& b) { kvlayer::golden::write_file(p, b); };

  write(npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
               std::vector<std::uint8_t>(8)));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(p); }),
            ps + ": fortran_order arrays are not supported (save a C-ordered array)");

  write(npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
               std::vector<std::uint8_t>(8)));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy_float(p); }),
            ps + ": npy dtype '<i4' is not supported (supported: '<f4', '<f2')");
  write(npy_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
               std::vector<std::uint8_t>(8)));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy_float(p); }),
            ps + ": npy dtype '>f4' is not supported (supported: '<f4', '<f2')");

  write(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
               std::vector<std::uint8_t>(20)));
  EXPECT_EQ(
      error_of([&] { kvlayer::golden::read_npy(p); }),
      ps + ": truncated: the header promises 6 values of 4 bytes but the file holds 20 data bytes");

  write(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
               std::vector<std::uint8_t>(6)));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(p); }),
            ps + ": 2 unexpected bytes after the 1 values");

  write(bytes_of("PK\x03\x04 not numpy at all"));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(p); }),
            ps + ": not an npy file (missing the \\x93NUMPY magic)");

  auto v4 = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                   std::vector<std::uint8_t>(4));
  v4[6] = 4;
  write(v4);
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(p); }),
            ps + ": npy format version 4 is not supported (1, 2, 3)");

  write(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
               std::vector<std::uint8_t>(4)));
  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(p); }),
            ps + ": malformed npy header: unknown key 'extra'");

  EXPECT_EQ(error_of([&] { kvlayer::golden::read_npy(t.path / "missing.npy"); }),
            (t.path / "missing.npy").string() + ": cannot read (No such file or directory)");
}

TEST(LoadGolden, VerifiesEveryFileAgainstTheManifest) {
  const auto* set = golden_set();
  ASSERT_NE(set, nullptr) << load_error();
  EXPECT_EQ(set->format, "kvlayer-golden-1");
  EXPECT_GT(set->files_verified, 100u);

  TempDir t;
  fs::copy(kvlayer::golden::default_golden_dir(), t.path / "data", fs::copy_options::recursive);
  const auto victim = t.path / "data" / "quant" / "uniform.q8_0.bin";
  auto bytes = kvlayer::golden::read_file(victim);
  bytes[40] ^= 0x01;
  kvlayer::golden::write_file(victim, bytes);
  const std::string msg = error_of([&] { kvlayer::golden::load_golden(t.path / "data"); });
  EXPECT_NE(msg.find("golden: case uniform: golden: quant/uniform.q8_0.bin has sha256 "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(regenerate with tools/regen-golden)"), std::string::npos) << msg;

  EXPECT_EQ(error_of([&] { kvlayer::golden::load_golden(t.path / "nowhere"); }),
            (t.path / "nowhere" / "manifest.json").string() +
                ": cannot read (No such file or directory)");
}

}  // namespace
}  // namespace kvlayer::testing
