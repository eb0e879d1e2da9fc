// The golden data set produced by golden/generate.py: quantization cases (f32 blocks and the
// expected q8_0 / q5_1 bytes) and decode cases (a sequence of appends and rewinds, the expected
// state and float64 attention output after each, and the final planes). See
// golden/data/manifest.json for the on-disk description.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::golden {

/// A block the generator wrote as the canonical bad block, and the value it must be reported
/// with (IEEE f32 bits).
struct GoldenBadBlock {
  std::int64_t block = 0;
  std::uint32_t value_bits = 0;
  float value() const;
};

/// Expected bytes of one quantization case in one block format.
struct QuantFormat {
  ref::BlockType type = ref::BlockType::q8_0;
  std::vector<std::uint8_t> expected;           ///< blocks × block_bytes(type)
  std::vector<GoldenBadBlock> bad_blocks;       ///< in block order
  std::vector<std::int64_t> degenerate_blocks;  ///< 1/d not finite: quants 0 by SPEC §3
};

/// One quantization case: `blocks` × 32 f32 inputs and the expected bytes per format.
struct QuantCase {
  std::string name, what;
  std::int64_t blocks = 0;
  std::vector<float> input;
  std::vector<QuantFormat> formats;
};

/// One operation of a decode case, with the state the generator's model expects after it.
struct GoldenOp {
  enum class Kind { append, rewind } kind = Kind::append;
  std::int64_t n = 0;              ///< append: rows
  std::int64_t src_row = 0;        ///< append: first row in the case's K/V inputs
  std::int64_t to = 0;             ///< rewind: new length
  bool expect_ok = true;           ///< false: the operation must be refused, state unchanged
  std::int64_t len = 0, base = 0;  ///< state after the operation
  bool decode_ok = true;           ///< false: a host decode must be refused (view not resident)
  /// "append 17 rows (src 3)" or "rewind to 40".
  std::string describe() const;
};

/// The sticky data error a decode case must end with.
struct GoldenDataError {
  std::int64_t row = 0;
  Plane plane = Plane::k;
  std::int64_t block = 0;
  std::uint32_t value_bits = 0;
};

/// One decode case: geometry, inputs, operations and expectations.
struct DecodeCase {
  std::string name, what;
  Geometry geometry;
  int gqa = 1, n_q_heads = 1;
  DType input_dtype = DType::f32;
  float scale = 1;               ///< the softmax scale used by the generator
  bool scale_is_default = true;  ///< true: call decode without a scale (SPEC default)
  std::int64_t input_rows = 0;
  std::vector<std::uint8_t> k_input, v_input;  ///< input_rows × kv_dim elements of input_dtype
  std::vector<float> query;                    ///< n_q_heads × head_dim
  std::vector<GoldenOp> ops;
  std::vector<double> outputs;          ///< ops × n_q_heads × head_dim (zero where refused)
  std::vector<float> magnitudes;        ///< Σ_t p_t |V_te|, same layout, rounded up
  std::vector<float> score_magnitudes;  ///< ops × n_q_heads: max_t |scale|·Σ_d |q_d K_td|
  std::int64_t final_len = 0, final_base = 0;
  std::vector<std::uint8_t> k_plane, v_plane;
  std::optional<GoldenDataError> data_error;

  int head_dim() const { return geometry.head_dim_k; }
  /// Pointer to K (or V) input row `row` (element type input_dtype).
  const void* k_row(std::int64_t row) const;
  const void* v_row(std::int64_t row) const;
  /// Number of keys decode attends after ops[op] (0 when that decode is refused).
  std::int64_t view_length(std::size_t op) const;
};

/// Everything in one golden data directory.
struct GoldenSet {
  std::filesystem::path dir;
  std::string format;
  std::size_t files_verified = 0;  ///< files whose size, shape, dtype and sha256 were checked
  std::vector<QuantCase> quant;
  std::vector<DecodeCase> decode;
};

/// Loads `dir`/manifest.json and every file it lists, verifying each file's sha256, dtype and
/// shape against the manifest. Throws kvlayer::Error (io) naming the file and the mismatch.
GoldenSet load_golden(const std::filesystem::path& dir);

/// The repository's golden/data (a compile-time path into the source tree).
std::filesystem::path default_golden_dir();

}  // namespace kvlayer::golden
