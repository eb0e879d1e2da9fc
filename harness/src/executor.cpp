// The Executor and the Sides it runs each command on: every command's run (harness/src/
// commands/) calls the model and the system; the state of both is compared after it here.
#include "kvlayer/harness/executor.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "kvlayer/reference/quantize.hpp"
#include "reference_calls.hpp"
#include "sides.hpp"

namespace kvlayer::harness {

void Stats::add(const Stats& o) {
  for (const auto& [k, v] : o.commands) commands[k] += v;
  refused += o.refused;
  rebases += o.rebases;
  rewinds += o.rewinds;
  graph_replays += o.graph_replays;
  restores += o.restores;
  restores_past_base += o.restores_past_base;
  bytes_compared += o.bytes_compared;
  decodes_compared += o.decodes_compared;
  seconds_in_commands += o.seconds_in_commands;
  seconds_in_system += o.seconds_in_system;
  seconds_in_snapshots += o.seconds_in_snapshots;
  seconds_in_bounds += o.seconds_in_bounds;
  tightness.add(o.tightness);
  systematic.add(o.systematic);
  for (const auto& [path, check] : o.systematic_by_path) systematic_by_path[path].add(check);
  coverage.add(o.coverage);
  if (o.worst_error_ratio > worst_error_ratio) {
    worst_error_ratio = o.worst_error_ratio;
    worst_error = o.worst_error;
    worst_bound = o.worst_bound;
  }
  if (o.worst_energy > worst_energy) {
    worst_energy = o.worst_energy;
    worst_energy_at = o.worst_energy_at;
  }
}

namespace {

/// Adds the wall-clock time of its own lifetime to `seconds`.
class Stopwatch {
 public:
  explicit Stopwatch(double& seconds) : seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point start_;
};

/// One call into the system under test: timed into stats, watched for a hang, and whatever it
/// launched counted into the coverage (also when it throws after a launch).
template <typename F>
auto timed_call(System& system, Stats& stats, HangWatchdog* watchdog, F&& f) {
  struct TakeCoverage {
    System& system;
    Stats& stats;
    ~TakeCoverage() { system.take_coverage(stats.coverage); }
  } take{system, stats};
  const Stopwatch w(stats.seconds_in_system);
  const HangWatchdog::Call watched(watchdog);
  return f();
}

/// Forwards every call of a batch (SPEC §12) as TimedSystem does its layer's.
class TimedBatchSystem final : public BatchSystem {
  template <typename F>
  auto timed(F&& f) {
    return timed_call(layer_system_, stats_, watchdog_, std::forward<F>(f));
  }

 public:
  TimedBatchSystem(std::unique_ptr<BatchSystem> inner, System& layer_system, Stats& stats,
                   HangWatchdog* watchdog)
      : inner_(std::move(inner)), layer_system_(layer_system), stats_(stats), watchdog_(watchdog) {}
  void set_active(std::span<const int> sequences) override {
    timed([&] { inner_->set_active(sequences); });
  }
  void append(int i, const HostRows& rows) override { timed([&] { inner_->append(i, rows); }); }
  void reserve(int i, std::int64_t k) override { timed([&] { inner_->reserve(i, k); }); }
  void account_steps(int i, std::int64_t k) override {
    timed([&] { inner_->account_steps(i, k); });
  }
  void rewind(int i, std::int64_t to) override { timed([&] { inner_->rewind(i, to); }); }
  void append_rows_dc(const HostRows& rows, int t, bool windowed) override {
    timed([&] { inner_->append_rows_dc(rows, t, windowed); });
  }
  void inc_seqlen(int t) override { timed([&] { inner_->inc_seqlen(t); }); }
  std::vector<float> decode_rows_dc(std::span<const float> q, int t, bool windowed,
                                    std::optional<float> scale) override {
    return timed([&] { return inner_->decode_rows_dc(q, t, windowed, scale); });
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<std::vector<int>>& lists,
                                              const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override {
    return timed([&] { return inner_->graph_chain(lists, rows, queries, windowed, scale); });
  }
  Snapshot snapshot(int i) override {
    const Stopwatch w(stats_.seconds_in_snapshots);
    const HangWatchdog::Call watched(watchdog_);
    return inner_->snapshot(i);
  }
  std::vector<kvlayer::AccumulationShape> accumulation_shapes(
      int t, std::span<const std::int64_t> view_keys) override {
    return timed([&] { return inner_->accumulation_shapes(t, view_keys); });
  }

 private:
  std::unique_ptr<BatchSystem> inner_;
  System& layer_system_;  ///< whose take_coverage counts the batch's launches too
  Stats& stats_;
  HangWatchdog* watchdog_;
};

/// Forwards every call to the system under test, timing it into the campaign's Stats (so the
/// summary can say where a case's time goes: model, system, read-backs or bounds).
class TimedSystem final : public System {
  // NOTE: defined before its uses (its return type is deduced).
  template <typename F>
  auto timed(F&& f) {
    return timed_call(inner_, stats_, watchdog_, std::forward<F>(f));
  }

 public:
  TimedSystem(System& inner, Stats& stats, HangWatchdog* watchdog)
      : inner_(inner), stats_(stats), watchdog_(watchdog) {}
  void append(const HostRows& rows) override { timed([&] { inner_.append(rows); }); }
  void append_dc(const HostRows& row, bool windowed) override {
    timed([&] { inner_.append_dc(row, windowed); });
  }
  void inc_seqlen() override { timed([&] { inner_.inc_seqlen(); }); }
  void append_rows_dc(const HostRows& rows, bool windowed) override {
    timed([&] { inner_.append_rows_dc(rows, windowed); });
  }
  void inc_seqlen(int t) override { timed([&] { inner_.inc_seqlen(t); }); }
  std::vector<float> decode_rows(DecodeVariant variant, std::span<const float> q, int t,
                                 std::optional<float> scale) override {
    return timed([&] { return inner_.decode_rows(variant, q, t, scale); });
  }
  std::vector<std::vector<float>> verify_chain(const std::vector<HostRows>& drafts,
                                               const std::vector<std::vector<float>>& queries,
                                               const std::vector<std::int64_t>& accepted, int t,
                                               bool windowed, std::optional<float> scale) override {
    return timed(
        [&] { return inner_.verify_chain(drafts, queries, accepted, t, windowed, scale); });
  }
  kvlayer::AccumulationShape verify_accumulation_shape(int t) override {
    return timed([&] { return inner_.verify_accumulation_shape(t); });
  }
  void account_steps(std::int64_t k) override { timed([&] { inner_.account_steps(k); }); }
  void reserve(std::int64_t k) override { timed([&] { inner_.reserve(k); }); }
  void rewind(std::int64_t to) override { timed([&] { inner_.rewind(to); }); }
  std::pair<std::int64_t, std::int64_t> physical_rows(std::int64_t s, std::int64_t e) override {
    return timed([&] { return inner_.physical_rows(s, e); });
  }
  bool can_rewind_to(std::int64_t p) override {
    return timed([&] { return inner_.can_rewind_to(p); });
  }
  std::vector<float> decode(DecodeVariant variant, std::span<const float> q,
                            std::optional<float> scale) override {
    return timed([&] { return inner_.decode(variant, q, scale); });
  }
  std::vector<std::vector<float>> graph_chain(const std::vector<HostRows>& rows,
                                              const std::vector<std::vector<float>>& queries,
                                              bool windowed, std::optional<float> scale) override {
    return timed([&] { return inner_.graph_chain(rows, queries, windowed, scale); });
  }
  std::vector<std::vector<float>> last_chain_eager() override {
    const HangWatchdog::Call watched(watchdog_);
    return inner_.last_chain_eager();
  }
  void clear_status() override { timed([&] { inner_.clear_status(); }); }
  Snapshot snapshot() override {
    const Stopwatch w(stats_.seconds_in_snapshots);
    const HangWatchdog::Call watched(watchdog_);
    return inner_.snapshot();
  }
  // The layer's own snapshot and restores are calls under test, not state read-backs.
  kvlayer::Snapshot take_snapshot() override {
    return timed([&] { return inner_.take_snapshot(); });
  }
  void restore(const kvlayer::Snapshot& s) override {
    timed([&] { inner_.restore(s); });
  }
  void restore_into_fresh(const kvlayer::Snapshot& s) override {
    timed([&] { inner_.restore_into_fresh(s); });
  }
  std::unique_ptr<BatchSystem> make_batch(int sequences) override {
    std::unique_ptr<BatchSystem> batch = timed([&] { return inner_.make_batch(sequences); });
    if (!batch) return nullptr;
    return std::make_unique<TimedBatchSystem>(std::move(batch), inner_, stats_, watchdog_);
  }
  kvlayer::AccumulationShape accumulation_shape(DecodeVariant variant) override {
    return timed([&] { return inner_.accumulation_shape(variant); });
  }

 private:
  System& inner_;
  Stats& stats_;
  HangWatchdog* watchdog_;  ///< null: calls are not watched
};

std::string first_byte_difference(const std::vector<std::uint8_t>& a,
                                  const std::vector<std::uint8_t>& b, std::int64_t tok_bytes,
                                  const char* plane) {
  if (a.size() != b.size())
    return std::string(plane) + " plane sizes differ: " + std::to_string(a.size()) + " vs " +
           std::to_string(b.size());
  const auto it = std::mismatch(a.begin(), a.end(), b.begin());
  if (it.first == a.end()) return {};
  const auto at = std::int64_t(it.first - a.begin());
  std::ostringstream s;
  s << plane << " plane differs at byte " << at << " (physical row " << at / tok_bytes
    << ", byte " << at % tok_bytes << " of the row): model 0x" << std::hex << int(*it.first)
    << ", system 0x" << int(*it.second);
  return s.str();
}

/// Naive float64 attention over one KV head, independent of the reference's Eigen path, with
/// the decode's scale (nullopt: the default).
double naive_output(const ref::KvLayer& m, const std::vector<float>& q, int n_q_heads,
                    std::optional<float> decode_scale, int h, int e, std::int64_t begin,
                    std::int64_t end, std::int64_t base) {
  const Geometry& g = m.geometry();
  const int kv = h / (n_q_heads / g.n_kv_heads);
  const double scale = decode_scale.value_or(ref::default_scale(g.head_dim_k));
  std::vector<double> s;
  for (std::int64_t t = begin; t < end; ++t) {
    const auto k = m.dequantized_row(Plane::k, t - base);
    double dot = 0;
    for (int d = 0; d < g.head_dim_k; ++d)
      dot += double(q[std::size_t(h * g.head_dim_k + d)]) * k[std::size_t(kv * g.head_dim_k + d)];
    s.push_back(scale * dot);
  }
  if (s.empty()) return 0;
  const double top = *std::max_element(s.begin(), s.end());
  double num = 0, den = 0;
  for (std::int64_t t = begin; t < end; ++t) {
    const double w = std::exp(s[std::size_t(t - begin)] - top);
    num += w * m.dequantized_row(Plane::v, t - base)[std::size_t(kv * g.head_dim_v + e)];
    den += w;
  }
  return num / den;
}

}  // namespace

Sides::Sides(const Case& c, System* system, HangWatchdog* watchdog)
    : geometry_(c.geometry),
      dtype_(c.dtype),
      n_q_heads_(c.n_q_heads),
      seed_(c.seed),
      timed_(system ? std::make_unique<TimedSystem>(*system, stats_, watchdog) : nullptr),
      system_(timed_.get()),
      model_(c.geometry, c.max_verify) {}

HostRows Sides::rows(std::int64_t n, std::uint64_t seed, DataKind kind) const {
  kinds_ |= 1u << unsigned(kind);
  return make_rows(geometry_, dtype_, n, seed, kind);
}

std::vector<float> Sides::query(std::uint64_t seed) const {
  return make_query(geometry_, n_q_heads_, seed);
}

std::vector<float> Sides::queries(std::int64_t t, std::uint64_t seed) const {
  std::vector<float> q;
  Rng rng(seed);
  for (std::int64_t i = 0; i < t; ++i) {
    const std::vector<float> one = make_query(geometry_, n_q_heads_, rng.next());
    q.insert(q.end(), one.begin(), one.end());
  }
  return q;
}

void Sides::model_append_rows_dc(const HostRows& rows, bool windowed) {
  reference_append_rows_dc(model_, rows, windowed);
}

bool Sides::rows_append_writes(std::int64_t t, bool windowed) const {
  const std::int64_t len_d = model_.len_d(), phys = len_d - (windowed ? model_.base_d() : 0);
  return t >= 1 && t <= model_.max_verify() && len_d + t <= geometry_.max_ctx && phys >= 0 &&
         phys + t <= geometry_.rows();
}

std::optional<std::vector<double>> Sides::model_decode_rows(DecodeVariant variant,
                                                            const std::vector<float>& q,
                                                            std::int64_t t,
                                                            std::optional<float> scale) {
  return reference_decode_rows(model_, variant, q, n_q_heads_, int(t), scale);
}

Sides::Expectation Sides::expect_decode_rows(DecodeVariant variant, const std::vector<float>& q,
                                             std::int64_t t, std::optional<float> scale,
                                             std::optional<std::vector<double>> out) {
  const Geometry& g = geometry_;
  Expectation x{std::string(verify_variant_name(variant)), std::move(out), {}, {}};
  x.size = std::size_t(t) * std::size_t(n_q_heads_) * std::size_t(g.head_dim_v);
  if (!x.out) return x;  // a device error: nothing may be written
  const bool host = variant == DecodeVariant::host;
  const std::int64_t len = host ? model_.len() : model_.len_d();
  const std::int64_t base = host ? model_.base() : variant == DecodeVariant::dcw ? model_.base_d() : 0;
  const std::vector<ref::DecodeView> views = ref::verify_views(g, len, base, int(t));
  if (system_) {
    const Stopwatch w(stats_.seconds_in_bounds);
    const auto bounds = ref::decode_rows_bound(model_, q, n_q_heads_, scale, views,
                                               system_->verify_accumulation_shape(int(t)));
    for (const ref::DecodeBound& b : bounds) x.bound.append(b);
    return x;
  }
  // Reference only: a few elements of every row recomputed by the naive loop over the row's view.
  const std::size_t q_row = std::size_t(n_q_heads_) * std::size_t(g.head_dim_k);
  const std::size_t out_row = std::size_t(n_q_heads_) * std::size_t(g.head_dim_v);
  Rng pick(std::uint64_t(len) * 7919u + std::uint64_t(t));
  for (std::int64_t i = 0; i < t && !x.self_check; ++i) {
    const std::vector<float> qi(q.begin() + std::ptrdiff_t(i * q_row),
                                q.begin() + std::ptrdiff_t((i + 1) * q_row));
    if (auto d =
            naive_mismatch(qi, scale, views[std::size_t(i)], x.out->data() + i * out_row, pick, 2))
      x.self_check = x.name + ": reference row " + std::to_string(i) + " " + *d;
  }
  ++stats_.decodes_compared;
  return x;
}

std::optional<std::string> Sides::verify_both(DecodeVariant variant, const std::vector<float>& q,
                                              std::int64_t t, std::optional<float> scale) {
  const auto m = attempt([&] { return model_decode_rows(variant, q, t, scale); });
  if (!m.value) ++stats_.refused;
  std::optional<Expectation> x;
  if (m.value) x = expect_decode_rows(variant, q, t, scale, *m.value);
  if (x && x->self_check) return x->self_check;
  if (!system_) return std::nullopt;
  const auto out = attempt([&] { return system_->decode_rows(variant, q, int(t), scale); });
  if (auto d = compare_refusal(m, out)) return d;
  if (x) return check_decode(*x, *out.value);
  return std::nullopt;
}

std::optional<std::string> Sides::naive_mismatch(const std::vector<float>& q,
                                                 std::optional<float> scale,
                                                 const ref::DecodeView& view, const double* out,
                                                 Rng& pick, int count) const {
  const Geometry& g = geometry_;
  for (int i = 0; i < count; ++i) {
    const int h = int(pick.range(0, n_q_heads_ - 1)), e = int(pick.range(0, g.head_dim_v - 1));
    const double want =
        naive_output(model_, q, n_q_heads_, scale, h, e, view.begin, view.end, view.base);
    const double got = out[std::size_t(h * g.head_dim_v + e)];
    const double tol = 1e-12 * (1.0 + std::fabs(want)) * double(view.end - view.begin + 1);
    if (!(std::fabs(want - got) <= tol) && !(std::isnan(want) && std::isnan(got)))
      return "output [" + std::to_string(h) + "," + std::to_string(e) + "] = " +
             std::to_string(got) + " but the naive float64 loop gives " + std::to_string(want);
  }
  return std::nullopt;
}

void Sides::model_append_dc(const HostRows& row, bool windowed) {
  if (windowed)
    model_.append_dcw(view_of(row));
  else
    model_.append_dc(view_of(row));
}

std::optional<std::vector<double>> Sides::model_decode(DecodeVariant variant,
                                                       const std::vector<float>& q,
                                                       std::optional<float> scale) {
  return reference_decode(model_, variant, q, n_q_heads_, scale);
}

bool Sides::dc_append_writes(bool windowed) const {
  // SPEC §7: a device-counter append writes only inside the plane and below max_ctx.
  const std::int64_t len_d = model_.len_d(), phys = len_d - (windowed ? model_.base_d() : 0);
  return len_d < geometry_.max_ctx && phys >= 0 && phys < geometry_.rows();
}

void Sides::remember_rows(const HostRows& rows, std::int64_t first) {
  const Geometry& g = geometry_;
  for (std::int64_t r = 0; r < rows.n; ++r) {
    std::vector<std::uint8_t> k(std::size_t(g.k_tok_bytes())), v(std::size_t(g.v_tok_bytes()));
    ref::quantize_row(ref::BlockType::q8_0,
                      std::span<const float>(rows.k.data() + r * g.kv_dim_k(), std::size_t(g.kv_dim_k())), k);
    ref::quantize_row(ref::BlockType::q5_1,
                      std::span<const float>(rows.v.data() + r * g.kv_dim_v(), std::size_t(g.kv_dim_v())), v);
    shadow_[first + r] = {std::move(k), std::move(v)};
  }
}

std::optional<std::string> Sides::check_model_invariants() {
  const Geometry& g = geometry_;
  const std::int64_t len = model_.len(), base = model_.base();
  std::ostringstream s;
  if (base % kRingAlign != 0) s << "base " << base << " is not a multiple of " << kRingAlign;
  else if (base < last_base_) s << "base decreased from " << last_base_ << " to " << base;
  else if (base > len) s << "base " << base << " > len " << len;
  else if (len - base > g.rows()) s << "len " << len << " − base " << base << " > rows " << g.rows();
  else if (model_.base_d() != base) s << "base_d " << model_.base_d() << " != base " << base;
  if (!s.str().empty()) return "model invariant broken: " + s.str();
  // Every live logical row still holds the bytes it was written with, where SPEC §6 maps it.
  // Rows a device-counter append wrote at len_d ≥ len are live until accounted for, unless a
  // rebase ran in between: it moves only [retain, len) (the host's rows).
  const std::int64_t live_end = base > last_base_ ? len : std::max(len, model_.len_d());
  if (base > last_base_) ++stats_.rebases;
  if (base - last_base_ > kRingAlign) ++stats_.coverage.rebases_over_one_unit;
  last_base_ = base;
  shadow_.erase(shadow_.begin(), shadow_.lower_bound(base));
  shadow_.erase(shadow_.lower_bound(live_end), shadow_.end());
  for (const auto& [row, bytes] : shadow_) {
    const std::int64_t p = row - base;
    if (p >= g.rows()) continue;  // only reachable past a device overrun, which wrote nothing
    if (!std::equal(bytes.first.begin(), bytes.first.end(),
                    model_.k_plane().begin() + p * g.k_tok_bytes()) ||
        !std::equal(bytes.second.begin(), bytes.second.end(),
                    model_.v_plane().begin() + p * g.v_tok_bytes()))
      return "model lost logical row " + std::to_string(row) + " (expected at physical row " +
             std::to_string(p) + ")";
  }
  return std::nullopt;
}

std::optional<std::string> Sides::check_replays(const char* unit,
                                                const std::vector<Expectation>& expected,
                                                const std::vector<std::vector<float>>& outputs,
                                                const std::vector<std::vector<float>>& eager) {
  const std::string units = std::string(unit) + "s";
  if (outputs.size() != expected.size())
    return "chain returned " + std::to_string(outputs.size()) + " outputs for " +
           std::to_string(expected.size()) + " " + units;
  if (!eager.empty() && eager.size() != outputs.size())
    return "chain ran " + std::to_string(eager.size()) + " eager calls for " +
           std::to_string(outputs.size()) + " " + units;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    std::optional<std::string> d = check_decode(expected[i], outputs[i]);
    if (!d && !eager.empty() && eager[i].size() != outputs[i].size())
      d = expected[i].name + " eager output has " + std::to_string(eager[i].size()) +
          " values, the replay " + std::to_string(outputs[i].size());
    for (std::size_t e = 0; !d && !eager.empty() && e < outputs[i].size(); ++e)
      if (std::bit_cast<std::uint32_t>(outputs[i][e]) != std::bit_cast<std::uint32_t>(eager[i][e]))
        d = expected[i].name + " output element " + std::to_string(e) + ": replayed " +
            std::to_string(outputs[i][e]) + " but eager " + std::to_string(eager[i][e]) +
            " on the same state (must be bit-identical)";
    if (d) return std::string(unit) + " " + std::to_string(i) + ": " + *d;
  }
  return std::nullopt;
}

std::optional<std::string> Sides::compare_state() {
  if (auto broken = check_model_invariants()) return broken;
  if (!system_) return std::nullopt;
  const Snapshot s = system_->snapshot();
  const Geometry& g = geometry_;
  std::string d = first_byte_difference(model_.k_plane(), s.k_plane, g.k_tok_bytes(), "K");
  if (d.empty()) d = first_byte_difference(model_.v_plane(), s.v_plane, g.v_tok_bytes(), "V");
  if (!d.empty()) return d;
  for (const auto* tail : {&s.k_tail, &s.v_tail})
    for (std::size_t i = 0; i < tail->size(); ++i)
      if ((*tail)[i] != 0)
        return std::string(tail == &s.k_tail ? "K" : "V") + " plane tail byte " +
               std::to_string(i) + " past the last row is " + std::to_string((*tail)[i]) +
               " (must stay 0)";
  stats_.bytes_compared += std::int64_t(s.k_plane.size() + s.v_plane.size() + s.k_tail.size() +
                                        s.v_tail.size());
  std::ostringstream c;
  if (s.len != model_.len()) c << " len " << s.len << " (model " << model_.len() << ")";
  if (s.len_d != model_.len_d()) c << " len_d " << s.len_d << " (model " << model_.len_d() << ")";
  if (s.base != model_.base()) c << " base " << s.base << " (model " << model_.base() << ")";
  if (s.base_d != model_.base_d()) c << " base_d " << s.base_d << " (model " << model_.base_d() << ")";
  if (!c.str().empty()) return "counters differ:" + c.str();
  if (!(s.status == model_.status()))
    return "status differs:\n  model:  " + model_.status().message() + "\n  system: " +
           s.status.message();
  return std::nullopt;
}

namespace {

bool same_geometry(const Geometry& a, const Geometry& b) {
  return a.n_kv_heads == b.n_kv_heads && a.head_dim_k == b.head_dim_k &&
         a.head_dim_v == b.head_dim_v && a.max_ctx == b.max_ctx && a.window == b.window &&
         a.storage == b.storage && a.max_append == b.max_append && a.rewind_slack == b.rewind_slack;
}

/// The first byte where two snapshots' K (or V) bytes differ, named by logical row; empty when
/// equal.
std::string snapshot_byte_difference(const std::vector<std::uint8_t>& model,
                                     const std::vector<std::uint8_t>& system, std::int64_t first,
                                     std::int64_t tok_bytes, const char* plane) {
  if (model.size() != system.size())
    return std::string("snapshot ") + plane + " sizes differ: model " +
           std::to_string(model.size()) + " bytes, system " + std::to_string(system.size());
  const auto it = std::mismatch(model.begin(), model.end(), system.begin());
  if (it.first == model.end()) return {};
  const auto at = std::int64_t(it.first - model.begin());
  std::ostringstream s;
  s << "snapshot " << plane << " bytes differ at byte " << at << " (logical row "
    << first + at / tok_bytes << ", byte " << at % tok_bytes << " of the row): model 0x" << std::hex
    << int(*it.first) << ", system 0x" << int(*it.second);
  return s.str();
}

}  // namespace

Sides::Snapshots Sides::take_snapshots() {
  Snapshots r;
  r.diff =
      both([&] { r.model = model_.snapshot(); }, [&] { r.system = system_->take_snapshot(); }).diff;
  if (r.diff || !r.model) return r;
  const kvlayer::Snapshot& m = *r.model;
  const Geometry& g = geometry_;
  // The model's snapshot: the restore plan's rows, as they were written.
  std::ostringstream c;
  if (!same_geometry(m.geometry, g)) c << " geometry '" << m.geometry.describe() << "'";
  if (m.len != model_.len()) c << " len " << m.len << " (layer " << model_.len() << ")";
  if (m.first != snapshot_first(g, model_.len()))
    c << " first " << m.first << " (the plan's " << snapshot_first(g, model_.len()) << ")";
  if (m.base != model_.base()) c << " base " << m.base << " (layer " << model_.base() << ")";
  if (std::int64_t(m.k.size()) != m.rows() * g.k_tok_bytes() ||
      std::int64_t(m.v.size()) != m.rows() * g.v_tok_bytes())
    c << " " << m.k.size() << " K and " << m.v.size() << " V bytes for " << m.rows() << " rows";
  if (!c.str().empty()) {
    r.diff = "model snapshot:" + c.str();
    return r;
  }
  for (auto it = shadow_.lower_bound(m.first); it != shadow_.end() && it->first < m.len; ++it) {
    const std::size_t i = std::size_t(it->first - m.first);
    if (!std::equal(it->second.first.begin(), it->second.first.end(),
                    m.k.begin() + std::ptrdiff_t(i * std::size_t(g.k_tok_bytes()))) ||
        !std::equal(it->second.second.begin(), it->second.second.end(),
                    m.v.begin() + std::ptrdiff_t(i * std::size_t(g.v_tok_bytes())))) {
      r.diff = "model snapshot: logical row " + std::to_string(it->first) +
               " does not hold the bytes it was written with";
      return r;
    }
  }
  if (!r.system) return r;
  const kvlayer::Snapshot& s = *r.system;
  std::ostringstream d;
  if (!same_geometry(s.geometry, m.geometry))
    d << " geometry '" << s.geometry.describe() << "' (model '" << m.geometry.describe() << "')";
  if (s.len != m.len) d << " len " << s.len << " (model " << m.len << ")";
  if (s.first != m.first) d << " first " << s.first << " (model " << m.first << ")";
  if (s.base != m.base) d << " base " << s.base << " (model " << m.base << ")";
  if (!d.str().empty()) {
    r.diff = "snapshots differ:" + d.str();
    return r;
  }
  std::string b = snapshot_byte_difference(m.k, s.k, m.first, g.k_tok_bytes(), "K");
  if (b.empty()) b = snapshot_byte_difference(m.v, s.v, m.first, g.v_tok_bytes(), "V");
  if (!b.empty()) r.diff = b;
  return r;
}

Sides::Outcome Sides::restore(const Snapshots& s, bool into_current) {
  const kvlayer::Snapshot& m = s.model.value();
  const auto o = both(
      [&] {
        if (into_current) return model_.restore(m);
        ref::KvLayer fresh(geometry_, model_.max_verify());
        fresh.restore(m);
        model_ = std::move(fresh);
      },
      [&] {
        into_current ? system_->restore(s.system.value())
                     : system_->restore_into_fresh(s.system.value());
      });
  if (!o.accepted) return o;
  if (!into_current) {
    ++stats_.restores;
    if (m.first > m.base) ++stats_.restores_past_base;
  }
  // The restored layer holds the snapshot's rows [first, len) and zeros elsewhere. Its base
  // (first on a ring) is no rebase: the invariants go on from it.
  shadow_.erase(shadow_.begin(), shadow_.lower_bound(m.first));
  forget_rows_from(m.len);
  last_base_ = model_.base();
  return o;
}

Sides::Expectation Sides::expect_decode(DecodeVariant variant, const std::vector<float>& q,
                                        std::optional<float> scale,
                                        std::optional<std::vector<double>> out) {
  const Geometry& g = geometry_;
  Expectation x{decode_variant_name(variant), std::move(out), {}, {}};
  x.size = std::size_t(n_q_heads_) * std::size_t(g.head_dim_v);
  if (!x.out) return x;  // a device error: nothing may be written
  ref::DecodeView view;
  if (variant == DecodeVariant::host) {
    const auto [b, e] = model_.view();
    view = {b, e, model_.base()};
  } else if (variant == DecodeVariant::dc) {
    view = {0, model_.len_d(), 0};
  } else {
    view = {std::max<std::int64_t>(0, model_.len_d() - *g.window), model_.len_d(), model_.base_d()};
  }
  if (system_) {
    const Stopwatch w(stats_.seconds_in_bounds);
    x.bound =
        ref::decode_bound(model_, q, n_q_heads_, scale, view, system_->accumulation_shape(variant));
    return x;
  }
  // Reference only: recompute a few elements with an independent naive loop.
  Rng pick(std::uint64_t(view.end) * 7919u + std::uint64_t(view.begin));
  if (auto d = naive_mismatch(q, scale, view, x.out->data(), pick, 4))
    x.self_check = x.name + ": reference " + *d;
  ++stats_.decodes_compared;
  return x;
}

std::optional<std::string> Sides::check_decode(const Expectation& x,
                                               const std::vector<float>& actual) {
  const Geometry& g = geometry_;
  if (actual.size() != x.size)
    return x.name + " output has " + std::to_string(actual.size()) + " values, expected " +
           std::to_string(x.size);
  if (!x.out) {  // the model recorded a device error: the system must have written nothing
    for (std::size_t i = 0; i < actual.size(); ++i)
      if (std::bit_cast<std::uint32_t>(actual[i]) != kPoisonBits)
        return x.name + " wrote output element " + std::to_string(i) +
               " although the model recorded a device error";
    return std::nullopt;
  }
  // The statistics' unit is an output row (a verify's row is the decode of its own view): each
  // row alone, then into the totals.
  const std::size_t row_values = std::size_t(n_q_heads_) * std::size_t(g.head_dim_v);
  const std::size_t rows = x.out->size() / row_values;
  ref::SystematicCheck launch;
  // Closes a row: into the report, and a failure when the declared check alarms.
  const auto end_row = [&](std::size_t row) -> std::optional<std::string> {
    const double energy = launch.current_energy();
    std::optional<std::string> alarm;
    if (energy >= ref::SystematicCheck::kNoiseThreshold || energy > stats_.worst_energy) {
      std::ostringstream s;
      s << std::setprecision(9) << x.name << " row " << row << " of " << rows << " of case seed "
        << seed_ << " (" << g.n_kv_heads << " x " << g.head_dim_k << ", gqa "
        << n_q_heads_ / g.n_kv_heads << ", data";
      for (unsigned k = 0; k <= unsigned(kLastDataKind); ++k)
        if (kinds_ >> k & 1u) s << " " << data_kind_name(DataKind(k));
      // Its element farthest from the noise model's expected value, in sigmas.
      std::size_t at = 0;
      double far = -1;
      for (std::size_t i = row * row_values; i < (row + 1) * row_values; ++i)
        if (x.bound.sigma[i] > 0 && std::isfinite(actual[i]) &&
            std::fabs(actual[i] - x.bound.expected[i]) / x.bound.sigma[i] > far) {
          far = std::fabs(actual[i] - x.bound.expected[i]) / x.bound.sigma[i];
          at = i;
        }
      if (far >= 0)
        s << "; element " << at << ": system " << actual[at] << ", expected "
          << x.bound.expected[at] << ", sigma " << x.bound.sigma[at] << ", o~ "
          << x.bound.rounded[at] << ", bound " << x.bound.bound[at] << ", max |V| "
          << x.bound.max_abs_v[at];
      s << ")";
      if (energy >= ref::SystematicCheck::kNoiseThreshold) {
        std::ostringstream a;
        a << "the declared statistical check (kvlayer/accuracy.hpp, noise model) failed: energy "
          << energy << " >= " << ref::SystematicCheck::kNoiseThreshold << " in " << s.str();
        alarm = a.str();
      }
      if (energy > stats_.worst_energy) {
        stats_.worst_energy = energy;
        stats_.worst_energy_at = s.str();
      }
    }
    launch.end_launch();
    return alarm;
  };
  for (std::size_t i = 0; i < x.out->size(); ++i) {
    if (i > 0 && i % row_values == 0)
      if (auto alarm = end_row(i / row_values - 1)) return alarm;
    const double want = (*x.out)[i], got = actual[i];
    // Written only for a difference: formatting every element costs more than comparing it.
    const auto element = [&] {
      std::ostringstream s;
      s << x.name << " output [head " << i / std::size_t(g.head_dim_v) << ", "
        << i % std::size_t(g.head_dim_v) << "]: system " << got << ", reference " << want;
      return s.str();
    };
    if (std::isnan(want)) {
      if (!std::isnan(got))
        return element() + " (the reference attended a bad block: NaN expected)";
      stats_.tightness.skip();
      continue;
    }
    if (!std::isfinite(got)) return element() + " (not finite)";
    const double err = std::fabs(got - want);
    if (err > x.bound.bound[i]) {
      std::ostringstream s;
      s << element() << ", error " << err << " exceeds the derived bound " << x.bound.bound[i];
      return s.str();
    }
    const double ratio = x.bound.bound[i] > 0 ? err / x.bound.bound[i] : 0;
    if (ratio > stats_.worst_error_ratio) {
      stats_.worst_error_ratio = ratio;
      stats_.worst_error = err;
      stats_.worst_bound = x.bound.bound[i];
    }
    stats_.tightness.record(got, x.bound, i);
    launch.record(got, want, x.bound, i);
  }
  if (auto alarm = end_row(rows - 1)) return alarm;
  stats_.systematic.add(launch);
  stats_
      .systematic_by_path[std::string(rows > 1 ? "verify" : "decode") + " d" +
                          std::to_string(g.head_dim_k)]
      .add(launch);
  ++stats_.decodes_compared;
  return std::nullopt;
}

Executor::Executor(const Case& c, System* system, HangWatchdog* watchdog)
    : case_(c), sides_(std::make_unique<Sides>(c, system, watchdog)) {}

Executor::~Executor() = default;

const ref::KvLayer& Executor::model() const {
  return sides_->model();
}

const Stats& Executor::stats() const {
  return sides_->stats();
}

std::optional<std::string> Executor::step(const Command& command) {
  const Stopwatch whole(sides_->stats().seconds_in_commands);
  executed_.push_back(command);
  ++sides_->stats().commands[kind_name(command)];
  const auto diff = std::visit([&](const auto& c) { return c.run(*sides_); }, command);
  if (diff) return describe(command) + ": " + *diff;
  if (auto d = sides_->compare_state()) return "after " + describe(command) + ": " + *d;
  return std::nullopt;
}

std::optional<Mismatch> Executor::run_all() {
  for (std::size_t i = 0; i < case_.commands.size(); ++i)
    if (auto d = step(case_.commands[i])) return Mismatch{i, *d};
  return std::nullopt;
}

}  // namespace kvlayer::harness
