// batch_steps / batch_chain: a batch of fresh layers (SPEC §12) beside the case's layer, driven
// through engine steps drawn from the command's seed and compared with ref::KvBatch after every
// operation (commands.hpp, BatchSteps).
#include <algorithm>
#include <bit>
#include <memory>
#include <optional>
#include <string>

#include "draw.hpp"
#include "kvlayer/reference/kv_batch.hpp"
#include "kvlayer/testing/batch.hpp"
#include "sides.hpp"

namespace kvlayer::harness {
namespace {

/// Both sides of one batch command: the reference batch and, with a system, its batch.
class BatchSides {
 public:
  BatchSides(Sides& s, int sequences)
      : s_(s),
        model_(s.geometry(), sequences, s.model().max_verify()),
        system_(s.system() ? s.system()->make_batch(sequences) : nullptr) {}

  ref::KvBatch& model() { return model_; }
  BatchSystem* system() { return system_.get(); }
  int sequences() const { return model_.max_batch(); }

  /// Runs model_call and (with a system) system_call: refused alike, or both accept.
  template <typename M, typename F>
  std::optional<std::string> both(const std::string& what, M&& model_call, F&& system_call) {
    const Sides::Outcome o = s_.both(
        [&] {
          model_call();
          return true;
        },
        [&] {
          if (system_) system_call(*system_);
          return true;
        });
    if (o.diff) return what + ": " + *o.diff;
    return std::nullopt;
  }

  /// Every sequence's planes (and their zero tails), counters and status on both sides.
  std::optional<std::string> compare(const std::string& after) {
    if (!system_) return std::nullopt;
    for (int i = 0; i < sequences(); ++i) {
      const Snapshot got = system_->snapshot(i);
      const Snapshot want = testing::snapshot(model_.layer(i));
      std::string d;
      if (got.k_plane != want.k_plane) d += " K plane differs;";
      if (got.v_plane != want.v_plane) d += " V plane differs;";
      const auto zero = [](const std::vector<std::uint8_t>& t) {
        return std::all_of(t.begin(), t.end(), [](std::uint8_t b) { return b == 0; });
      };
      if (!zero(got.k_tail) || !zero(got.v_tail)) d += " a plane's tail was written;";
      if (got.len != want.len || got.len_d != want.len_d || got.base != want.base ||
          got.base_d != want.base_d)
        d += " counters: system len " + std::to_string(got.len) + " len_d " +
             std::to_string(got.len_d) + " base " + std::to_string(got.base) + " base_d " +
             std::to_string(got.base_d) + ", model len " + std::to_string(want.len) + " len_d " +
             std::to_string(want.len_d) + " base " + std::to_string(want.base) + " base_d " +
             std::to_string(want.base_d) + ";";
      if (!testing::same_status(got.status, want.status))
        d += " status: system \"" + got.status.message() + "\", model \"" + want.status.message() +
             "\";";
      if (!d.empty()) return "after " + after + ", sequence " + std::to_string(i) + ":" + d;
    }
    return std::nullopt;
  }

  /// What a batch decode the model just ran must produce, per active entry (want: the model's
  /// outputs): each within its sequence's bound over its own views, taken on the model's state
  /// now (the bound needs the system's launch shape: none without a system).
  std::vector<Sides::Expectation> expectations(
      const std::string& what, const std::vector<float>& q, int t, std::optional<float> scale,
      const std::vector<std::optional<std::vector<double>>>& want) {
    std::vector<Sides::Expectation> xs;
    if (!system_) return xs;
    const Geometry& g = s_.geometry();
    const std::size_t per_q =
        std::size_t(t) * std::size_t(s_.n_q_heads()) * std::size_t(g.head_dim_k);
    const std::vector<AccumulationShape> shapes =
        system_->accumulation_shapes(t, testing::batch_view_keys(model_, want, t));
    for (std::size_t j = 0; j < want.size(); ++j) {
      const int sequence = model_.active()[j];
      Sides::Expectation x{
          what + " position " + std::to_string(j) + " (sequence " + std::to_string(sequence) + ")",
          want[j],
          {},
          {}};
      x.size = std::size_t(t) * std::size_t(s_.n_q_heads()) * std::size_t(g.head_dim_v);
      if (x.out) {
        const ref::KvLayer& layer = model_.layer(sequence);
        const std::vector<ref::DecodeView> views =
            ref::verify_views(g, layer.len_d(), g.window ? layer.base_d() : 0, t);
        const std::span<const float> qj = std::span<const float>(q).subspan(j * per_q, per_q);
        for (const ref::DecodeBound& b :
             ref::decode_rows_bound(layer, qj, s_.n_q_heads(), scale, views, shapes.at(j)))
          x.bound.append(b);
      }
      xs.push_back(std::move(x));
    }
    return xs;
  }

  /// Coverage of a batch decode over `active` (the model's state as the decode sees it).
  void count_decode(const std::vector<int>& active) {
    if (active.size() < 2) return;
    Coverage& c = s_.stats().coverage;
    ++c.batch_decodes;
    if (!s_.geometry().is_ring()) return;
    for (const int i : active)
      if (model_.layer(i).base_d() != model_.layer(active.front()).base_d()) {
        ++c.batch_ring_distinct_bases;
        return;
      }
  }

  /// A batch decode's output (max_batch positions of T queries) against its expectations:
  /// position j < their number as expectation j says, every position past them unwritten.
  std::optional<std::string> check(const std::string& what, const std::vector<float>& got, int t,
                                   const std::vector<Sides::Expectation>& xs) {
    const std::size_t per_out =
        std::size_t(t) * std::size_t(s_.n_q_heads()) * std::size_t(s_.geometry().head_dim_v);
    if (got.size() != per_out * std::size_t(sequences()))
      return what + ": the system returned " + std::to_string(got.size()) + " values, expected " +
             std::to_string(per_out * std::size_t(sequences()));
    for (std::size_t j = 0; j < std::size_t(sequences()); ++j) {
      const std::vector<float> mine(got.begin() + std::ptrdiff_t(j * per_out),
                                    got.begin() + std::ptrdiff_t((j + 1) * per_out));
      if (j < xs.size()) {
        if (auto d = s_.check_decode(xs[j], mine)) return d;
        continue;
      }
      for (std::size_t i = 0; i < mine.size(); ++i)
        if (std::bit_cast<std::uint32_t>(mine[i]) != kPoisonBits)
          return what + " position " + std::to_string(j) +
                 " is past the active list, yet element " + std::to_string(i) + " was written";
    }
    return std::nullopt;
  }

 private:
  Sides& s_;
  ref::KvBatch model_;
  std::unique_ptr<BatchSystem> system_;
};

/// Rows drawn for a step: gaussian mostly, needles now and then (peaked attention).
DataKind step_data(Rng& rng) {
  return rng.chance(20) ? DataKind::needles : DataKind::gaussian;
}

}  // namespace

/// Thrice as often on a ring: its sequences' bases part only there (batch_first_base_d).
int BatchSteps::weight(const GenView& v) {
  return v.geometry.is_ring() ? 6 : 2;
}

/// 1–8 sequences, up to 12 steps; a captured chain one time in three.
BatchSteps BatchSteps::gen(const GenView& v, Draw& d) {
  const std::int64_t sequences = d.in_range64(1, 9);
  const std::int64_t steps = d.in_range64(1, 13);
  const std::uint64_t seed = d.seed();
  const bool chain = d.in_range(0, 3) == 0;
  return BatchSteps{sequences, steps, seed, chain, draw_scale(v, d)};
}

/// The case's layer is left alone.
void BatchSteps::apply(ref::KvLayer&) const {}

std::optional<std::string> BatchSteps::run(Sides& s) const {
  const Geometry& g = s.geometry();
  if (sequences < 1 || sequences > 8 || steps <= 0) return std::nullopt;
  const bool windowed = g.window.has_value();
  BatchSides b(s, int(sequences));
  ref::KvBatch& model = b.model();
  Rng rng(seed);
  // Every sequence at its own length first: a host append of up to a few hundred rows (a
  // ring's legal appends are shorter; a refusal must then be alike on both sides). A ring's
  // sequence is filled to a length drawn up to three times its rows, by appends of at most
  // max_append rows (at most 200 of them), so that the rings rebase to different bases and a
  // batch decode must take each sequence's own base_d.
  const auto append = [&](int i, std::int64_t n) {
    const HostRows rows = s.rows(n, rng.next(), step_data(rng));
    return b.both(
        "append to sequence " + std::to_string(i), [&] { model.layer(i).append(view_of(rows)); },
        [&](BatchSystem& sys) { sys.append(i, rows); });
  };
  for (int i = 0; i < b.sequences(); ++i) {
    if (!g.is_ring()) {
      const std::int64_t most = std::min<std::int64_t>(g.max_ctx / 2, windowed ? *g.window : 600);
      if (const std::int64_t n = rng.range(0, std::max<std::int64_t>(0, most)); n > 0)
        if (auto d = append(i, n)) return d;
      continue;
    }
    const std::int64_t target = rng.range(0, std::min<std::int64_t>(g.max_ctx / 2, 3 * g.rows()));
    for (int a = 0; a < 200 && model.layer(i).len() < target; ++a)
      if (auto d = append(i, std::min(target - model.layer(i).len(), rng.range(1, g.max_append))))
        return d;
  }
  if (auto d = b.compare("the sequences' first appends")) return d;
  const int top = std::min(model.max_verify(), 8);
  if (!chain) {
    for (std::int64_t step = 0; step < steps; ++step) {
      const std::string at = "step " + std::to_string(step);
      const std::vector<int> active = testing::draw_active(b.sequences(), rng);
      if (auto d = b.both(
              at + " set_active", [&] { model.set_active(active); },
              [&](BatchSystem& sys) { sys.set_active(active); }))
        return d;
      const int t = int(rng.range(1, top));
      for (const int i : active)
        if (model.layer(i).len() + t > g.max_ctx) return std::nullopt;  // no room: done
      for (const int i : active)
        if (auto d = b.both(
                at + " reserve", [&] { model.layer(i).reserve(t); },
                [&](BatchSystem& sys) { sys.reserve(i, t); }))
          return d;
      const HostRows rows = s.rows(std::int64_t(active.size()) * t, rng.next(), step_data(rng));
      if (auto d = b.both(
              at + " append_rows",
              [&] {
                windowed ? model.append_rows_dcw(view_of(rows), t)
                         : model.append_rows_dc(view_of(rows), t);
              },
              [&](BatchSystem& sys) { sys.append_rows_dc(rows, t, windowed); }))
        return d;
      if (auto d = b.compare(at + " append_rows")) return d;
      if (auto d = b.both(
              at + " inc_seqlen", [&] { model.inc_seqlen(t); },
              [&](BatchSystem& sys) { sys.inc_seqlen(t); }))
        return d;
      if (auto d = b.compare(at + " inc_seqlen")) return d;
      const std::vector<float> q = s.queries(std::int64_t(active.size()) * t, rng.next());
      const auto want = windowed ? model.decode_rows_dcw(q, s.n_q_heads(), t, scale)
                                 : model.decode_rows_dc(q, s.n_q_heads(), t, scale);
      if (BatchSystem* sys = b.system()) {
        b.count_decode(active);
        const std::string what = at + " decode T " + std::to_string(t);
        const std::vector<float> got = sys->decode_rows_dc(q, t, windowed, scale);
        if (auto d = b.check(what, got, t, b.expectations(what, q, t, scale, want))) return d;
      }
      if (auto d = b.compare(at + " decode")) return d;
      for (const int i : active)
        if (auto d = b.both(
                at + " account_steps", [&] { model.layer(i).account_steps(t); },
                [&](BatchSystem& sys) { sys.account_steps(i, t); }))
          return d;
      if (!active.empty() && rng.chance(30)) {
        const int i = active[std::size_t(rng.range(0, std::int64_t(active.size()) - 1))];
        const std::int64_t to = model.layer(i).len() - rng.range(0, t - 1);
        if (model.layer(i).can_rewind_to(to))
          if (auto d = b.both(
                  at + " rewind", [&] { model.layer(i).rewind(to); },
                  [&](BatchSystem& sys) { sys.rewind(i, to); }))
            return d;
      }
      if (auto d = b.compare(at + " account_steps")) return d;
    }
    return std::nullopt;
  }
  // batch_chain: the model runs the rounds eagerly, each decode's expectation taken on the
  // state it decoded; the system replays one captured step per round.
  std::vector<std::vector<int>> lists;
  std::vector<HostRows> rows;
  std::vector<std::vector<float>> queries;
  std::vector<std::vector<Sides::Expectation>> expected;
  for (std::int64_t r = 0; r < steps; ++r) {
    std::vector<int> active = testing::draw_active(b.sequences(), rng);
    std::erase_if(active, [&](int i) { return model.layer(i).len() + 1 > g.max_ctx; });
    model.set_active(active);
    for (const int i : active) model.layer(i).reserve(1);
    rows.push_back(s.rows(std::int64_t(active.size()), rng.next(), step_data(rng)));
    windowed ? model.append_rows_dcw(view_of(rows.back()), 1)
             : model.append_rows_dc(view_of(rows.back()), 1);
    model.inc_seqlen(1);
    queries.push_back(s.queries(std::int64_t(active.size()), rng.next()));
    const auto want = windowed ? model.decode_rows_dcw(queries.back(), s.n_q_heads(), 1, scale)
                               : model.decode_rows_dc(queries.back(), s.n_q_heads(), 1, scale);
    expected.push_back(
        b.expectations("batch_chain round " + std::to_string(r), queries.back(), 1, scale, want));
    for (const int i : active) model.layer(i).account_steps(1);
    lists.push_back(std::move(active));
  }
  BatchSystem* sys = b.system();
  if (!sys) return std::nullopt;
  for (std::size_t r = 0; r < lists.size(); ++r) {
    b.count_decode(lists[r]);
    if (r > 0 && lists[r] != lists[r - 1]) ++s.stats().coverage.batch_replays_membership_changed;
  }
  const std::vector<std::vector<float>> got =
      sys->graph_chain(lists, rows, queries, windowed, scale);
  if (got.size() != lists.size())
    return "batch_chain: the system returned " + std::to_string(got.size()) + " rounds, expected " +
           std::to_string(lists.size());
  for (std::size_t r = 0; r < got.size(); ++r)
    if (auto d = b.check("batch_chain round " + std::to_string(r), got[r], 1, expected[r]))
      return d;
  return b.compare("the batch chain");
}

}  // namespace kvlayer::harness
