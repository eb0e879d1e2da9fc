// The model-based property on the GPU: the reference (model) against the CUDA KvLayer
// (system), compared byte for byte after every command (SPEC §10). SKIPPED without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "kvlayer/harness/campaign.hpp"
#include "kvlayer/harness/cuda_system.hpp"
#include "kvlayer/testing/gpu.hpp"

namespace kvlayer::harness {
namespace {

/// KVLAYER_GPU_CASES / KVLAYER_GPU_SEED / KVLAYER_GPU_MAX_SIZE (commands in the largest case) /
/// KVLAYER_GPU_HANG_SECONDS (a call into the layer running longer is a hang: the process exits
/// 1 naming it; device-check raises it under compute-sanitizer) override the defaults.
/// KVLAYER_GPU_SHARD=k with KVLAYER_GPU_SHARDS=n runs only shard k's part of those cases
/// (CampaignConfig::shard): n processes together run exactly the cases of one.
std::int64_t env_or(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 10) : fallback;
}

TEST(ModelCuda, RandomSequencesMatchTheReferenceByteForByte) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  CampaignConfig config;
  config.seed = std::uint64_t(env_or("KVLAYER_GPU_SEED", 20261129));
  config.cases = env_or("KVLAYER_GPU_CASES", 200);
  config.shard = int(env_or("KVLAYER_GPU_SHARD", 0));
  config.shards = int(env_or("KVLAYER_GPU_SHARDS", 1));
  config.max_size = int(env_or("KVLAYER_GPU_MAX_SIZE", config.max_size));
  config.make_system = cuda_system_factory();
  config.hang_seconds =
      double(env_or("KVLAYER_GPU_HANG_SECONDS", std::int64_t(kDefaultHangSeconds)));
  config.on_hang = [](const HangReport& h) {
    std::cout << "hang: " << h.command << " did not return after " << h.seconds << " s ("
              << h.commands << " commands; replay file "
              << (h.replay_error.empty() ? h.replay_file : h.replay_error) << ")" << std::endl;
  };
  const CampaignResult r = run_campaign(config);
  std::cout << "cases " << r.cases << ", bytes compared " << r.stats.bytes_compared << ", decodes "
            << r.stats.decodes_compared << ", graph replays " << r.stats.graph_replays
            << ", restores " << r.stats.restores << " (" << r.stats.restores_past_base
            << " of a ring snapshot starting above its base)"
            << ", worst error/bound " << r.stats.worst_error_ratio << ", seconds " << r.seconds
            << "\n";
  kvlayer::testing::bound_tightness().add(r.stats.tightness);  // printed by the shared main
  kvlayer::testing::systematic_check().add(r.stats.systematic);
  EXPECT_TRUE(r.passed) << r.report << "\nreplay: " << r.replay_file;
  EXPECT_GT(r.stats.bytes_compared, 0);
  EXPECT_GT(r.stats.decodes_compared, 0);
  std::cout << r.stats.coverage.table();
  // SPEC §10.7's floors (every selectable instance at 1, 2 and >= 3 key-loop trips, and the
  // other rows non-zero) are the device campaign's gate (tools/device-campaign.sh, thousands of
  // cases): 200 cases reached 44 of the 81 instance rows on an H100 (the CUDA-core family is
  // drawn in one case of six), so here the table is printed, not held to them.
  if (config.shards > 1) {
    // A shard holds part of the restores; the unsharded run holds the floor below.
    std::cout << "shard " << config.shard << " of " << config.shards << ": "
              << r.stats.restores_past_base << " restores of a ring snapshot above its base\n";
  } else if (config.cases >= 200 && r.passed) {
    // Restores into a second layer, some of a ring whose rows move to physical row 0: where the
    // restore mutants (cuda/src/mutants.def) show. The reference-only campaign of this seed and
    // size draws the same cases (kvlayer fuzz --cases 200 --reference-only): 16 of the latter.
    EXPECT_GT(r.stats.restores_past_base, 0) << "no restore of a ring snapshot above its base";
  }
}

}  // namespace
}  // namespace kvlayer::harness
