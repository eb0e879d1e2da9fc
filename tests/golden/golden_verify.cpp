#include "golden_verify.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>

#include "kvlayer/error.hpp"
#include "kvlayer/golden/check.hpp"
#include "kvlayer/golden/golden.hpp"
#include "kvlayer/golden/npy.hpp"
#include "kvlayer/golden/sha256.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::testing {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::io, what);
}

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

/// The files of the verify section, each checked against its manifest entry when read.
class Files {
 public:
  Files(std::filesystem::path dir, const json& entries) : dir_(std::move(dir)), entries_(entries) {}

  /// A .npy file of dtype `descr` and shape `shape`: its element bytes.
  std::vector<std::uint8_t> npy(const std::string& rel, const std::string& descr,
                                const std::vector<std::int64_t>& shape) {
    const std::vector<std::uint8_t> bytes = checked(rel);
    const golden::NpyHeader h = golden::parse_npy_header(bytes);
    const std::vector<std::int64_t> listed =
        entry(rel).at("shape").get<std::vector<std::int64_t>>();
    if (h.descr != descr || h.fortran_order || h.shape != shape || listed != shape)
      bad("golden verify: " + rel + " has dtype " + h.descr + " and shape " +
          shape_string(h.shape) + "; the case needs " + descr + " " + shape_string(shape) +
          " (manifest: " + shape_string(listed) + ")");
    const std::size_t n = std::size_t(h.count()) * std::size_t(golden::npy_item_size(descr));
    if (bytes.size() != h.data_offset + n)
      bad("golden verify: " + rel + " holds " + std::to_string(bytes.size() - h.data_offset) +
          " data bytes, its header promises " + std::to_string(n));
    return {bytes.begin() + std::ptrdiff_t(h.data_offset), bytes.end()};
  }

  /// A .bin file of `size` bytes.
  std::vector<std::uint8_t> bin(const std::string& rel, std::int64_t size) {
    std::vector<std::uint8_t> bytes = checked(rel);
    if (std::int64_t(bytes.size()) != size)
      bad("golden verify: " + rel + " holds " + std::to_string(bytes.size()) + " bytes, expected " +
          std::to_string(size));
    return bytes;
  }

  std::size_t verified() const { return verified_; }

 private:
  const json& entry(const std::string& rel) const {
    if (!entries_.contains(rel)) bad("golden verify: " + rel + " is not listed in verify.files");
    return entries_.at(rel);
  }
  std::vector<std::uint8_t> checked(const std::string& rel) {
    const json& e = entry(rel);
    std::vector<std::uint8_t> bytes = golden::read_file(dir_ / rel);
    const std::string got = golden::sha256_hex(bytes), want = e.at("sha256").get<std::string>();
    if (got != want)
      bad("golden verify: " + rel + " has sha256 " + got + ", manifest says " + want +
          " (regenerate with tools/regen-golden)");
    ++verified_;
    return bytes;
  }

  std::filesystem::path dir_;
  const json& entries_;
  std::size_t verified_ = 0;
};

template <typename T>
std::vector<T> as(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

std::uint32_t parse_bits(const std::string& hex) {
  if (hex.size() != 10 || hex.rfind("0x", 0) != 0)
    bad("golden verify: bad scale_bits '" + hex + "'");
  return std::uint32_t(std::stoul(hex.substr(2), nullptr, 16));
}

VerifyCase load_case(const json& c, Files& files) {
  VerifyCase d;
  d.name = c.at("name").get<std::string>();
  d.what = c.at("what").get<std::string>();
  if (c.at("kind").get<std::string>() != "verify") bad("golden verify: kind is not 'verify'");
  const json& g = c.at("geometry");
  Geometry& geo = d.geometry;
  geo.n_kv_heads = g.at("n_kv_heads").get<int>();
  geo.head_dim_k = geo.head_dim_v = g.at("head_dim").get<int>();
  geo.max_ctx = g.at("max_ctx").get<std::int64_t>();
  if (!g.at("window").is_null()) geo.window = g.at("window").get<std::int64_t>();
  const std::string storage = g.at("storage").get<std::string>();
  if (storage != "flat" && storage != "ring") bad("golden verify: storage " + storage);
  geo.storage = storage == "ring" ? Storage::ring : Storage::flat;
  geo.max_append = g.at("max_append").get<std::int64_t>();
  geo.rewind_slack = g.at("rewind_slack").get<std::int64_t>();
  geo.validate();
  if (geo.rows() != g.at("rows").get<std::int64_t>())
    bad("golden verify: rows " + std::to_string(g.at("rows").get<std::int64_t>()) +
        " but the geometry has " + std::to_string(geo.rows()));
  d.gqa = c.at("gqa").get<int>();
  d.n_q_heads = c.at("n_q_heads").get<int>();
  if (d.n_q_heads != d.gqa * geo.n_kv_heads) bad("golden verify: n_q_heads != gqa x n_kv_heads");
  if (c.at("input_dtype").get<std::string>() != "f32") bad("golden verify: input_dtype is not f32");
  d.scale = std::bit_cast<float>(parse_bits(c.at("scale_bits").get<std::string>()));
  d.scale_is_default = c.at("scale_is_default").get<bool>();

  for (const json& o : c.at("ops")) {
    VerifyOp op;
    const std::string kind = o.at("op").get<std::string>();
    if (kind == "append") {
      op.kind = VerifyOp::Kind::append;
      op.n = o.at("n").get<std::int64_t>();
    } else if (kind == "rewind") {
      op.kind = VerifyOp::Kind::rewind;
      op.to = o.at("to").get<std::int64_t>();
    } else if (kind == "verify" || kind == "decode_rows") {
      op.kind = kind == "verify" ? VerifyOp::Kind::verify : VerifyOp::Kind::decode_rows;
      op.n = o.at("T").get<std::int64_t>();
      op.q_row = o.at("q_row").get<std::int64_t>();
      op.decode_ok = o.at("decode").get<std::string>() == "ok";
      if (op.decode_ok) {
        op.out_row = o.at("out_row").get<std::int64_t>();
        d.output_rows = std::max(d.output_rows, op.out_row + op.n);
      }
      d.query_rows = std::max(d.query_rows, op.q_row + op.n);
      if (op.kind == VerifyOp::Kind::verify) {
        if (!op.decode_ok) bad("golden verify: a verify op whose decode is refused");
        op.L = o.at("L").get<std::int64_t>();
        op.accept = o.at("accept").get<std::int64_t>();
      }
    } else {
      bad("golden verify: unknown op '" + kind + "'");
    }
    if (op.kind == VerifyOp::Kind::append || op.kind == VerifyOp::Kind::verify) {
      op.src_row = o.at("src_row").get<std::int64_t>();
      d.input_rows = std::max(d.input_rows, op.src_row + op.n);
    }
    op.len = o.at("len").get<std::int64_t>();
    op.base = o.at("base").get<std::int64_t>();
    d.ops.push_back(op);
  }
  const std::int64_t kv_dim = geo.kv_dim_k(), hd = geo.head_dim_k, nq = d.n_q_heads;
  d.k_input =
      as<float>(files.npy(c.at("k_input").get<std::string>(), "<f4", {d.input_rows, kv_dim}));
  d.v_input =
      as<float>(files.npy(c.at("v_input").get<std::string>(), "<f4", {d.input_rows, kv_dim}));
  d.queries =
      as<float>(files.npy(c.at("queries").get<std::string>(), "<f4", {d.query_rows, nq, hd}));
  d.outputs =
      as<double>(files.npy(c.at("outputs").get<std::string>(), "<f8", {d.output_rows, nq, hd}));
  d.magnitudes =
      as<float>(files.npy(c.at("magnitudes").get<std::string>(), "<f4", {d.output_rows, nq, hd}));
  d.score_magnitudes =
      as<float>(files.npy(c.at("score_magnitudes").get<std::string>(), "<f4", {d.output_rows, nq}));
  const json& fin = c.at("final");
  d.final_len = fin.at("len").get<std::int64_t>();
  d.final_base = fin.at("base").get<std::int64_t>();
  d.k_plane = files.bin(fin.at("k_plane").get<std::string>(), geo.rows() * geo.k_tok_bytes());
  d.v_plane = files.bin(fin.at("v_plane").get<std::string>(), geo.rows() * geo.v_tok_bytes());
  return d;
}

void note(std::vector<std::string>& failures, const std::string& msg) {
  kvlayer::golden::note_failure(failures, msg);
}

}  // namespace

std::string VerifyOp::describe() const {
  switch (kind) {
    case Kind::append:
      return "append " + std::to_string(n) + " rows (inputs from row " + std::to_string(src_row) +
             ")";
    case Kind::rewind:
      return "rewind to " + std::to_string(to);
    case Kind::verify:
      return "verify T " + std::to_string(n) + " (inputs from row " + std::to_string(src_row) +
             ", accept " + std::to_string(accept) + ")";
    case Kind::decode_rows:
      return "decode_rows T " + std::to_string(n);
  }
  return "?";
}

VerifySet load_verify_golden(const std::filesystem::path& dir) {
  const std::vector<std::uint8_t> text = golden::read_file(dir / "manifest.json");
  VerifySet set;
  json manifest;
  try {
    manifest = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    bad("golden verify: " + (dir / "manifest.json").string() + ": " + e.what());
  }
  if (!manifest.contains("verify")) bad("golden verify: manifest.json has no 'verify' section");
  const json& section = manifest.at("verify");
  std::optional<Files> files;
  try {
    files.emplace(dir, section.at("files"));
    for (const json& c : section.at("cases")) {
      const std::string name = c.value("name", std::string("?"));
      try {
        set.cases.push_back(load_case(c, *files));
      } catch (const Error& e) {
        bad("golden verify: case " + name + ": " + e.what());
      } catch (const json::exception& e) {
        bad("golden verify: case " + name + ": " + e.what());
      }
    }
  } catch (const json::exception& e) {
    bad(std::string("golden verify: ") + e.what());
  }
  set.files_verified = files->verified();
  if (set.files_verified != section.at("files").size())
    bad("golden verify: manifest lists " + std::to_string(section.at("files").size()) +
        " verify files but the cases use " + std::to_string(set.files_verified));
  return set;
}

namespace {
struct Loaded {
  std::unique_ptr<VerifySet> set;
  std::string error;
};
const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    try {
      r.set = std::make_unique<VerifySet>(load_verify_golden(golden::default_golden_dir()));
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    return r;
  }();
  return l;
}
}  // namespace

const VerifySet* verify_golden() {
  return loaded().set.get();
}
const std::string& verify_load_error() {
  return loaded().error;
}

VerifyCheck check_verify(const VerifyCase& c) {
  VerifyCheck r;
  const Geometry& g = c.geometry;
  const int nq = c.n_q_heads, hd = c.head_dim();
  const std::size_t q_row = std::size_t(nq) * std::size_t(hd), out_row = q_row;
  const std::optional<float> scale =
      c.scale_is_default ? std::nullopt : std::optional<float>(c.scale);
  if (c.scale_is_default && ref::default_scale(hd) != c.scale)
    note(r.failures, c.name + ": the reference's default scale differs from golden's");
  // The largest T in the case, so the layer accepts every step (SPEC §11: max_verify ≥ 16).
  int max_verify = ref::kDefaultMaxVerify;
  for (const VerifyOp& op : c.ops) max_verify = std::max(max_verify, int(op.n));
  ref::KvLayer layer(g, max_verify);
  const bool windowed = g.window.has_value();

  // Row i of a T-query decode at L against golden rows [first, first + T).
  const auto compare_rows = [&](const std::vector<double>& got, std::int64_t length, int t,
                                std::int64_t first, const std::string& where) {
    if (got.size() != std::size_t(t) * out_row) {
      ++r.op_failures;
      note(r.failures, where + ": decode returned " + std::to_string(got.size()) + " values");
      return;
    }
    for (int i = 0; i < t; ++i) {
      // SPEC §11's view of row i, for the tolerance's key count.
      const std::int64_t end = length - t + i + 1;
      const std::int64_t n_keys = windowed ? std::min<std::int64_t>(end, *g.window) : end;
      for (std::size_t e = 0; e < out_row; ++e) {
        const std::size_t at = std::size_t(first + i) * out_row + e;
        const double want = c.outputs[at], x = got[std::size_t(i) * out_row + e];
        const double tol = golden::decode_tolerance(
            c.magnitudes[at],
            c.score_magnitudes[std::size_t(first + i) * std::size_t(nq) + e / std::size_t(hd)], hd,
            n_keys);
        ++r.outputs_compared;
        bool ok;
        if (std::isnan(want)) {
          ok = std::isnan(x);
        } else {
          const double err = std::fabs(x - want);
          ok = err <= tol;  // false for a NaN x
          if (std::isfinite(err)) {
            if (tol > 0)
              r.max_error_ratio = std::max(r.max_error_ratio, err / tol);
            else if (err > 0)
              r.max_error_ratio = INFINITY;
          }
        }
        if (!ok) {
          ++r.output_failures;
          std::ostringstream s;
          s.precision(17);
          s << where << ": row " << i << " head " << e / std::size_t(hd) << " dim "
            << e % std::size_t(hd) << ": reference " << x << ", golden " << want << ", tolerance "
            << tol;
          note(r.failures, s.str());
        }
      }
    }
  };

  for (std::size_t i = 0; i < c.ops.size(); ++i) {
    const VerifyOp& op = c.ops[i];
    const std::string where = c.name + " op " + std::to_string(i) + " (" + op.describe() + ")";
    const int t = int(op.n);
    const std::span<const float> q =
        op.kind == VerifyOp::Kind::verify || op.kind == VerifyOp::Kind::decode_rows
            ? std::span<const float>(c.queries).subspan(std::size_t(op.q_row) * q_row,
                                                        std::size_t(t) * q_row)
            : std::span<const float>();
    ++r.ops;
    try {
      switch (op.kind) {
        case VerifyOp::Kind::append:
          layer.append({c.k_row(op.src_row), c.v_row(op.src_row), op.n, DType::f32});
          break;
        case VerifyOp::Kind::rewind:
          layer.rewind(op.to);
          break;
        case VerifyOp::Kind::verify: {
          ++r.steps;
          const ref::RowsView drafts{c.k_row(op.src_row), c.v_row(op.src_row), op.n, DType::f32};
          layer.reserve(op.n);
          const std::int64_t len_d = layer.len_d();
          if (windowed)
            layer.append_rows_dcw(drafts);
          else
            layer.append_rows_dc(drafts);
          if (layer.len_d() != len_d) {
            ++r.op_failures;
            note(r.failures, where + ": the multi-row append moved len_d");
          }
          layer.inc_seqlen(t);
          if (layer.len_d() != op.L) {
            ++r.op_failures;
            note(r.failures, where + ": len_d " + std::to_string(layer.len_d()) +
                                 " at the decode, golden L " + std::to_string(op.L));
          }
          const auto dev = windowed ? layer.decode_rows_dcw(q, nq, t, scale)
                                    : layer.decode_rows_dc(q, nq, t, scale);
          layer.account_steps(op.n);
          if (!dev) {
            ++r.op_failures;
            note(r.failures,
                 where + ": device-counter verify wrote nothing: " + layer.status().message());
          } else {
            const std::vector<double> host = layer.decode_rows(q, nq, t, scale);
            if (host != *dev) {
              ++r.op_failures;
              note(r.failures, where + ": device-counter and host-len verify differ");
            }
            compare_rows(host, op.L, t, op.out_row, where);
          }
          layer.rewind(op.L - op.n + op.accept);
          break;
        }
        case VerifyOp::Kind::decode_rows: {
          const kvlayer::golden::LayerState before = kvlayer::golden::layer_state(layer);
          try {
            const std::vector<double> got = layer.decode_rows(q, nq, t, scale);
            if (!op.decode_ok) {
              ++r.op_failures;
              note(r.failures, where + ": accepted, golden expects a refusal");
            } else {
              compare_rows(got, layer.len(), t, op.out_row, where);
            }
          } catch (const Error& e) {
            if (op.decode_ok || e.kind() != ErrorKind::refused) {
              ++r.op_failures;
              note(r.failures, where + ": refused, golden expects an output: " + e.what());
            } else if (!(kvlayer::golden::layer_state(layer) == before)) {
              ++r.op_failures;
              note(r.failures, where + ": refused but the state changed");
            }
          }
          break;
        }
      }
    } catch (const Error& e) {
      ++r.op_failures;
      note(r.failures, where + ": " + e.what());
      break;  // the later ops would start from another state
    }
    if (layer.len() != op.len || layer.base() != op.base || layer.len_d() != op.len ||
        layer.base_d() != op.base) {
      ++r.op_failures;
      note(r.failures, where + ": len/base/len_d/base_d " + std::to_string(layer.len()) + "/" +
                           std::to_string(layer.base()) + "/" + std::to_string(layer.len_d()) +
                           "/" + std::to_string(layer.base_d()) + ", golden len " +
                           std::to_string(op.len) + " base " + std::to_string(op.base));
      break;
    }
  }

  if (layer.len() != c.final_len || layer.base() != c.final_base) {
    ++r.op_failures;
    note(r.failures, c.name + ": final len/base " + std::to_string(layer.len()) + "/" +
                         std::to_string(layer.base()) + ", golden " + std::to_string(c.final_len) +
                         "/" + std::to_string(c.final_base));
  }
  for (auto [name, got, want, tok] :
       {std::tuple{"K", &layer.k_plane(), &c.k_plane, g.k_tok_bytes()},
        std::tuple{"V", &layer.v_plane(), &c.v_plane, g.v_tok_bytes()}}) {
    const kvlayer::golden::PlaneComparison p =
        kvlayer::golden::compare_plane(c.name, name, *got, *want, tok);
    r.plane_bytes += p.bytes;
    r.plane_byte_mismatches += p.mismatches;
    if (p.failure) note(r.failures, *p.failure);
  }
  if (!layer.status().ok()) {
    ++r.op_failures;
    note(r.failures, c.name + ": unexpected status: " + layer.status().message());
  }
  return r;
}

}  // namespace kvlayer::testing
