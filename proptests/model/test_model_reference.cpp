// The model-based property with the reference alone (no system): every command's model
// invariants (SPEC §10.5, logical rows preserved across rebases) and an independent float64
// recomputation of decodes. The GPU version is proptests/cuda.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "kvlayer/harness/generate.hpp"
#include "kvlayer/harness/replay_file.hpp"

namespace kvlayer::harness {
namespace {

RC_GTEST_PROP(ModelReference, RandomSequencesKeepEveryInvariant, ()) {
  PropertyOptions options;
  options.replay_path = "model-reference-failure.json";
  model_based_property(options);
}

TEST(ReplayFile, RoundTripsEveryCommandKind) {
  Case c;
  c.geometry.n_kv_heads = 2;
  c.geometry.head_dim_k = c.geometry.head_dim_v = 64;
  c.geometry.max_ctx = 300;
  c.geometry.window = 61;
  c.geometry.storage = Storage::ring;
  c.geometry.max_append = 7;
  c.geometry.rewind_slack = 5;
  c.n_q_heads = 6;
  c.dtype = DType::bf16;
  c.seed = 18446744073709551615ull;
  c.commands = {Append{3, 17, DataKind::ties}, AppendDc{5, DataKind::bad, true}, IncSeqlen{},
                AccountSteps{1}, Reserve{4}, Rewind{2}, Decode{DecodeVariant::dcw, 9},
                PhysicalRows{1, 3}, CanRewindTo{0}, GraphChain{4, 11, true}, StatusQuery{}};
  const Case back = from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  ASSERT_EQ(back.commands.size(), c.commands.size());
  for (std::size_t i = 0; i < c.commands.size(); ++i)
    EXPECT_EQ(describe(back.commands[i]), describe(c.commands[i]));
}

}  // namespace
}  // namespace kvlayer::harness
