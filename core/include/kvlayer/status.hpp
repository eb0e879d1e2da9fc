// Sticky errors a layer records instead of throwing: bad data (SPEC §3) and device-counter
// steps beyond their headroom or grid (SPEC §7). Shared by the reference and the CUDA layer so
// that both report the same values with the same words.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string>

namespace kvlayer {

/// Which plane a block belongs to.
enum class Plane : std::uint8_t { k, v };

/// A block that could not be represented and was written as the canonical bad block.
/// NOTE: when several bad blocks are seen before a status query, the one kept is the lowest
/// (row, plane, block) key, so the record does not depend on GPU scheduling.
struct DataError {
  std::int64_t row = 0;    ///< logical row
  Plane plane = Plane::k;
  std::int64_t block = 0;  ///< block index inside the row
  float value = 0;         ///< first non-finite value, else the value of largest magnitude
  /// Equal when every field is; `value` compares by its bits, so a NaN equals the same NaN.
  bool operator==(const DataError& o) const {
    return row == o.row && plane == o.plane && block == o.block &&
           std::bit_cast<std::uint32_t>(value) == std::bit_cast<std::uint32_t>(o.value);
  }
};

/// What a device-counter step did wrong.
enum class DeviceErrorKind : std::int32_t {
  append_outside_rows = 1,  ///< append_dcw: len_d − base_d ≥ rows (no reserve() headroom)
  append_past_max_ctx = 2,  ///< append_dc/append_dcw: len_d ≥ max_ctx
  decode_view_too_long = 3, ///< decode_dc(w): the view exceeds the grid or the resident rows
};

/// A device-counter step that wrote nothing because it would have gone out of bounds.
/// NOTE: the first one recorded sticks until the status is cleared.
struct DeviceError {
  DeviceErrorKind kind = DeviceErrorKind::append_outside_rows;
  std::int64_t len_d = 0;
  std::int64_t base_d = 0;
  std::int64_t limit = 0;  ///< rows, max_ctx or the grid's key capacity, per kind
  bool operator==(const DeviceError&) const = default;
};

/// The sticky state of a layer.
struct LayerStatus {
  std::optional<DataError> data_error;
  std::optional<DeviceError> device_error;
  bool ok() const { return !data_error && !device_error; }
  bool operator==(const LayerStatus&) const = default;
  /// "ok", or one line per recorded error.
  std::string message() const;
};

/// "data error: row R, plane K, block B: value V cannot be represented; ..." (SPEC §3).
std::string describe(const DataError& e);
/// "device error: append_dcw at len_d L, base_d B: ..." (SPEC §7).
std::string describe(const DeviceError& e);

/// Keeps the lower of two data errors by (row, plane, block).
void keep_first(std::optional<DataError>& slot, const DataError& candidate);

}  // namespace kvlayer
