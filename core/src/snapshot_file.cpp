// The snapshot file (snapshot_file.hpp): a Snapshot's fields as GGUF metadata and tensors, the
// reader's checks in the order a file can fail them (GGUF header, keys, the snapshot's rows,
// tensors, CRCs), and the crash-safe write (durable_file.hpp).
#include "kvlayer/snapshot_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "durable_file.hpp"
#include "gguf.hpp"
#include "kvlayer/crc32.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer {
namespace {

constexpr std::uint32_t kAlignment = 32;
constexpr const char* kTensorK = "kv.k";
constexpr const char* kTensorV = "kv.v";

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

/// The file as header + tensor bytes + padding, without copying the tensors.
struct Layout {
  std::vector<std::uint8_t> header;
  std::vector<std::uint8_t> k_pad, v_pad;  ///< zeros after each tensor, to the alignment
};

Layout layout(const Snapshot& s) {
  validate_snapshot(s, "save_snapshot");
  const Geometry& g = s.geometry;
  gguf::HeaderBuilder b;
  b.add_string("general.architecture", "kvlayer");
  b.add_u32("general.alignment", kAlignment);
  b.add_u32("kvlayer.format_version", kSnapshotFormatVersion);
  b.add_u32("kvlayer.n_kv_heads", std::uint32_t(g.n_kv_heads));
  b.add_u32("kvlayer.head_dim_k", std::uint32_t(g.head_dim_k));
  b.add_u32("kvlayer.head_dim_v", std::uint32_t(g.head_dim_v));
  b.add_u64("kvlayer.max_ctx", std::uint64_t(g.max_ctx));
  if (g.window) b.add_u64("kvlayer.window", std::uint64_t(*g.window));
  b.add_string("kvlayer.storage", g.is_ring() ? "ring" : "flat");
  b.add_u64("kvlayer.max_append", std::uint64_t(g.max_append));
  b.add_u64("kvlayer.rewind_slack", std::uint64_t(g.rewind_slack));
  b.add_u64("kvlayer.len", std::uint64_t(s.len));
  b.add_u64("kvlayer.first", std::uint64_t(s.first));
  b.add_u64("kvlayer.base", std::uint64_t(s.base));
  b.add_u32("kvlayer.k_crc32", crc32(s.k));
  b.add_u32("kvlayer.v_crc32", crc32(s.v));
  const auto rows = std::uint64_t(s.rows());
  const std::uint64_t k_padded = gguf::pad_to(s.k.size(), kAlignment);
  b.add_tensor(kTensorK, {std::uint64_t(g.kv_dim_k()), rows}, gguf::kGgmlQ8_0, 0);
  b.add_tensor(kTensorV, {std::uint64_t(g.kv_dim_v()), rows}, gguf::kGgmlQ5_1, k_padded);
  Layout l;
  l.header = b.finish(kAlignment);
  // The last tensor is padded too, as gguf-py does (ggml's reader expects it).
  l.k_pad.assign(std::size_t(k_padded - s.k.size()), 0);
  l.v_pad.assign(std::size_t(gguf::pad_to(s.v.size(), kAlignment) - s.v.size()), 0);
  return l;
}

class MemorySource : public gguf::Source {
 public:
  explicit MemorySource(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint64_t size() const override { return bytes_.size(); }
  void read(std::uint64_t offset, void* dst, std::size_t n) const override {
    if (n > 0) std::memcpy(dst, bytes_.data() + offset, n);
  }

 private:
  std::span<const std::uint8_t> bytes_;
};

class FileSource : public gguf::Source {
 public:
  explicit FileSource(const std::string& path) : where_("load_snapshot: " + path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open", errno);
    // The destructor does not run for a constructor that throws: close here.
    struct stat st {};
    const int err = ::fstat(fd_, &st) != 0 ? errno : 0;
    if (err != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(err != 0 ? "cannot stat" : "not a regular file", err);
    }
    size_ = std::uint64_t(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, void* dst, std::size_t n) const override {
    auto* out = static_cast<std::uint8_t*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, out, n, off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("read failed", errno);
      if (r == 0) fail("read failed: the file shrank while being read", 0);
      out += r;
      offset += std::uint64_t(r);
      n -= std::size_t(r);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const {
    throw Error(ErrorKind::io,
                where_ + ": " + what + (err != 0 ? std::string(": ") + std::strerror(err) : ""));
  }
  std::string where_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// The reader proper, over any source.
Snapshot read_snapshot(const gguf::Source& src, const std::string& name) {
  const std::string where = "load_snapshot: " + name;
  auto fail = [&](const std::string& what) -> void {
    throw Error(ErrorKind::io, where + ": " + what);
  };
  const gguf::Header h = gguf::parse_header(src, where);

  auto get = [&](const std::string& key, gguf::Type type) -> const gguf::Value& {
    const gguf::Value* v = h.find(key);
    if (v == nullptr)
      fail("missing key " + key + " (" + gguf::type_name(std::uint32_t(type)) + ")");
    if (v->type != type)
      fail(key + ": type " + gguf::type_name(std::uint32_t(v->type)) + ", expected " +
           gguf::type_name(std::uint32_t(type)));
    return *v;
  };
  // Integers as the Geometry / Snapshot fields hold them; the range checks are validate's.
  auto as_int = [&](const std::string& key) -> int {
    const std::uint64_t v = get(key, gguf::Type::u32).u;
    if (v > std::uint64_t(INT_MAX))
      fail(key + ": " + std::to_string(v) + " exceeds " + std::to_string(INT_MAX));
    return int(v);
  };
  auto as_int64 = [&](const std::string& key) -> std::int64_t {
    const std::uint64_t v = get(key, gguf::Type::u64).u;
    if (v > std::uint64_t(INT64_MAX))
      fail(key + ": " + std::to_string(v) + " exceeds " + std::to_string(INT64_MAX));
    return std::int64_t(v);
  };

  const std::uint64_t version = get("kvlayer.format_version", gguf::Type::u32).u;
  if (version != kSnapshotFormatVersion)
    fail("kvlayer.format_version: " + std::to_string(version) + ", expected " +
         std::to_string(kSnapshotFormatVersion));
  Snapshot s;
  Geometry& g = s.geometry;
  g.n_kv_heads = as_int("kvlayer.n_kv_heads");
  g.head_dim_k = as_int("kvlayer.head_dim_k");
  g.head_dim_v = as_int("kvlayer.head_dim_v");
  g.max_ctx = as_int64("kvlayer.max_ctx");
  if (h.find("kvlayer.window") != nullptr) g.window = as_int64("kvlayer.window");
  const std::string& storage = get("kvlayer.storage", gguf::Type::string).s;
  if (storage != "flat" && storage != "ring")
    fail("kvlayer.storage: '" + storage + "', expected 'flat' or 'ring'");
  g.storage = storage == "ring" ? Storage::ring : Storage::flat;
  g.max_append = as_int64("kvlayer.max_append");
  g.rewind_slack = as_int64("kvlayer.rewind_slack");
  s.len = as_int64("kvlayer.len");
  s.first = as_int64("kvlayer.first");
  s.base = as_int64("kvlayer.base");
  const auto k_crc = std::uint32_t(get("kvlayer.k_crc32", gguf::Type::u32).u);
  const auto v_crc = std::uint32_t(get("kvlayer.v_crc32", gguf::Type::u32).u);
  try {
    validate_snapshot_rows(s, where.c_str());
  } catch (const Error& e) {
    throw Error(ErrorKind::io, e.what());
  }

  // Each tensor: its type, its shape against the rows above, its place inside the file (checked
  // before anything is allocated), then its bytes.
  auto tensor = [&](const char* name, std::uint32_t type, std::int64_t kv_dim, const char* dim_name,
                    std::int64_t tok_bytes) {
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "[" + to_string.
    std::string want_dims = "[";
    want_dims += std::to_string(kv_dim);
    want_dims += ", ";
    want_dims += std::to_string(s.rows());
    want_dims += "]";
    const gguf::TensorInfo* t = h.tensor(name);
    if (t == nullptr)
      fail(std::string("missing tensor ") + name + " (" + gguf::ggml_type_name(type) +
           ", ggml dims " + want_dims + ")");
    if (t->type != type)
      fail(std::string("tensor ") + name + ": type " + std::to_string(t->type) + " (" +
           gguf::ggml_type_name(t->type) + "), expected " + std::to_string(type) + " (" +
           gguf::ggml_type_name(type) + ")");
    if (t->dims != std::vector<std::uint64_t>{std::uint64_t(kv_dim), std::uint64_t(s.rows())}) {
      std::string got = "[";
      for (std::size_t i = 0; i < t->dims.size(); ++i)
        got += (i > 0 ? ", " : "") + std::to_string(t->dims[i]);
      fail(std::string("tensor ") + name + ": ggml dims " + got + "], expected " + want_dims +
           " ([" + dim_name + ", len - first])");
    }
    if (t->offset % h.alignment != 0)
      fail(std::string("tensor ") + name + ": offset " + std::to_string(t->offset) +
           " is not a multiple of the alignment " + std::to_string(h.alignment));
    // The extent padded to the alignment, as ggml's reader requires it (gguf-py and
    // save_snapshot write the padding): a file cut inside the last padding is truncated too.
    const auto bytes = std::uint64_t(s.rows() * tok_bytes);
    const std::uint64_t extent = gguf::pad_to(bytes, h.alignment);
    const std::uint64_t size = src.size();
    if (h.data_offset > size || t->offset > size - h.data_offset ||
        extent > size - h.data_offset - t->offset)
      fail(std::string("truncated: tensor ") + name + " needs bytes [" +
           std::to_string(h.data_offset + t->offset) + ", " +
           std::to_string(h.data_offset + t->offset + extent) + ") (" + std::to_string(bytes) +
           " padded to the alignment " + std::to_string(h.alignment) + "), the file has " +
           std::to_string(size));
    std::vector<std::uint8_t> out(static_cast<std::size_t>(bytes));
    src.read(h.data_offset + t->offset, out.data(), out.size());
    return out;
  };
  s.k = tensor(kTensorK, gguf::kGgmlQ8_0, g.kv_dim_k(), "kv_dim_k", g.k_tok_bytes());
  s.v = tensor(kTensorV, gguf::kGgmlQ5_1, g.kv_dim_v(), "kv_dim_v", g.v_tok_bytes());
  if (const std::uint32_t c = crc32(s.k); c != k_crc)
    fail("kvlayer.k_crc32: " + hex32(k_crc) + ", but tensor kv.k's bytes have CRC-32 " + hex32(c) +
         " (corrupted)");
  if (const std::uint32_t c = crc32(s.v); c != v_crc)
    fail("kvlayer.v_crc32: " + hex32(v_crc) + ", but tensor kv.v's bytes have CRC-32 " + hex32(c) +
         " (corrupted)");
  return s;
}

}  // namespace

void save_snapshot(const std::string& path, const Snapshot& s) {
  const Layout l = layout(s);
  const std::span<const std::uint8_t> pieces[] = {l.header, s.k, l.k_pad, s.v, l.v_pad};
  detail::write_file_durably(path, pieces, "save_snapshot");
}

std::vector<std::uint8_t> encode_snapshot(const Snapshot& s) {
  const Layout l = layout(s);
  std::vector<std::uint8_t> out;
  for (const std::vector<std::uint8_t>* p : {&l.header, &s.k, &l.k_pad, &s.v, &l.v_pad})
    out.insert(out.end(), p->begin(), p->end());
  return out;
}

Snapshot load_snapshot(const std::string& path) {
  const FileSource src(path);
  return read_snapshot(src, path);
}

Snapshot parse_snapshot(std::span<const std::uint8_t> file, const std::string& name) {
  return read_snapshot(MemorySource(file), name);
}

}  // namespace kvlayer
