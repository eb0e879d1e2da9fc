// kvlayer inspect / snapshot-demo: the snapshot file (SPEC §13, kvlayer/snapshot_file.hpp).
// inspect reads a file (every check of load_snapshot: GGUF version, keys, shapes, CRCs) and
// prints what it holds; snapshot-demo writes, or compares a file with, a snapshot of a reference
// layer filled with seeded rows (the golden test's data for gguf-py, both directions).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvlayer/crc32.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "kvlayer/testing/rng.hpp"

namespace kvlayer::cli {
namespace {

constexpr std::string_view kInspectLine = "kvlayer inspect FILE";
constexpr std::string_view kDemoLine =
    "kvlayer snapshot-demo --output FILE | --compare FILE [--storage flat|ring] [--len N] "
    "[--seed S]";

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

/// load_snapshot, its messages without the "load_snapshot: " prefix (the CLI names itself).
Snapshot load(const std::string& path) {
  try {
    return load_snapshot(path);
  } catch (const Error& e) {
    const std::string m = e.what(), prefix = "load_snapshot: ";
    throw Error(e.kind(), m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m);
  }
}

/// What one tensor holds: its dequantized values (SPEC §4) and quantization steps, canonical
/// bad blocks (SPEC §3: a NaN scale) counted apart.
std::string tensor_summary(const char* name, ref::BlockType type,
                           const std::vector<std::uint8_t>& bytes, std::int64_t rows,
                           std::int64_t kv_dim) {
  const int bb = ref::block_bytes(type);
  const std::size_t blocks = bytes.size() / std::size_t(bb);
  std::size_t bad = 0, values = 0;
  double max_abs = 0, sum_abs = 0, max_step = 0, sum_step = 0;
  float x[kBlockValues];
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::span<const std::uint8_t> in(bytes.data() + b * std::size_t(bb), std::size_t(bb));
    ref::dequantize_row(type, in, x);
    const double d = std::fabs(double(f16_bits_to_f32(std::uint16_t(in[0] | in[1] << 8))));
    bool finite = std::isfinite(d);
    for (float v : x) finite = finite && std::isfinite(v);
    if (!finite) {
      ++bad;
      continue;
    }
    for (float v : x) {
      max_abs = std::max(max_abs, double(std::fabs(v)));
      sum_abs += std::fabs(v);
    }
    values += kBlockValues;
    max_step = std::max(max_step, d);
    sum_step += d;
  }
  const std::size_t good = blocks - bad;
  return fmt(
      "%-11s %s, %lld rows x %lld: %zu blocks, %zu bad; |value| max %.6g mean %.6g; "
      "step d max %.6g mean %.6g (rounding error <= d/2 per value)",
      name, type == ref::BlockType::q8_0 ? "q8_0" : "q5_1", (long long)rows, (long long)kv_dim,
      blocks, bad, max_abs, values > 0 ? sum_abs / double(values) : 0.0, max_step,
      good > 0 ? sum_step / double(good) : 0.0);
}

int run_inspect(const std::vector<std::string>& args) {
  std::string path;
  for (const std::string& a : args) {
    if (a.rfind("--", 0) == 0)
      throw UsageError("unknown option '" + a + "' (usage: " + std::string(kInspectLine) + ")");
    if (!path.empty())
      throw UsageError("unexpected argument '" + a + "' (usage: " + std::string(kInspectLine) +
                       ")");
    path = a;
  }
  if (path.empty()) throw UsageError("missing FILE (usage: " + std::string(kInspectLine) + ")");
  const Snapshot s = load(path);
  const Geometry& g = s.geometry;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  std::cout << fmt("%-11s %s (%llu bytes, GGUF v3, kvlayer format %u)\n", "file", path.c_str(),
                   (unsigned long long)size, kSnapshotFormatVersion)
            << fmt("%-11s %s\n", "geometry", g.describe().c_str())
            << fmt("%-11s %lld\n", "len", (long long)s.len)
            << fmt("%-11s %s\n", "window", g.window ? std::to_string(*g.window).c_str() : "none")
            << fmt("%-11s %lld (%lld rows held, [%lld, %lld); base %lld when saved)\n", "first row",
                   (long long)s.first, (long long)s.rows(), (long long)s.first, (long long)s.len,
                   (long long)s.base)
            << fmt("%-11s kv.k 0x%08x, kv.v 0x%08x: match the stored kvlayer.k_crc32, "
                   "kvlayer.v_crc32\n",
                   "crc32", crc32(s.k), crc32(s.v))
            << tensor_summary("kv.k", ref::BlockType::q8_0, s.k, s.rows(), g.kv_dim_k()) << "\n"
            << tensor_summary("kv.v", ref::BlockType::q5_1, s.v, s.rows(), g.kv_dim_v()) << "\n";
  return kExitOk;
}

/// The demo layer: ring 2x64/64 max_ctx 4096 window 100 max_append 16 rewind_slack 8, or the
/// same heads flat without a window, filled to `len` by appends of 1..16 seeded rows (per
/// block a power-of-two scale in [2^-4, 2^2] times uniform(-1, 1)).
Snapshot demo_snapshot(bool ring, std::int64_t len, std::uint64_t seed) {
  Geometry g;
  g.n_kv_heads = 2;
  g.head_dim_k = g.head_dim_v = 64;
  g.max_ctx = 4096;
  if (ring) {
    g.window = 100;
    g.storage = Storage::ring;
    g.max_append = 16;
    g.rewind_slack = 8;
  }
  ref::KvLayer layer(g);
  testing::Rng rng(seed);
  while (layer.len() < len) {
    const std::int64_t n = std::min<std::int64_t>(rng.range(1, 16), len - layer.len());
    std::vector<float> k(std::size_t(n * g.kv_dim_k())), v(std::size_t(n * g.kv_dim_v()));
    for (std::vector<float>* x : {&k, &v})
      for (std::size_t b = 0; b < x->size(); b += kBlockValues) {
        const float scale = std::ldexp(1.0f, int(rng.range(-4, 2)));
        for (std::size_t j = b; j < b + kBlockValues; ++j) (*x)[j] = scale * rng.uniform(-1, 1);
      }
    layer.append({k.data(), v.data(), n, DType::f32});
  }
  return layer.snapshot();
}

/// The first difference between a loaded file and the demo snapshot, or "".
std::string difference(const Snapshot& file, const Snapshot& demo) {
  const Geometry &a = file.geometry, &b = demo.geometry;
  if (!same_layout(a, b) || a.max_append != b.max_append || a.rewind_slack != b.rewind_slack)
    return "geometry '" + a.describe() + "' (max_append " + std::to_string(a.max_append) +
           ", rewind_slack " + std::to_string(a.rewind_slack) + "), the demo's '" + b.describe() +
           "'";
  for (auto [name, x, y] :
       {std::tuple{"len", file.len, demo.len}, std::tuple{"first", file.first, demo.first},
        std::tuple{"base", file.base, demo.base}})
    if (x != y) return fmt("%s %lld, the demo's %lld", name, (long long)x, (long long)y);
  for (auto [name, x, y, tok] : {std::tuple{"kv.k", &file.k, &demo.k, a.k_tok_bytes()},
                                 std::tuple{"kv.v", &file.v, &demo.v, a.v_tok_bytes()}})
    for (std::size_t i = 0; i < x->size(); ++i)
      if ((*x)[i] != (*y)[i])
        return fmt("%s byte %zu (row %lld, byte %lld of the row): 0x%02x, the demo's 0x%02x", name,
                   i, (long long)(file.first + std::int64_t(i) / tok),
                   (long long)(std::int64_t(i) % tok), (*x)[i], (*y)[i]);
  return "";
}

int run_snapshot_demo(const std::vector<std::string>& args) {
  const Options o(args, {"output", "compare", "storage", "len", "seed"}, {});
  const auto output = o.get("output"), compare = o.get("compare");
  if (output.has_value() == compare.has_value())
    throw UsageError(
        "give one of --output FILE and --compare FILE (usage: " + std::string(kDemoLine) + ")");
  const std::string storage = o.get("storage").value_or("ring");
  if (storage != "flat" && storage != "ring")
    throw UsageError("unknown --storage '" + storage + "' (supported: flat, ring)");
  const std::int64_t len = o.integer("len", 300, 0, 4096);
  const auto seed =
      std::uint64_t(o.integer("seed", 1, 0, std::numeric_limits<std::int64_t>::max()));
  const Snapshot demo = demo_snapshot(storage == "ring", len, seed);
  if (output) {
    save_snapshot(*output, demo);
    std::cout << *output << ": " << demo.geometry.describe() << ", len " << demo.len << ", rows ["
              << demo.first << ", " << demo.len << ")\n";
    return kExitOk;
  }
  const std::string d = difference(load(*compare), demo);
  if (!d.empty()) throw Error(ErrorKind::io, *compare + ": differs from the demo snapshot: " + d);
  std::cout << *compare << ": identical to the demo snapshot (geometry, len " << demo.len
            << ", first " << demo.first << ", base " << demo.base << ", " << demo.k.size()
            << " K and " << demo.v.size() << " V bytes)\n";
  return kExitOk;
}

}  // namespace

const Command& inspect_command() {
  static const Command c{
      "inspect", "what a snapshot file holds (geometry, rows, CRCs, quantization)",
      "usage: kvlayer inspect FILE\n\n"
      "Reads a snapshot file (SPEC 13: GGUF v3, tensors kv.k Q8_0 and kv.v Q5_1, kvlayer.*\n"
      "metadata) with every check of load_snapshot (version, keys, tensor types and shapes,\n"
      "CRC-32s) and prints its geometry, len, window, first row, the CRCs, and per tensor the\n"
      "blocks (canonical bad blocks apart), the magnitude of the dequantized values and the\n"
      "quantization step d (a value's rounding error is at most d/2).\n\n"
      "Exit status: 0 read, 1 unreadable or malformed file, 2 usage error.\n",
      &run_inspect};
  return c;
}

const Command& snapshot_demo_command() {
  static const Command c{
      "snapshot-demo", "write (or compare with) a seeded snapshot file",
      "usage: kvlayer snapshot-demo --output FILE | --compare FILE [--storage flat|ring]\n"
      "                             [--len N] [--seed S]\n\n"
      "Fills a reference layer (ring: 2x64/64 max_ctx 4096 window 100 max_append 16\n"
      "rewind_slack 8; flat: the same heads, no window) to len N with seeded rows and\n"
      "  --output FILE   saves its snapshot (crash-safe; SPEC 13)\n"
      "  --compare FILE  loads FILE and compares it with that snapshot: geometry, len, first,\n"
      "                  base and every tensor byte (the golden test's check of files written\n"
      "                  by gguf-py)\n"
      "  --storage S     ring (default) or flat\n"
      "  --len N         rows appended, 0..4096 (default 300)\n"
      "  --seed S        the rows' seed (default 1)\n\n"
      "Exit status: 0 written or identical, 1 I/O error, malformed file or a difference,\n"
      "2 usage error.\n",
      &run_snapshot_demo};
  return c;
}

}  // namespace kvlayer::cli
