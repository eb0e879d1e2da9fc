// append(n): n host rows drawn from (seed, data), quantized into the layer (SPEC §5, §6).
#include <algorithm>

#include "draw.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

int Append::weight(const GenView& v) {
  return v.geometry.is_ring() ? 24 : 14;
}

/// A legal n, or one in twenty times one row more than fits; on a flat layer longer than the
/// short class, one in four a prefill of up to kMaxPrefill rows, so that views of thousands of
/// keys (and the long class's 128K) are reached within a case.
Append Append::gen(const GenView& v, Draw& d) {
  const bool over = d.in_range(0, 20) == 0;
  std::int64_t most = v.max_append();
  if (!over && !v.geometry.is_ring() && v.geometry.max_ctx > 640 && d.in_range(0, 4) == 0)
    most = std::max<std::int64_t>(1, std::min(v.room(), kMaxPrefill));
  const std::int64_t n = over ? v.room() + 1 : d.in_range64(1, most + 1);
  return Append{std::max<std::int64_t>(n, over ? 1 : 0), d.seed(), draw_data_kind(d)};
}

void Append::apply(ref::KvLayer& twin) const {
  if (n < 1) return;
  if (n <= kTwinRows) return twin.append(twin_rows(n));
  // A long append on a flat twin goes in pieces (the same rows land in the same places), and
  // only when it fits: otherwise both sides refuse it and nothing changes.
  if (twin.geometry().is_ring() || n > twin.geometry().max_ctx - twin.len()) return;
  for (std::int64_t done = 0; done < n; done += kTwinRows)
    twin.append(twin_rows(std::min<std::int64_t>(n - done, kTwinRows)));
}

std::optional<std::string> Append::run(Sides& s) const {
  const HostRows rows = s.rows(n, seed, data);
  const std::int64_t first = s.model().len();
  const auto o =
      s.both([&] { s.model().append(view_of(rows)); }, [&] { s.system()->append(rows); });
  if (o.accepted) s.remember_rows(rows, first);
  return o.diff;
}

}  // namespace kvlayer::harness
