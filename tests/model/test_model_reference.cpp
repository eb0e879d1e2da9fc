// The model-based property with the reference alone (no system): every command's model
// invariants (SPEC §10.5, logical rows preserved across rebases) and an independent float64
// recomputation of decodes. The GPU version is test_model_cuda.cpp.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/generate.hpp"
#include "kvlayer/harness/replay_file.hpp"
#include "kvlayer/harness/row_data.hpp"

namespace kvlayer::harness {
namespace {

/// Every passing case also survives its replay file: the same commands come back, and the
/// same text. Every drawn decode scale is the default times a factor in (1/2, 2) and not a
/// power of two (one would hide a scale folded into an fp16 operand).
RC_GTEST_PROP(ModelReference, RandomSequencesKeepEveryInvariant, ()) {
  PropertyOptions options;
  options.replay_path = "model-reference-failure.json";
  options.on_case_passed = [](const Case& c) {
    const std::string text = to_json(c);
    const Case back = from_json(text);
    RC_ASSERT(back.commands == c.commands);
    RC_ASSERT(to_json(back) == text);
    const double def = 1.0 / std::sqrt(double(c.geometry.head_dim_k));
    int scaled = 0;
    for (const Command& command : c.commands) {
      const auto scale = std::visit(
          [](const auto& x) -> std::optional<float> {
            if constexpr (requires { x.scale; }) return x.scale;
            return std::nullopt;
          },
          command);
      if (!scale) continue;
      ++scaled;
      int e = 0;
      RC_ASSERT(std::frexp(*scale, &e) != 0.5f);
      RC_ASSERT(*scale > 0.49 * def && *scale < 2.01 * def);
    }
    RC_CLASSIFY(scaled > 0, "a decode with a drawn scale");
  };
  model_based_property(options);
}

/// The ties data must be able to catch an FMA-contracted q5_1 quantizer (a planted mutant):
/// quantizing its f32 V rows with one fused multiply-add must change some bytes.
TEST(RowData, TiesRowsCatchAFusedQ5_1Quantizer) {
  Geometry g;
  g.n_kv_heads = 2;
  g.head_dim_k = g.head_dim_v = 128;
  g.max_ctx = 16;
  int sensitive = 0, blocks = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const HostRows rows = make_rows(g, DType::f32, 4, seed, DataKind::ties);
    for (std::size_t b = 0; b < rows.v.size() / kBlockValues; ++b) {
      const float* x = rows.v.data() + b * kBlockValues;
      const float lo = *std::min_element(x, x + kBlockValues);
      const float hi = *std::max_element(x, x + kBlockValues);
      const float id = 1.0f / ((hi - lo) / 31.0f);
      ++blocks;
      for (int j = 0; j < kBlockValues; ++j) {
        volatile float scaled = (x[j] - lo) * id;
        if (unsigned(scaled + 0.5f) != unsigned(std::fma(x[j] - lo, id, 0.5f))) {
          ++sensitive;
          break;
        }
      }
    }
  }
  // About half the ties V blocks are FMA-sensitive ones (the others are exact-tie blocks).
  EXPECT_GT(sensitive, blocks / 3) << sensitive << " of " << blocks << " blocks";
  std::cout << sensitive << " of " << blocks << " ties blocks are FMA-sensitive\n";
}

/// The needles data must make attention peaked however long the view: a query along a needle
/// row's K direction puts nearly all its weight there, so the decode returns that row's V.
TEST(RowData, NeedleRowsDominateTheAttentionOfAQueryAlongThem) {
  Geometry g;
  g.n_kv_heads = 2;
  g.head_dim_k = g.head_dim_v = 128;
  g.max_ctx = 4096;
  int needles_seen = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const HostRows rows = make_rows(g, DType::f32, 4096, seed, DataKind::needles);
    ref::KvLayer layer(g);
    layer.append(rows.view());
    for (int h = 0; h < g.n_kv_heads; ++h) {
      // Needle rows: K norm far above the bulk's (√D·σ for gaussian rows).
      std::vector<double> norm(std::size_t(rows.n));
      for (std::int64_t r = 0; r < rows.n; ++r) {
        double s = 0;
        for (int d = 0; d < g.head_dim_k; ++d) {
          const double x = rows.k[std::size_t(r * g.kv_dim_k() + h * g.head_dim_k + d)];
          s += x * x;
        }
        norm[std::size_t(r)] = std::sqrt(s);
      }
      std::vector<double> sorted = norm;
      std::nth_element(sorted.begin(), sorted.begin() + rows.n / 2, sorted.end());
      const double median = sorted[std::size_t(rows.n / 2)];
      for (std::int64_t r = 0; r < rows.n; ++r) {
        if (norm[std::size_t(r)] < 5 * median) continue;
        ++needles_seen;
        // A query along the needle (one query head per KV head; the other head's query zero).
        std::vector<float> q(std::size_t(g.n_kv_heads * g.head_dim_k), 0.0f);
        for (int d = 0; d < g.head_dim_k; ++d)
          q[std::size_t(h * g.head_dim_k + d)] =
              float(rows.k[std::size_t(r * g.kv_dim_k() + h * g.head_dim_k + d)] /
                    norm[std::size_t(r)] * 2.0 / (median / std::sqrt(double(g.head_dim_k))));
        const std::vector<double> o = layer.decode(q, g.n_kv_heads);
        const std::vector<float> v = layer.dequantized_row(Plane::v, r);
        for (int e = 0; e < g.head_dim_v; ++e) {
          const double want = v[std::size_t(h * g.head_dim_v + e)];
          EXPECT_NEAR(o[std::size_t(h * g.head_dim_v + e)], want, 0.05 * std::fabs(want))
              << "seed " << seed << " head " << h << " row " << r << " element " << e;
        }
      }
    }
  }
  EXPECT_GE(needles_seen, 8) << "4 appends x 2 heads, 1-3 needles each";
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
                PhysicalRows{1, 3}, CanRewindTo{0}, GraphChain{4, 11, true}, StatusQuery{},
                DraftStep{3, 21, DataKind::integers, true}, Verify{2, 8},
                VerifyChain{5, 4, 13, true}};
  c.commands.insert(c.commands.end(), {TakeSnapshot{}, Restore{false}, Restore{true},
                                       BatchSteps{3, 5, 19, false}, BatchSteps{8, 2, 23, true}});
  std::set<std::size_t> kinds;
  for (const Command& command : c.commands) kinds.insert(command.index());
  EXPECT_EQ(kinds.size(), std::variant_size_v<Command>) << "a command kind is missing here";
  const Case back = from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  EXPECT_TRUE(back.commands == c.commands);
  // The lines `kvlayer replay` prints and rapidcheck shows a shrunk sequence with.
  const std::vector<std::string> lines = {
      "append n=3 data=ties seed=17", "append_dcw data=bad seed=5", "inc_seqlen",
      "account_steps k=1",            "reserve k=4",                "rewind to=2",
      "decode_dcw seed=9",            "physical_rows [1, 3)",       "can_rewind_to p=0",
      "graph_chain steps=4 dcw seed=11", "status",
      "draft_step t=3 data=integers dcw seed=21", "decode_rows t=2 seed=8",
      "verify_chain rounds=5 t=4 dcw seed=13"};
  const std::vector<std::string> snapshot_lines = {
      "snapshot", "restore into_fresh", "restore into_current",
      "batch_steps sequences=3 steps=5 seed=19", "batch_chain sequences=8 steps=2 seed=23"};
  ASSERT_EQ(back.commands.size(), lines.size() + snapshot_lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(describe(back.commands[i]), lines[i]);
  for (std::size_t i = 0; i < snapshot_lines.size(); ++i)
    EXPECT_EQ(describe(back.commands[lines.size() + i]), snapshot_lines[i]);
  EXPECT_EQ(describe(AppendDc{1, DataKind::wide, false}), "append_dc data=wide seed=1");
  EXPECT_EQ(describe(Decode{DecodeVariant::host, 2}), "decode seed=2");
  EXPECT_EQ(describe(GraphChain{2, 3, false}), "graph_chain steps=2 dc seed=3");
  EXPECT_EQ(kind_name(Decode{DecodeVariant::dc, 2}), "decode_dc");
  // The replay-file form: the op name and the fields by key.
  const std::string text = to_json(
      Case{c.geometry,
           1,
           DType::f32,
           0,
           {AppendDc{1, DataKind::wide, false}, GraphChain{2, 3, false}, PhysicalRows{-1, 4}},
           Case{}.max_verify,
           DecodeChoice{}});
  for (const char* line : {R"({"data":"wide","op":"append_dc","seed":1})",
                           R"({"op":"graph_chain","seed":3,"steps":2,"windowed":false})",
                           R"({"end":4,"op":"physical_rows","start":-1})"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
  Case snapshots = c;
  snapshots.commands = {TakeSnapshot{}, Restore{true}};
  const std::string snapshots_text = to_json(snapshots);
  for (const char* line : {R"({"op":"snapshot"})", R"({"into_current":true,"op":"restore"})"})
    EXPECT_NE(snapshots_text.find(line), std::string::npos) << line << " not in\n"
                                                            << snapshots_text;
}

/// A decode command's scale survives its replay file bit for bit and shows in its line; one
/// without a scale (the default) has no "scale" key, so files written before commands had
/// one read back as unscaled.
TEST(ReplayFile, RoundTripsADecodeScaleAndReadsFilesWithout) {
  Case c;
  c.geometry.n_kv_heads = 1;
  c.geometry.head_dim_k = c.geometry.head_dim_v = 128;
  c.geometry.max_ctx = 100;
  c.geometry.window = 40;
  const float odd = 0.0883883461f * 1.2345678f;  // not a power of two, all mantissa bits used
  c.commands = {Decode{DecodeVariant::host, 1, odd},
                Decode{DecodeVariant::dcw, 2},
                Verify{3, 4, 0.3f},
                DraftStep{2, 5, DataKind::gaussian, true, 0.0625f * 1.5f},
                GraphChain{3, 6, true, odd},
                VerifyChain{2, 3, 7, true, 1e-3f}};
  const std::string text = to_json(c);
  const Case back = from_json(text);
  EXPECT_TRUE(back.commands == c.commands) << text;
  EXPECT_EQ(std::get<Decode>(back.commands[0]).scale, odd);  // bit for bit (not within a tolerance)
  EXPECT_EQ(std::get<Decode>(back.commands[1]).scale, std::nullopt);
  EXPECT_EQ(to_json(back), text);
  EXPECT_NE(text.find(R"({"op":"decode_dcw","seed":2})"), std::string::npos) << text;
  EXPECT_EQ(describe(Verify{3, 4, 0.3f}), "decode_rows t=3 scale=0.3 seed=4");
  EXPECT_EQ(describe(GraphChain{3, 6, false, 0.09375f}),
            "graph_chain steps=3 dc scale=0.09375 seed=6");
  EXPECT_EQ(describe(Decode{DecodeVariant::dc, 2}), "decode_dc seed=2");
  // The line shows the shortest text that reads back as the same float.
  const std::string line = describe(back.commands[0]);
  const auto at = line.find("scale=");
  ASSERT_NE(at, std::string::npos) << line;
  EXPECT_EQ(std::stof(line.substr(at + 6)), odd) << line;

  // A file without scales (as written before commands had one), and one with "scale": null.
  const std::string old_file =
      R"({"format": "kvlayer-replay", "version": 1, "geometry": {"n_kv_heads": 1, "head_dim_k": 64,)"
      R"( "head_dim_v": 64, "max_ctx": 100, "window": 40, "storage": "flat", "max_append": 1,)"
      R"( "rewind_slack": 0}, "n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": [)"
      R"({"op": "decode", "seed": 9}, {"op": "decode_rows", "t": 2, "seed": 8},)"
      R"( {"op": "draft_step", "t": 3, "seed": 21, "data": "ties", "windowed": true},)"
      R"( {"op": "graph_chain", "steps": 4, "windowed": true, "seed": 11},)"
      R"( {"op": "verify_chain", "rounds": 5, "t": 4, "windowed": true, "seed": 13},)"
      R"( {"op": "decode_dcw", "seed": 3, "scale": null}]})";
  const Case old = from_json(old_file);
  const std::vector<Command> unscaled = {Decode{DecodeVariant::host, 9},
                                         Verify{2, 8},
                                         DraftStep{3, 21, DataKind::ties, true},
                                         GraphChain{4, 11, true},
                                         VerifyChain{5, 4, 13, true},
                                         Decode{DecodeVariant::dcw, 3}};
  EXPECT_TRUE(old.commands == unscaled);
  EXPECT_EQ(to_json(old).find("scale"), std::string::npos);

  // A scale that is not a number, or beyond f32's range, is refused by name.
  for (const auto& [scale, message] : std::vector<std::pair<std::string, std::string>>{
           {R"("big")", "replay file: commands[0].scale: expected a number or null"},
           {"1e39", "replay file: commands[0].scale: 1e+39 is outside the f32 range"}}) {
    const std::string bad = text.substr(0, text.find("\"commands\"")) +
                            R"("commands": [{"op": "decode", "seed": 1, "scale": )" + scale + "}]}";
    try {
      from_json(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message) << bad;
    }
  }
}

}  // namespace
}  // namespace kvlayer::harness

namespace kvlayer::harness {
namespace {

/// A malformed replay file is refused with a message naming the field and what is wrong.
TEST(ReplayFile, MalformedFilesNameTheFieldAndTheProblem) {
  const std::string geometry =
      R"("geometry": {"n_kv_heads": 1, "head_dim_k": 64, "head_dim_v": 64, "max_ctx": 100, )"
      R"("window": null, "storage": "flat", "max_append": 1, "rewind_slack": 0})";
  const auto file = [&](const std::string& geometry_part, const std::string& rest) {
    return R"({"format": "kvlayer-replay", "version": 1, )" + geometry_part + ", " + rest + "}";
  };
  const std::string ok_rest = R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": [])";
  EXPECT_NO_THROW(from_json(file(geometry, ok_rest)));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "replay file: JSON: "},
      {"[1, 2]", "replay file: top level: expected an object"},
      {R"({"format": "other", "version": 1})", "replay file: format: expected \"kvlayer-replay\""},
      {R"({"format": "kvlayer-replay", "version": 2})",
       "replay file: top level.version: 2 is outside [1, 1]"},
      {file(geometry, R"("dtype": "f32", "seed": 1, "commands": [])"),
       "replay file: top level: missing field 'n_q_heads'"},
      {file(geometry, R"("n_q_heads": 2, "dtype": "f64", "seed": 1, "commands": [])"),
       "replay file: dtype: unknown dtype 'f64' (expected f32, f16 or bf16)"},
      {file(geometry, R"("n_q_heads": "two", "dtype": "f32", "seed": 1, "commands": [])"),
       "replay file: top level.n_q_heads: expected an integer"},
      {file(geometry, R"("n_q_heads": 2, "dtype": "f32", "seed": -1, "commands": [])"),
       "replay file: top level.seed: expected a non-negative integer"},
      {file(geometry, R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": {})"),
       "replay file: commands: expected an array"},
      {file(geometry, R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": [{"op": "jump"}])"),
       "replay file: commands[0].op: unknown op 'jump'"},
      {file(geometry, ok_rest + R"(, "decode": {"batch_waves": 0})"),
       "replay file: decode.batch_waves: 0 is outside [1, 64]"},
      {file(geometry, ok_rest + R"(, "decode": {"waves": 8})"),
       "replay file: decode: unknown field 'waves'"},
      {file(geometry, ok_rest + R"(, "decode": {"verify": "auto"})"),
       "replay file: decode.verify: 'auto' is not one of mma, wgmma"},
      {file(
           geometry,
           R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": [{"op": "append", "n": 2, "seed": 1}])"),
       "replay file: commands[0]: missing field 'data'"},
      {file(
           geometry,
           R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": [{"op": "graph_chain", "steps": 5000, "seed": 1, "windowed": false}])"),
       "replay file: commands[0].steps: 5000 is outside [0, 4096]"},
      {file(
           R"("geometry": {"n_kv_heads": 1, "head_dim_k": 48, "head_dim_v": 64, "max_ctx": 100, "window": null, "storage": "flat", "max_append": 1, "rewind_slack": 0})",
           ok_rest),
       "replay file: geometry: geometry: head_dim_k 48 must be a positive multiple of 32 up to "
       "4096"},
      {file(
           R"("geometry": {"n_kv_heads": 1, "head_dim_k": 64, "head_dim_v": 64, "max_ctx": 100, "window": null, "storage": "circle", "max_append": 1, "rewind_slack": 0})",
           ok_rest),
       "replay file: geometry.storage: expected \"flat\" or \"ring\", got 'circle'"},
  };
  // The snapshot commands' flag (SPEC §13).
  const std::string restores = R"("n_q_heads": 2, "dtype": "f32", "seed": 1, "commands": )";
  const std::vector<std::pair<std::string, std::string>> snapshot_cases = {
      {file(geometry, restores + R"([{"op": "snapshot"}, {"op": "restore"}])"),
       "replay file: commands[1]: missing field 'into_current'"},
      {file(geometry, restores + R"([{"op": "restore", "into_current": 1}])"),
       "replay file: commands[0].into_current: expected true or false"}};
  for (const auto* list : {&cases, &snapshot_cases})
    for (const auto& [text, message] : *list) {
      try {
        from_json(text);
        ADD_FAILURE() << "accepted: " << text;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::io);
        EXPECT_EQ(std::string(e.what()).substr(0, message.size()), message) << text;
      }
    }
  try {
    read_replay_file("/nonexistent/replay.json");
    ADD_FAILURE() << "read a file that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "replay file /nonexistent/replay.json: cannot be read");
  }
}

}  // namespace
}  // namespace kvlayer::harness
