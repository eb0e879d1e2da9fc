// CRC-32 (IEEE 802.3, the polynomial of zlib, gzip and PNG; Python's zlib.crc32), for the
// snapshot file's per-tensor checksums.
#pragma once

#include <cstdint>
#include <span>

namespace kvlayer {

/// The CRC-32 of `bytes` continued from `crc` (0 to start): crc32(b, crc32(a)) == crc32(a ++ b).
std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0);

}  // namespace kvlayer
