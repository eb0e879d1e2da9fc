// Parsing of `kvlayer quantize` input bytes, apart from file I/O so that a fuzzer can drive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvlayer::cli {

/// The values of a quantize input: a .npy of '<f4' or '<f2' (f16 converted exactly) when
/// `npy`, else raw little-endian f32. Throws kvlayer::Error (io) naming `name`, the value and
/// the limit on malformed, truncated or unsupported input.
std::vector<float> parse_quantize_input(std::span<const std::uint8_t> bytes, bool npy,
                                        const std::string& name);

}  // namespace kvlayer::cli
