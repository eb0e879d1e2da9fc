#include "kvlayer/golden/npy.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"

namespace kvlayer::golden {
namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::io, what);
}

/// Reads the Python-literal dictionary numpy writes: {'descr': '<f4', 'fortran_order': False,
/// 'shape': (3, 32), }. Keys may come in any order; unknown keys are an error.
class HeaderDict {
 public:
  explicit HeaderDict(std::string_view s) : s_(s) {}

  void parse(NpyHeader& h) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (peek() != '}') {
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        h.descr = quoted();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (word("True"))
          h.fortran_order = true;
        else if (word("False"))
          h.fortran_order = false;
        else
          fail("fortran_order must be True or False");
        have_order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        have_shape = true;
      } else {
        fail("unknown key '" + key + "'");
      }
      if (peek() == ',') ++pos_;
    }
    if (!have_descr || !have_order || !have_shape)
      fail("header lacks one of 'descr', 'fortran_order', 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { bad("malformed npy header: " + what); }
  char peek() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool word(std::string_view w) {
    peek();
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    const std::size_t end = s_.find(q, ++pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (peek() != ')') {
      std::int64_t v = 0;
      bool any = false;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
        any = true;
      }
      if (!any) fail("expected a dimension");
      dims.push_back(v);
      if (peek() == ',') ++pos_;
    }
    ++pos_;
    return dims;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::int64_t NpyHeader::count() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      bad("npy shape overflows 64 bits");
    n *= d;
  }
  return n;
}

int npy_item_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<u4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<f8") return 8;
  if (descr == "|u1") return 1;
  return 0;
}

NpyHeader parse_npy_header(std::span<const std::uint8_t> file) {
  static constexpr std::uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (file.size() < 10 || std::memcmp(file.data(), kMagic, 6) != 0)
    bad("not an npy file (missing the \\x93NUMPY magic)");
  NpyHeader h;
  h.major_version = file[6];
  std::size_t header_len = 0, prefix = 0;
  if (h.major_version == 1) {
    header_len = std::size_t(file[8]) | std::size_t(file[9]) << 8;
    prefix = 10;
  } else if (h.major_version == 2 || h.major_version == 3) {
    if (file.size() < 12) bad("npy header truncated");
    header_len = std::size_t(file[8]) | std::size_t(file[9]) << 8 | std::size_t(file[10]) << 16 |
                 std::size_t(file[11]) << 24;
    prefix = 12;
  } else {
    bad("npy format version " + std::to_string(h.major_version) + " is not supported (1, 2, 3)");
  }
  if (file.size() < prefix + header_len)
    bad("npy header truncated: it claims " + std::to_string(header_len) + " bytes, the file has " +
        std::to_string(file.size() - prefix));
  const std::string_view text(reinterpret_cast<const char*>(file.data() + prefix), header_len);
  HeaderDict(text).parse(h);
  h.data_offset = prefix + header_len;
  return h;
}

namespace {
/// Reads and validates a .npy file; `allowed` lists the accepted descrs (all of npy_item_size's
/// when empty), and the unsupported-dtype message names exactly that set.
NpyArray parse_npy_checked(std::span<const std::uint8_t> file, const std::string& name,
                           const std::vector<std::string>& allowed) {
  const std::string where = name + ": ";
  NpyArray a;
  try {
    a.header = parse_npy_header(file);
  } catch (const Error& e) {
    bad(where + e.what());
  }
  const NpyHeader& h = a.header;
  const std::vector<std::string> all = {"<f4", "<f2", "<f8", "|u1", "<u2", "<u4"};
  const std::vector<std::string>& set = allowed.empty() ? all : allowed;
  if (std::find(set.begin(), set.end(), h.descr) == set.end()) {
    std::string list;
    for (const auto& d : set) list += (list.empty() ? "'" : ", '") + d + "'";
    bad(where + "npy dtype '" + h.descr + "' is not supported (supported: " + list + ")");
  }
  if (h.fortran_order)
    bad(where + "fortran_order arrays are not supported (save a C-ordered array)");
  const int item = npy_item_size(h.descr);
  const std::int64_t count = h.count();
  const std::size_t available = file.size() - h.data_offset;
  if (count > std::int64_t(available / std::size_t(item)))
    bad(where + "truncated: the header promises " + std::to_string(count) + " values of " +
        std::to_string(item) + " bytes but the file holds " + std::to_string(available) +
        " data bytes");  // count·item may overflow: never computed here
  if (std::size_t(count) * std::size_t(item) != available)
    bad(where + std::to_string(available - std::size_t(count) * std::size_t(item)) +
        " unexpected bytes after the " + std::to_string(count) + " values");
  a.data.assign(file.begin() + std::ptrdiff_t(h.data_offset), file.end());
  return a;
}
}  // namespace

NpyArray read_npy(const std::filesystem::path& path) {
  return parse_npy_checked(read_file(path), path.string(), {});
}

NpyArray read_npy_float(const std::filesystem::path& path) {
  return parse_npy_checked(read_file(path), path.string(), {"<f4", "<f2"});
}

NpyArray parse_npy_float(std::span<const std::uint8_t> file, const std::string& name) {
  return parse_npy_checked(file, name, {"<f4", "<f2"});
}

std::vector<float> npy_to_f32(const NpyArray& a, const std::string& what) {
  const std::int64_t n = a.header.count();
  std::vector<float> out(static_cast<std::size_t>(n));
  if (a.header.descr == "<f4") {
    if (!out.empty())  // memcpy with a null pointer is undefined even for 0 bytes
      std::memcpy(out.data(), a.data.data(), out.size() * 4);  // host is little-endian
  } else if (a.header.descr == "<f2") {
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = f16_bits_to_f32(std::uint16_t(a.data[2 * i] | a.data[2 * i + 1] << 8));
  } else {
    bad(what + ": npy dtype '" + a.header.descr + "' is not supported (supported: '<f4', '<f2')");
  }
  return out;
}

std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    bad(path.string() + ": cannot read (is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path.string() + ": cannot read (" + std::strerror(errno) + ")");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  if (in.bad()) bad(path.string() + ": cannot read (I/O error)");
  return bytes;
}

void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) bad(path.string() + ": cannot write (" + std::strerror(errno) + ")");
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  out.flush();
  if (!out) bad(path.string() + ": cannot write (I/O error)");
}

}  // namespace kvlayer::golden
