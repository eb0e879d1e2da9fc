// The verify cases of the golden data (SPEC §11), listed under manifest.json's "verify" key by
// golden/generate.py: speculative steps (T draft rows by a multi-row device-counter append, a
// verify decode of T queries, a rewind that keeps a prefix) and the float64 output of every
// query row. Loaded with nlohmann_json (the SPEC §2-8 loader, kvlayer_golden, ignores the key)
// and replayed on the reference by check_verify().
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvlayer/geometry.hpp"

namespace kvlayer::testing {

/// One operation of a verify case, with the state the generator's model expects after it.
struct VerifyOp {
  enum class Kind {
    append,       ///< host append of n rows
    rewind,       ///< rewind to `to`
    verify,       ///< reserve(T), T-row device-counter append, inc_seqlen(T), verify decode at
                  ///< L, account_steps(T), rewind(L − T + accept)
    decode_rows,  ///< host-len verify decode of T queries at the current state
  } kind = Kind::append;
  std::int64_t n = 0;              ///< append: rows; verify / decode_rows: T
  std::int64_t src_row = 0;        ///< append / verify: first row in the case's K/V inputs
  std::int64_t to = 0;             ///< rewind: new length
  std::int64_t q_row = 0;          ///< verify / decode_rows: first of the T rows in `queries`
  std::int64_t out_row = 0;        ///< verify / decode_rows (decode_ok): first of the T output rows
  std::int64_t L = 0;              ///< verify: len at the decode (the old len + T)
  std::int64_t accept = 0;         ///< verify: drafts kept
  bool decode_ok = true;           ///< decode_rows: false when the decode must be refused
  std::int64_t len = 0, base = 0;  ///< state after the op
  /// "verify T 16 (inputs from row 64, accept 4)" and the like.
  std::string describe() const;
};

/// One verify case: geometry, inputs, operations and expectations.
struct VerifyCase {
  std::string name, what;
  Geometry geometry;
  int gqa = 1, n_q_heads = 1;
  float scale = 1;
  bool scale_is_default = true;  ///< true: decode without a scale (the SPEC default)
  std::int64_t input_rows = 0, query_rows = 0, output_rows = 0;
  std::vector<float> k_input, v_input;  ///< input_rows × kv_dim, f32
  std::vector<float> queries;           ///< query_rows × n_q_heads × head_dim
  std::vector<VerifyOp> ops;
  std::vector<double> outputs;          ///< output_rows × n_q_heads × head_dim
  std::vector<float> magnitudes;        ///< Σ_t p_t |V_te|, same layout, rounded up
  std::vector<float> score_magnitudes;  ///< output_rows × n_q_heads: max_t |scale|·Σ_d |q_d K_td|
  std::int64_t final_len = 0, final_base = 0;
  std::vector<std::uint8_t> k_plane, v_plane;

  int head_dim() const { return geometry.head_dim_k; }
  const float* k_row(std::int64_t row) const { return k_input.data() + row * geometry.kv_dim_k(); }
  const float* v_row(std::int64_t row) const { return v_input.data() + row * geometry.kv_dim_v(); }
};

/// Every verify case of one golden data directory.
struct VerifySet {
  std::vector<VerifyCase> cases;
  std::size_t files_verified = 0;  ///< files whose dtype, shape, size and sha256 were checked
};

/// Loads the "verify" section of `dir`/manifest.json and every file it lists, checking each
/// against its entry (sha256, dtype, shape) and against what its case needs, and that every
/// listed file is used. Throws kvlayer::Error (io) naming the case, the file and the mismatch.
VerifySet load_verify_golden(const std::filesystem::path& dir);

/// The repository's golden verify set, loaded once per process; nullptr (with
/// verify_load_error() set) when it does not load.
const VerifySet* verify_golden();
const std::string& verify_load_error();

/// The outcome of replaying one verify case on the reference.
struct VerifyCheck {
  std::int64_t ops = 0, op_failures = 0;  ///< state, refusal, status or equality mismatches
  std::int64_t steps = 0;                 ///< verify ops replayed
  std::int64_t plane_bytes = 0, plane_byte_mismatches = 0;
  std::int64_t outputs_compared = 0, output_failures = 0;
  double max_error_ratio = 0;         ///< largest |reference − golden| / tolerance (≤ 1 passes)
  std::vector<std::string> failures;  ///< the first few, readable
  bool pass() const {
    return op_failures == 0 && plane_byte_mismatches == 0 && output_failures == 0 &&
           failures.empty();
  }
};

/// Replays `c` on a fresh ref::KvLayer: every op, the state after it, the multi-row
/// device-counter appends, the device-counter verify decode (bit for bit equal to the host-len
/// one on the accounted state) and every output row within kvlayer::golden::decode_tolerance,
/// refused decodes with the state unchanged, then the final planes byte for byte.
VerifyCheck check_verify(const VerifyCase& c);

}  // namespace kvlayer::testing
