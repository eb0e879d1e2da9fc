#include "durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "kvlayer/error.hpp"
#include "kvlayer/snapshot_file.hpp"

namespace kvlayer::detail {
namespace {

std::optional<std::uint64_t> g_crash_point;  // set_save_crash_point (tests only)

[[noreturn]] void fail(const char* operation, const std::string& path, const std::string& what,
                       int err) {
  throw Error(ErrorKind::io,
              std::string(operation) + ": " + path + ": " + what + ": " + std::strerror(err));
}

/// Writes all of `bytes` (retrying short writes and EINTR); returns 0 or the errno.
int write_all(int fd, const std::uint8_t* bytes, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, bytes, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes += w;
    n -= std::size_t(w);
  }
  return 0;
}

}  // namespace

void set_save_crash_point(std::optional<std::uint64_t> bytes) {
  g_crash_point = bytes;
}

void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::uint8_t>> pieces,
                        const char* operation) {
  const std::filesystem::path target(path);
  const std::string dir =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  // O_EXCL on a name of our own: never another writer's temporary file, and the umask applies
  // (as for any new file).
  static std::atomic<unsigned> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt >= 100))
      fail(operation, path, "cannot create a temporary file in " + dir, errno);
  }
  auto abandon = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(operation, path, what, err);
  };

  std::uint64_t written = 0;
  for (std::span<const std::uint8_t> piece : pieces) {
    std::size_t n = piece.size();
    const bool crash = g_crash_point && *g_crash_point - written < n;
    if (crash) n = std::size_t(*g_crash_point - written);
    if (const int err = write_all(fd, piece.data(), n)) abandon("write failed", err);
    written += n;
    if (crash) break;
  }
  if (g_crash_point && *g_crash_point <= written) {
    // As a writer killed here: the kernel closes the file; nothing else happens.
    ::close(fd);
    throw Error(ErrorKind::io, std::string(operation) + ": " + path + ": stopped after " +
                                   std::to_string(written) +
                                   " bytes (test crash point); the temporary file " + tmp +
                                   " is left behind");
  }
  if (::fsync(fd) != 0) abandon("fsync failed", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(operation, path, "close failed", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(operation, path, "cannot rename " + tmp + " over it", err);
  }
  // The rename is durable only once the directory entry is.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    fail(operation, path, "written, but its directory " + dir + " cannot be opened for fsync",
         errno);
  if (::fsync(dfd) != 0) {
    const int err = errno;
    ::close(dfd);
    fail(operation, path, "written, but fsync of its directory " + dir + " failed", err);
  }
  ::close(dfd);
}

}  // namespace kvlayer::detail
