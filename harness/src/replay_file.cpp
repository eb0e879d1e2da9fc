#include "kvlayer/harness/replay_file.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>
#include <utility>

#include "kvlayer/error.hpp"

namespace kvlayer::harness {
namespace {

using nlohmann::json;
constexpr const char* kFormat = "kvlayer-replay";
constexpr int kVersion = 1;

[[noreturn]] void malformed(const std::string& where, const std::string& what) {
  throw Error(ErrorKind::io, "replay file: " + where + ": " + what);
}

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) malformed(where, "expected an object");
  const auto it = obj.find(key);
  if (it == obj.end()) malformed(where, std::string("missing field '") + key + "'");
  return *it;
}

std::int64_t integer(const json& obj, const char* key, const std::string& where,
                     std::int64_t lo, std::int64_t hi) {
  const json& v = field(obj, key, where);
  if (!v.is_number_integer()) malformed(where + "." + key, "expected an integer");
  const auto x = v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX)
                     ? hi + 1
                     : v.get<std::int64_t>();
  if (x < lo || x > hi)
    malformed(where + "." + key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "]");
  return x;
}

std::uint64_t seed_of(const json& obj, const std::string& where) {
  const json& v = field(obj, "seed", where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    malformed(where + ".seed", "expected a non-negative integer");
  return v.get<std::uint64_t>();
}

bool boolean(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_boolean()) malformed(where + "." + key, "expected true or false");
  return v.get<bool>();
}

std::string text(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_string()) malformed(where + "." + key, "expected a string");
  return v.get<std::string>();
}

/// An optional decode scale: absent or null is nullopt (the default), else a finite f32.
std::optional<float> scale_of(const json& obj, const std::string& where) {
  const auto it = obj.find("scale");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) malformed(where + ".scale", "expected a number or null");
  // Checked as a double first: converting one beyond f32's range is undefined behaviour.
  const double s = it->get<double>();
  if (!(std::fabs(s) <= double(std::numeric_limits<float>::max())))
    malformed(where + ".scale", it->dump() + " is outside the f32 range");
  return float(s);
}

DataKind data_kind(const json& obj, const std::string& where) {
  const std::string s = text(obj, "data", where);
  for (int k = 0; k <= int(kLastDataKind); ++k)
    if (data_kind_name(DataKind(k)) == s) return DataKind(k);
  malformed(where + ".data", "unknown data kind '" + s + "'");
}

DType dtype_of(const std::string& s, const std::string& where) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    if (dtype_name(t) == s) return t;
  malformed(where, "unknown dtype '" + s + "' (expected f32, f16 or bf16)");
}

constexpr std::int64_t kMaxCount = 1 << 30;

/// A command's fields into its JSON object.
struct JsonOut {
  json& j;
  void count(const char* key, std::int64_t v, std::int64_t = 0, std::int64_t = 0) { j[key] = v; }
  void range(const char* start_key, const char* end_key, std::int64_t start, std::int64_t end) {
    j[start_key] = start;
    j[end_key] = end;
  }
  void data(DataKind kind) { j["data"] = data_kind_name(kind); }
  void seed(std::uint64_t seed) { j["seed"] = seed; }
  void flag(const char* key, bool v, const char*, const char*) { j[key] = v; }
  // Left out when nullopt, so that a file without scales reads (and is written) as before.
  // double(f32) prints with enough digits to read back as the same f32.
  void scale(std::optional<float> v) {
    if (v) j["scale"] = double(*v);
  }
};

/// A command's fields from its JSON object, each checked as it is read.
struct JsonIn {
  const json& j;
  const std::string& where;
  void count(const char* key, std::int64_t& v, std::int64_t lo = -kMaxCount,
             std::int64_t hi = kMaxCount) {
    v = integer(j, key, where, lo, hi);
  }
  void range(const char* start_key, const char* end_key, std::int64_t& start, std::int64_t& end) {
    count(start_key, start);
    count(end_key, end);
  }
  void data(DataKind& kind) { kind = data_kind(j, where); }
  void seed(std::uint64_t& seed) { seed = seed_of(j, where); }
  void flag(const char* key, bool& v, const char*, const char*) { v = boolean(j, key, where); }
  void scale(std::optional<float>& v) { v = scale_of(j, where); }
};

json command_json(const Command& command) {
  return std::visit(
      []<typename C>(const C& c) {
        json j = json::object();
        j["op"] = std::string(name_of(c));
        JsonOut out{j};
        C::fields(c, out);
        return j;
      },
      command);
}

/// The command named `op`, its fields read from j; nullopt when C does not go by that name.
template <typename C>
std::optional<Command> command_named(const std::string& op, const json& j,
                                     const std::string& where) {
  const auto names = names_of<C>();
  const auto it = std::find(names.begin(), names.end(), op);
  if (it == names.end()) return std::nullopt;
  C c{};
  if constexpr (requires { C::named_by; }) {
    using Name = std::remove_reference_t<decltype(c.*C::named_by)>;
    c.*C::named_by = static_cast<Name>(it - names.begin());
  }
  JsonIn in{j, where};
  C::fields(c, in);
  return c;
}

Command command_of(const json& j, const std::string& where) {
  const std::string op = text(j, "op", where);
  std::optional<Command> command;
  for_each_command([&]<typename C>(std::type_identity<C>) {
    if (!command) command = command_named<C>(op, j, where);
  });
  if (!command) malformed(where + ".op", "unknown op '" + op + "'");
  return *command;
}

constexpr const char* kKernels[] = {"mma", "cuda_core"};
constexpr const char* kRows[] = {"auto", "split", "whole"};
constexpr const char* kVerify[] = {"mma", "wgmma"};

json decode_json(const DecodeChoice& d) {
  json j = json::object();
  if (d.kernel) j["kernel"] = kKernels[int(*d.kernel)];
  if (d.rows) j["rows"] = kRows[int(*d.rows)];
  if (d.verify) j["verify"] = kVerify[int(*d.verify)];
  if (d.split_balance) j["split_balance"] = *d.split_balance;
  if (d.max_verify_splits != 0) j["max_verify_splits"] = d.max_verify_splits;
  if (d.batch_waves) j["batch_waves"] = *d.batch_waves;
  return j;
}

/// The index of `value` in names, or a malformed-file error listing them.
template <std::size_t N>
int one_of(const json& obj, const char* key, const char* const (&names)[N]) {
  const std::string v = text(obj, key, "decode");
  for (std::size_t i = 0; i < N; ++i)
    if (v == names[i]) return int(i);
  std::string list;
  for (const char* n : names) list += (list.empty() ? "" : ", ") + std::string(n);
  malformed(std::string("decode.") + key, "'" + v + "' is not one of " + list);
}

DecodeChoice decode_of(const json& j) {
  if (!j.is_object()) malformed("decode", "expected an object");
  for (const auto& [key, value] : j.items())
    if (key != "kernel" && key != "rows" && key != "verify" && key != "split_balance" &&
        key != "max_verify_splits" && key != "batch_waves")
      malformed("decode", "unknown field '" + key + "'");
  DecodeChoice d;
  if (j.contains("kernel")) d.kernel = DecodeChoice::Kernel(one_of(j, "kernel", kKernels));
  if (j.contains("rows")) d.rows = DecodeChoice::Rows(one_of(j, "rows", kRows));
  if (j.contains("verify")) d.verify = DecodeChoice::Verify(one_of(j, "verify", kVerify));
  if (j.contains("split_balance"))
    d.split_balance = int(integer(j, "split_balance", "decode", 0, 64));
  if (j.contains("max_verify_splits"))
    d.max_verify_splits = int(integer(j, "max_verify_splits", "decode", 0, 1024));
  if (j.contains("batch_waves")) d.batch_waves = int(integer(j, "batch_waves", "decode", 1, 64));
  return d;
}

}  // namespace

std::string to_json(const Case& c) {
  const Geometry& g = c.geometry;
  json geometry = {{"n_kv_heads", g.n_kv_heads}, {"head_dim_k", g.head_dim_k},
                   {"head_dim_v", g.head_dim_v}, {"max_ctx", g.max_ctx},
                   {"window", g.window ? json(*g.window) : json(nullptr)},
                   {"storage", g.is_ring() ? "ring" : "flat"}, {"max_append", g.max_append},
                   {"rewind_slack", g.rewind_slack}};
  std::ostringstream s;
  s << "{\n  \"format\": \"" << kFormat << "\",\n  \"version\": " << kVersion
    << ",\n  \"geometry\": " << geometry.dump() << ",\n  \"n_q_heads\": " << c.n_q_heads
    << ",\n  \"dtype\": \"" << dtype_name(c.dtype) << "\",\n  \"seed\": " << c.seed;
  // Written only when not the defaults, so that files of cases without them stay as they were.
  if (c.max_verify != Case{}.max_verify) s << ",\n  \"max_verify\": " << c.max_verify;
  if (c.decode != DecodeChoice{}) s << ",\n  \"decode\": " << decode_json(c.decode).dump();
  s << ",\n  \"commands\": [";
  for (std::size_t i = 0; i < c.commands.size(); ++i)
    s << (i ? ",\n    " : "\n    ") << command_json(c.commands[i]).dump();
  s << "\n  ]\n}\n";
  return s.str();
}

Case from_json(std::string_view text_in) {
  json j;
  try {
    j = json::parse(text_in.begin(), text_in.end());
  } catch (const json::exception& e) {  // parse errors, and numbers out of range
    malformed("JSON", e.what());
  }
  if (!j.is_object()) malformed("top level", "expected an object");
  if (text(j, "format", "top level") != kFormat)
    malformed("format", std::string("expected \"") + kFormat + "\"");
  integer(j, "version", "top level", kVersion, kVersion);
  Case c;
  const json& g = field(j, "geometry", "top level");
  const std::string gw = "geometry";
  c.geometry.n_kv_heads = int(integer(g, "n_kv_heads", gw, 1, 4096));
  c.geometry.head_dim_k = int(integer(g, "head_dim_k", gw, 1, 4096));
  c.geometry.head_dim_v = int(integer(g, "head_dim_v", gw, 1, 4096));
  c.geometry.max_ctx = integer(g, "max_ctx", gw, 1, INT32_MAX);
  const json& w = field(g, "window", gw);
  if (!w.is_null()) c.geometry.window = integer(g, "window", gw, 1, INT32_MAX);
  const std::string storage = text(g, "storage", gw);
  if (storage != "flat" && storage != "ring")
    malformed("geometry.storage", "expected \"flat\" or \"ring\", got '" + storage + "'");
  c.geometry.storage = storage == "ring" ? Storage::ring : Storage::flat;
  c.geometry.max_append = integer(g, "max_append", gw, 1, INT32_MAX);
  c.geometry.rewind_slack = integer(g, "rewind_slack", gw, 0, INT32_MAX);
  try {
    c.geometry.validate();
  } catch (const Error& e) {
    malformed("geometry", e.what());
  }
  c.n_q_heads = int(integer(j, "n_q_heads", "top level", 1, 65536));
  c.dtype = dtype_of(text(j, "dtype", "top level"), "dtype");
  c.seed = seed_of(j, "top level");
  if (j.contains("max_verify")) c.max_verify = int(integer(j, "max_verify", "top level", 1, 1024));
  if (j.contains("decode")) c.decode = decode_of(field(j, "decode", "top level"));
  const json& cmds = field(j, "commands", "top level");
  if (!cmds.is_array()) malformed("commands", "expected an array");
  if (cmds.size() > 100000) malformed("commands", "more than 100000 commands");
  for (std::size_t i = 0; i < cmds.size(); ++i)
    c.commands.push_back(command_of(cmds[i], "commands[" + std::to_string(i) + "]"));
  return c;
}

Case read_replay_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::io, "replay file " + path + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  try {
    return from_json(s.str());
  } catch (const Error& e) {
    throw Error(ErrorKind::io, path + ": " + e.what());
  }
}

void write_replay_file(const std::string& path, const Case& c) {
  std::ofstream out(path, std::ios::binary);
  out << to_json(c);
  if (!out) throw Error(ErrorKind::io, "replay file " + path + ": cannot be written");
}

}  // namespace kvlayer::harness
