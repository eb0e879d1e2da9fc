// The snapshot file (SPEC §13, kvlayer/snapshot_file.hpp): round trips of flat, windowed and
// ring snapshots, the GGUF layout the bytes follow, every refusal of a bad file with its exact
// message (truncated at every length, CRC mismatch, wrong version, type, shape, missing or
// mistyped keys, …), and crash safety: a save stopped after N bytes, for every N, leaves the
// old file intact (or no file), and a complete save replaces it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kvlayer/crc32.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

/// A reference layer's snapshot after `len` rows of seeded data.
kvlayer::Snapshot snapshot_at(const Geometry& g, std::int64_t len, std::uint64_t seed) {
  KvLayer l(g);
  Rng rng(seed);
  while (l.len() < len) {
    const std::int64_t n = std::min<std::int64_t>(g.is_ring() ? g.max_append : 9, len - l.len());
    l.append(random_rows(g, n, rng).f32_view());
  }
  return l.snapshot();
}

/// ring 2x32/64 window 61 at len 150: first 64, base 64, 86 rows of 68 + 96 bytes.
kvlayer::Snapshot ring_snapshot() {
  return snapshot_at(ring_geometry(2, 32, 64, 1000, 61, 5, 3), 150, 1);
}

std::string same(const kvlayer::Snapshot& a, const kvlayer::Snapshot& b) {
  std::string d;
  if (!same_layout(a.geometry, b.geometry) || a.geometry.max_append != b.geometry.max_append ||
      a.geometry.rewind_slack != b.geometry.rewind_slack)
    d += "geometry " + a.geometry.describe() + " vs " + b.geometry.describe() + "; ";
  if (a.len != b.len || a.first != b.first || a.base != b.base) d += "len/first/base differ; ";
  if (a.k != b.k) d += "K bytes differ; ";
  if (a.v != b.v) d += "V bytes differ; ";
  return d;
}

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The message of the kvlayer::Error f throws (kind io), or a failure description.
std::string error_of(const std::function<void()>& f, ErrorKind kind = ErrorKind::io) {
  try {
    f();
  } catch (const Error& e) {
    if (e.kind() != kind) return std::string("wrong error kind: ") + e.what();
    return e.what();
  }
  return "no error";
}

std::string parse_error(const Bytes& file) {
  return error_of([&] { (void)parse_snapshot(file, "snap.gguf"); });
}

/// Offset just past the GGUF string `s` (its bytes) in `file`; fails the test when absent.
std::size_t after_string(const Bytes& file, const std::string& s) {
  Bytes pattern(8, 0);
  for (int i = 0; i < 8; ++i) pattern[std::size_t(i)] = std::uint8_t(s.size() >> (8 * i));
  pattern.insert(pattern.end(), s.begin(), s.end());
  const auto it = std::search(file.begin(), file.end(), pattern.begin(), pattern.end());
  EXPECT_NE(it, file.end()) << s;
  return std::size_t(it - file.begin()) + pattern.size();
}

void put(Bytes& file, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) file[at + std::size_t(i)] = std::uint8_t(v >> (8 * i));
}

std::uint64_t get(const Bytes& file, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | file[at + std::size_t(i)];
  return v;
}

class SnapshotFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kvlayer_snapshot_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    detail::set_save_crash_point(std::nullopt);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  /// Files in the directory other than `keep`.
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != keep) out.push_back(e.path().filename().string());
    return out;
  }
  fs::path dir_;
};

TEST(Crc32, KnownValues) {
  const std::string check = "123456789";
  const Bytes b(check.begin(), check.end());
  EXPECT_EQ(crc32(b), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32(Bytes{}), 0u);
  EXPECT_EQ(crc32(std::span(b).subspan(4), crc32(std::span(b).first(4))), 0xCBF43926u);
}

TEST_F(SnapshotFile, RoundTripsFlatWindowedRingAndEmptySnapshots) {
  const kvlayer::Snapshot cases[] = {
      snapshot_at(flat_geometry(2, 32, 64, 300), 123, 1),
      snapshot_at(flat_geometry(1, 64, 32, 300, 17), 40, 2),
      ring_snapshot(),
      snapshot_at(ring_geometry(1, 32, 32, 100, 1, 3, 0), 100, 3),  // window 1, full max_ctx
      snapshot_at(flat_geometry(1, 32, 32, 10), 0, 4),              // empty tensors
      snapshot_at(ring_geometry(1, 32, 32, 500, 40, 4, 2), 0, 5),
  };
  for (const kvlayer::Snapshot& s : cases) {
    SCOPED_TRACE(s.geometry.describe() + " len " + std::to_string(s.len));
    const std::string p = path("s.gguf");
    save_snapshot(p, s);
    EXPECT_EQ(read_file(p), encode_snapshot(s));
    EXPECT_EQ(same(load_snapshot(p), s), "");
    EXPECT_EQ(others("s.gguf"), std::vector<std::string>{}) << "no temporary file stays behind";
    // And the restored layer equals one restored from the snapshot itself.
    KvLayer a(s.geometry), b(s.geometry);
    a.restore(s);
    b.restore(load_snapshot(p));
    EXPECT_EQ(snapshot_diff(snapshot(a), snapshot(b), s.geometry), "");
  }
}

TEST_F(SnapshotFile, BytesFollowTheGgufLayout) {
  const kvlayer::Snapshot s = ring_snapshot();
  const Bytes f = encode_snapshot(s);
  EXPECT_EQ(std::string(f.begin(), f.begin() + 4), "GGUF");
  EXPECT_EQ(get(f, 4, 4), 3u);    // version
  EXPECT_EQ(get(f, 8, 8), 2u);    // tensors
  EXPECT_EQ(get(f, 16, 8), 16u);  // metadata: architecture, alignment, 14 kvlayer keys
  // kv.k: 2 dims [kv_dim_k 64, rows 86], Q8_0, offset 0; kv.v: [128, 86], Q5_1, offset 5856.
  std::size_t at = after_string(f, "kv.k");
  EXPECT_EQ(get(f, at, 4), 2u);
  EXPECT_EQ(get(f, at + 4, 8), 64u);
  EXPECT_EQ(get(f, at + 12, 8), 86u);
  EXPECT_EQ(get(f, at + 20, 4), 8u);
  EXPECT_EQ(get(f, at + 24, 8), 0u);
  at = after_string(f, "kv.v");
  EXPECT_EQ(get(f, at + 4, 8), 128u);
  EXPECT_EQ(get(f, at + 12, 8), 86u);
  EXPECT_EQ(get(f, at + 20, 4), 7u);
  EXPECT_EQ(get(f, at + 24, 8), 5856u);  // 86 x 68 = 5848, padded to 32
  const std::size_t data = (at + 32 + 31) / 32 * 32;
  EXPECT_EQ(Bytes(f.begin() + std::ptrdiff_t(data), f.begin() + std::ptrdiff_t(data) + 5848), s.k);
  EXPECT_EQ(Bytes(f.begin() + std::ptrdiff_t(data + 5856),
                  f.begin() + std::ptrdiff_t(data + 5856 + 8256)),
            s.v);
  EXPECT_EQ(f.size(), data + 5856 + 8256);  // 8256 is a multiple of 32
  // Metadata values, as the golden check reads them with gguf-py.
  EXPECT_EQ(get(f, after_string(f, "general.alignment"), 4), 4u);  // uint32
  EXPECT_EQ(get(f, after_string(f, "general.alignment") + 4, 4), 32u);
  EXPECT_EQ(get(f, after_string(f, "kvlayer.first") + 4, 8), 64u);
  EXPECT_EQ(get(f, after_string(f, "kvlayer.k_crc32") + 4, 4), crc32(s.k));
  const std::string ring = "ring";
  EXPECT_NE(std::search(f.begin(), f.end(), ring.begin(), ring.end()), f.end());
}

TEST_F(SnapshotFile, AFlatLayerWithoutAWindowHasNoWindowKey) {
  const Bytes f = encode_snapshot(snapshot_at(flat_geometry(1, 32, 32, 10), 3, 1));
  const std::string w = "kvlayer.window";
  EXPECT_EQ(std::search(f.begin(), f.end(), w.begin(), w.end()), f.end());
  EXPECT_EQ(get(f, 16, 8), 15u);
}

// ---- refusals ----------------------------------------------------------------------------

TEST_F(SnapshotFile, UnreadableFiles) {
  EXPECT_EQ(error_of([&] { (void)load_snapshot(path("missing.gguf")); }),
            "load_snapshot: " + path("missing.gguf") + ": cannot open: No such file or directory");
  EXPECT_EQ(error_of([&] { (void)load_snapshot(dir_.string()); }),
            "load_snapshot: " + dir_.string() + ": not a regular file");
}

TEST_F(SnapshotFile, EveryTruncationIsRefused) {
  for (const kvlayer::Snapshot& s :
       {ring_snapshot(), snapshot_at(flat_geometry(1, 32, 32, 10), 0, 1)}) {
    const Bytes f = encode_snapshot(s);
    for (std::size_t n = 0; n < f.size(); ++n) {
      const std::string e = parse_error(Bytes(f.begin(), f.begin() + std::ptrdiff_t(n)));
      ASSERT_EQ(e.rfind("load_snapshot: snap.gguf: truncated: ", 0), 0u)
          << "cut at " << n << ": " << e;
    }
  }
  const Bytes f = encode_snapshot(ring_snapshot());
  EXPECT_EQ(parse_error(Bytes(f.begin(), f.begin() + 3)),
            "load_snapshot: snap.gguf: truncated: the GGUF magic at byte 0 needs 4 bytes, the file "
            "has 3");
  EXPECT_EQ(parse_error(Bytes(f.begin(), f.begin() + 30)),
            "load_snapshot: snap.gguf: truncated: metadata key 0's length at byte 24 needs 8 "
            "bytes, the file has 30");
  EXPECT_EQ(parse_error(Bytes(f.begin(), f.begin() + 35)),
            "load_snapshot: snap.gguf: truncated: metadata key 0 at byte 32 needs 20 bytes, the "
            "file has 35");
  EXPECT_EQ(parse_error(Bytes(f.begin(), f.end() - 1)),
            "load_snapshot: snap.gguf: truncated: tensor kv.v needs bytes [" +
                std::to_string(f.size() - 8256) + ", " + std::to_string(f.size()) +
                ") (8256 padded to the alignment 32), the file has " +
                std::to_string(f.size() - 1));
}

TEST_F(SnapshotFile, CrcMismatchesAreRefused) {
  const kvlayer::Snapshot s = ring_snapshot();
  Bytes f = encode_snapshot(s);
  const std::size_t v_end = f.size();
  const std::size_t k_begin = v_end - 8256 - 5856;
  Bytes bad = f;
  bad[k_begin + 100] ^= 0x01;
  Bytes k = s.k;
  k[100] ^= 0x01;
  char want[64];
  std::snprintf(want, sizeof want, "0x%08x, but tensor kv.k's bytes have CRC-32 0x%08x", crc32(s.k),
                crc32(k));
  EXPECT_EQ(parse_error(bad),
            std::string("load_snapshot: snap.gguf: kvlayer.k_crc32: ") + want + " (corrupted)");
  bad = f;
  bad[v_end - 1] ^= 0x80;
  Bytes v = s.v;
  v.back() ^= 0x80;
  std::snprintf(want, sizeof want, "0x%08x, but tensor kv.v's bytes have CRC-32 0x%08x", crc32(s.v),
                crc32(v));
  EXPECT_EQ(parse_error(bad),
            std::string("load_snapshot: snap.gguf: kvlayer.v_crc32: ") + want + " (corrupted)");
  // A stored CRC that is wrong for good bytes is refused the same way.
  bad = f;
  put(bad, after_string(f, "kvlayer.k_crc32") + 4, crc32(s.k) ^ 1u, 4);
  std::snprintf(want, sizeof want, "0x%08x, but tensor kv.k's bytes have CRC-32 0x%08x",
                crc32(s.k) ^ 1u, crc32(s.k));
  EXPECT_EQ(parse_error(bad),
            std::string("load_snapshot: snap.gguf: kvlayer.k_crc32: ") + want + " (corrupted)");
}

TEST_F(SnapshotFile, HeaderRefusals) {
  const Bytes f = encode_snapshot(ring_snapshot());
  const std::string at = "load_snapshot: snap.gguf: ";
  Bytes b = f;
  b[0] = 'P';
  EXPECT_EQ(parse_error(b),
            at + "not a GGUF file: the first 4 bytes are 50 47 55 46, expected 47 47 55 46 "
                 "(\"GGUF\")");
  b = f;
  put(b, 4, 2, 4);
  EXPECT_EQ(parse_error(b), at + "GGUF version 2, expected 3");
  b = f;
  put(b, after_string(f, "general.alignment") + 4, 24, 4);
  EXPECT_EQ(parse_error(b), at + "general.alignment: 24, expected a power of two");
  b = f;  // two keys named kvlayer.v_crc32
  b[after_string(f, "kvlayer.k_crc32") - 7] = 'v';
  EXPECT_EQ(parse_error(b), at + "duplicate key kvlayer.v_crc32");
  b = f;
  put(b, after_string(f, "kvlayer.len"), 13, 4);
  EXPECT_EQ(parse_error(b), at + "key kvlayer.len: unknown value type 13");
}

TEST_F(SnapshotFile, MissingAndMistypedKeysAreRefused) {
  const Bytes f = encode_snapshot(ring_snapshot());
  const std::string at = "load_snapshot: snap.gguf: ";
  const std::pair<const char*, const char*> keys[] = {
      {"kvlayer.format_version", "uint32"},
      {"kvlayer.n_kv_heads", "uint32"},
      {"kvlayer.head_dim_k", "uint32"},
      {"kvlayer.head_dim_v", "uint32"},
      {"kvlayer.max_ctx", "uint64"},
      {"kvlayer.storage", "string"},
      {"kvlayer.max_append", "uint64"},
      {"kvlayer.rewind_slack", "uint64"},
      {"kvlayer.len", "uint64"},
      {"kvlayer.first", "uint64"},
      {"kvlayer.base", "uint64"},
      {"kvlayer.k_crc32", "uint32"},
      {"kvlayer.v_crc32", "uint32"},
  };
  for (const auto& [key, type] : keys) {
    Bytes b = f;
    b[after_string(f, key) - 1] = '~';  // renames the key
    EXPECT_EQ(parse_error(b), at + "missing key " + key + " (" + type + ")");
  }
  // The window is optional, but a ring needs one.
  Bytes b = f;
  b[after_string(f, "kvlayer.window") - 1] = '~';
  EXPECT_EQ(parse_error(b), at + "snapshot geometry: ring storage requires a window");
  // Another type of the same size: uint64 -> int64, uint32 -> int32.
  b = f;
  put(b, after_string(f, "kvlayer.len"), 11, 4);
  EXPECT_EQ(parse_error(b), at + "kvlayer.len: type int64, expected uint64");
  b = f;
  put(b, after_string(f, "kvlayer.head_dim_k"), 5, 4);
  EXPECT_EQ(parse_error(b), at + "kvlayer.head_dim_k: type int32, expected uint32");
}

TEST_F(SnapshotFile, BadValuesAreRefusedWithTheExpectedValue) {
  const Bytes f = encode_snapshot(ring_snapshot());
  const std::string at = "load_snapshot: snap.gguf: ";
  auto with = [&](const char* key, std::uint64_t v, int n) {
    Bytes b = f;
    put(b, after_string(f, key) + 4, v, n);
    return parse_error(b);
  };
  EXPECT_EQ(with("kvlayer.format_version", 2, 4), at + "kvlayer.format_version: 2, expected 1");
  EXPECT_EQ(with("kvlayer.n_kv_heads", 0, 4),
            at + "snapshot geometry: n_kv_heads 0 is outside [1, 4096]");
  EXPECT_EQ(with("kvlayer.n_kv_heads", 0x80000000u, 4),
            at + "kvlayer.n_kv_heads: 2147483648 exceeds 2147483647");
  EXPECT_EQ(with("kvlayer.head_dim_v", 48, 4),
            at + "snapshot geometry: head_dim_v 48 must be a positive multiple of 32 up to 4096");
  EXPECT_EQ(with("kvlayer.len", 1001, 8), at + "snapshot len 1001 is outside [0, max_ctx 1000]");
  EXPECT_EQ(with("kvlayer.len", 1ull << 63, 8),
            at + "kvlayer.len: 9223372036854775808 exceeds 9223372036854775807");
  EXPECT_EQ(with("kvlayer.first", 32, 8),
            at + "snapshot first 32 is not the restore plan's first row 64 for len 150 (ring: "
                 "align_down(len - (window - 1)))");
  EXPECT_EQ(with("kvlayer.base", 96, 8),
            at + "snapshot base 96 is above its first row 64 (lapped: the ring had dropped rows "
                 "the snapshot must hold)");
  Bytes b = f;
  b[after_string(f, "kvlayer.storage") + 4 + 8 + 1] = 'o';  // "ring" -> "rong"
  EXPECT_EQ(parse_error(b), at + "kvlayer.storage: 'rong', expected 'flat' or 'ring'");
}

TEST_F(SnapshotFile, WrongTensorsAreRefused) {
  const Bytes f = encode_snapshot(ring_snapshot());
  const std::string at = "load_snapshot: snap.gguf: ";
  const std::size_t k = after_string(f, "kv.k"), v = after_string(f, "kv.v");
  Bytes b = f;
  put(b, k + 20, 1, 4);
  EXPECT_EQ(parse_error(b), at + "tensor kv.k: type 1 (F16), expected 8 (Q8_0)");
  b = f;
  put(b, v + 20, 8, 4);
  EXPECT_EQ(parse_error(b), at + "tensor kv.v: type 8 (Q8_0), expected 7 (Q5_1)");
  b = f;
  put(b, k + 12, 85, 8);
  EXPECT_EQ(parse_error(b),
            at + "tensor kv.k: ggml dims [64, 85], expected [64, 86] ([kv_dim_k, len - first])");
  b = f;  // the numpy order [rows, kv_dim] written as ggml dims
  put(b, v + 4, 86, 8);
  put(b, v + 12, 128, 8);
  EXPECT_EQ(parse_error(b),
            at + "tensor kv.v: ggml dims [86, 128], expected [128, 86] ([kv_dim_v, len - first])");
  b = f;
  b[k - 1] = 'x';
  EXPECT_EQ(parse_error(b), at + "missing tensor kv.k (Q8_0, ggml dims [64, 86])");
  b = f;
  put(b, v + 24, 5857, 8);
  EXPECT_EQ(parse_error(b), at + "tensor kv.v: offset 5857 is not a multiple of the alignment 32");
  b = f;
  put(b, v + 24, 5856 + 32, 8);
  EXPECT_EQ(parse_error(b).rfind(at + "truncated: tensor kv.v needs bytes [", 0), 0u);
}

// ---- writing ---------------------------------------------------------------------------------

TEST_F(SnapshotFile, SaveRefusesAMalformedSnapshotAndWritesNothing) {
  kvlayer::Snapshot s = ring_snapshot();
  s.v.pop_back();
  EXPECT_EQ(error_of([&] { save_snapshot(path("s.gguf"), s); }, ErrorKind::refused),
            "save_snapshot: snapshot V holds 8255 bytes, expected 8256 (rows [64, 150) x 96)");
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SnapshotFile, SaveIntoAMissingDirectoryNamesTheDirectory) {
  const std::string p = path("no/such/dir/s.gguf");
  EXPECT_EQ(error_of([&] { save_snapshot(p, ring_snapshot()); }),
            "save_snapshot: " + p + ": cannot create a temporary file in " + path("no/such/dir") +
                ": No such file or directory");
}

TEST_F(SnapshotFile, AWriterStoppedAfterAnyByteLeavesTheOldFileIntact) {
  const std::string p = path("s.gguf");
  const kvlayer::Snapshot old_s = snapshot_at(flat_geometry(1, 32, 32, 50), 20, 1);
  const kvlayer::Snapshot new_s = snapshot_at(ring_geometry(1, 32, 64, 400, 30, 4, 2), 77, 2);
  save_snapshot(p, old_s);
  const Bytes old_bytes = read_file(p), new_bytes = encode_snapshot(new_s);
  ASSERT_NE(old_bytes, new_bytes);
  for (std::uint64_t n = 0; n <= new_bytes.size(); ++n) {
    detail::set_save_crash_point(n);
    const std::string e = error_of([&] { save_snapshot(p, new_s); });
    ASSERT_EQ(e.rfind("save_snapshot: " + p + ": stopped after " + std::to_string(n) +
                          " bytes (test crash point)",
                      0),
              0u)
        << e;
    ASSERT_EQ(read_file(p), old_bytes) << "stopped after " << n << " bytes";
    // The killed writer's temporary file holds exactly what it wrote.
    const std::vector<std::string> left = others("s.gguf");
    ASSERT_EQ(left.size(), 1u);
    ASSERT_EQ(read_file(dir_ / left[0]),
              Bytes(new_bytes.begin(), new_bytes.begin() + std::ptrdiff_t(n)));
    fs::remove(dir_ / left[0]);
  }
  EXPECT_EQ(same(load_snapshot(p), old_s), "");
  // Past the last byte the crash point is never reached: the save completes.
  detail::set_save_crash_point(new_bytes.size() + 1);
  save_snapshot(p, new_s);
  EXPECT_EQ(read_file(p), new_bytes);
  EXPECT_EQ(same(load_snapshot(p), new_s), "");
  EXPECT_EQ(others("s.gguf"), std::vector<std::string>{});
}

TEST_F(SnapshotFile, AWriterStoppedBeforeTheRenameLeavesNoTarget) {
  const std::string p = path("s.gguf");
  const kvlayer::Snapshot s = ring_snapshot();
  for (std::uint64_t n : {std::uint64_t(0), std::uint64_t(100), encode_snapshot(s).size()}) {
    detail::set_save_crash_point(n);
    EXPECT_NE(error_of([&] { save_snapshot(p, s); }), "no error");
    EXPECT_FALSE(fs::exists(p)) << n;
  }
  detail::set_save_crash_point(std::nullopt);
  save_snapshot(p, s);
  EXPECT_EQ(same(load_snapshot(p), s), "");
}

}  // namespace
}  // namespace kvlayer::testing
