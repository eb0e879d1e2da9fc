#include "gguf.hpp"

#include <cstring>
#include <iterator>
#include <set>
#include <sstream>

#include "kvlayer/error.hpp"

namespace kvlayer::gguf {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};

/// Bytes of a scalar value of type t, 0 for strings and arrays (and unknown types).
std::uint64_t scalar_bytes(std::uint32_t t) {
  switch (static_cast<Type>(t)) {
    case Type::u8:
    case Type::i8:
    case Type::boolean:
      return 1;
    case Type::u16:
    case Type::i16:
      return 2;
    case Type::u32:
    case Type::i32:
    case Type::f32:
      return 4;
    case Type::u64:
    case Type::i64:
    case Type::f64:
      return 8;
    case Type::string:
    case Type::array:
      return 0;
  }
  return 0;
}

bool known_type(std::uint32_t t) {
  return t <= static_cast<std::uint32_t>(Type::f64);
}

/// A cursor over a Source that checks every read against the size first.
class Reader {
 public:
  Reader(const Source& src, const std::string& where) : src_(src), where_(where) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::io, where_ + ": " + what);
  }
  std::uint64_t pos() const { return pos_; }

  void need(std::uint64_t n, const std::string& what) const {
    if (n > src_.size() - pos_) {
      std::ostringstream s;
      s << "truncated: " << what << " at byte " << pos_ << " needs " << n << " bytes, the file has "
        << src_.size();
      fail(s.str());
    }
  }
  void bytes(void* dst, std::size_t n, const std::string& what) {
    need(n, what);
    src_.read(pos_, dst, n);
    pos_ += n;
  }
  std::uint64_t uint(int n, const std::string& what) {
    std::uint8_t b[8] = {};
    bytes(b, std::size_t(n), what);
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | b[i];
    return v;
  }
  std::uint32_t u32(const std::string& what) { return std::uint32_t(uint(4, what)); }
  std::uint64_t u64(const std::string& what) { return uint(8, what); }
  std::string str(const std::string& what) {
    const std::uint64_t n = u64(what + "'s length");
    need(n, what);
    std::string s(std::size_t(n), '\0');
    bytes(s.data(), s.size(), what);
    return s;
  }
  void skip(std::uint64_t n, const std::string& what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const Source& src_;
  const std::string& where_;
  std::uint64_t pos_ = 0;
};

Value read_value(Reader& r, std::uint32_t type, const std::string& key) {
  const std::string what = "the value of " + key;
  if (!known_type(type)) r.fail("key " + key + ": unknown value type " + std::to_string(type));
  Value v;
  v.type = static_cast<Type>(type);
  switch (v.type) {
    case Type::string:
      v.s = r.str(what);
      break;
    case Type::array: {
      const std::uint32_t elem = r.u32(what + "'s element type");
      const std::uint64_t count = r.u64(what + "'s element count");
      if (elem == static_cast<std::uint32_t>(Type::array))
        r.fail("key " + key + ": nested arrays are not supported");
      if (!known_type(elem))
        r.fail("key " + key + ": unknown array element type " + std::to_string(elem));
      if (elem == static_cast<std::uint32_t>(Type::string)) {
        // Each element takes at least its 8-byte length: the loop ends with the file.
        for (std::uint64_t i = 0; i < count; ++i) (void)r.str(what + "'s element");
      } else {
        const std::uint64_t size = scalar_bytes(elem);
        if (count > UINT64_MAX / size)
          r.fail("key " + key + ": array of " + std::to_string(count) + " elements is too large");
        r.skip(count * size, what);
      }
      v.u = count;
      break;
    }
    case Type::i8:
    case Type::i16:
    case Type::i32:
    case Type::i64: {
      const int n = int(scalar_bytes(type));
      const std::uint64_t raw = r.uint(n, what);
      const int shift = 64 - 8 * n;  // sign-extend
      v.i = static_cast<std::int64_t>(raw << shift) >> shift;
      break;
    }
    case Type::f32: {
      const std::uint32_t raw = std::uint32_t(r.uint(4, what));
      float f;
      static_assert(sizeof f == 4);
      std::memcpy(&f, &raw, 4);
      v.f = f;
      break;
    }
    case Type::f64: {
      const std::uint64_t raw = r.uint(8, what);
      double d;
      std::memcpy(&d, &raw, 8);
      v.f = d;
      break;
    }
    default:
      v.u = r.uint(int(scalar_bytes(type)), what);
      break;
  }
  return v;
}

void put(std::vector<std::uint8_t>& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(std::uint8_t(v >> (8 * i)));
}
void put_string(std::vector<std::uint8_t>& out, const std::string& s) {
  put(out, s.size(), 8);
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

std::string type_name(std::uint32_t type) {
  static const char* const names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                      "int32",  "float32", "bool",   "string", "array",
                                      "uint64", "int64",   "float64"};
  if (known_type(type)) return names[type];
  return "type " + std::to_string(type);
}

std::string ggml_type_name(std::uint32_t type) {
  static const char* const names[] = {"F32",  "F16",  "Q4_0", "Q4_1", "type 4", "type 5",
                                      "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",   "Q3_K",
                                      "Q4_K", "Q5_K", "Q6_K", "Q8_K"};
  if (type < std::size(names)) return names[type];
  return "unknown";
}

const Value* Header::find(std::string_view key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

const TensorInfo* Header::tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(const Source& src, const std::string& where) {
  Reader r(src, where);
  char magic[4];
  r.bytes(magic, 4, "the GGUF magic");
  if (std::string_view(magic, 4) != std::string_view(kMagic, 4)) {
    std::ostringstream s;
    s << "not a GGUF file: the first 4 bytes are" << std::hex;
    for (char c : magic) s << " " << int(std::uint8_t(c) >> 4) << int(std::uint8_t(c) & 15);
    s << ", expected 47 47 55 46 (\"GGUF\")";
    r.fail(s.str());
  }
  const std::uint32_t version = r.u32("the GGUF version");
  if (version != kVersion)
    r.fail("GGUF version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  const std::uint64_t n_tensors = r.u64("the tensor count");
  const std::uint64_t n_kv = r.u64("the metadata count");

  Header h;
  std::set<std::string> keys;
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = r.str("metadata key " + std::to_string(i));
    if (!keys.insert(key).second) r.fail("duplicate key " + key);
    const std::uint32_t type = r.u32("the value type of " + key);
    h.metadata.emplace_back(key, read_value(r, type, key));
  }
  std::set<std::string> names;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = r.str("tensor name " + std::to_string(i));
    if (!names.insert(t.name).second) r.fail("duplicate tensor " + t.name);
    const std::uint32_t n_dims = r.u32("tensor " + t.name + "'s n_dims");
    if (n_dims > kMaxDims)
      r.fail("tensor " + t.name + ": n_dims " + std::to_string(n_dims) + ", expected at most " +
             std::to_string(kMaxDims));
    for (std::uint32_t d = 0; d < n_dims; ++d)
      t.dims.push_back(r.u64("tensor " + t.name + "'s dims"));
    t.type = r.u32("tensor " + t.name + "'s type");
    t.offset = r.u64("tensor " + t.name + "'s offset");
    h.tensors.push_back(std::move(t));
  }
  if (const Value* a = h.find("general.alignment")) {
    if (a->type != Type::u32)
      r.fail("general.alignment: type " + type_name(std::uint32_t(a->type)) + ", expected uint32");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      r.fail("general.alignment: " + std::to_string(a->u) + ", expected a power of two");
    h.alignment = std::uint32_t(a->u);
  }
  h.data_offset = pad_to(r.pos(), h.alignment);
  return h;
}

void HeaderBuilder::add_u32(const std::string& key, std::uint32_t v) {
  put_string(kv_, key);
  put(kv_, std::uint32_t(Type::u32), 4);
  put(kv_, v, 4);
  ++n_kv_;
}

void HeaderBuilder::add_u64(const std::string& key, std::uint64_t v) {
  put_string(kv_, key);
  put(kv_, std::uint32_t(Type::u64), 4);
  put(kv_, v, 8);
  ++n_kv_;
}

void HeaderBuilder::add_string(const std::string& key, const std::string& v) {
  put_string(kv_, key);
  put(kv_, std::uint32_t(Type::string), 4);
  put_string(kv_, v);
  ++n_kv_;
}

void HeaderBuilder::add_tensor(const std::string& name, const std::vector<std::uint64_t>& dims,
                               std::uint32_t type, std::uint64_t offset) {
  put_string(tensors_, name);
  put(tensors_, dims.size(), 4);
  for (std::uint64_t d : dims) put(tensors_, d, 8);
  put(tensors_, type, 4);
  put(tensors_, offset, 8);
  ++n_tensors_;
}

std::vector<std::uint8_t> HeaderBuilder::finish(std::uint32_t alignment) const {
  std::vector<std::uint8_t> out(kMagic, kMagic + 4);
  put(out, kVersion, 4);
  put(out, n_tensors_, 8);
  put(out, n_kv_, 8);
  out.insert(out.end(), kv_.begin(), kv_.end());
  out.insert(out.end(), tensors_.begin(), tensors_.end());
  out.resize(std::size_t(pad_to(out.size(), alignment)), 0);
  return out;
}

}  // namespace kvlayer::gguf
