// append_dc / append_dcw: one row written at the device counter len_d (SPEC §7).
#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int AppendDc::weight(const GenView&) {
  return 6;
}

/// Windowed on a ring, half the time on a windowed flat layer, one in eight times on a flat layer
/// without a window.
AppendDc AppendDc::gen(const GenView& v, Draw& d) {
  const Geometry& g = v.geometry;
  const bool windowed =
      g.is_ring() || (g.window && d.in_range(0, 2) == 0) || (!g.window && d.in_range(0, 8) == 0);
  return AppendDc{d.seed(), draw_data_kind(d), windowed};
}

void AppendDc::apply(ref::KvLayer& twin) const {
  windowed ? twin.append_dcw(twin_rows(1)) : twin.append_dc(twin_rows(1));
}

std::optional<std::string> AppendDc::run(Sides& s) const {
  const HostRows row = s.rows(1, seed, data);
  const std::int64_t at = s.model().len_d();
  const bool writes = s.dc_append_writes(windowed);
  const auto o = s.both([&] { s.model_append_dc(row, windowed); },
                        [&] { s.system()->append_dc(row, windowed); });
  if (o.accepted && writes) s.remember_rows(row, at);
  return o.diff;
}

}  // namespace kvlayer::harness
