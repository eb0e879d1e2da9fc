// The reference layer's entry point for a harness decode variant or a windowed choice: one
// mapping for the model side (sides.hpp) and for ReferenceSystem, so that both call the same
// reference function for the same command.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "kvlayer/harness/commands.hpp"
#include "kvlayer/harness/row_data.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::harness {

/// decode / decode_dc / decode_dcw as `variant` names (nullopt: a device error recorded).
inline std::optional<std::vector<double>> reference_decode(ref::KvLayer& layer,
                                                           DecodeVariant variant,
                                                           std::span<const float> q, int n_q_heads,
                                                           std::optional<float> scale) {
  switch (variant) {
    case DecodeVariant::host:
      return layer.decode(q, n_q_heads, scale);
    case DecodeVariant::dc:
      return layer.decode_dc(q, n_q_heads, scale);
    case DecodeVariant::dcw:
      return layer.decode_dcw(q, n_q_heads, scale);
  }
  return std::nullopt;
}

/// decode_rows / decode_rows_dc / decode_rows_dcw as `variant` names; compute_output false
/// (device-counter variants only) checks and records as the call would, without the output.
inline std::optional<std::vector<double>> reference_decode_rows(
    ref::KvLayer& layer, DecodeVariant variant, std::span<const float> q, int n_q_heads, int t,
    std::optional<float> scale, bool compute_output = true) {
  switch (variant) {
    case DecodeVariant::host:
      return layer.decode_rows(q, n_q_heads, t, scale);
    case DecodeVariant::dc:
      return layer.decode_rows_dc(q, n_q_heads, t, scale, compute_output);
    case DecodeVariant::dcw:
      return layer.decode_rows_dcw(q, n_q_heads, t, scale, compute_output);
  }
  return std::nullopt;
}

/// The device-counter variant of a windowed or window-less layer.
inline DecodeVariant dc_variant(bool windowed) {
  return windowed ? DecodeVariant::dcw : DecodeVariant::dc;
}

/// append_rows_dc(w) of rows.n rows.
inline void reference_append_rows_dc(ref::KvLayer& layer, const HostRows& rows, bool windowed) {
  windowed ? layer.append_rows_dcw(rows.view()) : layer.append_rows_dc(rows.view());
}

}  // namespace kvlayer::harness
