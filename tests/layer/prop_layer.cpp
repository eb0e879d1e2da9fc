// State-machine properties of the reference KvLayer (SPEC §5–7, §9, §10.4–5), with rapidcheck:
// the system is ref::KvLayer, the model is kvlayer::testing::Shadow (testbed.hpp), an independent
// re-derivation of SPEC.md. Random geometries (flat, windowed flat, ring; odd windows; tiny
// capacities) and random command sequences: appends in every dtype (some with NaN), rewinds
// (shallow and to the very limit), reserves, device-counter chains with and without reserve()
// (overruns included), host decodes, status clears and, in the second property, illegal requests.
//
// After every command: every plane byte and counter equals the model's; SPEC §10.5 (base a
// multiple of 32, never decreasing, base ≤ len, len − base ≤ rows); every logical row the
// model remembers reads back (dequantized_row at physical_rows(row, row + 1)) as the
// quantization of the values written there. After a legal rewind to p, the next append and its
// decode (host and device-counter) stay inside the resident rows.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

using std::int64_t;
using std::to_string;

/// The model: the independent layer model plus the query shape of this case.
struct Model {
  Shadow s;
  int n_q_heads = 1;
};
using Sut = KvLayer;
using Cmd = rc::state::Command<Model, Sut>;

// ---- helpers -------------------------------------------------------------------------------

/// n rows from a seed: exact16 values when the append goes through a 16-bit dtype (so the model
/// can hold the same f32 values), realistic values otherwise; optionally a NaN at `bad_at`
/// (an element index over K then V of all rows).
HostRows rows_for(const Geometry& g, int64_t n, std::uint64_t seed, bool exact,
                  int64_t bad_at = -1) {
  Rng rng(seed);
  HostRows r = random_rows(g, n, rng, exact ? Values::exact16 : Values::varied);
  if (bad_at >= 0) {
    if (bad_at < int64_t(r.k.size()))
      r.k[std::size_t(bad_at)] = NAN;
    else
      r.v[std::size_t(bad_at - int64_t(r.k.size())) % r.v.size()] = NAN;
  }
  return r;
}

std::vector<float> random_q(const Model& m, std::uint64_t seed) {
  Rng rng(seed);
  return random_query(m.s.geometry(), m.n_q_heads, rng);
}

/// Bit patterns of floats, so NaN (from a canonical bad block) compares equal to itself.
std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

/// What row values dequantize to after quantization (SPEC §3–4), computed from the values.
std::vector<float> roundtrip(Plane p, const std::vector<float>& x) {
  const BlockType t = p == Plane::k ? BlockType::q8_0 : BlockType::q5_1;
  std::vector<std::uint8_t> bytes(x.size() / 32 * std::size_t(kvlayer::ref::block_bytes(t)));
  (void)kvlayer::ref::quantize_row(t, x, bytes);
  std::vector<float> out(x.size());
  kvlayer::ref::dequantize_row(t, bytes, out);
  return out;
}

/// The checks made after every command (see the file comment).
void verify(const Model& m, const KvLayer& sut, int64_t base_before) {
  RC_ASSERT(state_diff(m.s, sut) == std::string());
  if (sut.geometry().is_ring()) RC_ASSERT(ring_invariants(sut, base_before) == std::string());
  RC_ASSERT(sut.base() <= sut.len());
  RC_ASSERT(sut.len() <= sut.geometry().max_ctx);
  for (const auto& [row, vals] : m.s.written()) {
    if (row < sut.base() || row >= sut.len()) continue;
    const int64_t phys = sut.physical_rows(row, row + 1).first;
    RC_ASSERT(bits(sut.dequantized_row(Plane::k, phys)) == bits(roundtrip(Plane::k, vals.first)));
    RC_ASSERT(bits(sut.dequantized_row(Plane::v, phys)) == bits(roundtrip(Plane::v, vals.second)));
  }
}

/// Decode outputs against the float64 oracle over the model's rows.
void check_decode(const Model& m, const std::vector<float>& q, std::optional<float> scale,
                  std::pair<int64_t, int64_t> view, bool device, const std::vector<double>& got) {
  const Geometry& g = m.s.geometry();
  const auto want =
      oracle_decode(g, q, m.n_q_heads, scale.value_or(default_scale(g)), view.first, view.second,
                    [&](Plane p, int64_t t) { return m.s.dequantized(p, t, device); });
  // A canonical bad block in the view makes NaN in both; compare_outputs treats NaN as a
  // mismatch, so compare the NaN pattern separately.
  bool nan = false;
  for (double x : want) nan |= std::isnan(x);
  if (nan) {
    RC_ASSERT(want.size() == got.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      RC_ASSERT(std::isnan(want[i]) == std::isnan(got[i]));
    return;
  }
  RC_ASSERT(compare_outputs(want, got) == std::string());
}

/// Runs f against the reference: it must be refused with exactly `message`, state unchanged.
template <typename F>
void assert_refused(const KvLayer& sut, F&& f, const std::string& message) {
  RC_ASSERT(check_refused_unchanged(sut, std::forward<F>(f), message) == std::string());
}

// ---- legal commands -------------------------------------------------------------------------

struct Append : Cmd {
  int64_t n;
  DType dtype;
  std::uint64_t seed;
  int64_t bad_at = -1;

  explicit Append(const Model& m) {
    const Geometry& g = m.s.geometry();
    // Mostly step-sized appends; sometimes prefill-sized ones (larger than max_append is legal
    // whenever it fits, SPEC §6).
    const int64_t small = g.is_ring() ? 2 * g.max_append : 8;
    n = *rc::gen::weightedOneOf<int64_t>({{4, rc::gen::inRange<int64_t>(1, small + 1)},
                                          {1, rc::gen::inRange<int64_t>(1, 2 * small + 40)}});
    dtype = *rc::gen::element(DType::f32, DType::f32, DType::f16, DType::bf16);
    seed = *rc::gen::arbitrary<std::uint64_t>();
    if (*rc::gen::inRange(0, 12) == 0)
      bad_at = *rc::gen::inRange<int64_t>(0, n * (g.kv_dim_k() + g.kv_dim_v()));
  }
  HostRows rows(const Model& m) const {
    return rows_for(m.s.geometry(), n, seed, dtype != DType::f32, bad_at);
  }
  void checkPreconditions(const Model& m) const override {
    RC_PRE(m.s.plan(n).fits);
    RC_PRE(m.s.len_d() == m.s.len());
  }
  void apply(Model& m) const override { m.s.append(rows(m)); }
  void run(const Model& m, Sut& sut) const override {
    Model next = m;
    apply(next);
    const HostRows r = rows(m);
    if (dtype == DType::f32) {
      sut.append(r.f32_view());
    } else {
      sut.append(with_dtype(r, dtype).view());
    }
    verify(next, sut, m.s.base());
  }
  void show(std::ostream& os) const override {
    os << "append(n=" << n << ", " << kvlayer::dtype_name(dtype) << ", seed=" << seed;
    if (bad_at >= 0) os << ", NaN at element " << bad_at;
    os << ")";
  }
};

/// An append that brings the plane to exactly full, or one or two rows short of it: the
/// boundary where the next append must rebase (SPEC §6).
struct Fill : Append {
  explicit Fill(const Model& m) : Append(m) {
    const Shadow& s = m.s;
    n = std::max<int64_t>(1, s.rows() - (s.len() - s.base()) - *rc::gen::inRange<int64_t>(0, 3));
    n = std::min(n, std::max<int64_t>(1, s.geometry().max_ctx - s.len()));
    if (bad_at >= 0) bad_at %= n * (s.geometry().kv_dim_k() + s.geometry().kv_dim_v());
  }
  void show(std::ostream& os) const override {
    os << "fill: ";
    Append::show(os);
  }
};

struct Rewind : Cmd {
  int64_t p;
  std::uint64_t seed;

  explicit Rewind(const Model& m) {
    const Geometry& g = m.s.geometry();
    const int64_t len = m.s.len();
    switch (*rc::gen::inRange(0, 4)) {
      case 0:  // the very limit of can_rewind_to (with base 0 every p ≥ 0 is legal: go shallow)
        p = m.s.base() == 0 ? len - *rc::gen::inRange<int64_t>(0, 12) : m.s.base() + *g.window - 1;
        break;
      case 1:
        p = len;
        break;
      default:
        p = len - *rc::gen::inRange<int64_t>(0, 12);
        break;
    }
    seed = *rc::gen::arbitrary<std::uint64_t>();
  }
  void checkPreconditions(const Model& m) const override {
    RC_PRE(m.s.can_rewind_to(p));
    RC_PRE(m.s.len_d() == m.s.len());
  }
  void apply(Model& m) const override { m.s.rewind(p); }
  void run(const Model& m, Sut& sut) const override {
    Model next = m;
    apply(next);
    RC_ASSERT(sut.can_rewind_to(p));
    if (next.s.geometry().is_ring() && m.s.base() > 0)
      RC_ASSERT(!sut.can_rewind_to(m.s.base() + *m.s.geometry().window - 2));
    sut.rewind(p);
    verify(next, sut, m.s.base());
    // SPEC §10.5: the next append + decode stay inside the resident rows, for a host step and
    // for a reserved device-counter step. Tried on copies; the sequence goes on unchanged.
    if (p >= m.s.geometry().max_ctx) return;
    const HostRows r = rows_for(m.s.geometry(), 1, seed, false);
    const auto q = random_q(m, seed);
    {
      Model host = next;
      KvLayer l = sut;
      RC_ASSERT(host.s.plan(1).fits);
      l.append(r.f32_view());
      host.s.append(r);
      RC_ASSERT(host.s.can_decode());
      const auto v = l.view();
      RC_ASSERT(l.physical_rows(v.first, v.second).second <= l.rows());
      check_decode(host, q, std::nullopt, host.s.view(), false, l.decode(q, m.n_q_heads));
    }
    {
      Model dev = next;
      KvLayer l = sut;
      l.clear_status();  // errors recorded earlier stick; this step must not add one
      dev.s.clear_status();
      l.reserve(1);
      dev.s.reserve(1);
      const bool win = dev.s.geometry().window.has_value();
      if (win) {
        l.append_dcw(r.f32_view());
      } else {
        l.append_dc(r.f32_view());
      }
      dev.s.append_device(r, win);
      l.inc_seqlen();
      dev.s.inc_seqlen();
      const auto out = win ? l.decode_dcw(q, m.n_q_heads) : l.decode_dc(q, m.n_q_heads);
      const auto view = dev.s.device_view(win);
      RC_ASSERT(out.has_value());
      RC_ASSERT(view.has_value());
      RC_ASSERT(l.status().device_error == std::nullopt);
      check_decode(dev, q, std::nullopt, *view, true, *out);
    }
  }
  void show(std::ostream& os) const override { os << "rewind(" << p << ")"; }
};

struct Reserve : Cmd {
  int64_t k;
  explicit Reserve(const Model& m) {
    k = *rc::gen::inRange<int64_t>(0, m.s.geometry().max_append + 3);
  }
  void checkPreconditions(const Model& m) const override {
    RC_PRE(k == 0 || m.s.can_reserve(k));
    RC_PRE(m.s.len_d() == m.s.len());
  }
  void apply(Model& m) const override {
    if (k > 0) m.s.reserve(k);
  }
  void run(const Model& m, Sut& sut) const override {
    Model next = m;
    apply(next);
    sut.reserve(k);
    verify(next, sut, m.s.base());
  }
  void show(std::ostream& os) const override { os << "reserve(" << k << ")"; }
};

/// k device-counter steps (append_dc or append_dcw at the slot, inc_seqlen, decode_dc or
/// decode_dcw), then the host's account_steps(k): with reserve(k) first (the legal chain) or
/// without it (an overrun the layer must record, not execute). A refused account_steps is
/// followed by the host's recovery: rewind(len) to bring len_d back to len.
struct DeviceChain : Cmd {
  int64_t k;
  bool reserve_first, use_dcw;
  std::uint64_t seed;

  explicit DeviceChain(const Model& m) {
    k = *rc::gen::inRange<int64_t>(1, m.s.geometry().max_append + 4);
    reserve_first = *rc::gen::element(true, true, true, false);
    use_dcw = *rc::gen::arbitrary<bool>();
    seed = *rc::gen::arbitrary<std::uint64_t>();
  }
  void checkPreconditions(const Model& m) const override {
    RC_PRE(m.s.len_d() == m.s.len());
    if (reserve_first) RC_PRE(m.s.can_reserve(k));
  }
  bool dcw(const Model& m) const { return m.s.geometry().is_ring() || use_dcw; }

  /// Runs the chain on the model and, when sut is given, on the reference with checks.
  void exec(Model& m, KvLayer* sut) const {
    const Geometry& g = m.s.geometry();
    const int64_t base_before = m.s.base();
    const bool win = g.window.has_value();
    if (reserve_first) {
      m.s.reserve(k);
      if (sut) sut->reserve(k);
    }
    for (int64_t i = 0; i < k; ++i) {
      const HostRows r = rows_for(g, 1, seed + std::uint64_t(i), false);
      m.s.append_device(r, dcw(m));
      m.s.inc_seqlen();
      const auto view = m.s.device_view(win);
      if (!sut) continue;
      if (dcw(m)) {
        sut->append_dcw(r.f32_view());
      } else {
        sut->append_dc(r.f32_view());
      }
      sut->inc_seqlen();
      const auto q = random_q(m, seed ^ std::uint64_t(i + 1));
      const auto out = win ? sut->decode_dcw(q, m.n_q_heads) : sut->decode_dc(q, m.n_q_heads);
      RC_ASSERT(out.has_value() == view.has_value());
      if (out) check_decode(m, q, std::nullopt, *view, true, *out);
      RC_ASSERT(state_diff(m.s, *sut) == std::string());
    }
    if (m.s.can_account(k)) {
      m.s.account_steps(k);
      if (sut) sut->account_steps(k);
    } else {
      if (sut) {
        const int64_t len = m.s.len(), over_ctx = len + k > g.max_ctx;
        assert_refused(
            *sut, [&] { sut->account_steps(k); },
            over_ctx ? "account_steps: len " + to_string(len) + " + k " + to_string(k) +
                           " is outside [len, max_ctx " + to_string(g.max_ctx) + "]"
                     : "account_steps: len " + to_string(len) + " + k " + to_string(k) +
                           " - base " + to_string(m.s.base()) + " exceeds rows " +
                           to_string(m.s.rows()) + " (more steps than reserve() made room for)");
        sut->rewind(len);
      }
      m.s.rewind(m.s.len());
    }
    if (sut) verify(m, *sut, base_before);
  }
  void apply(Model& m) const override { exec(m, nullptr); }
  void run(const Model& m, Sut& sut) const override {
    Model next = m;
    exec(next, &sut);
  }
  void show(std::ostream& os) const override {
    os << "device_chain(k=" << k << (reserve_first ? ", reserve first" : ", no reserve")
       << (use_dcw ? ", dcw" : "") << ", seed=" << seed << ")";
  }
};

struct HostDecode : Cmd {
  std::uint64_t seed;
  std::optional<float> scale;
  explicit HostDecode(const Model&) {
    seed = *rc::gen::arbitrary<std::uint64_t>();
    if (*rc::gen::arbitrary<bool>()) scale = float(*rc::gen::inRange(-20, 21)) / 8.0f;
  }
  void apply(Model&) const override {}
  void run(const Model& m, Sut& sut) const override {
    const auto q = random_q(m, seed);
    if (m.s.can_decode()) {
      check_decode(m, q, scale, m.s.view(), false, sut.decode(q, m.n_q_heads, scale));
    } else {
      assert_refused(
          sut, [&] { (void)sut.decode(q, m.n_q_heads, scale); },
          "decode: the view starts at logical row " + to_string(m.s.view().first) +
              ", below base " + to_string(m.s.base()) +
              " (not resident; append before decoding after a rewind this deep)");
    }
    verify(m, sut, m.s.base());
  }
  void show(std::ostream& os) const override {
    os << "decode(seed=" << seed;
    if (scale) os << ", scale=" << *scale;
    os << ")";
  }
};

struct ClearStatus : Cmd {
  explicit ClearStatus(const Model&) {}
  void apply(Model& m) const override { m.s.clear_status(); }
  void run(const Model& m, Sut& sut) const override {
    Model next = m;
    apply(next);
    sut.clear_status();
    verify(next, sut, m.s.base());
  }
  void show(std::ostream& os) const override { os << "clear_status()"; }
};

// ---- illegal requests ---------------------------------------------------------------------------

/// One refused request of SPEC §9, chosen against the current state, with the exact message the
/// reference gives. The state must be unchanged afterwards.
struct Illegal : Cmd {
  int kind;
  int64_t extra;  ///< how far past the limit
  int which;      ///< sub-choice (operation, side)

  static constexpr int kKinds = 15;
  explicit Illegal(const Model&) {
    kind = *rc::gen::inRange(0, kKinds);
    extra = *rc::gen::inRange<int64_t>(0, 5);
    which = *rc::gen::inRange(0, 3);
  }

  /// The request and its message, or nullopt when this kind does not apply to the state.
  std::optional<std::pair<std::function<void(KvLayer&)>, std::string>> request(
      const Model& m) const {
    using R = std::pair<std::function<void(KvLayer&)>, std::string>;
    const Shadow& s = m.s;
    const Geometry& g = s.geometry();
    const int64_t len = s.len(), base = s.base(), rows = s.rows(), ctx = g.max_ctx;
    const bool ring = g.is_ring();
    const auto rows_n = [&g](int64_t n) {
      return std::make_shared<HostRows>(rows_for(g, n, 7, false));
    };
    const char* dec_ops[] = {"decode", "decode_dc", "decode_dcw"};
    const std::string dec = dec_ops[which];
    const auto decode_call = [dec](std::vector<float> q, int heads) {
      return [dec, q, heads](KvLayer& l) {
        if (dec == "decode") (void)l.decode(q, heads);
        if (dec == "decode_dc") (void)l.decode_dc(q, heads);
        if (dec == "decode_dcw") (void)l.decode_dcw(q, heads);
      };
    };
    switch (kind) {
      case 0: {
        auto r = rows_n(1);
        return R{[r](KvLayer& l) {
                   l.append({r->k.data(), r->v.data(), 0, DType::f32});
                 },
                 "append: n 0 must be at least 1"};
      }
      case 1: {
        const int64_t n = ctx - len + 1 + extra;
        auto r = rows_n(n);
        return R{[r](KvLayer& l) { l.append(r->f32_view()); },
                 "append: len " + to_string(len) + " + n " + to_string(n) + " exceeds max_ctx " +
                     to_string(ctx)};
      }
      case 2:
      case 3: {  // a ring append (or reserve) that cannot fit after the rebase
        if (!ring) return std::nullopt;
        const int64_t retain = std::max(
            base, Shadow::align_down(std::max<int64_t>(0, len - (*g.window - 1) - g.rewind_slack)));
        const int64_t keep = len - retain, n = rows - keep + 1 + extra;
        if (len + n > ctx) return std::nullopt;
        const std::string op = kind == 2 ? "append" : "reserve";
        auto r = rows_n(n);
        return R{[r, n, is_append = kind == 2](KvLayer& l) {
                   if (is_append)
                     l.append(r->f32_view());
                   else
                     l.reserve(n);
                 },
                 op + ": ring cannot fit n " + to_string(n) + " rows: " + to_string(keep) +
                     " rows must stay resident (from logical row " + to_string(retain) + ") and " +
                     to_string(keep) + " + " + to_string(n) + " exceeds rows " + to_string(rows)};
      }
      case 4: {
        const int64_t p = which == 0 ? -1 - extra : len + 1 + extra;
        return R{[p](KvLayer& l) { l.rewind(p); },
                 "rewind: new_len " + to_string(p) + " is outside [0, len " + to_string(len) + "]"};
      }
      case 5: {  // below the can_rewind_to limit of a ring
        if (!ring || base == 0) return std::nullopt;
        const int64_t p = base + *g.window - 2 - extra;
        if (p < 0 || p > len) return std::nullopt;
        return R{[p](KvLayer& l) { l.rewind(p); },
                 "rewind: new_len " + to_string(p) + " needs logical row " +
                     to_string(std::max<int64_t>(0, p - (*g.window - 1))) +
                     " resident (the window of the next append), below base " + to_string(base) +
                     " (the ring already dropped it)"};
      }
      case 6: {
        const int64_t a = which == 0 ? base - 1 - extra : which == 1 ? base : base + 2 + extra;
        const int64_t b = which == 0 ? base : which == 1 ? base + rows + 1 + extra : base + 1;
        return R{[a, b](KvLayer& l) { (void)l.physical_rows(a, b); },
                 "physical_rows: [" + to_string(a) + ", " + to_string(b) +
                     ") is not within the resident rows [" + to_string(base) + ", " +
                     to_string(base + rows) + ")"};
      }
      case 7: {
        auto r = rows_n(2);
        if (ring && which == 0)
          return R{[r](KvLayer& l) {
                     l.append_dc({r->k.data(), r->v.data(), 1, DType::f32});
                   },
                   "append_dc: ring layers use append_dcw"};
        const std::string op = which == 2 ? "append_dcw" : "append_dc";
        return R{[r, op](KvLayer& l) {
                   if (op == "append_dc")
                     l.append_dc(r->f32_view());
                   else
                     l.append_dcw(r->f32_view());
                 },
                 op + ": n 2 must be 1"};
      }
      case 8: {
        const std::vector<float> q(std::size_t(m.n_q_heads * g.head_dim_k), 0.5f);
        if (ring)
          return R{[q, h = m.n_q_heads](KvLayer& l) { (void)l.decode_dc(q, h); },
                   "decode_dc: ring layers use decode_dcw"};
        if (g.window)
          return R{[q, h = m.n_q_heads](KvLayer& l) { (void)l.decode_dc(q, h); },
                   "decode_dc: attends [0, len_d) and ignores the window " + to_string(*g.window) +
                       "; windowed layers use decode_dcw"};
        return R{[q, h = m.n_q_heads](KvLayer& l) { (void)l.decode_dcw(q, h); },
                 "decode_dcw: the layer has no window; use decode_dc"};
      }
      case 9: {
        const int64_t want = int64_t(m.n_q_heads) * g.head_dim_k;
        const int64_t size = which == 0 ? want - 1 - extra : want + 1 + extra;
        return R{decode_call(std::vector<float>(std::size_t(size), 0.5f), m.n_q_heads),
                 dec + ": q has " + to_string(size) + " values, expected n_q_heads " +
                     to_string(m.n_q_heads) + " x head_dim_k " + to_string(g.head_dim_k) + " = " +
                     to_string(want)};
      }
      case 10: {
        const int heads = extra == 0 ? 0 : g.n_kv_heads * int(extra) + 1;
        if (heads != 0 && g.n_kv_heads == 1) return std::nullopt;
        return R{decode_call(std::vector<float>(std::size_t(heads * g.head_dim_k), 0.5f), heads),
                 dec + ": n_q_heads " + to_string(heads) +
                     " must be a positive multiple of n_kv_heads " + to_string(g.n_kv_heads)};
      }
      case 11: {  // account_steps: negative, past max_ctx, or past the ring's rows
        int64_t k = 0;
        if (which == 0) k = -1 - extra;
        if (which == 1) k = ctx - len + 1 + extra;
        if (which == 0 || which == 1)
          return R{[k](KvLayer& l) { l.account_steps(k); },
                   "account_steps: len " + to_string(len) + " + k " + to_string(k) +
                       " is outside [len, max_ctx " + to_string(ctx) + "]"};
        k = rows - (len - base) + 1 + extra;
        if (len + k > ctx) return std::nullopt;
        return R{[k](KvLayer& l) { l.account_steps(k); },
                 "account_steps: len " + to_string(len) + " + k " + to_string(k) + " - base " +
                     to_string(base) + " exceeds rows " + to_string(rows) +
                     " (more steps than reserve() made room for)"};
      }
      case 12: {
        auto r = rows_n(1);
        const char* ops[] = {"append", "append_dc", "append_dcw"};
        const std::string op = ops[which];
        const bool null_k = extra % 2 == 0;
        return R{[r, op, null_k](KvLayer& l) {
                   const kvlayer::ref::RowsView v{null_k ? nullptr : r->k.data(),
                                                  null_k ? r->v.data() : nullptr, 1, DType::f32};
                   if (op == "append") l.append(v);
                   if (op == "append_dc") l.append_dc(v);
                   if (op == "append_dcw") l.append_dcw(v);
                 },
                 op + ": k and v must not be null"};
      }
      case 13: {
        const int64_t k = -1 - extra;
        return R{[k](KvLayer& l) { l.reserve(k); },
                 "reserve: k " + to_string(k) + " must not be negative"};
      }
      case 14: {
        const int64_t k = ctx - len + 1 + extra;
        return R{[k](KvLayer& l) { l.reserve(k); }, "reserve: len " + to_string(len) + " + n " +
                                                        to_string(k) + " exceeds max_ctx " +
                                                        to_string(ctx)};
      }
    }
    return std::nullopt;
  }

  void checkPreconditions(const Model& m) const override { RC_PRE(request(m).has_value()); }
  void apply(Model&) const override {}
  void run(const Model& m, Sut& sut) const override {
    const auto r = request(m);
    RC_ASSERT(r.has_value());
    assert_refused(
        sut, [&] { r->first(sut); }, r->second);
    verify(m, sut, m.s.base());
  }
  void show(std::ostream& os) const override {
    os << "illegal(kind=" << kind << ", extra=" << extra << ", which=" << which << ")";
  }
};

// ---- the properties -----------------------------------------------------------------------------

/// A random small geometry: flat, windowed flat or ring (twice as likely), odd windows from 1,
/// small max_append / rewind_slack, capacities from a handful of rows to a few hundred.
struct Case {
  Geometry g;
  int n_q_heads;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.g.describe() << ", n_q_heads " << c.n_q_heads;
}

/// NOTE: resized to the full size: rc::gen::inRange narrows its range at small sizes, which
/// would make the early cases all tiny flat layers.
rc::Gen<Case> gen_case() {
  return rc::gen::resize(
      100, rc::gen::exec([] {
        Geometry g;
        g.n_kv_heads = *rc::gen::inRange(1, 4);
        g.head_dim_k = *rc::gen::element(32, 64);
        g.head_dim_v = *rc::gen::element(32, 64, 96);
        const int kind = *rc::gen::inRange(0, 4);  // flat, windowed flat, ring, ring
        // Odd and tiny windows and the ones next to the alignment find the most.
        if (kind >= 1)
          g.window = *rc::gen::oneOf(rc::gen::element<int64_t>(1, 2, 3, 31, 32, 33, 61, 63),
                                     rc::gen::inRange<int64_t>(1, 90));
        g.max_ctx =
            *rc::gen::oneOf(rc::gen::inRange<int64_t>(4, 64), rc::gen::inRange<int64_t>(64, 201));
        if (kind >= 2) {
          g.storage = Storage::ring;
          g.max_append = *rc::gen::inRange<int64_t>(1, 8);
          g.rewind_slack = *rc::gen::inRange<int64_t>(0, 10);
          // Mostly rings that rebase (max_ctx well above rows), sometimes ones capped by max_ctx.
          const int64_t rows = *g.window + g.max_append + g.rewind_slack + 31;
          g.max_ctx = *rc::gen::weightedOneOf<int64_t>(
              {{1, rc::gen::inRange<int64_t>(4, rows + 1)},
               {4, rc::gen::inRange<int64_t>(rows + 1, 4 * rows)}});
        }
        return Case{g, g.n_kv_heads * *rc::gen::inRange(1, 4)};
      }));
}

void run_machine(const Case& c, bool with_illegal) {
  RC_TAG(c.g.is_ring() ? "ring" : c.g.window ? "windowed flat" : "flat");
  const Model initial{Shadow(c.g), c.n_q_heads};
  KvLayer sut(c.g);
  if (with_illegal) {
    rc::state::check(initial, sut,
                     rc::state::gen::execOneOfWithArgs<Append, Append, Fill, Rewind, Reserve,
                                                       DeviceChain, HostDecode, ClearStatus,
                                                       Illegal, Illegal, Illegal, Illegal>());
  } else {
    rc::state::check(
        initial, sut,
        rc::state::gen::execOneOfWithArgs<Append, Append, Append, Fill, Rewind, Reserve,
                                          DeviceChain, DeviceChain, HostDecode, ClearStatus>());
  }
  // What the sequences reached (printed by rapidcheck with the distribution).
  RC_CLASSIFY(sut.base() > 0, "rebased");
  RC_CLASSIFY(sut.len() == c.g.max_ctx, "filled max_ctx");
}

}  // namespace

RC_GTEST_PROP(LayerProps, SequencesMatchTheModelAndKeepTheRingInvariants, ()) {
  run_machine(*gen_case(), false);
}

RC_GTEST_PROP(LayerProps, RefusedRequestsLeaveTheStateUnchanged, ()) {
  run_machine(*gen_case(), true);
}

}  // namespace kvlayer::testing
