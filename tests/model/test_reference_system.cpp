// The harness's system path on the host: campaign cases (the generator `kvlayer fuzz` draws
// from) stepped through an Executor against ReferenceSystem, a second reference layer behind the
// System interface, must show no difference, and must reach every kind of comparison the
// executor makes against a system (counted, so the test cannot pass on cases that skip them).
// Then the same cases against systems that each get one thing wrong: the executor must report
// every one.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListenerAdapter.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/executor.hpp"
#include "kvlayer/harness/generate.hpp"
#include "kvlayer/harness/reference_system.hpp"

namespace kvlayer::harness {
namespace {

bool all_poison(const std::vector<float>& out) {
  for (const float x : out)
    if (std::bit_cast<std::uint32_t>(x) != kPoisonBits) return false;
  return true;
}

/// Forwards every call to another batch; a wrong batch overrides one.
class ForwardingBatch : public BatchSystem {
 public:
  explicit ForwardingBatch(std::unique_ptr<BatchSystem> inner) : inner_(std::move(inner)) {}
  void set_active(std::span<const int> s) override { inner_->set_active(s); }
  void append(int i, const HostRows& rows) override { inner_->append(i, rows); }
  void reserve(int i, std::int64_t k) override { inner_->reserve(i, k); }
  void account_steps(int i, std::int64_t k) override { inner_->account_steps(i, k); }
  void rewind(int i, std::int64_t to) override { inner_->rewind(i, to); }
  void append_rows_dc(const HostRows& rows, int t, bool w) override {
    inner_->append_rows_dc(rows, t, w);
  }
  void inc_seqlen(int t) override { inner_->inc_seqlen(t); }
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool w,
                                    std::optional<float> scale) override {
    return inner_->decode_rows_dc(q, t, w, scale);
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool w, std::optional<float> scale) override {
    return inner_->graph_chain(lists, rows, queries, w, scale);
  }
  Snapshot snapshot(int i) override { return inner_->snapshot(i); }
  std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int t, std::span<const std::int64_t> view_keys) override {
    return inner_->accumulation_shapes(t, view_keys);
  }

 protected:
  std::unique_ptr<BatchSystem> inner_;
};

/// What the campaign's cases made the system do.
struct Reached {
  std::int64_t decodes = 0;           ///< decode* calls that wrote their output
  std::int64_t decodes_poisoned = 0;  ///< decode outputs left unwritten (a device error), any call
  std::int64_t verify_decodes = 0;    ///< decode_rows calls of T ≥ 2 that wrote their output
  std::int64_t refusals = 0;          ///< calls the system refused (as the model did)
  std::int64_t graph_chains = 0, graph_steps = 0;
  std::int64_t verify_chains = 0, verify_rounds = 0;
  std::int64_t batches = 0;               ///< batch commands (make_batch)
  std::int64_t batch_decodes = 0;         ///< batch decodes of ≥ 2 active sequences
  std::int64_t batch_chains = 0;          ///< batch graph chains
  std::int64_t batch_chains_changed = 0;  ///< … whose active list changes between rounds
  std::int64_t restores = 0;
};

/// f(), counting a refusal into r before it propagates.
template <typename F>
auto counted(Reached& r, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    ++r.refusals;
    throw;
  }
}

/// ReferenceSystem, counting what it is asked to do into `reached`.
class CountingSystem final : public ReferenceSystem {
 public:
  CountingSystem(const Case& c, Reached& reached) : ReferenceSystem(c), r_(reached) {}

  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    auto out = counted(r_, [&] { return ReferenceSystem::decode(v, q, scale); });
    if (!all_poison(out)) ++r_.decodes;
    r_.decodes_poisoned += all_poison(out);
    return out;
  }
  std::vector<float> decode_rows(DecodeVariant v, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    auto out = counted(r_, [&] { return ReferenceSystem::decode_rows(v, q, t, scale); });
    if (t >= 2 && !all_poison(out)) ++r_.verify_decodes;
    r_.decodes_poisoned += all_poison(out);
    return out;
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool w, std::optional<float> scale) override {
    auto out = counted(r_, [&] { return ReferenceSystem::graph_chain(rows, queries, w, scale); });
    ++r_.graph_chains;
    r_.graph_steps += std::int64_t(out.size());
    for (const auto& step : out) r_.decodes_poisoned += all_poison(step);
    return out;
  }
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& queries,
                                               const std::vector<std::int64_t>& accepted, int t,
                                               bool w, std::optional<float> scale) override {
    auto out = counted(
        r_, [&] { return ReferenceSystem::verify_chain(drafts, queries, accepted, t, w, scale); });
    ++r_.verify_chains;
    r_.verify_rounds += std::int64_t(out.size());
    for (const auto& round : out) r_.decodes_poisoned += all_poison(round);
    return out;
  }
  void restore_into_fresh(const kvlayer::Snapshot& s) override {
    counted(r_, [&] { ReferenceSystem::restore_into_fresh(s); });
    ++r_.restores;
  }
  void reserve(std::int64_t k) override {
    counted(r_, [&] { ReferenceSystem::reserve(k); });
  }
  void rewind(std::int64_t to) override {
    counted(r_, [&] { ReferenceSystem::rewind(to); });
  }
  void append(const HostRows& rows) override {
    counted(r_, [&] { ReferenceSystem::append(rows); });
  }
  std::unique_ptr<BatchSystem> make_batch(int sequences) override {
    ++r_.batches;
    return std::make_unique<Batch>(ReferenceSystem::make_batch(sequences), r_);
  }

 private:
  class Batch final : public ForwardingBatch {
   public:
    Batch(std::unique_ptr<BatchSystem> inner, Reached& r)
        : ForwardingBatch(std::move(inner)), r_(r) {}
    void set_active(std::span<const int> s) override {
      ForwardingBatch::set_active(s);
      active_ = s.size();
    }
    std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool w,
                                      std::optional<float> scale) override {
      if (active_ >= 2) ++r_.batch_decodes;
      return ForwardingBatch::decode_rows_dc(q, t, w, scale);
    }
    std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                                const std::vector<HostRows>& rows,
                                                const std::vector<std::vector<float>>& queries,
                                                bool w, std::optional<float> scale) override {
      ++r_.batch_chains;
      for (std::size_t i = 1; i < lists.size(); ++i)
        if (lists[i] != lists[i - 1]) {
          ++r_.batch_chains_changed;
          break;
        }
      auto out = ForwardingBatch::graph_chain(lists, rows, queries, w, scale);
      if (!lists.empty()) active_ = lists.back().size();
      return out;
    }

   private:
    Reached& r_;
    std::size_t active_ = 0;
  };

  Reached& r_;
};

/// The campaign's cases, run once against CountingSystem and shared by the tests below.
struct Campaign {
  std::vector<Case> cases;  ///< each with the commands it ran
  Stats stats;
  Reached reached;
  bool passed = false;
  std::string report;
  double seconds = 0;
};

const Campaign& campaign() {
  static const Campaign c = [] {
    Campaign c;
    const auto start = std::chrono::steady_clock::now();
    PropertyOptions options;
    options.make_system = [&c](const Case& k) -> std::unique_ptr<System> {
      return std::make_unique<CountingSystem>(k, c.reached);
    };
    // Short views only: the system path, not long float64 decodes, is what runs here.
    options.limits.medium_ctx = 0;
    options.limits.long_ctx = 0;
    options.on_case_done = [&c](const Stats& s) { c.stats.add(s); };
    options.on_case_passed = [&c](const Case& k) { c.cases.push_back(k); };
    rc::detail::TestParams params;
    params.seed = 20261129;
    // Up to ~100 commands a case: the largest cases dominate the time (size 150 takes about
    // three times as long) and reach nothing these counts need that size 100 does not.
    params.maxSuccess = 50;
    params.maxSize = 100;
    params.disableShrinking = true;  // a failure is reported as drawn
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = "reference system campaign";
    rc::detail::TestListenerAdapter listener;
    const auto result = rc::detail::checkTestable([&] { model_based_property(options); }, metadata,
                                                  params, listener);
    rc::detail::SuccessResult success;
    c.passed = result.match(success);
    std::ostringstream report;
    rc::detail::printResultMessage(result, report);
    c.report = report.str();
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return c;
  }();
  return c;
}

TEST(ReferenceSystem, CampaignCasesShowNoDifferenceAndReachEveryComparison) {
  const Campaign& c = campaign();
  ASSERT_TRUE(c.passed) << c.report;
  const Reached& r = c.reached;
  std::cout << c.cases.size() << " cases in " << c.seconds << " s: " << r.decodes
            << " decodes written, " << r.decodes_poisoned << " left poisoned (device error), "
            << r.verify_decodes << " verify decodes of T >= 2, " << r.refusals << " refusals, "
            << r.graph_chains << " graph chains (" << r.graph_steps << " steps), "
            << r.verify_chains << " verify chains (" << r.verify_rounds << " rounds), "
            << r.restores << " restores, " << r.batches << " batch commands, " << r.batch_decodes
            << " batch decodes of >= 2 sequences, " << r.batch_chains << " batch chains ("
            << r.batch_chains_changed << " with a membership change); " << c.stats.decodes_compared
            << " decodes compared with a bound, " << c.stats.bytes_compared << " bytes compared\n"
            << c.stats.tightness.summary() << "\n"
            << "seconds: commands " << c.stats.seconds_in_commands << ", system "
            << c.stats.seconds_in_system << ", read-backs " << c.stats.seconds_in_snapshots
            << ", bounds " << c.stats.seconds_in_bounds << "\n";
  EXPECT_GT(r.decodes, 0);
  EXPECT_GT(r.decodes_poisoned, 0);
  EXPECT_GT(r.verify_decodes, 0);
  EXPECT_GT(r.refusals, 0);
  EXPECT_GT(r.graph_chains, 0);
  EXPECT_GT(r.verify_chains, 0);
  EXPECT_GT(r.restores, 0);
  EXPECT_GT(r.batches, 0);
  EXPECT_GT(r.batch_decodes, 0);
  EXPECT_GT(r.batch_chains_changed, 0);
  // The executor's own counts agree that it compared what the system returned.
  EXPECT_GT(c.stats.decodes_compared, 0);
  EXPECT_GT(c.stats.coverage.batch_decodes, 0);
  EXPECT_GT(c.stats.coverage.batch_replays_membership_changed, 0);
  EXPECT_GT(c.stats.tightness.elements(), 0);
}

// ---- Systems that get one thing wrong ----------------------------------------------------

/// Every decode's output changed by `change` (element 0 alone with kFirstOnly).
template <bool kFirstOnly>
struct ChangesDecodes : ReferenceSystem {
  ChangesDecodes(const Case& c, std::function<float(float)> change)
      : ReferenceSystem(c), change_(std::move(change)) {}
  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    std::vector<float> out = ReferenceSystem::decode(v, q, scale);
    if (!all_poison(out))
      for (std::size_t i = 0; i < (kFirstOnly ? 1 : out.size()); ++i) out[i] = change_(out[i]);
    return out;
  }
  std::function<float(float)> change_;
};

/// A verify decode's last element left poisoned.
struct LeavesAVerifyElementPoisoned : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<float> decode_rows(DecodeVariant v, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    std::vector<float> out = ReferenceSystem::decode_rows(v, q, t, scale);
    if (!out.empty()) out.back() = std::bit_cast<float>(kPoisonBits);
    return out;
  }
};

/// Zeros where a decode that recorded a device error must leave the poison.
struct WritesDespiteADeviceError : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  static std::vector<float> zeroed(std::vector<float> out) {
    if (!out.empty() && all_poison(out)) std::fill(out.begin(), out.end(), 0.0f);
    return out;
  }
  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    return zeroed(ReferenceSystem::decode(v, q, scale));
  }
  std::vector<float> decode_rows(DecodeVariant v, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    return zeroed(ReferenceSystem::decode_rows(v, q, t, scale));
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool w, std::optional<float> scale) override {
    auto outs = ReferenceSystem::graph_chain(rows, queries, w, scale);
    for (auto& out : outs) out = zeroed(std::move(out));
    return outs;
  }
};

/// Nothing returned where a decode that recorded a device error must return its poisoned output.
struct ReturnsNothingOnADeviceError : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    std::vector<float> out = ReferenceSystem::decode(v, q, scale);
    if (all_poison(out)) out.clear();
    return out;
  }
};

/// Refusals of decodes, verifies and rewinds swallowed: the call returns as if accepted
/// (outputs unwritten, nothing changed).
struct SwallowsRefusals : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<float> decode(DecodeVariant v, std::span<const float> q,
                            std::optional<float> scale) override {
    try {
      return ReferenceSystem::decode(v, q, scale);
    } catch (const Error&) {
      return std::vector<float>(std::size_t(n_q_heads() * geometry().head_dim_v),
                                std::bit_cast<float>(kPoisonBits));
    }
  }
  std::vector<float> decode_rows(DecodeVariant v, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    try {
      return ReferenceSystem::decode_rows(v, q, t, scale);
    } catch (const Error&) {
      return {};
    }
  }
  void rewind(std::int64_t to) override {
    try {
      ReferenceSystem::rewind(to);
    } catch (const Error&) {
    }
  }
};

/// A graph chain's eager decode one ulp away from its replay on the same state.
struct EagerDiffersFromTheReplay : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<std::vector<float>> last_chain_eager() override {
    auto eager = ReferenceSystem::last_chain_eager();
    if (!eager.empty() && !eager.back().empty())
      eager.back()[0] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(eager.back()[0]) ^ 1u);
    return eager;
  }
};

/// A graph chain's eager decode one value short of its replay.
struct EagerIsShort : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<std::vector<float>> last_chain_eager() override {
    auto eager = ReferenceSystem::last_chain_eager();
    if (!eager.empty() && !eager.back().empty()) eager.back().pop_back();
    return eager;
  }
};

/// A verify chain whose last round skips its account_steps (and so its rewind).
struct VerifyChainSkipsAccountSteps : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& queries,
                                               const std::vector<std::int64_t>& accepted, int t,
                                               bool w, std::optional<float> scale) override {
    std::vector<std::vector<float>> outputs;
    for (std::size_t r = 0; r < drafts.size(); ++r) {
      reserve(t);
      append_rows_dc(drafts[r], w);
      inc_seqlen(t);
      outputs.push_back(
          decode_rows(w ? DecodeVariant::dcw : DecodeVariant::dc, queries[r], t, scale));
      if (r + 1 == drafts.size()) break;
      account_steps(t);
      if (accepted[r] < t) rewind(layer().len() - t + accepted[r]);
    }
    return outputs;
  }
};

/// The last appended row's last K byte left unwritten (read back as zero).
struct LeavesTheLastByteUnwritten : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  void append(const HostRows& rows) override {
    ReferenceSystem::append(rows);
    const std::int64_t row = layer().len() - 1 - layer().base();  // physical
    unwritten_ = std::size_t((row + 1) * geometry().k_tok_bytes() - 1);
  }
  Snapshot snapshot() override {
    Snapshot s = ReferenceSystem::snapshot();
    if (unwritten_) s.k_plane.at(*unwritten_) = 0;
    return s;
  }
  std::optional<std::size_t> unwritten_;
};

/// A system whose batches are `B` around the reference batch.
template <typename B>
struct WithBatch : ReferenceSystem {
  using ReferenceSystem::ReferenceSystem;
  std::unique_ptr<BatchSystem> make_batch(int sequences) override {
    return std::make_unique<B>(ReferenceSystem::make_batch(sequences), sequences);
  }
};

/// A batch that knows its active list.
struct ListedBatch : ForwardingBatch {
  ListedBatch(std::unique_ptr<BatchSystem> inner, int sequences)
      : ForwardingBatch(std::move(inner)), sequences_(sequences) {}
  void set_active(std::span<const int> s) override {
    ForwardingBatch::set_active(s);
    active_.assign(s.begin(), s.end());
  }
  std::vector<int> active_;
  int sequences_;
};

/// A batch decode with its first two positions swapped.
struct SwapsTwoBatchPositions : ListedBatch {
  using ListedBatch::ListedBatch;
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool w,
                                    std::optional<float> scale) override {
    std::vector<float> out = ForwardingBatch::decode_rows_dc(q, t, w, scale);
    const std::size_t per = out.size() / std::size_t(sequences_);
    if (active_.size() >= 2)
      std::swap_ranges(out.begin(), out.begin() + std::ptrdiff_t(per),
                       out.begin() + std::ptrdiff_t(per));
    return out;
  }
};

/// Batch decodes and chains at the default scale whatever scale they are given.
struct BatchIgnoresTheScale : ListedBatch {
  using ListedBatch::ListedBatch;
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool w,
                                    std::optional<float>) override {
    return ForwardingBatch::decode_rows_dc(q, t, w, std::nullopt);
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool w, std::optional<float>) override {
    return ForwardingBatch::graph_chain(lists, rows, queries, w, std::nullopt);
  }
};

/// A batch decode that writes the first position past the active list.
struct WritesPastTheList : ListedBatch {
  using ListedBatch::ListedBatch;
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool w,
                                    std::optional<float> scale) override {
    std::vector<float> out = ForwardingBatch::decode_rows_dc(q, t, w, scale);
    const std::size_t per = out.size() / std::size_t(sequences_);
    if (active_.size() < std::size_t(sequences_)) out[active_.size() * per] = 0.0f;
    return out;
  }
};

/// A batch chain whose first non-empty round skips account_steps on its first sequence.
struct BatchChainSkipsAccountSteps : ListedBatch {
  using ListedBatch::ListedBatch;
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool w, std::optional<float> scale) override {
    std::vector<std::vector<float>> outputs;
    bool skipped = false;
    for (std::size_t r = 0; r < lists.size(); ++r) {
      set_active(lists[r]);
      for (const int i : lists[r]) reserve(i, 1);
      append_rows_dc(rows[r], 1, w);
      inc_seqlen(1);
      outputs.push_back(decode_rows_dc(queries[r], 1, w, scale));
      for (const int i : lists[r]) {
        if (!skipped) {
          skipped = true;
          continue;
        }
        account_steps(i, 1);
      }
    }
    return outputs;
  }
};

/// The first difference the executor reports for any campaign case run against `system`
/// (made per case), with the case's index; exceptions are reported as such.
std::pair<std::size_t, std::string> first_report(
    const std::function<std::unique_ptr<System>(const Case&)>& make) {
  const std::vector<Case>& cases = campaign().cases;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::unique_ptr<System> system = make(cases[i]);
    Executor ex(cases[i], system.get());
    for (const Command& command : cases[i].commands) {
      try {
        if (auto d = ex.step(command)) return {i, *d};
      } catch (const std::exception& e) {
        return {i, std::string("exception: ") + e.what()};
      }
    }
  }
  return {cases.size(), "(no difference)"};
}

template <typename S>
std::function<std::unique_ptr<System>(const Case&)> make() {
  return [](const Case& c) { return std::make_unique<S>(c); };
}

template <bool kFirstOnly>
std::function<std::unique_ptr<System>(const Case&)> changes(std::function<float(float)> change) {
  return
      [change](const Case& c) { return std::make_unique<ChangesDecodes<kFirstOnly>>(c, change); };
}

/// Every wrong system is reported on a case that reaches its fault, by the check named (each runs
/// the campaign's cases in order until one reports it).
TEST(ReferenceSystem, EverySystemThatGetsOneThingWrongIsReported) {
  ASSERT_TRUE(campaign().passed) << campaign().report;
  struct Wrong {
    const char* name;
    std::function<std::unique_ptr<System>(const Case&)> make;
    /// A part of the executor's report; "a|b": either (a bug the first failing case may show
    /// by either of two checks, depending on the draws).
    const char* report;
  };
  const std::vector<Wrong> wrongs = {
      {"a decode element a million times its magnitude off",
       changes<true>([](float x) { return x + 1e6f * (std::fabs(x) + 1); }),
       "exceeds the derived bound"},
      // 1e-3 of an element passes the bound where the output is small against the V it averages
      // (it allows about 2^-10 of Σ p·|V|); the declared check, the finer, reports it first.
      {"a decode element off by 1e-3", changes<true>([](float x) { return x * 1.001f; }),
       "the declared statistical check"},
      // 2^-12 of every output is below the bound's resolution everywhere.
      {"every decode 2^-12 too large", changes<false>([](float x) { return x * (1 + 0x1p-12f); }),
       "the declared statistical check"},
      {"a verify element left poisoned", make<LeavesAVerifyElementPoisoned>(), "(not finite)"},
      {"written despite a device error", make<WritesDespiteADeviceError>(),
       "although the model recorded a device error"},
      {"nothing returned on a device error", make<ReturnsNothingOnADeviceError>(),
       "output has 0 values"},
      {"refusals swallowed", make<SwallowsRefusals>(), "system accepted"},
      {"an eager decode one ulp off", make<EagerDiffersFromTheReplay>(), "(must be bit-identical)"},
      {"an eager decode one value short", make<EagerIsShort>(), "eager output has"},
      {"a verify chain round unaccounted", make<VerifyChainSkipsAccountSteps>(),
       "counters differ|eager calls for 2 rounds"},
      {"an append's last byte unwritten", make<LeavesTheLastByteUnwritten>(), "K plane differs"},
      {"two batch positions swapped", make<WithBatch<SwapsTwoBatchPositions>>(), "position 0"},
      {"a batch position past the list written", make<WithBatch<WritesPastTheList>>(),
       "is past the active list"},
      {"a batch at the default scale whatever it is given", make<WithBatch<BatchIgnoresTheScale>>(),
       "exceeds the derived bound"},
      {"a batch chain round unaccounted", make<WithBatch<BatchChainSkipsAccountSteps>>(),
       "after the batch chain"},
  };
  for (const Wrong& w : wrongs) {
    const auto start = std::chrono::steady_clock::now();
    const auto [index, report] = first_report(w.make);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << w.name << ": case " << index << " (" << seconds << " s): " << report.substr(0, 300)
              << "\n";
    bool found = false;
    for (std::string_view rest = w.report; !found;) {
      const std::size_t bar = rest.find('|');
      found = report.find(rest.substr(0, bar)) != std::string::npos;
      if (bar == std::string_view::npos) break;
      rest.remove_prefix(bar + 1);
    }
    EXPECT_TRUE(found) << w.name << ": expected \"" << w.report << "\" in: " << report;
  }
}

}  // namespace
}  // namespace kvlayer::harness
