// Crash-safe replacement of a file's contents: the bytes go to a temporary file in the target's
// directory, are fsynced, and the temporary file is renamed over the target, then the directory
// is fsynced. A writer killed at any point leaves the target as it was (old contents, or absent)
// or with the new contents complete, never a mix; a killed writer may leave its temporary file
// (named "<target>.tmp.<pid>.<n>") behind.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvlayer::detail {

/// Writes the concatenation of `pieces` to `path` as described above. Throws kvlayer::Error (io)
/// "<operation>: <path>: <what failed>: <strerror>"; on such a failure the temporary file is
/// removed and the target untouched (except when only the directory's fsync failed: the target
/// then holds the new contents, which may not survive a power loss; the message says so).
void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::uint8_t>> pieces,
                        const char* operation);

}  // namespace kvlayer::detail
