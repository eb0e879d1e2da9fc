// Reading NumPy .npy files (format versions 1-3) and whole binary files. Shared by the golden
// loader and the `kvlayer` CLI, which accepts .npy inputs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace kvlayer::golden {

/// The parsed header of a .npy file.
struct NpyHeader {
  int major_version = 1;
  std::string descr;  ///< dtype string, e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::int64_t> shape;  ///< empty for a 0-d array
  std::size_t data_offset = 0;      ///< bytes before the first element
  /// Number of elements (product of the shape; 1 for a 0-d array).
  std::int64_t count() const;
};

/// Bytes per element of a supported little-endian descr ("<f4" 4, "<f2" 2, "<f8" 8, "|u1" 1,
/// "<u2" 2, "<u4" 4); 0 when the descr is not one kvlayer reads.
int npy_item_size(const std::string& descr);

/// Parses the magic and header dictionary at the start of `file`. Throws kvlayer::Error (io) with
/// a message naming what is wrong (bad magic, unsupported version, malformed dictionary).
NpyHeader parse_npy_header(std::span<const std::uint8_t> file);

/// A whole .npy file: its header and its element bytes (exactly count() * item size).
struct NpyArray {
  NpyHeader header;
  std::vector<std::uint8_t> data;
};

/// Reads `path` as .npy. Throws kvlayer::Error (io) if unreadable, malformed, Fortran-ordered,
/// of an unsupported dtype, truncated, or followed by extra bytes; the message starts with the
/// path.
NpyArray read_npy(const std::filesystem::path& path);

/// As read_npy, but accepts only "<f4" and "<f2" (the float inputs kvlayer quantizes); the
/// unsupported-dtype message names exactly those two.
NpyArray read_npy_float(const std::filesystem::path& path);

/// As read_npy_float, on the bytes of a file already in memory; messages start with `name`.
NpyArray parse_npy_float(std::span<const std::uint8_t> file, const std::string& name);

/// The elements of a "<f4" or "<f2" array as f32 (f16 converted exactly). Throws otherwise,
/// naming the dtype and the supported set.
std::vector<float> npy_to_f32(const NpyArray& a, const std::string& what);

/// Reads a whole file. Throws kvlayer::Error (io) "<path>: cannot read (<reason>)".
std::vector<std::uint8_t> read_file(const std::filesystem::path& path);

/// Writes a whole file. Throws kvlayer::Error (io) "<path>: cannot write (<reason>)".
void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes);

}  // namespace kvlayer::golden
