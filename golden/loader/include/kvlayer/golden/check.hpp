// Replays golden cases on the CPU reference and compares: quantized bytes bit for bit, bad-block
// reports, layer state after every operation, final planes byte for byte, and decode outputs
// within a derived bound. Used by tests/golden and by `kvlayer selfcheck`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvlayer/golden/golden.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::golden {

/// Bound on |reference − golden| for one decode output element. Both are float64 evaluations of
/// SPEC §8 over bit-identical dequantized values (the planes are compared byte for byte
/// separately), so they differ only by rounding order. With u = 2^-53, D = head_dim, n keys,
/// S = max_t |scale|·Σ_d |q_d K_td| (score_magnitude) and M = Σ_t p_t |V_te| (magnitude):
///  - each side's score has error ≤ γ_{D+1}·S (any summation order) plus ≤ 2u·S from s − max,
///    so the two sides' scores differ by Δ ≤ (2(D+1) + 4)·u·S;
///  - softmax is shift-invariant, so unnormalised weights differ relatively by ≤ e^Δ − 1, plus
///    exp rounding (≤ 4 ulp per side for libm / numpy SIMD exp): ε_w = expm1(Δ) + 16u;
///    normalised weights then differ relatively by ≤ 2ε_w + 2γ_n (the sums Σ w) + 2u (division);
///  - Σ_t p_t V_te in float64 has error ≤ γ_n·M per side.
/// So |Δo_e| ≤ (2ε_w + (4n + 4)·u)·M to first order; the tolerance is twice that, which
/// covers the second-order terms and M being stored rounded up to f32. It is ~1e-13·M at the
/// golden sizes, far below any real defect (one f32 rounding is 6e-8).
double decode_tolerance(double magnitude, double score_magnitude, int head_dim,
                        std::int64_t n_keys);

/// Result of checking one quantization case in one format.
struct QuantCheck {
  std::string case_name;
  ref::BlockType type = ref::BlockType::q8_0;
  std::int64_t blocks = 0;
  std::int64_t mismatched_blocks = 0;  ///< blocks whose bytes differ (block or row quantizer)
  std::int64_t bad_expected = 0;       ///< canonical bad blocks in the case
  std::int64_t bad_misreported = 0;    ///< bad blocks reported wrongly (or good ones reported)
  std::int64_t degenerate = 0;         ///< degenerate blocks (compared like every other)
  std::vector<std::string> failures;   ///< first few failure descriptions
  bool pass() const { return mismatched_blocks == 0 && bad_misreported == 0 && failures.empty(); }
};

/// Quantizes every block of `c` with the reference (block by block, and as one row) and
/// compares with the golden bytes and bad-block reports of `f`.
QuantCheck check_quant(const QuantCase& c, const QuantFormat& f);

/// Result of replaying one decode case.
struct DecodeCheck {
  std::string case_name;
  std::int64_t ops = 0, op_failures = 0;  ///< state, refusal or status mismatches
  std::int64_t decodes = 0;               ///< decode calls made (ok + expected refusals)
  std::int64_t plane_bytes = 0, plane_byte_mismatches = 0;
  std::int64_t outputs_compared = 0, output_failures = 0, nan_outputs = 0;
  double max_abs_error = 0;    ///< largest |reference − golden| over finite outputs
  double max_error_ratio = 0;  ///< largest |reference − golden| / tolerance (≤ 1 passes)
  std::vector<std::string> failures;
  bool pass() const {
    return op_failures == 0 && plane_byte_mismatches == 0 && output_failures == 0 &&
           failures.empty();
  }
};

/// Replays `c` on a fresh ref::KvLayer: every operation, its refusal or success, the state after
/// it and a decode after it; then the final planes, len, base and the sticky data error.
DecodeCheck check_decode(const DecodeCase& c);

/// What a refused golden operation must leave unchanged: the planes and the counters.
struct LayerState {
  std::vector<std::uint8_t> k, v;
  std::int64_t len, base, len_d, base_d;
  bool operator==(const LayerState&) const = default;
};
LayerState layer_state(const ref::KvLayer& layer);

/// Appends a failure line, at most a dozen (then one "(further failures not listed)").
void note_failure(std::vector<std::string>& failures, const std::string& message);

/// A plane's bytes against the golden ones, byte for byte.
struct PlaneComparison {
  std::int64_t bytes = 0;              ///< golden bytes compared
  std::int64_t mismatches = 0;         ///< bytes that differ (all of them when the sizes differ)
  std::optional<std::string> failure;  ///< "<case>: <plane> plane: …" when any differ
};
PlaneComparison compare_plane(const std::string& case_name, const char* plane,
                              const std::vector<std::uint8_t>& got,
                              const std::vector<std::uint8_t>& golden, std::int64_t tok_bytes);

}  // namespace kvlayer::golden
