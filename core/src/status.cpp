#include "kvlayer/status.hpp"

#include <sstream>
#include <tuple>

namespace kvlayer {

std::string describe(const DataError& e) {
  std::ostringstream s;
  s << "data error: row " << e.row << ", plane " << (e.plane == Plane::k ? "K" : "V") << ", block "
    << e.block << ": value " << e.value
    << " cannot be represented (non-finite, or its fp16 scale or minimum overflows); the block "
       "was written as the canonical bad block";
  return s.str();
}

std::string describe(const DeviceError& e) {
  std::ostringstream s;
  s << "device error: ";
  switch (e.kind) {
    case DeviceErrorKind::append_outside_rows:
      s << "device-counter append at len_d " << e.len_d << ", base_d " << e.base_d
        << ": physical row " << (e.len_d - e.base_d) << " is outside the plane's " << e.limit
        << " rows (call reserve(k) before a chain of k steps); nothing was written";
      break;
    case DeviceErrorKind::append_past_max_ctx:
      s << "device-counter append at len_d " << e.len_d << ": reaches max_ctx " << e.limit
        << "; nothing was written";
      break;
    case DeviceErrorKind::decode_view_too_long:
      s << "device-counter decode at len_d " << e.len_d << ", base_d " << e.base_d
        << ": the view exceeds its limit of " << e.limit << " keys or resident rows; nothing "
           "was written";
      break;
  }
  return s.str();
}

std::string LayerStatus::message() const {
  if (ok()) return "ok";
  std::string out;
  if (data_error) out += describe(*data_error);
  if (device_error) {
    if (!out.empty()) out += '\n';
    out += describe(*device_error);
  }
  return out;
}

void keep_first(std::optional<DataError>& slot, const DataError& c) {
  if (!slot || std::tuple(c.row, c.plane, c.block) < std::tuple(slot->row, slot->plane, slot->block))
    slot = c;
}

}  // namespace kvlayer
