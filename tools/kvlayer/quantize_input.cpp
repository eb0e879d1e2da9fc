#include "quantize_input.hpp"

#include <cstring>

#include "kvlayer/error.hpp"
#include "kvlayer/golden/npy.hpp"

namespace kvlayer::cli {

std::vector<float> parse_quantize_input(std::span<const std::uint8_t> bytes, bool npy,
                                        const std::string& name) {
  if (npy) return golden::npy_to_f32(golden::parse_npy_float(bytes, name), name);
  if (bytes.size() % 4 != 0)
    throw Error(ErrorKind::io, name + ": " + std::to_string(bytes.size()) +
                                   " bytes is not a whole number of float32 values (4 bytes each)");
  std::vector<float> v(bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());  // little-endian host
  return v;
}

}  // namespace kvlayer::cli
