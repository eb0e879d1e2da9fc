// kvlayer quantize / dequantize: f32 (raw or .npy) <-> raw q8_0 / q5_1 blocks, with the
// reference quantizers (SPEC §2-4).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "quantize_input.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/golden/npy.hpp"
#include "kvlayer/reference/quantize.hpp"

namespace kvlayer::cli {
namespace {

constexpr std::string_view kQuantizeLine =
    "kvlayer quantize --type q8_0|q5_1 --input IN --output OUT";
constexpr std::string_view kDequantizeLine =
    "kvlayer dequantize --type q8_0|q5_1 --input IN --output OUT";

[[noreturn]] void data_error(const std::string& what) {
  throw Error(ErrorKind::io, what);
}

ref::BlockType parse_type(const std::string& t) {
  if (t == "q8_0") return ref::BlockType::q8_0;
  if (t == "q5_1") return ref::BlockType::q5_1;
  throw UsageError("unknown --type '" + t + "' (supported: q8_0, q5_1)");
}

/// IN as f32 values: a .npy of '<f4' or '<f2' (f16 converted exactly), else raw little-endian f32.
std::vector<float> read_values(const std::filesystem::path& in) {
  return parse_quantize_input(golden::read_file(in), in.extension() == ".npy", in.string());
}

std::string value_string(float v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

int run_quantize(const std::vector<std::string>& args) {
  const Options o(args, {"type", "input", "output"}, {});
  const ref::BlockType type = parse_type(o.require("type", kQuantizeLine));
  const std::string in = o.require("input", kQuantizeLine);
  const std::string out = o.require("output", kQuantizeLine);
  const std::vector<float> x = read_values(in);
  if (x.empty()) data_error(in + ": holds no values (need at least one block of 32)");
  if (x.size() % kBlockValues != 0)
    data_error(in + ": holds " + std::to_string(x.size()) +
               " values, not a multiple of the block size " + std::to_string(kBlockValues));
  const std::size_t blocks = x.size() / kBlockValues;
  const std::size_t bb = std::size_t(ref::block_bytes(type));
  std::vector<std::uint8_t> bytes(blocks * bb);
  // Block by block, so every bad block is reported, not just the first.
  std::size_t bad = 0;
  constexpr std::size_t kMaxWarnings = 10;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::span<const float> in_block(x.data() + b * kBlockValues, kBlockValues);
    std::span<std::uint8_t> out_block(bytes.data() + b * bb, bb);
    if (const auto r = ref::quantize_row(type, in_block, out_block)) {
      if (++bad <= kMaxWarnings)
        std::cerr << "kvlayer quantize: warning: block " << b << " (values " << b * kBlockValues
                  << ".." << (b + 1) * kBlockValues - 1 << "): value " << value_string(r->value)
                  << " cannot be represented; wrote the canonical bad block\n";
    }
  }
  if (bad > kMaxWarnings)
    std::cerr << "kvlayer quantize: warning: " << bad << " bad blocks in all ("
              << bad - kMaxWarnings << " not listed)\n";
  golden::write_file(out, bytes);
  return kExitOk;
}

int run_dequantize(const std::vector<std::string>& args) {
  const Options o(args, {"type", "input", "output"}, {});
  const ref::BlockType type = parse_type(o.require("type", kDequantizeLine));
  const std::string in = o.require("input", kDequantizeLine);
  const std::string out = o.require("output", kDequantizeLine);
  const std::vector<std::uint8_t> bytes = golden::read_file(in);
  const std::size_t bb = std::size_t(ref::block_bytes(type));
  const char* name = type == ref::BlockType::q8_0 ? "q8_0" : "q5_1";
  if (bytes.empty()) data_error(in + ": holds no blocks");
  if (bytes.size() % bb != 0)
    data_error(in + ": holds " + std::to_string(bytes.size()) + " bytes, not a multiple of the " +
               name + " block size " + std::to_string(bb));
  std::vector<float> x(bytes.size() / bb * kBlockValues);
  ref::dequantize_row(type, bytes, x);
  golden::write_file(out, std::span(reinterpret_cast<const std::uint8_t*>(x.data()), x.size() * 4));
  return kExitOk;
}

}  // namespace

const Command& quantize_command() {
  static const Command c{
      "quantize", "f32 values (raw or .npy) -> raw q8_0 / q5_1 blocks",
      "usage: kvlayer quantize --type q8_0|q5_1 --input IN --output OUT\n\n"
      "Quantizes IN with the reference quantizer (SPEC 2-3) and writes the raw blocks to OUT\n"
      "(q8_0: 34 bytes per 32 values, q5_1: 24 bytes per 32 values).\n\n"
      "  --type T     q8_0 or q5_1\n"
      "  --input IN   a .npy file (dtype '<f4' or '<f2', C order, any shape) when the name ends "
      "in\n"
      "               .npy, else raw little-endian float32; the value count must be a positive\n"
      "               multiple of 32\n"
      "  --output OUT raw blocks, overwritten\n\n"
      "A block holding NaN or Inf, or whose fp16 scale (or q5_1 minimum) overflows, is written as\n"
      "the canonical bad block and reported as a warning on stderr; the exit status stays 0.\n"
      "Exit status: 0 written, 1 data or I/O error, 2 usage error.\n",
      &run_quantize};
  return c;
}

const Command& dequantize_command() {
  static const Command c{
      "dequantize", "raw q8_0 / q5_1 blocks -> raw f32 values",
      "usage: kvlayer dequantize --type q8_0|q5_1 --input IN --output OUT\n\n"
      "Dequantizes raw blocks (SPEC 4: q8_0 d*q; q5_1 d*q + m, each one f32 rounding) and writes\n"
      "32 little-endian float32 values per block to OUT.\n\n"
      "  --type T     q8_0 or q5_1\n"
      "  --input IN   raw blocks; the size must be a positive multiple of the block size (34 / "
      "24)\n"
      "  --output OUT raw float32, overwritten\n\n"
      "Exit status: 0 written, 1 data or I/O error, 2 usage error.\n",
      &run_dequantize};
  return c;
}

}  // namespace kvlayer::cli
