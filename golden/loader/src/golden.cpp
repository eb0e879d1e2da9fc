#include "kvlayer/golden/golden.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

#include "kvlayer/error.hpp"
#include "kvlayer/golden/manifest.hpp"
#include "kvlayer/golden/npy.hpp"
#include "kvlayer/golden/sha256.hpp"

#ifndef KVLAYER_GOLDEN_DIR
#error "KVLAYER_GOLDEN_DIR must name the source tree's golden/data"
#endif

namespace kvlayer::golden {
namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::io, what);
}

const std::string& string_at(const Json& object, std::string_view key) {
  return as_string(member(object, key));
}

std::int64_t int_at(const Json& object, std::string_view key) {
  return as_int(member(object, key));
}

std::uint32_t parse_bits(const std::string& hex) {
  if (hex.size() != 10 || hex.rfind("0x", 0) != 0) bad("golden: bad value_bits '" + hex + "'");
  return std::uint32_t(std::stoul(hex.substr(2), nullptr, 16));
}

/// Loads the files the manifest lists, checking each against its entry; hands out bytes by name.
class Files {
 public:
  Files(const std::filesystem::path& dir, const Json& entries) : dir_(dir), entries_(entries) {}

  /// Raw bytes of a .bin file, checked against its manifest entry.
  std::vector<std::uint8_t> bin(const std::string& rel, std::int64_t expect_size) {
    const Json& e = entry(rel);
    std::vector<std::uint8_t> bytes = read_file(dir_ / rel);
    verify_hash(rel, e, bytes);
    if (string_at(e, "dtype") != "uint8" || std::int64_t(bytes.size()) != expect_size)
      bad("golden: " + rel + " holds " + std::to_string(bytes.size()) + " bytes, expected " +
          std::to_string(expect_size));
    return bytes;
  }

  /// A .npy file, checked against its manifest entry and against `descr` and `shape`.
  NpyArray npy(const std::string& rel, const std::string& descr,
               const std::vector<std::int64_t>& shape) {
    const Json& e = entry(rel);
    verify_hash(rel, e, read_file(dir_ / rel));
    NpyArray a = read_npy(dir_ / rel);
    std::vector<std::int64_t> listed;
    for (const Json& d : as_array(member(e, "shape"))) listed.push_back(as_int(d));
    if (a.header.descr != descr || a.header.shape != shape || listed != shape)
      bad("golden: " + rel + " has dtype " + a.header.descr + " and shape " +
          shape_string(a.header.shape) + "; the case needs " + descr + " " + shape_string(shape) +
          " (manifest: " + shape_string(listed) + ")");
    return a;
  }

  std::size_t verified() const { return verified_; }

 private:
  static std::string shape_string(const std::vector<std::int64_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
  }
  const Json& entry(const std::string& rel) {
    if (!has_member(entries_, rel)) bad("golden: " + rel + " is not listed in manifest.json files");
    return member(entries_, rel);
  }
  void verify_hash(const std::string& rel, const Json& e, const std::vector<std::uint8_t>& bytes) {
    const std::string got = sha256_hex(bytes);
    if (got != string_at(e, "sha256"))
      bad("golden: " + rel + " has sha256 " + got + ", manifest says " + string_at(e, "sha256") +
          " (regenerate with tools/regen-golden)");
    ++verified_;
  }

  std::filesystem::path dir_;
  const Json& entries_;
  std::size_t verified_ = 0;
};

std::vector<float> as_f32(const NpyArray& a) {
  std::vector<float> out(a.data.size() / 4);
  std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}

QuantCase load_quant(const Json& c, Files& files) {
  QuantCase q;
  q.name = string_at(c, "name");
  q.what = string_at(c, "what");
  q.blocks = int_at(c, "blocks");
  q.input = as_f32(files.npy(string_at(c, "input"), "<f4", {q.blocks, kBlockValues}));
  for (const auto& [fmt, info] : as_object(member(c, "formats"))) {
    QuantFormat f;
    if (fmt == "q8_0")
      f.type = ref::BlockType::q8_0;
    else if (fmt == "q5_1")
      f.type = ref::BlockType::q5_1;
    else
      bad("golden: case " + q.name + ": unknown format '" + fmt + "'");
    f.expected = files.bin(string_at(info, "expected"), q.blocks * ref::block_bytes(f.type));
    for (const Json& b : as_array(member(info, "bad_blocks")))
      f.bad_blocks.push_back({int_at(b, "block"), parse_bits(string_at(b, "value_bits"))});
    for (const Json& b : as_array(member(info, "degenerate_blocks")))
      f.degenerate_blocks.push_back(as_int(b));
    q.formats.push_back(std::move(f));
  }
  if (q.formats.empty()) bad("golden: case " + q.name + " has no formats");
  return q;
}

DecodeCase load_decode(const Json& c, Files& files) {
  DecodeCase d;
  d.name = string_at(c, "name");
  d.what = string_at(c, "what");
  const Json& g = member(c, "geometry");
  Geometry& geo = d.geometry;
  geo.n_kv_heads = int(int_at(g, "n_kv_heads"));
  geo.head_dim_k = geo.head_dim_v = int(int_at(g, "head_dim"));
  geo.max_ctx = int_at(g, "max_ctx");
  if (!member(g, "window").is_null()) geo.window = int_at(g, "window");
  const std::string& storage = string_at(g, "storage");
  if (storage != "flat" && storage != "ring")
    bad("golden: case " + d.name + ": storage " + storage);
  geo.storage = storage == "ring" ? Storage::ring : Storage::flat;
  geo.max_append = int_at(g, "max_append");
  geo.rewind_slack = int_at(g, "rewind_slack");
  d.gqa = int(int_at(c, "gqa"));
  d.n_q_heads = int(int_at(c, "n_q_heads"));
  const std::string& dt = string_at(c, "input_dtype");
  if (dt != "f32" && dt != "f16") bad("golden: case " + d.name + ": input_dtype " + dt);
  d.input_dtype = dt == "f16" ? DType::f16 : DType::f32;
  d.scale = std::bit_cast<float>(parse_bits(string_at(c, "scale_bits")));
  d.scale_is_default = as_bool(member(c, "scale_is_default"));

  const std::int64_t kv_dim = geo.kv_dim_k(), hd = geo.head_dim_k, nq = d.n_q_heads;
  const std::string in_descr = d.input_dtype == DType::f16 ? "<f2" : "<f4";
  for (const Json& o : as_array(member(c, "ops"))) {
    GoldenOp op;
    const std::string& kind = string_at(o, "op");
    if (kind == "append") {
      op.kind = GoldenOp::Kind::append;
      op.n = int_at(o, "n");
      op.src_row = int_at(o, "src_row");
      d.input_rows = std::max(d.input_rows, op.src_row + op.n);
    } else if (kind == "rewind") {
      op.kind = GoldenOp::Kind::rewind;
      op.to = int_at(o, "to");
    } else {
      bad("golden: case " + d.name + ": unknown op '" + kind + "'");
    }
    op.expect_ok = string_at(o, "expect") == "ok";
    op.decode_ok = string_at(o, "decode") == "ok";
    op.len = int_at(o, "len");
    op.base = int_at(o, "base");
    d.ops.push_back(op);
  }
  const std::int64_t n_ops = std::int64_t(d.ops.size());
  d.k_input = files.npy(string_at(c, "k_input"), in_descr, {d.input_rows, kv_dim}).data;
  d.v_input = files.npy(string_at(c, "v_input"), in_descr, {d.input_rows, kv_dim}).data;
  d.query = as_f32(files.npy(string_at(c, "query"), "<f4", {nq, hd}));
  const NpyArray out = files.npy(string_at(c, "outputs"), "<f8", {n_ops, nq, hd});
  d.outputs.resize(out.data.size() / 8);
  std::memcpy(d.outputs.data(), out.data.data(), out.data.size());
  d.magnitudes = as_f32(files.npy(string_at(c, "magnitudes"), "<f4", {n_ops, nq, hd}));
  d.score_magnitudes = as_f32(files.npy(string_at(c, "score_magnitudes"), "<f4", {n_ops, nq}));
  const Json& fin = member(c, "final");
  d.final_len = int_at(fin, "len");
  d.final_base = int_at(fin, "base");
  const std::int64_t rows = int_at(g, "rows");
  d.k_plane = files.bin(string_at(fin, "k_plane"), rows * geo.k_tok_bytes());
  d.v_plane = files.bin(string_at(fin, "v_plane"), rows * geo.v_tok_bytes());
  if (!member(c, "data_error").is_null()) {
    const Json& e = member(c, "data_error");
    const std::string& plane = string_at(e, "plane");
    d.data_error = GoldenDataError{int_at(e, "row"), plane == "K" ? Plane::k : Plane::v,
                                   int_at(e, "block"), parse_bits(string_at(e, "value_bits"))};
  }
  return d;
}

}  // namespace

float GoldenBadBlock::value() const {
  return std::bit_cast<float>(value_bits);
}

std::string GoldenOp::describe() const {
  if (kind == Kind::rewind) return "rewind to " + std::to_string(to);
  return "append " + std::to_string(n) + " rows (inputs from row " + std::to_string(src_row) + ")";
}

const void* DecodeCase::k_row(std::int64_t row) const {
  return k_input.data() + row * geometry.kv_dim_k() * std::int64_t(dtype_size(input_dtype));
}
const void* DecodeCase::v_row(std::int64_t row) const {
  return v_input.data() + row * geometry.kv_dim_v() * std::int64_t(dtype_size(input_dtype));
}

std::int64_t DecodeCase::view_length(std::size_t op) const {
  const GoldenOp& o = ops.at(op);
  if (!o.decode_ok) return 0;
  const std::int64_t begin =
      geometry.window ? std::max<std::int64_t>(0, o.len - *geometry.window) : 0;
  return o.len - begin;
}

GoldenSet load_golden(const std::filesystem::path& dir) {
  const std::vector<std::uint8_t> text = read_file(dir / "manifest.json");
  const Json manifest =
      parse_json(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  GoldenSet set;
  set.dir = dir;
  set.format = string_at(manifest, "format");
  if (set.format != "kvlayer-golden-1")
    bad("golden: " + (dir / "manifest.json").string() + " has format '" + set.format +
        "', this loader reads kvlayer-golden-1");
  Files files(dir, member(manifest, "files"));
  for (const Json& c : as_array(member(manifest, "cases"))) {
    const std::string& kind = string_at(c, "kind");
    try {
      if (kind == "quant")
        set.quant.push_back(load_quant(c, files));
      else if (kind == "decode")
        set.decode.push_back(load_decode(c, files));
      else
        bad("golden: unknown case kind '" + kind + "'");
    } catch (const Error& e) {
      bad("golden: case " + string_at(c, "name") + ": " + e.what());
    }
  }
  set.files_verified = files.verified();
  if (set.files_verified != as_object(member(manifest, "files")).size())
    bad("golden: manifest lists " + std::to_string(as_object(member(manifest, "files")).size()) +
        " files but the cases use " + std::to_string(set.files_verified));
  return set;
}

std::filesystem::path default_golden_dir() {
  return KVLAYER_GOLDEN_DIR;
}

}  // namespace kvlayer::golden
