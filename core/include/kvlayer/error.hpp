// The one exception type of kvlayer: every refused request, I/O failure and CUDA failure.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvlayer {

/// What went wrong, coarsely; the message carries the details (operation, values, limit).
enum class ErrorKind {
  refused,  ///< a request refused before any work (SPEC §9); state untouched
  device,   ///< a CUDA runtime failure
  io,       ///< a file could not be read or written, or is malformed
};

/// The exception thrown by every kvlayer entry point.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  /// The coarse class of the failure.
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

/// Throws a refusal whose message is "<operation>: <the parts, concatenated>".
/// NOTE: call it before touching any state, so that a refused request changes nothing.
template <typename... Parts>
[[noreturn]] void refuse(const char* operation, Parts&&... parts) {
  throw Error(ErrorKind::refused, detail::concat(operation, ": ", std::forward<Parts>(parts)...));
}

}  // namespace kvlayer
