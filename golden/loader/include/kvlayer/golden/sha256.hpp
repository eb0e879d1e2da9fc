// SHA-256 (FIPS 180-4), so the loader can prove it reads the files the manifest describes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvlayer::golden {

/// Lower-case hex SHA-256 digest of `bytes`.
std::string sha256_hex(std::span<const std::uint8_t> bytes);

}  // namespace kvlayer::golden
