// libFuzzer target: `kvlayer quantize` input handling (raw f32 or .npy, chosen by the first
// byte), then quantization of what parsed. Malformed input must be refused with kvlayer::Error.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "quantize_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlayer;
  if (size == 0) return 0;
  const bool npy = data[0] & 1;
  std::vector<float> values;
  try {
    values = cli::parse_quantize_input(std::span<const std::uint8_t>(data + 1, size - 1), npy, "input");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::io) std::abort();
    return 0;
  }
  const std::size_t usable = values.size() - values.size() % kBlockValues;
  const std::span<const float> x(values.data(), usable);
  for (auto t : {ref::BlockType::q8_0, ref::BlockType::q5_1}) {
    std::vector<std::uint8_t> out(usable / kBlockValues * std::size_t(ref::block_bytes(t)));
    ref::quantize_row(t, x, out);
    std::vector<float> back(usable);
    ref::dequantize_row(t, out, back);
  }
  return 0;
}
