#include "kvlayer/harness/coverage.hpp"

#include <cstdio>

namespace kvlayer::harness {

void Coverage::record(const LaunchRecord& launch) {
  Instance& i = instances[launch.instance];
  ++i.launches;
  if (launch.loop_trips >= 1) ++i.trips[launch.loop_trips >= 3 ? 2 : launch.loop_trips - 1];
  if (launch.active_splits > 256) ++i.merges_over_256;
  if (launch.queries > 16) ++verify_over_16;
  if (launch.past_base && launch.active_splits >= 2) ++ring_past_base_splits;
}

void Coverage::add(const Coverage& o) {
  for (const auto& [name, x] : o.instances) {
    Instance& i = instances[name];
    i.launches += x.launches;
    for (int k = 0; k < 3; ++k) i.trips[k] += x.trips[k];
    i.merges_over_256 += x.merges_over_256;
  }
  verify_over_16 += o.verify_over_16;
  ring_past_base_splits += o.ring_past_base_splits;
  rebases_over_one_unit += o.rebases_over_one_unit;
  batch_decodes += o.batch_decodes;
  batch_ring_distinct_bases += o.batch_ring_distinct_bases;
  batch_replays_membership_changed += o.batch_replays_membership_changed;
}

std::string Coverage::table() const {
  std::string out = "coverage: launches per kernel instance by the longest warp loop's trips\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-28s %10s %10s %10s %10s %12s\n", "instance", "launches",
                "1 trip", "2 trips", ">= 3 trips", "> 256 splits");
  out += line;
  for (const auto& [name, i] : instances) {
    std::snprintf(line, sizeof line, "  %-28s %10lld %10lld %10lld %10lld %12lld\n", name.c_str(),
                  (long long)i.launches, (long long)i.trips[0], (long long)i.trips[1],
                  (long long)i.trips[2], (long long)i.merges_over_256);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  verify T > 16: %lld; ring views past base over >= 2 splits: %lld; rebases of "
                ">= 2 units: %lld\n",
                (long long)verify_over_16, (long long)ring_past_base_splits,
                (long long)rebases_over_one_unit);
  out += line;
  std::snprintf(line, sizeof line,
                "  batch decodes of >= 2 sequences: %lld; of ring sequences at different bases: "
                "%lld; graph replays after a membership change: %lld\n",
                (long long)batch_decodes, (long long)batch_ring_distinct_bases,
                (long long)batch_replays_membership_changed);
  out += line;
  return out;
}

std::string selectable_line(const std::vector<std::string>& selectable) {
  std::string line = "coverage selectable:";
  for (std::size_t i = 0; i < selectable.size(); ++i) line += (i ? "; " : " ") + selectable[i];
  return line + "\n";
}

std::vector<std::string> Coverage::unmet_floors(const std::vector<std::string>& selectable) const {
  std::vector<std::string> unmet;
  const char* buckets[] = {"1 trip", "2 trips", ">= 3 trips"};
  for (const std::string& name : selectable) {
    const auto it = instances.find(name);
    for (int k = 0; k < 3; ++k)
      if (it == instances.end() || it->second.trips[k] == 0)
        unmet.push_back(name + ": no launch of " + buckets[k]);
  }
  std::int64_t merges = 0;
  for (const auto& [name, i] : instances) merges += i.merges_over_256;
  if (merges == 0) unmet.push_back("no merge over more than 256 splits");
  if (verify_over_16 == 0) unmet.push_back("no verify of T > 16");
  if (ring_past_base_splits == 0) unmet.push_back("no ring view past base over >= 2 splits");
  if (rebases_over_one_unit == 0) unmet.push_back("no rebase of >= 2 units");
  if (batch_decodes == 0) unmet.push_back("no batch decode of >= 2 sequences");
  if (batch_ring_distinct_bases == 0)
    unmet.push_back("no batch decode of ring sequences at different bases");
  if (batch_replays_membership_changed == 0)
    unmet.push_back("no batch graph replay after a membership change");
  return unmet;
}

}  // namespace kvlayer::harness
