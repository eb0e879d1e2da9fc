// The subset of GGUF (version 3, little-endian) a snapshot file needs, private to core: a header
// builder, and a parser that checks every length against the file's size before it reads or
// allocates (the loader and its libFuzzer target feed it arbitrary bytes).
// Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata
// (key string, u32 value type, value), the tensor infos (name, u32 n_dims, u64 dims[n_dims]
// fastest first, u32 ggml type, u64 offset into the data section), zero padding to the
// alignment, then the tensor data (each tensor at a multiple of the alignment). A string is a
// u64 byte count and the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlayer::gguf {

inline constexpr std::uint32_t kVersion = 3;
inline constexpr std::uint32_t kDefaultAlignment = 32;  ///< when general.alignment is absent
inline constexpr std::uint32_t kMaxDims = 4;            ///< GGML_MAX_DIMS

/// Metadata value types.
enum class Type : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
/// "uint32", "string", … as gguf-py spells them (lower case), or "type N" for an unknown one.
std::string type_name(std::uint32_t type);

/// ggml tensor types of the planes.
inline constexpr std::uint32_t kGgmlQ5_1 = 7;
inline constexpr std::uint32_t kGgmlQ8_0 = 8;
/// "Q8_0", "Q5_1", "F32", … for the common ggml types, else "unknown".
std::string ggml_type_name(std::uint32_t type);

/// One metadata value; arrays are skipped (their element type and count are kept).
struct Value {
  Type type = Type::u8;
  std::uint64_t u = 0;  ///< unsigned integers and bool
  std::int64_t i = 0;   ///< signed integers
  double f = 0;         ///< floats
  std::string s;        ///< strings
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;  ///< ggml order: fastest-varying first
  std::uint32_t type = 0;
  std::uint64_t offset = 0;  ///< from the start of the data section
};

struct Header {
  std::vector<std::pair<std::string, Value>> metadata;  ///< in file order, keys distinct
  std::vector<TensorInfo> tensors;                      ///< in file order, names distinct
  std::uint32_t alignment = kDefaultAlignment;
  std::uint64_t data_offset = 0;  ///< absolute offset of the data section

  const Value* find(std::string_view key) const;
  const TensorInfo* tensor(std::string_view name) const;
};

/// Random-access bytes: a file or a buffer.
class Source {
 public:
  virtual ~Source() = default;
  virtual std::uint64_t size() const = 0;
  /// Reads [offset, offset + n); the parser only asks for bytes inside [0, size()).
  virtual void read(std::uint64_t offset, void* dst, std::size_t n) const = 0;
};

/// Parses a version-3 header. Throws kvlayer::Error (io) "<where>: <what>" when the file is not
/// GGUF, has another version, is truncated or malformed (duplicate keys or tensors, unknown
/// value types, nested arrays, more than kMaxDims dims, general.alignment not a power of two).
Header parse_header(const Source& src, const std::string& where);

/// Builds a header in the order the calls are made.
class HeaderBuilder {
 public:
  void add_u32(const std::string& key, std::uint32_t v);
  void add_u64(const std::string& key, std::uint64_t v);
  void add_string(const std::string& key, const std::string& v);
  void add_tensor(const std::string& name, const std::vector<std::uint64_t>& dims,
                  std::uint32_t type, std::uint64_t offset);
  /// The header's bytes, zero-padded to a multiple of `alignment`.
  std::vector<std::uint8_t> finish(std::uint32_t alignment) const;

 private:
  std::vector<std::uint8_t> kv_, tensors_;
  std::uint64_t n_kv_ = 0, n_tensors_ = 0;
};

/// x rounded up to a multiple of `align` (> 0).
constexpr std::uint64_t pad_to(std::uint64_t x, std::uint64_t align) {
  return (x + align - 1) / align * align;
}

}  // namespace kvlayer::gguf
