#include "kvlayer/golden/golden.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

#include "kvlayer/error.hpp"
#include "kvlayer/golden/json.hpp"
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
    if (e["dtype"].as_string() != "uint8" || std::int64_t(bytes.size()) != expect_size)
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
    for (const Json& d : e["shape"].as_array()) listed.push_back(d.as_int());
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
    if (!entries_.contains(rel)) bad("golden: " + rel + " is not listed in manifest.json files");
    return entries_[rel];
  }
  void verify_hash(const std::string& rel, const Json& e, const std::vector<std::uint8_t>& bytes) {
    const std::string got = sha256_hex(bytes);
    if (got != e["sha256"].as_string())
      bad("golden: " + rel + " has sha256 " + got + ", manifest says " + e["sha256"].as_string() +
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
  q.name = c["name"].as_string();
  q.what = c["what"].as_string();
  q.blocks = c["blocks"].as_int();
  q.input = as_f32(files.npy(c["input"].as_string(), "<f4", {q.blocks, kBlockValues}));
  for (const auto& [fmt, info] : c["formats"].as_object()) {
    QuantFormat f;
    if (fmt == "q8_0")
      f.type = ref::BlockType::q8_0;
    else if (fmt == "q5_1")
      f.type = ref::BlockType::q5_1;
    else
      bad("golden: case " + q.name + ": unknown format '" + fmt + "'");
    f.expected = files.bin(info["expected"].as_string(), q.blocks * ref::block_bytes(f.type));
    for (const Json& b : info["bad_blocks"].as_array())
      f.bad_blocks.push_back({b["block"].as_int(), parse_bits(b["value_bits"].as_string())});
    for (const Json& b : info["degenerate_blocks"].as_array())
      f.degenerate_blocks.push_back(b.as_int());
    q.formats.push_back(std::move(f));
  }
  if (q.formats.empty()) bad("golden: case " + q.name + " has no formats");
  return q;
}

DecodeCase load_decode(const Json& c, Files& files) {
  DecodeCase d;
  d.name = c["name"].as_string();
  d.what = c["what"].as_string();
  const Json& g = c["geometry"];
  Geometry& geo = d.geometry;
  geo.n_kv_heads = int(g["n_kv_heads"].as_int());
  geo.head_dim_k = geo.head_dim_v = int(g["head_dim"].as_int());
  geo.max_ctx = g["max_ctx"].as_int();
  if (!g["window"].is_null()) geo.window = g["window"].as_int();
  const std::string& storage = g["storage"].as_string();
  if (storage != "flat" && storage != "ring")
    bad("golden: case " + d.name + ": storage " + storage);
  geo.storage = storage == "ring" ? Storage::ring : Storage::flat;
  geo.max_append = g["max_append"].as_int();
  geo.rewind_slack = g["rewind_slack"].as_int();
  d.gqa = int(c["gqa"].as_int());
  d.n_q_heads = int(c["n_q_heads"].as_int());
  const std::string& dt = c["input_dtype"].as_string();
  if (dt != "f32" && dt != "f16") bad("golden: case " + d.name + ": input_dtype " + dt);
  d.input_dtype = dt == "f16" ? DType::f16 : DType::f32;
  d.scale = std::bit_cast<float>(parse_bits(c["scale_bits"].as_string()));
  d.scale_is_default = c["scale_is_default"].as_bool();

  const std::int64_t kv_dim = geo.kv_dim_k(), hd = geo.head_dim_k, nq = d.n_q_heads;
  const std::string in_descr = d.input_dtype == DType::f16 ? "<f2" : "<f4";
  for (const Json& o : c["ops"].as_array()) {
    GoldenOp op;
    const std::string& kind = o["op"].as_string();
    if (kind == "append") {
      op.kind = GoldenOp::Kind::append;
      op.n = o["n"].as_int();
      op.src_row = o["src_row"].as_int();
      d.input_rows = std::max(d.input_rows, op.src_row + op.n);
    } else if (kind == "rewind") {
      op.kind = GoldenOp::Kind::rewind;
      op.to = o["to"].as_int();
    } else {
      bad("golden: case " + d.name + ": unknown op '" + kind + "'");
    }
    op.expect_ok = o["expect"].as_string() == "ok";
    op.decode_ok = o["decode"].as_string() == "ok";
    op.len = o["len"].as_int();
    op.base = o["base"].as_int();
    d.ops.push_back(op);
  }
  const std::int64_t n_ops = std::int64_t(d.ops.size());
  d.k_input = files.npy(c["k_input"].as_string(), in_descr, {d.input_rows, kv_dim}).data;
  d.v_input = files.npy(c["v_input"].as_string(), in_descr, {d.input_rows, kv_dim}).data;
  d.query = as_f32(files.npy(c["query"].as_string(), "<f4", {nq, hd}));
  const NpyArray out = files.npy(c["outputs"].as_string(), "<f8", {n_ops, nq, hd});
  d.outputs.resize(out.data.size() / 8);
  std::memcpy(d.outputs.data(), out.data.data(), out.data.size());
  d.magnitudes = as_f32(files.npy(c["magnitudes"].as_string(), "<f4", {n_ops, nq, hd}));
  d.score_magnitudes = as_f32(files.npy(c["score_magnitudes"].as_string(), "<f4", {n_ops, nq}));
  const Json& fin = c["final"];
  d.final_len = fin["len"].as_int();
  d.final_base = fin["base"].as_int();
  const std::int64_t rows = g["rows"].as_int();
  d.k_plane = files.bin(fin["k_plane"].as_string(), rows * geo.k_tok_bytes());
  d.v_plane = files.bin(fin["v_plane"].as_string(), rows * geo.v_tok_bytes());
  if (!c["data_error"].is_null()) {
    const Json& e = c["data_error"];
    const std::string& plane = e["plane"].as_string();
    d.data_error = GoldenDataError{e["row"].as_int(), plane == "K" ? Plane::k : Plane::v,
                                   e["block"].as_int(), parse_bits(e["value_bits"].as_string())};
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
      Json::parse(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  GoldenSet set;
  set.dir = dir;
  set.format = manifest["format"].as_string();
  if (set.format != "kvlayer-golden-1")
    bad("golden: " + (dir / "manifest.json").string() + " has format '" + set.format +
        "', this loader reads kvlayer-golden-1");
  Files files(dir, manifest["files"]);
  for (const Json& c : manifest["cases"].as_array()) {
    const std::string& kind = c["kind"].as_string();
    try {
      if (kind == "quant")
        set.quant.push_back(load_quant(c, files));
      else if (kind == "decode")
        set.decode.push_back(load_decode(c, files));
      else
        bad("golden: unknown case kind '" + kind + "'");
    } catch (const Error& e) {
      bad("golden: case " + c["name"].as_string() + ": " + e.what());
    }
  }
  set.files_verified = files.verified();
  if (set.files_verified != manifest["files"].as_object().size())
    bad("golden: manifest lists " + std::to_string(manifest["files"].as_object().size()) +
        " files but the cases use " + std::to_string(set.files_verified));
  return set;
}

std::filesystem::path default_golden_dir() {
  return KVLAYER_GOLDEN_DIR;
}

}  // namespace kvlayer::golden
