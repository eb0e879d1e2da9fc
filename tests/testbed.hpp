// Shared test bed for the reference tests and properties (CUTLASS-testbed style): seeded inputs
// (initialize), an independent model of a layer written from SPEC.md (run), and state
// comparisons that return a readable difference instead of asserting (verify), so that the same
// helpers serve GoogleTest (EXPECT_*) and rapidcheck (RC_ASSERT).
//
// NOTE: the model below (`Shadow`) deliberately re-derives every rule of SPEC §5–7 from the text
// rather than calling KvLayer::plan_append or friends: the reference is what is under test. It
// does use ref::quantize_row for block bytes; the quantizer itself is checked against a separate
// oracle in test_quantize.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <source_location>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kvlayer/error.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/status.hpp"
#include "kvlayer/testing/geometry.hpp"
#include "kvlayer/testing/rng.hpp"
#include "kvlayer/testing/rows.hpp"
#include "kvlayer/testing/snapshot.hpp"

namespace kvlayer::testing {

using ref::BlockType;
using ref::KvLayer;

// ---- initialize ---------------------------------------------------------------------------

/// Which values random rows hold.
enum class Values {
  /// Per block a random power-of-two scale in [2^-10, 2^10] times uniform(−1, 1): realistic.
  varied,
  /// Integers in [−255, 255] times 2^-e, e in [0, 8]: exact in f32, f16 and bf16, so every input
  /// dtype carries the same values.
  exact16,
};

inline void fill_values(std::vector<float>& out, Rng& rng, Values kind) {
  for (std::size_t b = 0; b < out.size(); b += kvlayer::kBlockValues) {
    const float scale = std::ldexp(1.0f, int(rng.range(-10, 10)));
    const int e = int(rng.range(0, 8));
    for (std::size_t j = b; j < std::min(out.size(), b + kvlayer::kBlockValues); ++j)
      out[j] = kind == Values::varied ? scale * rng.uniform(-1.0f, 1.0f)
                                      : std::ldexp(float(rng.range(-255, 255)), -e);
  }
}

/// n random rows for geometry g, in f32.
inline HostRows random_rows(const Geometry& g, std::int64_t n, Rng& rng,
                            Values kind = Values::varied) {
  std::vector<float> k(std::size_t(n * g.kv_dim_k())), v(std::size_t(n * g.kv_dim_v()));
  fill_values(k, rng, kind);
  fill_values(v, rng, kind);
  return encode_rows(std::move(k), std::move(v), n, DType::f32);
}

// ---- verify: snapshots -------------------------------------------------------------------

/// First difference between two byte planes ("" when equal), in rows and bytes.
inline std::string plane_diff(const char* name, const std::vector<std::uint8_t>& want,
                              const std::vector<std::uint8_t>& got, std::int64_t tok_bytes) {
  std::ostringstream s;
  if (got.size() < want.size()) {
    s << name << " plane has " << got.size() << " bytes, want at least " << want.size() << "; ";
    return s.str();
  }
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i]) {
      s << name << " plane byte " << i << " (physical row " << std::int64_t(i) / tok_bytes
        << ", byte " << std::int64_t(i) % tok_bytes << "): want " << int(want[i]) << ", got "
        << int(got[i]) << "; ";
      return s.str();
    }
  return "";
}

/// "" when a and b are identical, else what differs.
inline std::string snapshot_diff(const Snapshot& want, const Snapshot& got, const Geometry& g) {
  std::ostringstream s;
  s << plane_diff("K", want.k_plane, got.k_plane, g.k_tok_bytes())
    << plane_diff("V", want.v_plane, got.v_plane, g.v_tok_bytes());
  if (want.k_plane.size() != got.k_plane.size() || want.v_plane.size() != got.v_plane.size())
    s << "plane sizes differ; ";
  auto num = [&s](const char* n, std::int64_t w, std::int64_t x) {
    if (w != x) s << n << " want " << w << ", got " << x << "; ";
  };
  num("len", want.len, got.len);
  num("len_d", want.len_d, got.len_d);
  num("base", want.base, got.base);
  num("base_d", want.base_d, got.base_d);
  if (!same_status(want.status, got.status))
    s << "status want '" << want.status.message() << "', got '" << got.status.message() << "'; ";
  return s.str();
}

/// Runs f, which must throw kvlayer::Error of kind `refused` with exactly `message`, and checks
/// that the layer's state is byte-for-byte what it was. Returns "" on success, else the problem.
template <typename F>
std::string check_refused_unchanged(const KvLayer& layer, F&& f, const std::string& message) {
  const Snapshot before = snapshot(layer);
  std::string problem;
  try {
    f();
    problem = "no error thrown (want '" + message + "'); ";
  } catch (const kvlayer::Error& e) {
    if (e.kind() != kvlayer::ErrorKind::refused) problem += "error kind is not 'refused'; ";
    if (e.what() != message)
      problem += "message '" + std::string(e.what()) + "', want '" + message + "'; ";
  } catch (const std::exception& e) {
    problem = std::string("threw a non-kvlayer exception: ") + e.what() + "; ";
  }
  return problem + snapshot_diff(before, snapshot(layer), layer.geometry());
}

/// GoogleTest form of check_refused_unchanged: records a
/// failure at the caller's line when f is not refused with exactly `expected_message` or when
/// any state (bytes, len, len_d, base, base_d, status) changed.
template <typename F>
void expect_refused_unchanged(const KvLayer& layer, F&& f, const std::string& expected_message,
                              std::source_location at = std::source_location::current()) {
  const std::string problem = check_refused_unchanged(layer, std::forward<F>(f), expected_message);
  if (!problem.empty()) ADD_FAILURE_AT(at.file_name(), int(at.line())) << problem;
}

/// Runs f, which must throw kvlayer::Error (refused) with exactly `message` (no layer to
/// snapshot, e.g. a constructor). Returns "" on success.
template <typename F>
std::string check_throws_refused(F&& f, const std::string& message) {
  try {
    f();
    return "no error thrown (want '" + message + "')";
  } catch (const kvlayer::Error& e) {
    std::string p;
    if (e.kind() != kvlayer::ErrorKind::refused) p += "error kind is not 'refused'; ";
    if (e.what() != message) p += "message '" + std::string(e.what()) + "', want '" + message + "'";
    return p;
  }
}

// ---- run: an independent model of SPEC §5–7 ---------------------------------------------

/// The layer as SPEC.md describes it, re-derived from the text: planes, counters, status, and
/// for each logical row the f32 values last written there (to check contents across rebases).
class Shadow {
 public:
  explicit Shadow(const Geometry& g)
      : g_(g),
        rows_(g.storage == Storage::ring
                  ? std::min(g.max_ctx, *g.window + g.max_append + g.rewind_slack + 31)
                  : g.max_ctx),
        k_(std::size_t(rows_ * g.k_tok_bytes()), 0),
        v_(std::size_t(rows_ * g.v_tok_bytes()), 0) {}

  struct Plan {
    bool fits = false;
    bool rebase = false;
    std::int64_t retain = 0, keep = 0, write_row = 0;
  };

  const Geometry& geometry() const { return g_; }
  bool ring() const { return g_.storage == Storage::ring; }
  std::int64_t rows() const { return rows_; }
  std::int64_t len() const { return len_; }
  std::int64_t base() const { return base_; }
  std::int64_t len_d() const { return len_d_; }
  std::int64_t base_d() const { return base_d_; }
  const kvlayer::LayerStatus& status() const { return status_; }
  const std::vector<std::uint8_t>& k_plane() const { return k_; }
  const std::vector<std::uint8_t>& v_plane() const { return v_; }
  /// Logical row -> (K values, V values) last written there and still in the plane.
  const std::map<std::int64_t, std::pair<std::vector<float>, std::vector<float>>>& written() const {
    return written_;
  }

  static std::int64_t align_down(std::int64_t a) { return a - a % 32; }

  /// SPEC §6 append planning for n rows at len (flat: always at len).
  Plan plan(std::int64_t n) const {
    Plan p;
    if (n < 1 || len_ + n > g_.max_ctx) return p;
    p.fits = true;
    p.retain = base_;
    p.write_row = len_ - base_;
    if (!ring() || len_ - base_ + n <= rows_) return p;
    p.rebase = true;
    p.retain = std::max(
        base_, align_down(std::max<std::int64_t>(0, len_ - (*g_.window - 1) - g_.rewind_slack)));
    p.keep = len_ - p.retain;
    p.write_row = p.keep;
    p.fits = p.keep + n <= rows_;
    return p;
  }

  bool can_rewind_to(std::int64_t p) const {
    if (p < 0 || p > len_) return false;
    if (!ring()) return true;
    return align_down(std::max<std::int64_t>(0, p - (*g_.window - 1))) >= base_;
  }

  /// Host decode view [begin, end) (SPEC §8).
  std::pair<std::int64_t, std::int64_t> view() const { return view_at(len_); }
  std::pair<std::int64_t, std::int64_t> view_at(std::int64_t len) const {
    if (!g_.window) return {0, len};
    return {std::max<std::int64_t>(0, len - *g_.window), len};
  }

  /// A legal append (plan(n).fits must hold).
  void append(const HostRows& r) {
    const Plan p = plan(r.n);
    if (!p.fits) throw std::logic_error("Shadow::append: illegal append");
    if (p.rebase) rebase_to(p.retain);
    for (std::int64_t i = 0; i < r.n; ++i) write(r, i, p.write_row + i, len_ + i);
    len_ += r.n;
    len_d_ = len_;
  }

  void rewind(std::int64_t p) {
    if (!can_rewind_to(p)) throw std::logic_error("Shadow::rewind: illegal rewind");
    len_ = len_d_ = p;
  }

  /// True iff reserve(k) is legal.
  bool can_reserve(std::int64_t k) const { return plan(k).fits; }
  void reserve(std::int64_t k) {
    const Plan p = plan(k);
    if (!p.fits) throw std::logic_error("Shadow::reserve: illegal reserve");
    if (p.rebase) rebase_to(p.retain);
  }

  /// append_dc (windowed = false) or append_dcw (true) of one row (SPEC §7).
  void append_device(const HostRows& one, bool windowed) {
    const std::int64_t b = windowed ? base_d_ : 0;
    if (len_d_ >= g_.max_ctx) {  // checked first, as the reference does (SPEC is silent)
      device_error({kvlayer::DeviceErrorKind::append_past_max_ctx, len_d_, b, g_.max_ctx});
      written_.erase(len_d_);
    } else if (len_d_ - b >= rows_) {
      device_error({kvlayer::DeviceErrorKind::append_outside_rows, len_d_, b, rows_});
      written_.erase(len_d_);
    } else {
      write(one, 0, len_d_ - b, len_d_);
    }
  }
  void inc_seqlen() { ++len_d_; }
  /// True iff account_steps(k) keeps every SPEC invariant: len + k ≤ max_ctx (§6) and, on a
  /// ring, len + k − base ≤ rows (§6). NOTE: len + k == len_d is the caller's duty; the
  /// reference does not check it (README "Where SPEC.md is silent").
  bool can_account(std::int64_t k) const {
    return k >= 0 && len_ + k <= g_.max_ctx && len_ + k - base_ <= rows_;
  }
  void account_steps(std::int64_t k) {
    if (!can_account(k)) throw std::logic_error("Shadow::account_steps: illegal");
    len_ += k;
  }

  /// True iff a host-len decode is accepted: its view must be resident (README: a view
  /// starting below base right after a rewind to the limit is refused).
  bool can_decode() const { return view().first >= base_; }

  /// decode_dc (windowed = false) or decode_dcw (true): the logical view, or nullopt after
  /// recording the device error SPEC §7 asks for.
  std::optional<std::pair<std::int64_t, std::int64_t>> device_view(bool windowed) {
    if (!windowed) {
      if (len_d_ > g_.max_ctx) {
        device_error({kvlayer::DeviceErrorKind::decode_view_too_long, len_d_, 0, g_.max_ctx});
        return std::nullopt;
      }
      return std::pair<std::int64_t, std::int64_t>{0, len_d_};
    }
    // The reference checks max_ctx first, then the resident rows (SPEC is silent on which
    // limit to report when both are exceeded).
    const auto v = view_at(len_d_);
    if (len_d_ > g_.max_ctx) {
      device_error({kvlayer::DeviceErrorKind::decode_view_too_long, len_d_, base_d_, g_.max_ctx});
      return std::nullopt;
    }
    if (v.first < base_d_ || len_d_ - base_d_ > rows_) {
      device_error({kvlayer::DeviceErrorKind::decode_view_too_long, len_d_, base_d_, rows_});
      return std::nullopt;
    }
    return v;
  }

  void clear_status() { status_ = {}; }

  /// The snapshot the reference must equal.
  Snapshot snapshot() const {
    Snapshot s;
    s.k_plane = k_;
    s.v_plane = v_;
    s.len = len_;
    s.len_d = len_d_;
    s.base = base_;
    s.base_d = base_d_;
    s.status = status_;
    return s;
  }

  /// Dequantized K or V of logical row r as this model holds it (SPEC §4).
  std::vector<float> dequantized(Plane p, std::int64_t logical, bool device = false) const {
    const std::int64_t phys = logical - (device ? base_d_ : base_);
    const std::int64_t tb = p == Plane::k ? g_.k_tok_bytes() : g_.v_tok_bytes();
    const auto& plane = p == Plane::k ? k_ : v_;
    std::vector<float> out(std::size_t(p == Plane::k ? g_.kv_dim_k() : g_.kv_dim_v()));
    kvlayer::ref::dequantize_row(p == Plane::k ? BlockType::q8_0 : BlockType::q5_1,
                                 std::span(plane).subspan(std::size_t(phys * tb), std::size_t(tb)),
                                 out);
    return out;
  }

 private:
  /// SPEC §3 / status.hpp: the data error kept is the lowest (row, plane K < V, block).
  /// Written out here (not kvlayer::keep_first) so that the model does not share that rule's
  /// code with the reference.
  void keep_lowest(const kvlayer::DataError& c) {
    auto& slot = status_.data_error;
    auto key = [](const kvlayer::DataError& e) {
      return std::tuple(e.row, e.plane == Plane::k ? 0 : 1, e.block);
    };
    if (!slot || key(c) < key(*slot)) slot = c;
  }

  void device_error(const kvlayer::DeviceError& e) {
    if (!status_.device_error) status_.device_error = e;
  }

  void rebase_to(std::int64_t retain) {
    const std::int64_t keep = len_ - retain;
    for (auto [plane, tb] : {std::pair{&k_, g_.k_tok_bytes()}, std::pair{&v_, g_.v_tok_bytes()}}) {
      // As if copied through a temporary (SPEC §6): the ranges may overlap.
      const std::vector<std::uint8_t> tmp(plane->begin() + (retain - base_) * tb,
                                          plane->begin() + (len_ - base_) * tb);
      std::copy(tmp.begin(), tmp.end(), plane->begin());
    }
    (void)keep;
    // Rows past len were not moved: whatever the model knew about them is gone.
    written_.erase(written_.lower_bound(len_), written_.end());
    base_ = base_d_ = retain;
  }

  void write(const HostRows& r, std::int64_t i, std::int64_t phys, std::int64_t logical) {
    auto kr = r.row(Plane::k, i, g_), vr = r.row(Plane::v, i, g_);
    auto put = [&](Plane p, const std::vector<float>& x, std::vector<std::uint8_t>& plane,
                   std::int64_t tb) {
      const auto bad = kvlayer::ref::quantize_row(
          p == Plane::k ? BlockType::q8_0 : BlockType::q5_1, x,
          std::span(plane).subspan(std::size_t(phys * tb), std::size_t(tb)));
      if (bad) keep_lowest({logical, p, bad->block, bad->value});
    };
    put(Plane::k, kr, k_, g_.k_tok_bytes());
    put(Plane::v, vr, v_, g_.v_tok_bytes());
    written_[logical] = {std::move(kr), std::move(vr)};
  }

  Geometry g_;
  std::int64_t rows_;
  std::vector<std::uint8_t> k_, v_;
  std::int64_t len_ = 0, base_ = 0, len_d_ = 0, base_d_ = 0;
  kvlayer::LayerStatus status_;
  std::map<std::int64_t, std::pair<std::vector<float>, std::vector<float>>> written_;
};

/// "" when the reference layer equals the model in every byte and counter (SPEC §10.1 style).
inline std::string state_diff(const Shadow& want, const KvLayer& got) {
  std::string d = snapshot_diff(want.snapshot(), snapshot(got), want.geometry());
  if (got.rows() != want.rows())
    d += "rows want " + std::to_string(want.rows()) + ", got " + std::to_string(got.rows()) + "; ";
  return d;
}

/// SPEC §10.5 on one state: "" when base is a multiple of 32, not below `prev_base`,
/// base ≤ len and len − base ≤ rows.
inline std::string ring_invariants(const KvLayer& l, std::int64_t prev_base) {
  std::ostringstream s;
  if (l.base() % 32 != 0) s << "base " << l.base() << " not a multiple of 32; ";
  if (l.base() < prev_base) s << "base decreased " << prev_base << " -> " << l.base() << "; ";
  if (l.base() > l.len()) s << "base " << l.base() << " > len " << l.len() << "; ";
  if (l.len() - l.base() > l.rows())
    s << "len " << l.len() << " - base " << l.base() << " > rows " << l.rows() << "; ";
  if (l.base_d() != l.base()) s << "base_d " << l.base_d() << " != base " << l.base() << "; ";
  return s.str();
}

// ---- verify: decode oracle ---------------------------------------------------------------

/// Straightforward float64 attention (SPEC §8) over logical keys [begin, end); `row(plane, t)`
/// gives the dequantized row of logical key t. Deliberately naive: no online softmax.
inline std::vector<double> oracle_decode(
    const Geometry& g, const std::vector<float>& q, int n_q_heads, float scale, std::int64_t begin,
    std::int64_t end, const std::function<std::vector<float>(Plane, std::int64_t)>& row) {
  const int gqa = n_q_heads / g.n_kv_heads;
  std::vector<double> out(std::size_t(n_q_heads) * g.head_dim_v, 0.0);
  if (end <= begin) return out;
  std::vector<std::vector<float>> ks, vs;
  for (std::int64_t t = begin; t < end; ++t) {
    ks.push_back(row(Plane::k, t));
    vs.push_back(row(Plane::v, t));
  }
  for (int h = 0; h < n_q_heads; ++h) {
    const int kvh = h / gqa;
    std::vector<double> s(ks.size());
    for (std::size_t t = 0; t < ks.size(); ++t) {
      double dot = 0;
      for (int d = 0; d < g.head_dim_k; ++d)
        dot += double(q[std::size_t(h) * g.head_dim_k + d]) *
               double(ks[t][std::size_t(kvh) * g.head_dim_k + d]);
      s[t] = double(scale) * dot;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (std::size_t t = 0; t < ks.size(); ++t)
      for (int d = 0; d < g.head_dim_v; ++d)
        out[std::size_t(h) * g.head_dim_v + d] +=
            s[t] / sum * double(vs[t][std::size_t(kvh) * g.head_dim_v + d]);
  }
  return out;
}

/// Default decode scale, 1/sqrt(head_dim_k) in f32 (kv_layer.hpp).
inline float default_scale(const Geometry& g) {
  return 1.0f / std::sqrt(float(g.head_dim_k));
}

/// "" when got matches want within `tol` (absolute, relative to max(1, max|want|)), else the
/// first mismatch. Both float64 computations of the same sum: tol guards summation order only.
inline std::string compare_outputs(const std::vector<double>& want, const std::vector<double>& got,
                                   double tol = 1e-12) {
  std::ostringstream s;
  if (want.size() != got.size()) {
    s << "size want " << want.size() << ", got " << got.size();
    return s.str();
  }
  double mag = 1;
  for (double w : want) mag = std::max(mag, std::fabs(w));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(want[i] - got[i]) <= tol * mag)) {
      s.precision(17);
      s << "output " << i << ": want " << want[i] << ", got " << got[i];
      return s.str();
    }
  return "";
}

/// Random query [n_q_heads, head_dim_k].
inline std::vector<float> random_query(const Geometry& g, int n_q_heads, Rng& rng) {
  std::vector<float> q(std::size_t(n_q_heads) * g.head_dim_k);
  for (float& x : q) x = rng.uniform(-1.0f, 1.0f);
  return q;
}

}  // namespace kvlayer::testing
